"""A rank's side of the hang autopsy: stack dumps on request, and a watchdog that says "stuck".

The rank wrapper (`distenv.local.reporting`) calls `arm` before it runs the script:

- `faulthandler` writes every thread's Python stack to the rank's fault file when the rank receives
  `DUMP_SIGNAL` (the agent's request once the job hangs) or SIGUSR1 (forwarded by ``distenv run``
  for a dump on demand; a script that installs its own SIGUSR1 handler replaces this one). The
  handler is C code: it dumps even while the main thread is blocked in C++ inside a collective.
- Only with a hang timeout: one daemon thread samples the rank every quarter of the timeout. The
  rank progresses when, since the last sample, the main thread's innermost frame or line changed
  (`sys._current_frames`), or the default process group issued a collective (its sequence
  number, read only once torch.distributed is initialized), or the process used more than
  `CPU_PROGRESS` of the period on the CPU apart from this thread (a long matmul). So a loop
  whose every sample lands on the same line (a long collective or a blocking synchronize each
  step) still progresses, while a rank that waits in a collective or sleeps uses next to none
  (gloo's threads included: tests/process/test_hang.py relies on it). A rank that busy-waits (a
  CUDA synchronize that spins) counts as progressing: the job's hang is then found on the rank
  that waits. The watch begins once torch.distributed is initialized: before, the rendezvous's
  own timeout names the ranks that did not arrive. When the rank has not progressed for the
  timeout, the thread writes one `stuck` line to the agent's report pipe, and again only after
  the main thread moved on and got stuck anew. While training runs the cost is one sample per
  period: no tracing, no extra process.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

from distenv.settings import HANG_VAR

__all__ = ["DUMP_SIGNAL", "HANG_VAR", "arm", "parse_stuck", "stuck_line"]

#: The signal the agent sends for a dump: a real-time signal no library claims, so that a script's
#: own SIGUSR1 handler (a checkpoint on a scheduler's warning) is not run by a hang.
DUMP_SIGNAL: int = signal.SIGRTMIN + 3
#: The share of a period the process must spend on the CPU (this thread's own time apart) for
#: the period to count as progress.
CPU_PROGRESS = 0.01
#: The shortest and longest period between two samples.
MIN_PERIOD, MAX_PERIOD = 0.05, 15.0


def stuck_line(frame: str, since: float) -> bytes:
    """Return the report pipe's line that says the main thread is stuck at `frame` since `since`."""
    return (json.dumps({"stuck": frame[:240], "since": since}, ensure_ascii=True) + "\n").encode()


def parse_stuck(data: bytes) -> tuple[str, float] | None:
    """Return the first `stuck_line` in `data` as (where, since), None if there is none valid."""
    for line in data.splitlines():
        if line.startswith(b'{"stuck"'):
            with contextlib.suppress(ValueError, TypeError, RecursionError):
                fields = json.loads(line)
                if isinstance(fields.get("stuck"), str) and type(fields.get("since")) is float:
                    return fields["stuck"][:240], fields["since"]
    return None


def _where(frame: FrameType | None, users: Callable[[str], bool]) -> str:
    """Return ``file:line in function`` of the innermost frame of the user's code from `frame` on."""
    inner = frame
    while frame is not None and not users(frame.f_code.co_filename):
        frame = frame.f_back
    frame = frame or inner
    if frame is None:
        return "?"
    code = frame.f_code
    return f"{os.path.basename(code.co_filename)}:{frame.f_lineno} in {code.co_name}"


def _watch(timeout: float, report_fd: int, main: int, users: Callable[[str], bool]) -> None:
    """Sample the main thread forever; write a `stuck_line` when it made no progress for `timeout`."""
    period = min(MAX_PERIOD, max(MIN_PERIOD, timeout / 4))
    last: tuple[int, int, int] | None = None
    cpu = time.process_time() - time.thread_time()
    moved = time.time()
    told = False
    while True:
        time.sleep(period)
        frame = sys._current_frames().get(main)
        if frame is None:  # the main thread has ended: the interpreter is exiting
            return
        collectives = _collectives()
        here = (id(frame.f_code), frame.f_lineno or 0, collectives)
        now_cpu = time.process_time() - time.thread_time()
        # Before the rank joined its group, waiting (for the slowest rank's import torch) is no
        # hang: the rendezvous has its own timeout, which names the ranks that did not arrive.
        if here != last or now_cpu - cpu >= CPU_PROGRESS * period or collectives < 0:
            last, moved, told = here, time.time(), False
        cpu = now_cpu
        if not told and time.time() - moved >= timeout:
            told = True
            with contextlib.suppress(OSError):
                os.write(report_fd, stuck_line(_where(frame, users), moved))
        del frame


def _collectives() -> int:
    """Return the default process group's sequence number (collectives issued), -1 if none."""
    dist = sys.modules.get("torch.distributed")  # never imported here: only if the script did
    with contextlib.suppress(Exception):  # any torch version, any backend: no number, no signal
        if dist is not None and dist.is_initialized():
            group = dist.distributed_c10d._get_default_group()
            return int(group._get_sequence_number_for_group())
    return -1


def _forget_in_child() -> None:
    """A forked child (a data loader's worker) does not dump into its parent's fault file.

    SIGUSR1 is left alone where the script installed its own handler (`signal.getsignal` shows
    only Python's handlers): unregistering would put back the default action, not its handler.
    """
    for signum in (DUMP_SIGNAL, signal.SIGUSR1):
        if signum == DUMP_SIGNAL or signal.getsignal(signum) in (signal.SIG_DFL, None):
            with contextlib.suppress(RuntimeError, ValueError):
                faulthandler.unregister(signum)


def arm(
    fault_fd: int | None,
    report_fd: int | None,
    hang: str | None,
    users: Callable[[str], bool] = lambda name: True,
) -> None:
    """Register the dump signals on `fault_fd`; with a timeout `hang` (seconds), start the watchdog.

    Args:
        fault_fd: The rank's fault file (None: no agent reads dumps, nothing is registered).
        report_fd: The agent's report pipe (None: no watchdog).
        hang: ``$DISTENV_HANG_TIMEOUT`` as the agent set it, or None.
        users: Whether a file holds the user's code (`distenv.local.reporting.users_file`): the
            stuck line names the innermost frame of the user's code.
    """
    if fault_fd is None:
        return
    with contextlib.suppress(OSError, ValueError, RuntimeError):
        for signum in (DUMP_SIGNAL, signal.SIGUSR1):
            faulthandler.register(signum, file=fault_fd, all_threads=True, chain=False)
        os.register_at_fork(after_in_child=_forget_in_child)
    try:
        timeout = float(hang or "nan")
    except ValueError:
        return
    if report_fd is None or not timeout > 0:
        return
    main = threading.main_thread().ident
    assert main is not None
    threading.Thread(
        target=_watch, args=(timeout, report_fd, main, users), name="distenv-watchdog", daemon=True
    ).start()
