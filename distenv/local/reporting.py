"""How a rank tells its node agent why it failed, so that a restart never rests on exit codes.

Under ``distenv run --max-restarts`` each rank runs as ``python -m distenv.local.reporting SCRIPT
ARGS``: this module runs the script as ``__main__`` (the same ``sys.argv``, ``sys.path[0]`` and
traceback as ``python SCRIPT``), and if an exception ends it, writes one `Report` line to the pipe
named by ``DISTENV_REPORT_FD`` before the exception goes on to print and set the exit status. The
agent (`distenv.local.restarts`) reads it once the rank has exited (`read_report`).

What is not worth retrying is decided here, from what the rank raised (`classify`): a distenv
refusal of the environment or the configuration (detection, configuration, master
resolution, requeue errors; not a rendezvous, process-group or worker failure, which a peer's
crash causes), an import or syntax error, a script that cannot be opened, a usage error
(argparse's ``error``, recognised by its frame), an interruption. Everything else, and a rank
killed by a signal other than a stopping one, is retried.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import sys
import time
from dataclasses import asdict, dataclass
from types import TracebackType

from distenv.variables import decimal

__all__ = ["REPORT_FD_VAR", "Report", "classify", "main", "read_report"]

#: The variable that names the pipe's write end in a rank (inherited through exec).
REPORT_FD_VAR = "DISTENV_REPORT_FD"
#: A report's most bytes: one atomic pipe write (PIPE_BUF), and one line of a job log.
MAX_REPORT_BYTES = 1024
#: The longest exception text a report carries.
MAX_WHAT_CHARS = 300
#: The kinds of failure, and whether another attempt could end otherwise.
RETRIED = {"exception": True, "refused": False, "import": False, "usage": False, "stopped": False}


@dataclass(frozen=True)
class Report:
    """Why one rank failed, as the rank itself knew it.

    Attributes:
        kind: One of `RETRIED`'s keys: ``exception`` (anything else, retried), ``refused`` (a
            distenv refusal), ``import`` (an import or syntax error, or a script that cannot be
            opened), ``usage`` (the script's
            argument parser refused its arguments), ``stopped`` (KeyboardInterrupt).
        what: The exception's first line, ``Type: message``.
        at: When it was raised (``time.time()``), so that the agents can tell a rank's own
            failure from the failures of the peers it broke, which follow it.
    """

    kind: str
    what: str
    at: float = 0.0

    @property
    def retried(self) -> bool:
        """Return whether another attempt could end otherwise."""
        return RETRIED[self.kind]

    def line(self) -> bytes:
        """Return the report as one JSON line of at most `MAX_REPORT_BYTES`."""
        return (json.dumps(asdict(self), ensure_ascii=True)[: MAX_REPORT_BYTES - 1] + "\n").encode()

    @classmethod
    def parse(cls, data: bytes) -> Report | None:
        """Return the report in `data` (its last complete line), None if there is none valid."""
        lines = data[-MAX_REPORT_BYTES * 4 :].splitlines()
        with contextlib.suppress(ValueError, TypeError, RecursionError):
            fields = json.loads(lines[-1]) if lines else None
            if (
                isinstance(fields, dict)
                and fields.get("kind") in RETRIED
                and isinstance(fields.get("what"), str)
                and type(fields.get("at")) is float
            ):
                return cls(fields["kind"], fields["what"][:MAX_WHAT_CHARS], fields["at"])
        return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    what = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return what[:MAX_WHAT_CHARS]


def _from_argparse(tb: TracebackType | None) -> bool:
    """Return whether a SystemExit was raised by ``argparse.ArgumentParser.error``."""
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "error" and os.path.basename(code.co_filename) == "argparse.py":
            return True
        tb = tb.tb_next
    return False


def classify(exc: BaseException) -> Report | None:
    """Return the report of an exception that ends a rank, None for a successful exit."""
    from distenv.errors import DistEnvError, InitError, RendezvousError, WorkerFailedError

    at = time.time()
    # Before SystemExit: an error that leaves a public call is one too (`distenv.exits`).
    if isinstance(exc, DistEnvError):
        peer = isinstance(exc, (RendezvousError, InitError, WorkerFailedError))
        return Report("exception" if peer else "refused", _first_line(exc), at)
    if isinstance(exc, SystemExit):
        if exc.code in (None, 0):
            return None
        kind = "usage" if _from_argparse(exc.__traceback__) else "exception"
        return Report(kind, f"SystemExit: {exc.code}"[:MAX_WHAT_CHARS], at)
    if isinstance(exc, (ImportError, SyntaxError)):
        kind = "import"
    elif isinstance(exc, KeyboardInterrupt):
        kind = "stopped"
    else:
        kind = "exception"
    return Report(kind, _first_line(exc), at)


def read_report(fd: int) -> Report | None:
    """Return the report waiting in the pipe `fd` (non-blocking, bounded), None if none."""
    data = b""
    with contextlib.suppress(BlockingIOError, OSError):
        while len(data) < MAX_REPORT_BYTES * 4:
            chunk = os.read(fd, MAX_REPORT_BYTES)
            if not chunk:
                break
            data += chunk
    return Report.parse(data)


def _report_fd() -> int | None:
    """Return the report pipe's descriptor (``DISTENV_REPORT_FD``), None if unset or not one."""
    return decimal(os.environ.get(REPORT_FD_VAR, ""))


def _send(report: Report | None) -> None:
    fd = _report_fd()
    if report is not None and fd is not None:
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


def main(argv: list[str]) -> None:
    """Run ``[-m] SCRIPT ARGS`` as ``python`` would, reporting the exception that ends it."""
    module = argv[:1] == ["-m"]
    target, args = (argv[1], argv[2:]) if module else (argv[0], argv[1:])
    fd = _report_fd()
    if fd is not None:  # a program the rank starts must not hold the agent's pipe open
        with contextlib.suppress(OSError):
            os.set_inheritable(fd, False)
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
