"""A rank's side of the hang autopsy: stack dumps on request, and a watchdog that says "stuck".

The rank wrapper (`distenv.local.reporting`) calls `arm` before it runs the script:

- `faulthandler` writes every thread's Python stack to the rank's fault file when the rank receives
  `DUMP_SIGNAL` (the agent's request once the job hangs) or SIGUSR1 (forwarded by ``distenv run``
  for a dump on demand; a script that installs its own SIGUSR1 handler replaces this one). The
  handler is C code: it dumps even while the main thread is blocked in C++ inside a collective.
- Only with a hang timeout: one daemon thread samples the main thread every quarter of the timeout
  (`sys._current_frames`, and the process's CPU clock). The rank progresses when the main
  thread's innermost frame or line changed since the last sample, or the process used CPU time
  (a loop whose every sample lands on the same ``all_reduce`` line still uses CPU between and in
  its calls; a long matmul uses it all along; a rank waiting in a collective or a sleep uses
  none). A rank that busy-waits (a CUDA synchronize that spins) counts as progressing: the
  job's hang is then found on the rank that waits. When it has not progressed for the timeout, the thread writes one `stuck`
  line to the agent's report pipe, and again only after the main thread moved on and got stuck
  anew. While training runs the cost is one sample per period: no tracing, no extra process.
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
from types import FrameType

from distenv.local.reporting import users_file
from distenv.settings import HANG_VAR

__all__ = ["DUMP_SIGNAL", "HANG_VAR", "arm", "parse_stuck", "stuck_line"]

#: The signal the agent sends for a dump: a real-time signal no library claims, so that a script's
#: own SIGUSR1 handler (a checkpoint on a scheduler's warning) is not run by a hang.
DUMP_SIGNAL: int = signal.SIGRTMIN + 3
#: CPU seconds of the process between two samples that count as progress (the watchdog's own
#: sample takes tens of microseconds).
CPU_PROGRESS = 0.002
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


def _where(frame: FrameType | None) -> str:
    """Return ``file:line in function`` of the innermost frame of the user's code from `frame` on."""
    inner = frame
    while frame is not None and not users_file(frame.f_code.co_filename):
        frame = frame.f_back
    frame = frame or inner
    if frame is None:
        return "?"
    code = frame.f_code
    return f"{os.path.basename(code.co_filename)}:{frame.f_lineno} in {code.co_name}"


def _watch(timeout: float, report_fd: int, main: int) -> None:
    """Sample the main thread forever; write a `stuck_line` when it made no progress for `timeout`."""
    period = min(MAX_PERIOD, max(MIN_PERIOD, timeout / 4))
    last: tuple[int, int] | None = None
    cpu = time.process_time()
    moved = time.time()
    told = False
    while True:
        time.sleep(period)
        frame = sys._current_frames().get(main)
        if frame is None:  # the main thread has ended: the interpreter is exiting
            return
        here = (id(frame.f_code), frame.f_lineno or 0)
        now_cpu = time.process_time()
        if here != last or now_cpu - cpu >= CPU_PROGRESS:
            last, moved, told = here, time.time(), False
        cpu = now_cpu
        if not told and time.time() - moved >= timeout:
            told = True
            with contextlib.suppress(OSError):
                os.write(report_fd, stuck_line(_where(frame), moved))
        del frame


def _forget_in_child() -> None:
    """A forked child (a data loader's worker) does not dump into its parent's fault file."""
    for signum in (DUMP_SIGNAL, signal.SIGUSR1):
        with contextlib.suppress(RuntimeError, ValueError):
            faulthandler.unregister(signum)


def arm(fault_fd: int | None, report_fd: int | None, hang: str | None) -> None:
    """Register the dump signals on `fault_fd`; with a timeout `hang` (seconds), start the watchdog.

    Args:
        fault_fd: The rank's fault file (None: no agent reads dumps, nothing is registered).
        report_fd: The agent's report pipe (None: no watchdog).
        hang: ``$DISTENV_HANG_TIMEOUT`` as the agent set it, or None.
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
        target=_watch, args=(timeout, report_fd, main), name="distenv-watchdog", daemon=True
    ).start()
