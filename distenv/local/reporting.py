"""How a rank tells its node agent why it failed, so that a restart never rests on exit codes.

Under ``distenv run --max-restarts`` each rank runs as ``python -m distenv.local.reporting SCRIPT
ARGS``: this module runs the script as ``__main__`` (the same ``sys.argv``, ``sys.path[0]`` and
traceback as ``python SCRIPT``), and if an exception ends it, writes one `Report` line to the pipe
named by ``DISTENV_REPORT_FD`` before the exception goes on to print and set the exit status. The
agent (`distenv.local.restarts`) reads it once the rank has exited (`read_report`).

What is not worth retrying is decided from what the rank raised (`distenv.postmortem.failure.classify`, the
one record format of every failure); a rank killed by a signal other than a stopping one is
retried.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import runpy
import sys
import time
from types import TracebackType

from distenv.local.watchdog import HANG_VAR, arm
from distenv.postmortem.failure import (
    MAX_FRAMES,
    MAX_REPORT_BYTES,
    MAX_WHAT_CHARS,
    PEER_WORDS,
    RETRIED,
    Report,
    classify,
    user_frames,
    users_file,
)
from distenv.variables import decimal

__all__ = [
    "FAULT_FD_VAR",
    "MAX_FRAMES",
    "PEER_WORDS",
    "REPORT_FD_VAR",
    "RETRIED",
    "Report",
    "classify",
    "main",
    "read_pipe",
    "read_report",
    "user_frames",
    "users_file",
]

#: The variable that names the pipe's write end in a rank (inherited through exec).
REPORT_FD_VAR = "DISTENV_REPORT_FD"
#: The variable that names the file a fatal signal's Python stack is written to.
FAULT_FD_VAR = "DISTENV_FAULT_FD"


def read_pipe(fd: int) -> bytes:
    """Return what waits in the pipe `fd` (non-blocking, at most 16 KiB)."""
    data = b""
    with contextlib.suppress(BlockingIOError, OSError):
        while len(data) < MAX_REPORT_BYTES * 4:
            chunk = os.read(fd, MAX_REPORT_BYTES)
            if not chunk:
                break
            data += chunk
    return data


def read_report(fd: int) -> Report | None:
    """Return the report waiting in the pipe `fd` (non-blocking, bounded), None if none."""
    return Report.parse(read_pipe(fd))


def _fd(name: str) -> int | None:
    """Return the descriptor the variable `name` holds (the agent's pipe or file), None if unset."""
    return decimal(os.environ.get(name, ""))


#: The rank's own pid: a process it forked (``os.fork``) that unwinds through `main` holds the
#: same descriptor, but its exception is not the rank's.
_RANK_PID = os.getpid()


def _send(report: Report | None) -> None:
    fd = _fd(REPORT_FD_VAR)
    if report is not None and fd is not None and os.getpid() == _RANK_PID:
        with contextlib.suppress(OSError):
            os.write(fd, report.line())


def _report(exc: BaseException) -> None:
    _send(classify(exc))


def _user_frames(tb: TracebackType | None) -> TracebackType | None:
    """Return `tb` from the script's first frame on: runpy's and this module's are not the user's."""
    ours = {__file__, runpy.__file__, "<frozen runpy>"}
    start = tb
    while start is not None and start.tb_frame.f_code.co_filename in ours:
        start = start.tb_next
    return start or tb


def _check_openable(script: str) -> None:
    """End as ``python SCRIPT`` does when it cannot open `script` (status 2), reported as not
    worth retrying: every attempt would fail the same way before running anything."""
    try:
        os.stat(script)
    except OSError as exc:
        what = f"can't open file {os.path.abspath(script)!r}: [Errno {exc.errno}] {exc.strerror}"
        print(f"{sys.executable}: {what}", file=sys.stderr)
        _send(Report("import", what[:MAX_WHAT_CHARS], time.time()))
        sys.exit(2)


def _watch_faults() -> None:
    """Write the Python stacks of a fatal signal to the agent's fault file, if it gave one.

    A script that enables `faulthandler` itself (``python -X faulthandler``) keeps its own.
    """
    fd = _fd(FAULT_FD_VAR)
    if fd is not None and not faulthandler.is_enabled():
        with contextlib.suppress(OSError, ValueError):
            faulthandler.enable(file=fd, all_threads=True)


def main(argv: list[str]) -> None:
    """Run ``[-m] SCRIPT ARGS`` as ``python`` would, reporting the exception that ends it."""
    module = argv[:1] == ["-m"]
    target, args = (argv[1], argv[2:]) if module else (argv[0], argv[1:])
    for name in (REPORT_FD_VAR, FAULT_FD_VAR):
        fd = _fd(name)
        if fd is not None:  # a program the rank starts must not hold the agent's pipe open
            with contextlib.suppress(OSError):
                os.set_inheritable(fd, False)
    _watch_faults()
    arm(_fd(FAULT_FD_VAR), _fd(REPORT_FD_VAR), os.environ.get(HANG_VAR))
    sys.argv = [target, *args]
    if not module:
        _check_openable(target)
    try:
        if module:
            sys.path[0] = os.getcwd()
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(target))
            runpy.run_path(target, run_name="__main__")
    except (SystemExit, KeyboardInterrupt) as exc:
        _report(exc)
        raise
    except BaseException as exc:
        _report(exc)
        # What python itself does with an uncaught exception, without this module's frames.
        trimmed = _user_frames(exc.__traceback__)
        sys.excepthook(type(exc), exc.with_traceback(trimmed), trimmed)
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
