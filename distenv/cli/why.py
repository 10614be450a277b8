"""``distenv why DIR``: the first-failure card of a job, from the records its ranks left in DIR.

DIR is a rank log folder (`distenv.postmortem.ranklog`: ``DISTENV_LOG_DIR`` or ``init_dist(log_dir=)``
under any launcher). Each rank N that reached `init_dist` has ``rank-N.log``; at its end it
wrote ``rank-N.report`` (its failure's record, empty for status 0) unless it was killed; a fatal
signal's stack, and the hang autopsy's dumps, are in ``rank-N.fault``. From them the card of
``distenv run`` (`distenv.local.card`) is made, with the same rule for "first": by when a rank
failed, a collective that a peer broke being a consequence. A rank with a log and no record
was stopped by its launcher or killed (SIGKILL leaves no word). If the fault files hold stack
dumps, the last one of each rank is grouped as the hang autopsy groups them.

Every file is read bounded; nothing read is trusted (records are parsed, text is escaped).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import re
import signal
from pathlib import Path

from distenv.errors import ConfigurationError, shown
from distenv.local.autopsy import summary, suspects
from distenv.local.card import card, rank_ranges
from distenv.local.dumps import crash_frames, main_stack
from distenv.local.ends import End
from distenv.local.witness import LAST_LINES
from distenv.postmortem.failure import Report
from distenv.postmortem.ranklog import read_identity

__all__ = ["Records", "add_why_parser", "why"]

#: The most ranks a folder is read for.
MAX_RANKS = 1 << 16
#: The most bytes read of the end of a log, or of a fault file's dumps.
TAIL_BYTES = 64 << 10
#: What faulthandler writes first at a fatal signal, and the signal each name stands for.
_FATAL = re.compile(
    rb"Fatal Python error: (Segmentation fault|Bus error|Aborted|Floating "
    rb"point exception|Illegal instruction)"
)
_SIGNALS = {
    b"Segmentation fault": signal.SIGSEGV,
    b"Bus error": signal.SIGBUS,
    b"Aborted": signal.SIGABRT,
    b"Floating point exception": signal.SIGFPE,
    b"Illegal instruction": signal.SIGILL,
}
_TRACEBACK = re.compile(rb"^.{0,16}Traceback \(most recent call last\):", re.MULTILINE)
_RANK_FILE = re.compile(r"rank-(\d{1,9})\.log")


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' * (len(ranks) > 1)} {rank_ranges(ranks)}"


def _tail(path: Path, limit: int = TAIL_BYTES) -> bytes:
    """Return the last `limit` bytes of `path` (b"" if it cannot be read)."""
    with contextlib.suppress(OSError), path.open("rb") as file:
        file.seek(0, 2)
        file.seek(max(0, file.tell() - limit))
        return file.read(limit)
    return b""


def _last_lines(log: Path) -> tuple[bytes, ...]:
    """Return a rank's last lines of output before its traceback, if it printed one."""
    text = _tail(log)
    found = list(_TRACEBACK.finditer(text))
    if found:
        text = text[: found[-1].start()]
    lines = [line for line in text.splitlines() if line.strip()]
    return tuple(lines[-LAST_LINES:])


class Records:
    """A log folder's records, seen as the card sees a node's witness (`distenv.local.card.Seen`).

    Args:
        directory: The log folder.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.stop_at: float | None = None
        self.held: collections.Counter[str] = collections.Counter()
        self.held_ranks: set[int] = set()
        self.ranks = sorted(
            int(m[1])
            for m in (_RANK_FILE.fullmatch(p.name) for p in directory.iterdir())
            if m is not None
        )[:MAX_RANKS]
        #: The last stack dump of each rank whose fault file holds dumps (main thread's frames).
        self.stacks = {}
        self._ends: list[End] = []
        self._hosts: dict[int, str] = {}
        self._started: dict[int, float] = {}
        for rank in self.ranks:
            end, stack = self._read(rank)
            self._ends.append(end)
            if stack:
                self.stacks[rank] = stack
        starts = [e.report.started for e in self._ends if e.report and e.report.started]
        starts += self._started.values()
        self.started_at = min(starts) if starts else 0.0

    def _read(self, rank: int) -> tuple[End, tuple[tuple[str, int, str], ...]]:
        log = self.directory / f"rank-{rank}.log"
        report_path = self.directory / f"rank-{rank}.report"
        fault = self.directory / f"rank-{rank}.fault"
        try:
            at = log.stat().st_mtime
        except OSError:
            at = 0.0
        data = _tail(report_path, 16 << 10)
        ended = report_path.exists()
        report = Report.parse(data) if data else None
        end = End(rank, -1, 0, 0 if ended else -signal.SIGTERM, at, report)
        end.stopped = not ended  # no record: stopped by the launcher, or killed
        end.last = _last_lines(log)
        if report is not None:
            end.returncode = report.status
            end.at, end.pid, end.local_rank = report.at, report.pid, report.local_rank
        with contextlib.suppress(OSError), fault.open("rb") as file:
            who = read_identity(file.read(512))
            if who is not None and report is None:
                end.local_rank, end.pid, self._hosts[rank], self._started[rank] = who
        crash = _tail(fault, 1 << 20)
        fatal = _FATAL.search(crash)
        stack: tuple[tuple[str, int, str], ...] = ()
        if fatal is not None:
            start = max(0, fault.stat().st_size - len(crash)) + fatal.start()
            end.returncode = -_SIGNALS[fatal[1]]
            end.stopped = False
            end.at = fault.stat().st_mtime  # written at the crash
            end.fault = crash_frames(fault, start)
        elif crash:
            stack = main_stack(crash)
        return end, stack

    def ends(self, *, everyone: bool = False) -> list[End]:
        """Return how each rank that failed (or, `everyone`, ended) ended, the cause first."""
        return sorted((e for e in self._ends if everyone or e.failed), key=End.order)

    def host(self, rank: int) -> str:
        """Return the host of `rank` from its record, "?" if it names none."""
        found = [e.report.host for e in self._ends if e.rank == rank and e.report]
        return found[0] if found and found[0] else self._hosts.get(rank, "?")


def why(directory: Path) -> list[str]:
    """Return the card of the job whose ranks kept their records in `directory`.

    Raises:
        ConfigurationError: If `directory` holds no rank's log.
    """
    try:
        records = Records(directory)
    except OSError as exc:
        raise ConfigurationError(
            "distenv why",
            f"cannot read {shown(str(directory))} ({exc.strerror or exc})",
            hint="pass the folder that DISTENV_LOG_DIR or init_dist(log_dir=) named",
        ) from None
    if not records.ranks:
        raise ConfigurationError(
            "distenv why",
            f"{shown(str(directory))} holds no rank-N.log",
            hint="pass the folder that DISTENV_LOG_DIR or init_dist(log_dir=) named; ranks "
            "write there from init_dist on",
        )
    logs = f"  logs:    {directory}/rank-N.log hold each rank's output and whole traceback"
    world = len(records.ranks)
    own = [e for e in records.ends() if e.own]
    stacks = records.stacks
    dumps = []
    if stacks:
        missing = [r for r in records.ranks if r not in stacks]
        dumps = [f"  stacks:  the last dump: {suspects(stacks)}", *summary(stacks, missing)]
    if own:
        cause = own[0]
        lines = card(
            records,
            cause,
            world,
            records.host(cause.rank),
            logs,
            title="distenv why",
            stopper="the launcher or killed (no record)",
        )
        return [*lines[:-1], *dumps, lines[-1]]
    ended = records.ends(everyone=True)
    silent = [e.rank for e in ended if e.stopped]
    failed = [e for e in ended if e.failed and not e.stopped]
    if failed:
        head = (
            f"distenv why: {_ranks([e.rank for e in failed])} failed, each because a peer broke "
            "its collective"
        )
    elif silent:
        head = "distenv why: no rank recorded a failure"
    else:
        head = f"distenv why: every rank ({world}) ended with status 0"
    lines = [head]
    if silent:
        lines.append(
            f"  silent:  {_ranks(silent)} left no record: killed (SIGKILL, the OOM "
            "killer), stopped by the launcher, or still running"
        )
    return [*lines, *dumps, logs]


def add_why_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``distenv why DIR``."""
    parser = commands.add_parser(
        "why",
        help="print the first-failure card of a job from its ranks' log folder",
        description="Print the first-failure card of a job from the records its ranks kept in "
        "DIR (DISTENV_LOG_DIR, or init_dist(log_dir=)): which rank failed first, how, where in "
        "your code, its last output, what the others did; and the last stack dumps, grouped.",
    )
    parser.add_argument("directory", metavar="DIR", type=Path, help="the job's log folder")
    parser.set_defaults(func=_cmd_why)


def _cmd_why(args: argparse.Namespace) -> int:
    lines = why(args.directory)
    print("\n".join(lines))
    return 0
