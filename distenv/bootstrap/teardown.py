"""Ending the process groups' lifetime before the interpreter finalises, so that no rank aborts at exit.

gloo runs each collective on a worker thread (``pt_gloo_runloop``) that drops its reference to
the finished work only after the caller has been woken. When that reference is the last one and a
tensor it holds owns a Python object, the thread takes the GIL to free it. Once CPython has begun
finalising, a thread that takes the GIL is ended with ``pthread_exit``, which unwinds through a
``noexcept`` C++ destructor and aborts the process (``terminate called without an active
exception``, SIGABRT, exit 134) after a run that succeeded. ``destroy_process_group()`` does not
stop those threads while a DDP reducer still holds the group.

`end_groups` runs while the interpreter is still whole (`init_dist` and `setup` register it with
`atexit`, so it runs before any handler registered earlier, and after any registered later):

1. it destroys the default group if the script did not (``destroy_process_group``: NCCL's
   communicators are shut down, every group is unregistered); a group already destroyed is left
   alone;
2. it collects garbage, so that DDP wrappers nothing refers to any more free their reducers, and
   with them the groups, whose destructors join the worker threads now;
3. it waits until every gloo worker thread still alive is idle (seen waiting on its queue twice in a
   row): a worker still finishing a collective gets the CPU and the GIL it needs now, not after
   finalisation began.

All of it runs in a daemon thread, within `TEARDOWN_S`.

A collective may also wait in a thread Python joins before any `atexit` handler runs: a
``threading.Thread`` (joined by ``threading._shutdown``) or a ``ThreadPoolExecutor`` worker
(joined by concurrent.futures' own hook). Left alone, such a thread holds the exit for the group's
timeout, silently, before `end_groups` is ever called. So `register` also hooks
``threading._register_atexit``, whose callbacks run (newest first) before those joins and before
concurrent.futures' hook: `before_joins` returns at once where no collective is in flight, waits
up to `TEARDOWN_S` for one to finish otherwise (the threads may have a reason to run on), and ends
the process as below if it is still waiting then. The group is not destroyed there: a thread
Python is about to join may still be using it. A worker still inside a collective then
(waiting on a peer that was stopped, or on an operation the script never waited for) would hold
the exit for the group's timeout, 30 minutes by default, when the group is destroyed: the rank says
so in one line and ends at once (``os._exit``) with the status the script was ending with
(`distenv.exits.ExitStatus`: an uncaught exception's 1 whatever ``sys.excepthook`` the script
installed, a refusal's 1, ``sys.exit``'s code), after flushing stdout and stderr.

Thread states come from ``/proc/self/task`` (`distenv.system.processes.threads`): an idle worker waits on its queue's condition variable
without a timeout, one inside a collective waits with the group's timeout (the fourth argument of
its ``futex`` call, in ``/proc/self/task/TID/syscall``). Without ``/proc`` (not Linux) steps 1 and
2 still run and step 3 is skipped.
"""

from __future__ import annotations

import atexit
import gc
import sys
import threading
import time
from collections.abc import Callable

from distenv.deadline import Deadline
from distenv.exits import ExitStatus
from distenv.system.processes import ThreadEntry, threads

__all__ = ["TEARDOWN_S", "before_joins", "end_groups", "register"]

#: The most `end_groups` may add to a rank's exit.
TEARDOWN_S = 5.0
# gloo names its worker threads so (torch/csrc/distributed/c10d/ProcessGroupGloo.cpp).
_WORKER_NAME = b"pt_gloo_runloop"
# How often the worker threads' states are read while waiting for them.
_POLL_S = 0.002
# The futex(2) system call's number on x86-64 and arm64, as /proc/TID/syscall shows it.
_FUTEX = {b"202", b"98"}

_registered = threading.Lock()
_done: list[bool] = []


def _idle(thread: ThreadEntry) -> bool:
    """Return whether a gloo worker waits on its queue: asleep in futex(2) with no timeout."""
    words = thread.syscall.split()
    return thread.state == "S" and len(words) > 4 and words[0] in _FUTEX and int(words[4], 16) == 0


def _wait_until_idle(until: Deadline) -> bool:
    """Return True once every gloo worker is seen idle twice in a row; False at `until`."""
    quiet = 0
    while quiet < 2:
        if until.passed():
            return False
        time.sleep(_POLL_S)  # releases the GIL to a worker that needs it
        found = threads()
        if found is None:
            return True
        workers = [thread for thread in found if thread.name == _WORKER_NAME]
        quiet = quiet + 1 if all(_idle(worker) for worker in workers) else 0
    return True


def _end(until: Deadline) -> bool:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()
    return _wait_until_idle(until)


def _bounded(call: Callable[[Deadline], bool]) -> tuple[bool, BaseException | None]:
    """Run ``call(until)`` in a daemon thread; return (whether it ended in time and True, error)."""
    until = Deadline.after(TEARDOWN_S)
    outcome: list[bool] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(call(until))
        except BaseException as exc:
            failure.append(exc)

    worker = threading.Thread(target=run, name="distenv-teardown", daemon=True)
    worker.start()
    worker.join(TEARDOWN_S + 10 * _POLL_S)
    return (not worker.is_alive() and outcome == [True]), (failure[0] if failure else None)


def _stuck_exit() -> None:
    """Say that a collective still waits `TEARDOWN_S` into the exit, and end with the status."""
    sys.stderr.write(
        f"distenv: a collective was still waiting on a peer {TEARDOWN_S:g} s into this "
        f"rank's exit; exiting now with {ExitStatus.describe()}, without waiting for the "
        "process group's timeout\n"
    )
    ExitStatus.end_now()


def before_joins() -> None:
    """Bound the exit of a collective left waiting in a thread Python joins (module doc).

    A no-op where torch.distributed was never imported or no thread but the main one remains.
    """
    if "torch.distributed" not in sys.modules:
        return
    main = threading.main_thread()
    if not any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate()):
        return
    if not _wait_until_idle(Deadline.after(TEARDOWN_S)):
        _stuck_exit()


def end_groups() -> None:
    """Destroy the default process group and let gloo's worker threads finish, within `TEARDOWN_S`.

    A no-op where torch.distributed was never imported. Never raises: a failure is reported in one
    line on stderr; a collective still waiting at the bound ends the process with its status.
    """
    if "torch.distributed" not in sys.modules:  # no group can exist: do not import torch for it
        return
    ended, failure = _bounded(_end)
    if failure is not None:
        sys.stderr.write(f"distenv: ending the process group at exit failed: {failure!r}\n")
    elif not ended:
        _stuck_exit()


def register() -> None:
    """Run `end_groups` at interpreter exit, and `before_joins` before Python joins its threads
    (once per process, however often this is called)."""
    # Imported first, so that concurrent.futures' hook (joining its workers) is registered
    # before ours, and runs after it.
    import concurrent.futures.thread  # noqa: F401

    with _registered:
        if not _done:
            ExitStatus.watch()
            atexit.register(end_groups)
            # Private, but the hook concurrent.futures itself uses (CPython 3.9+): run before the
            # interpreter joins non-daemon threads.
            threading._register_atexit(before_joins)  # type: ignore[attr-defined]
            _done.append(True)
