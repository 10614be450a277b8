"""One deadline for the whole bootstrap, and blocking calls that can be abandoned at it.

torch's store and process-group calls block inside C++: TCPStore's own timeout bounds neither its
constructor against a listener that never answers nor a later operation against a stopped server,
and a Python signal handler cannot run while the main thread is inside them. So the bootstrap runs
in one daemon thread (`watched`) while the main thread waits in short slices. The thread tells a
`Watch` which phase it is in, by when that phase must end and what to say if it does not; at that
time the main thread gives up with the phase's message, and a SIGINT or SIGTERM is handled within
the slice (`interruptible`), whatever the thread is blocked in. One thread serves every phase
(`bounded` remains for the rare one-off call: detection's read of a host file,
`distenv._hosts.read_host_file`). An abandoned thread stays blocked until the process
ends; the native calls release the GIL, so nothing else waits for it. A call that is only
waiting between store operations is told to stop instead (`pause` raises `Cancelled` in it), and
is given `distenv.timing.STOP_S` to do so, so that it is not left inside a native call while the interpreter
finalises. A call still blocked in a native call then (a store request against a listener that
never answers, or against a stopped rank 0) is left behind, and the process must end before that call
can return: a thread that comes back from C++ into a finalising interpreter is ended while it unwinds
C++ frames, and the process aborts (SIGABRT, exit 134, torch's stack dumps after distenv's one
line). So at exit, if a call left behind is still blocked, the process ends at once
(``os._exit``, after flushing stdout and stderr) with the status Python was ending it with
(`distenv.exits.ExitStatus`): `atexit` handlers registered before the call was left behind do not
run then. (The abort at exit after a finished training, ``terminate called without an active
exception``, comes from gloo's worker threads, not from this one: `distenv.bootstrap.teardown`.)

The deadline is the rendezvous timeout plus `distenv.timing.GRACE_S`, from `init_dist`'s entry to its return.
"""

from __future__ import annotations

import atexit
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import NamedTuple, TypeVar

from distenv.errors import RendezvousError
from distenv.exits import ExitStatus
from distenv.timing import SLICE_S, STOP_S

__all__ = [
    "Deadline",
    "StopSignalError",
    "Watch",
    "bounded",
    "interruptible",
    "watched",
]

T = TypeVar("T")

_current = threading.local()
# Watched calls given up on while still blocked (module doc); guarded by `_leaving`.
_left_behind: list[threading.Thread] = []
_leaving = threading.Lock()


class Cancelled(Exception):  # noqa: N818 -- a control-flow signal, not an error
    """Raised by `pause` in a bounded call its caller gave up on."""


def pause(seconds: float) -> None:
    """Sleep `seconds` inside a bounded call, or raise `Cancelled` as soon as it is abandoned."""
    cancel: threading.Event | None = getattr(_current, "cancel", None)
    if cancel is None:
        time.sleep(seconds)
    elif cancel.wait(seconds):
        raise Cancelled


def _end_if_left_behind() -> None:
    """At exit, end the process now if a call left behind is still blocked (module doc)."""
    if any(thread.is_alive() for thread in _left_behind):
        ExitStatus.end_now()


def _leave_behind(worker: threading.Thread) -> None:
    """Remember a watched call's thread that is still blocked after it was given up on."""
    with _leaving:
        if not _left_behind:
            ExitStatus.watch()  # so that a later sys.exit(N) still ends the process with N
            atexit.register(_end_if_left_behind)
        _left_behind.append(worker)


class Deadline(NamedTuple):
    """The instant a wait must end by, and the length it was set for (what its message states)."""

    at: float  # time.monotonic()
    seconds: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        """Return the deadline `seconds` from now."""
        return cls(time.monotonic() + seconds, seconds)

    def left(self) -> float:
        """Return the seconds left (negative once passed)."""
        return self.at - time.monotonic()

    def passed(self) -> bool:
        """Return whether the deadline has passed."""
        return time.monotonic() >= self.at

    def within(self, seconds: float) -> Deadline:
        """Return a wait of `seconds` from now that ends by this deadline all the same."""
        return Deadline(min(time.monotonic() + seconds, self.at), seconds)

    def sooner(self, seconds: float) -> Deadline:
        """Return this deadline moved `seconds` earlier."""
        return Deadline(self.at - seconds, self.seconds - seconds)

    def later(self, seconds: float) -> Deadline:
        """Return this deadline moved `seconds` later."""
        return self.sooner(-seconds)


class StopSignalError(Exception):
    """SIGTERM or SIGINT arrived while the bootstrap waited; the signal's name is the text."""


class Watch:
    """What a watched call is doing: the phase's name, when it must end, and what to say if not.

    The call updates it as it goes (`enter`); the main thread, waiting, reads it every slice.
    """

    def __init__(self, what: str, deadline: Deadline, expired: Callable[[], BaseException]) -> None:
        self.what, self.deadline, self.expired = what, deadline, expired
        self.end = deadline  # the whole watched call's: no phase may outlast it

    def enter(self, what: str, deadline: Deadline, expired: Callable[[], BaseException]) -> None:
        """Start a phase: `what` it is, its `deadline`, `expired()` the error after it."""
        self.what, self.deadline, self.expired = what, deadline, expired


def watched(call: Callable[[Watch], T], watch: Watch) -> T:
    """Return ``call(watch)``, run in a daemon thread, or raise ``watch.expired()`` at its deadline.

    The call's own exception is re-raised here. The main thread waits in `SLICE_S` slices, so a
    signal handler (`interruptible`) runs promptly even while the call is blocked in C++. One
    thread serves a whole sequence of phases, each of which names itself with ``watch.enter``.
    """
    outcome: list[T] = []
    failure: list[BaseException] = []
    cancel = threading.Event()

    def target() -> None:
        _current.cancel = cancel
        try:
            outcome.append(call(watch))
        except Cancelled:
            pass
        except BaseException as exc:  # every failure must reach the caller
            failure.append(exc)

    worker = threading.Thread(target=target, name="distenv-bootstrap", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            remaining = watch.deadline.left()
            if remaining <= 0:
                raise watch.expired()
            worker.join(min(remaining, SLICE_S))
    except BaseException:
        cancel.set()
        worker.join(STOP_S)
        if worker.is_alive():
            _leave_behind(worker)
        raise
    if failure:
        raise failure[0]
    return outcome[0]


def bounded(call: Callable[[], T], deadline: Deadline, expired: Callable[[], BaseException]) -> T:
    """Return ``call()``, run in a daemon thread, or raise ``expired()`` at `deadline`."""
    return watched(lambda _: call(), Watch("", deadline, expired))


@contextmanager
def interruptible(
    what: str | Watch, source: str, on_interrupt: Callable[[str], None] | None = None
) -> Iterator[None]:
    """Turn SIGTERM and SIGINT into a prompt `RendezvousError` while `what` runs (main thread).

    `what` names the phase, or is the `Watch` of a watched call that names its current one.
    `on_interrupt` gets the signal's name first (to tell the other ranks, say), and must be quick.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise StopSignalError(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    except (StopSignalError, KeyboardInterrupt) as exc:
        name = str(exc) or "SIGINT"
        if on_interrupt is not None:
            on_interrupt(name)
        raise RendezvousError(
            source,
            f"interrupted by {name} during {what.what if isinstance(what, Watch) else what}",
            hint="the job was stopped: by its launcher after another rank failed (distenv run, "
            "torchrun and srun --kill-on-bad-exit stop the others; the first failure is in the "
            "log), or by a time limit, scancel or Ctrl-C; nothing to fix here unless that was "
            "not intended",
        ) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
