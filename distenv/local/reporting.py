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
import faulthandler
import json
import os
import runpy
import sys
import time
from dataclasses import asdict, dataclass
from types import TracebackType

from distenv.local.watchdog import HANG_VAR, arm
from distenv.stacks import users_file
from distenv.variables import decimal

__all__ = [
    "FAULT_FD_VAR",
    "REPORT_FD_VAR",
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
#: A report's most bytes: one atomic pipe write (PIPE_BUF on Linux is 4096).
MAX_REPORT_BYTES = 4096
#: The longest exception text a report carries.
MAX_WHAT_CHARS = 300
#: The most frames of the user's code a report carries, and the longest one.
MAX_FRAMES = 3
MAX_FRAME_CHARS = 240
#: torch's exceptions for a collective or a store whose peer went away (torch.distributed.DistError
#: and its subclasses), and the words gloo and the store use for it in a RuntimeError.
PEER_TYPES = frozenset({"DistError", "DistBackendError", "DistNetworkError", "DistStoreError"})
PEER_WORDS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
#: How the watchdog's lines on the same pipe begin (`distenv.local.watchdog.stuck_line`).
STUCK_PREFIX = b'{"stuck"'
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
        frames: The innermost frames of the user's code, ``file:line in function: source``.
        peer: Whether it is a collective or store that a peer's end broke (a consequence).
        status: The status Python ends the rank with: 1, or ``sys.exit``'s code (the job's, where
            the stop reaches the rank while it still unwinds).
    """

    kind: str
    what: str
    at: float = 0.0
    frames: tuple[str, ...] = ()
    peer: bool = False
    status: int = 1

    @property
    def retried(self) -> bool:
        """Return whether another attempt could end otherwise."""
        return RETRIED[self.kind]

    def line(self) -> bytes:
        """Return the report as one JSON line of at most `MAX_REPORT_BYTES`."""
        fields = {**asdict(self), "what": self.what[:MAX_WHAT_CHARS]}
        text = json.dumps(fields, ensure_ascii=True)
        if len(text) >= MAX_REPORT_BYTES:  # escaped text can grow six-fold: drop the frames
            text = json.dumps({**fields, "frames": []}, ensure_ascii=True)
        return (text[: MAX_REPORT_BYTES - 1] + "\n").encode()

    @classmethod
    def parse(cls, data: bytes) -> Report | None:
        """Return the report in `data` (its last complete line), None if there is none valid."""
        # The watchdog's lines (`distenv.local.watchdog`) share the pipe: they are not reports.
        lines = [
            line
            for line in data[-MAX_REPORT_BYTES * 4 :].splitlines()
            if not line.startswith(STUCK_PREFIX)
        ]
        with contextlib.suppress(ValueError, TypeError, RecursionError):
            fields = json.loads(lines[-1]) if lines else None
            if (
                isinstance(fields, dict)
                and fields.get("kind") in RETRIED
                and isinstance(fields.get("what"), str)
                and type(fields.get("at")) is float
            ):
                frames = fields.get("frames", [])
                if not isinstance(frames, list) or not all(isinstance(f, str) for f in frames):
                    frames = []
                return cls(
                    fields["kind"],
                    fields["what"][:MAX_WHAT_CHARS],
                    fields["at"],
                    tuple(f[:MAX_FRAME_CHARS] for f in frames[-MAX_FRAMES:]),
                    fields.get("peer") is True,
                    _status(fields.get("status")),
                )
        return None


def _status(value: object) -> int:
    """Return a report's status field if it is one (0-255), else 1: a failure's default."""
    return value if type(value) is int and 0 < value <= 0xFF else 1


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


def user_frames(tb: TracebackType | None) -> tuple[str, ...]:
    """Return the innermost `MAX_FRAMES` frames of `tb` in the user's code, innermost last.

    The user's code is what is not distenv's, the standard library's or an installed package's
    (torch's); a script inside a virtual environment's folder is still the user's if it is not
    under site-packages.
    """
    import linecache

    found: list[str] = []
    while tb is not None:
        code = tb.tb_frame.f_code
        name = code.co_filename
        if users_file(name):
            source = linecache.getline(name, tb.tb_lineno).strip()
            frame = f"{os.path.basename(name)}:{tb.tb_lineno} in {code.co_name}"
            found.append((f"{frame}: {source}" if source else frame)[:MAX_FRAME_CHARS])
        tb = tb.tb_next
    return tuple(found[-MAX_FRAMES:])


def _broken_by_peer(exc: BaseException) -> bool:
    """Return whether `exc` is a collective or store that a peer broke (torch's words for it)."""
    torch_types = {c.__name__ for c in type(exc).__mro__ if c.__module__.startswith("torch")}
    if torch_types & PEER_TYPES:
        return True
    return isinstance(exc, RuntimeError) and any(word in str(exc) for word in PEER_WORDS)


def classify(exc: BaseException) -> Report | None:
    """Return the report of an exception that ends a rank, None for a successful exit."""
    from distenv.errors import DistEnvError, InitError, RendezvousError, WorkerFailedError
    from distenv.exits import code_of

    at = time.time()
    frames = user_frames(exc.__traceback__)
    # Before SystemExit: an error that leaves a public call is one too (`distenv.exits`).
    if isinstance(exc, DistEnvError):
        peer = isinstance(exc, (RendezvousError, InitError, WorkerFailedError))
        return Report("exception" if peer else "refused", _first_line(exc), at, frames, peer)
    if isinstance(exc, SystemExit):
        if exc.code in (None, 0):
            return None
        kind = "usage" if _from_argparse(exc.__traceback__) else "exception"
        what = f"SystemExit: {exc.code}"[:MAX_WHAT_CHARS]
        return Report(kind, what, at, frames, status=code_of(exc.code))
    if isinstance(exc, (ImportError, SyntaxError)):
        kind = "import"
    elif isinstance(exc, KeyboardInterrupt):
        kind = "stopped"
    else:
        kind = "exception"
    return Report(kind, _first_line(exc), at, frames, _broken_by_peer(exc))


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
