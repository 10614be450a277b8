"""A rank's own log folder under any launcher: its output, its failure record, its crash's stack.

With ``DISTENV_LOG_DIR=DIR`` (or ``init_dist(log_dir=DIR)``), each rank keeps, from `init_dist`
on, under its global rank N (detection's `RankInfo.rank`, known before the rendezvous)::

    DIR/rank-N.log     its stdout and stderr, as they came, still shown where they went before
    DIR/rank-N.report  at its end: a failure's record (`distenv.postmortem.failure.Report`, one JSON line),
                       empty when it ended with status 0; absent while it runs or after SIGKILL
    DIR/rank-N.fault   the Python stack of every thread at a fatal signal (`faulthandler`), and
                       the stack dumps of the hang autopsy

``distenv why DIR`` (`distenv.cli.why`) makes the first-failure card from them.

The output is kept at the file-descriptor level: descriptors 1 and 2 become the write ends of
pipes that one daemon thread of the rank reads and copies to the original descriptors and to the
log (no extra process; C++ and child processes' output included). What Python itself writes
(``print``, ``sys.stderr``, tracebacks) does not wait for that thread: ``sys.stdout`` and
``sys.stderr`` are replaced by streams that write to the console and to the log at once
(`_Both`), so nothing Python wrote and flushed is missing from the log when the rank is killed
a moment later (SIGKILL, a fatal signal). Only native code's writes to descriptors 1 and 2 still
in the pipe at such a death can be missing from the log (never from the console). The log is
bounded: past `HEAD` + twice `TAIL` bytes it is rewritten (written aside, then renamed over it, so
that a crash leaves one whole file) to its first `HEAD` and last `TAIL` bytes, with a line saying
how much was skipped.

The record is written by an `atexit` handler, from what Python is ending the process with
(`distenv.exits.ExitStatus`): an uncaught exception (whatever ``sys.excepthook`` printed it), a
distenv refusal, ``sys.exit(N)``. The handler is registered after the process group's teardown,
so it runs before it: a teardown that must end the rank at once still finds the record written.
At its end the descriptors are put back and the thread drains the pipes.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import faulthandler
import io
import os
import re
import selectors
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distenv.errors import ConfigurationError, shown
from distenv.exits import ExitStatus
from distenv.postmortem.failure import Report, classify
from distenv.settings import LOG_DIR_VAR

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__all__ = [
    "HEAD",
    "TAIL",
    "BoundedLog",
    "RankLog",
    "current",
    "folder",
    "identity",
    "paths",
    "read_identity",
    "start",
    "write_record",
]

#: The first bytes of a rank's output its log always keeps.
HEAD = 1 << 20
#: The last bytes of a rank's output its log always keeps (between `TAIL` and twice `TAIL`).
TAIL = 1 << 20
#: How long the end of the rank waits for its output to reach the log.
DRAIN_S = 1.0
_IDENTITY = re.compile(
    rb"distenv: rank \d{1,9}, local rank (-1|\d{1,9}), pid (\d{1,9}), host (\S{1,253}), "
    rb"started (\d{1,12}\.\d{1,9})\n"
)
#: The one log of this process (init_dist may be called again).
_started: list[RankLog] = []


def identity(rank: int, local_rank: int | None, started: float, pid: int | None = None) -> str:
    """Return the fault file's first line: who the rank is (`read_identity` reads it back)."""
    local = -1 if local_rank is None else local_rank
    pid = os.getpid() if pid is None else pid
    host = socket.gethostname()
    return (
        f"distenv: rank {rank}, local rank {local}, pid {pid}, host {host}, started {started!r}\n\n"
    )


def write_record(path: Path, report: Report | None) -> None:
    """Write a rank's record (empty: it ended with status 0), aside and renamed: whole or none."""
    aside = path.with_name(path.name + ".new")
    with contextlib.suppress(OSError):
        aside.write_bytes(b"" if report is None else report.line())
        os.replace(aside, path)


def read_identity(text: bytes) -> tuple[int, int, str, float] | None:
    """Return (local rank, pid, host, started) from a fault file's first line, None if absent."""
    found = _IDENTITY.match(text)
    if found is None:
        return None
    host = found[3].decode("utf-8", "replace")[:253]
    return int(found[1]), int(found[2]), host, float(found[4])


def paths(directory: Path, rank: int) -> tuple[Path, Path, Path]:
    """Return rank `rank`'s log, report and fault file in `directory`."""
    return tuple(directory / f"rank-{rank}.{kind}" for kind in ("log", "report", "fault"))  # type: ignore[return-value]


def folder(
    argument: str | os.PathLike[str] | None,
    setting: str | None,
    *,
    launcher: str = "init",
    option: str = "log_dir=",
) -> Path | None:
    """Return the log folder, created: `argument` (``log_dir=``), else ``$DISTENV_LOG_DIR``.

    Args:
        argument: The folder an argument names (`option`), if given.
        setting: ``$DISTENV_LOG_DIR``, if set.
        launcher: Who refuses a bad folder (``init``, ``run``).
        option: How the argument is spelled in the refusal (``log_dir=``, ``--log-dir ``).

    Raises:
        ConfigurationError: If the folder cannot be created or written, naming it and why.
    """
    value = os.fspath(argument) if argument is not None else setting
    if value is None:
        return None
    name = option if argument is not None else f"${LOG_DIR_VAR} is "
    if not value.strip():
        raise ConfigurationError(
            launcher,
            f"{name}{shown(value)} is empty, expected a folder",
            hint=f"pass a folder every node can write (e.g. {LOG_DIR_VAR}=$HOME/logs/$SLURM_JOB_ID)",
            variable=None if argument is not None else LOG_DIR_VAR,
            value=value,
        )
    path = Path(value).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as exc:
        raise ConfigurationError(
            launcher,
            f"{name}{shown(value)}: cannot create or write it ({exc.strerror or exc})",
            hint="pass a folder this user can write on every node (a shared file system)",
            variable=None if argument is not None else LOG_DIR_VAR,
            value=value,
        ) from None
    return path


class BoundedLog:
    """A rank's log file: appended to, and cut to its first `HEAD` and last `TAIL` bytes past a size.

    Also ``distenv run --log-dir``'s, whose supervisor writes each rank's lines to one.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.size = 0
        self.fd: int | None = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644
        )
        self._lock = threading.Lock()  # the rank's Python writes, and the thread's copies

    def write(self, data: bytes) -> None:
        """Append `data` (dropped once closed, or when the disk is full: never the rank's end)."""
        with self._lock, contextlib.suppress(OSError):
            if self.fd is None:
                return
            os.write(self.fd, data)
            self.size += len(data)
            if self.size > HEAD + 2 * TAIL:
                self._cut()

    def _cut(self) -> None:
        assert self.fd is not None
        with self.path.open("rb") as file:
            head = file.read(HEAD)
            file.seek(self.size - TAIL)
            tail = file.read(TAIL)
        start = tail.find(b"\n") + 1  # the kept part begins with a whole line
        tail = tail[start:] if 0 < start < len(tail) else tail
        skipped = self.size - len(head) - len(tail)
        note = f"\n[distenv: {skipped} bytes of this rank's output skipped here]\n".encode()
        aside = self.path.with_name(self.path.name + ".new")
        aside.write_bytes(head + note + tail)
        os.replace(aside, self.path)
        os.close(self.fd)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self.size = len(head) + len(note) + len(tail)

    def close(self) -> None:
        """Close the file; later writes are dropped."""
        with self._lock, contextlib.suppress(OSError, TypeError):
            fd, self.fd = self.fd, None
            os.close(fd)  # type: ignore[arg-type]


class _Both(io.RawIOBase):
    """What ``sys.stdout`` (or ``sys.stderr``) writes to while the log is kept: the console and
    the log, at once, so that nothing Python wrote is missing from the log at a crash.

    Args:
        fd: The descriptor it stands for (1 or 2: now the pipe; `fileno` says it, so that a child
            process given ``sys.stdout`` writes into the pipe, copied by the thread).
        console: Where that descriptor went before (a duplicate of it).
        sink: The log.
    """

    def __init__(self, fd: int, console: int, sink: BoundedLog) -> None:
        super().__init__()
        self._fd, self._console, self._sink = fd, console, sink

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._console)

    def write(self, data: ReadableBuffer) -> int:
        chunk = bytes(data)
        _tee(chunk, self._console, self._sink)
        return len(chunk)


def _tee(data: bytes, console: int, sink: BoundedLog) -> None:
    """Write `data` to the log, then all of it to the console's descriptor."""
    sink.write(data)
    view = memoryview(data)
    with contextlib.suppress(OSError):  # the console went away: the log goes on
        while view:
            view = view[os.write(console, view) :]


class RankLog:
    """One rank's log folder, kept from `start` to the process's end (module docstring).

    Args:
        directory: The log folder (created).
        rank: The rank's global rank.
        local_rank: Its index on its node, if known.
    """

    def __init__(self, directory: Path, rank: int, local_rank: int | None = None) -> None:
        self.directory = directory
        self.rank = rank
        self.local_rank = local_rank
        self.started = time.time()
        self.log, self.report, self.fault = paths(directory, rank)
        self._saved: dict[int, int] = {}
        #: The fault file's descriptor once started (append-only): the hang autopsy dumps into it.
        self.fault_fd: int | None = None
        self._streams: dict[str, Any] = {}
        self._thread: threading.Thread | None = None
        self._sink: BoundedLog | None = None

    def start(self) -> None:
        """Tee descriptors 1 and 2 into the log, watch fatal signals, record the end at exit."""
        with contextlib.suppress(FileNotFoundError):
            self.report.unlink()  # a record of an earlier run of the job would be read as this one's
        fault = os.open(self.fault, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        # Who wrote what follows: a crash leaves no record, only faulthandler's text after this.
        os.write(fault, identity(self.rank, self.local_rank, self.started).encode())
        self.fault_fd = fault
        if not faulthandler.is_enabled():  # ``python -X faulthandler`` writes to stderr: logged
            faulthandler.enable(file=fault, all_threads=True)
        sink = self._sink = BoundedLog(self.log)
        reads = []
        for fd in (1, 2):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                (sys.stdout if fd == 1 else sys.stderr).flush()
            read, write = os.pipe2(os.O_CLOEXEC)
            self._saved[fd] = os.dup(fd)
            os.set_inheritable(self._saved[fd], False)
            os.dup2(write, fd)  # inheritable: child processes' output is the rank's
            os.close(write)
            reads.append((read, self._saved[fd]))
        self._thread = threading.Thread(
            target=_copy, args=(reads, sink), name="distenv-log", daemon=True
        )
        self._thread.start()
        self._replace_streams(sink)
        atexit.register(self.end)

    def _replace_streams(self, sink: BoundedLog) -> None:
        """Point ``sys.stdout`` and ``sys.stderr`` at `_Both`, each as it was buffered before.

        Code that kept the old objects (a logging handler made earlier) still writes to
        descriptor 1 or 2: the pipe. A stream the script already replaced is left alone.
        """
        for name, fd in (("stdout", 1), ("stderr", 2)):
            old = getattr(sys, name)
            try:
                if old.fileno() != fd:
                    continue
                raw = _Both(fd, self._saved[fd], sink)
                buffer: Any = raw if old.write_through else io.BufferedWriter(raw)
                new = io.TextIOWrapper(
                    buffer,
                    encoding=old.encoding,
                    errors=old.errors,
                    line_buffering=old.line_buffering,
                    write_through=old.write_through,
                )
            except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
                continue
            self._streams[name] = old
            setattr(sys, name, new)

    def write_stderr(self, data: bytes) -> None:
        """Write `data` to the console's stderr and to the log at once, as ``sys.stderr`` does,
        without its lock (a stuck main thread may hold it) and without the pipe's copying thread
        (`mute_console` may follow at once)."""
        if self._sink is None or 2 not in self._saved:
            with contextlib.suppress(OSError):
                os.write(2, data)
            return
        _tee(data, self._saved[2], self._sink)

    def mute_console(self) -> None:
        """Send nothing more to the console; the log goes on keeping what is written.

        For a rank that is about to end itself (a hung job's end): once one rank ends, its peers'
        collectives break and their tracebacks would bury what was printed last, and descriptors
        1 and 2 alone do not hold them back, since `sys.stdout`, `sys.stderr` and the copying
        thread write to the console's own duplicates.
        """
        with contextlib.suppress(OSError):
            null = os.open(os.devnull, os.O_WRONLY)
            for saved in self._saved.values():
                os.dup2(null, saved, inheritable=False)
            os.close(null)

    def end(self) -> None:
        """Write the failure record, put descriptors 1 and 2 back and let the log catch up."""
        error = ExitStatus.error()
        status = ExitStatus.status()
        record = classify(error) if error is not None else None
        if record is None and status != 0:
            what = f"SystemExit: {status}" if status > 0 else "KeyboardInterrupt"
            record = Report("exception" if status > 0 else "stopped", what, time.time(), (), False)
        if record is not None:
            record = dataclasses.replace(
                record,
                status=status if status > 0 else record.status,
                host=socket.gethostname(),
                pid=os.getpid(),
                local_rank=-1 if self.local_rank is None else self.local_rank,
                started=self.started,
            )
        write_record(self.report, record)
        for name, old in self._streams.items():
            with contextlib.suppress(OSError, ValueError, AttributeError):
                getattr(sys, name).flush()
            setattr(sys, name, old)
        for fd, saved in self._saved.items():
            with contextlib.suppress(OSError, ValueError, AttributeError):
                (sys.stdout if fd == 1 else sys.stderr).flush()
            with contextlib.suppress(OSError):
                os.dup2(saved, fd)  # closes the pipe's write end: the thread reads its end
        if self._thread is not None:
            self._thread.join(DRAIN_S)


def _copy(reads: list[tuple[int, int]], sink: BoundedLog) -> None:
    """Copy what arrives on each pipe to its original descriptor and to the log, until EOF."""
    selector = selectors.DefaultSelector()
    for read, original in reads:
        selector.register(read, selectors.EVENT_READ, original)
    while selector.get_map():
        for key, _ in selector.select():
            read = int(key.fd)
            try:
                data = os.read(read, 1 << 16)
            except OSError:
                data = b""
            if not data:  # every write end closed (the rank's and its children's)
                selector.unregister(read)
                os.close(read)
                continue
            sink.write(data)
            with contextlib.suppress(OSError):  # the console went away: the log goes on
                os.write(key.data, data)
    sink.close()


def current() -> RankLog | None:
    """Return this process's log, if `start` began one (the hang autopsy dumps into its fault file)."""
    return _started[0] if _started else None


def start(directory: Path, rank: int, local_rank: int | None = None) -> RankLog:
    """Start rank `rank`'s log in `directory`, once per process; return it."""
    if not _started:
        log = RankLog(directory, rank, local_rank)
        log.start()
        _started.append(log)
    return _started[0]
