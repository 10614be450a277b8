"""One rank's failure record: why it failed, as the rank itself knew it, in one JSON line.

Every writer of a failure record uses this one format: the rank wrapper of ``distenv run``
(`distenv.local.reporting`, over a pipe to its node agent) and a rank under any launcher that
keeps a log folder (`distenv.postmortem.ranklog`, into ``DIR/rank-N.report``). Every reader too: ``distenv
run``'s supervisor and restarts, and ``distenv why`` (`distenv.cli.why`).

`classify` makes the record from the exception that ends a rank; what is not worth retrying is
decided there: a distenv refusal of the environment or the configuration (detection,
configuration, master resolution, requeue errors; not a rendezvous, process-group or worker
failure, which a peer's crash causes), an import or syntax error, a script that cannot be
opened, a usage error (argparse's ``error``, recognised by its frame), an interruption.
Everything else is retried. Nothing read back is trusted: `Report.parse` checks each field.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass
from types import TracebackType

from distenv.postmortem.stacks import users_file

__all__ = [
    "MAX_FRAMES",
    "MAX_REPORT_BYTES",
    "PEER_WORDS",
    "RETRIED",
    "Report",
    "classify",
    "user_frames",
    "users_file",
]

#: A report's most bytes: one atomic pipe write (PIPE_BUF on Linux is 4096).
MAX_REPORT_BYTES = 4096
#: The longest exception text a report carries.
MAX_WHAT_CHARS = 300
#: The longest host name a record carries (a DNS name's limit).
MAX_HOST_CHARS = 253
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
        host: The rank's host name, where no agent knows it (a log folder's record), else "".
        pid: The rank's process id, likewise (0: not given).
        local_rank: Its index on its node, likewise (-1: not given).
        started: When it started its log (``time.time()``), likewise (0.0: not given).
    """

    kind: str
    what: str
    at: float = 0.0
    frames: tuple[str, ...] = ()
    peer: bool = False
    status: int = 1
    host: str = ""
    pid: int = 0
    local_rank: int = -1
    started: float = 0.0

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
                    _text(fields.get("host"), MAX_HOST_CHARS),
                    _number(fields.get("pid"), 0, 1 << 31, 0),
                    _number(fields.get("local_rank"), 0, 1 << 20, -1),
                    fields["started"] if type(fields.get("started")) is float else 0.0,
                )
        return None


def _text(value: object, width: int) -> str:
    """Return a record's text field, cut at `width` ("" if it is none)."""
    return value[:width] if isinstance(value, str) else ""


def _number(value: object, low: int, high: int, default: int) -> int:
    """Return a record's integer field if it lies in [`low`, `high`), else `default`."""
    return value if type(value) is int and low <= value < high else default


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
    from distenv.errors import DistEnvError
    from distenv.exits import code_of

    at = time.time()
    frames = user_frames(exc.__traceback__)
    # Before SystemExit: an error that leaves a public call is one too (`distenv.exits`).
    if isinstance(exc, DistEnvError):
        peer = exc.consequence
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
