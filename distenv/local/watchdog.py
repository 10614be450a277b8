"""A rank's side of the hang autopsy: stack dumps on request, and a watchdog that says "stuck".

The rank wrapper (`distenv.local.reporting`) calls `arm` before it runs the script:

- `faulthandler` writes every thread's Python stack to the rank's fault file when the rank receives
  `DUMP_SIGNAL` (the agent's request once the job hangs) or SIGUSR1 (forwarded by ``distenv run``
  for a dump on demand; a script that installs its own SIGUSR1 handler replaces this one). The
  handler is C code: it dumps even while the main thread is blocked in C++ inside a collective.
- Only with a hang timeout: the watchdog thread of `distenv.postmortem.progress` samples the rank's
  progress, and when the rank made none for the timeout, writes one `stuck` line to the agent's
  report pipe (again only after the main thread moved on and got stuck anew). Since it runs,
  ``init_dist(hang_timeout=)`` starts no second watchdog in the rank (`distenv.postmortem.progress.watching`).
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal

from distenv.postmortem import progress
from distenv.settings import HANG_VAR

__all__ = ["DUMP_SIGNAL", "HANG_VAR", "arm", "parse_stuck", "stuck_line"]

#: The signal the agent sends for a dump: a real-time signal no library claims, so that a script's
#: own SIGUSR1 handler (a checkpoint on a scheduler's warning) is not run by a hang.
DUMP_SIGNAL: int = signal.SIGRTMIN + 3


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
) -> None:
    """Register the dump signals on `fault_fd`; with a timeout `hang` (seconds), start the watchdog.

    Args:
        fault_fd: The rank's fault file (None: no agent reads dumps, nothing is registered).
        report_fd: The agent's report pipe (None: no watchdog).
        hang: ``$DISTENV_HANG_TIMEOUT`` as the agent set it, or None. The stuck line names the
            innermost frame of the user's code (`distenv.postmortem.stacks.users_file`).
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

    def tell(where: str, since: float) -> None:
        with contextlib.suppress(OSError):
            os.write(report_fd, stuck_line(where, since))

    progress.start(timeout, tell)
