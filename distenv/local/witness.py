"""What ``distenv run`` sees of its ranks while they run: their output, their reports, their ends.

The `Witness` of a node keeps the facts the first-failure card (`distenv.local.card`) is made of:

- every line the ranks write, into the run's log file (`RunDir`, private to this user), and the
  last lines of each rank before it failed;
- each rank's `Report` (when, what, where it raised), read from a pipe only that rank holds, and
  the Python stack `faulthandler` wrote at a fatal signal, from a file only it holds open;
- when each rank ended, and how (``waitid(WNOWAIT)``: seen without reaping it, so that the
  supervisor's ``Popen`` keeps its status);
- the consequences: once a rank has failed, what the others write to stderr (their collective's
  traceback, torch's C++ stack dumps, ``terminate called``) is counted and kept in the log, not
  printed. A line that looks like a consequence while no failure is known yet waits up to
  `CAUSE_WAIT` for one: a rank writes its report before its traceback and its peers break only
  once it has closed its connections, so the cause is known before its consequences are printed.

Nothing read here is trusted: reports are parsed into checked fields, and lines are shown by the
card only with unprintable characters escaped.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from distenv.local.dumps import crash_frames
from distenv.local.ends import CONSEQUENCES, ONCE_PER_RANK, End
from distenv.local.reporting import (
    FAULT_FD_VAR,
    REPORT_FD_VAR,
    Report,
    read_pipe,
)
from distenv.local.watchdog import HANG_VAR, parse_stuck
from distenv.postmortem.ranklog import BoundedLog, identity, paths, write_record
from distenv.system.processes import oom_killed_by_kernel_log, oom_kills

__all__ = ["RunDir", "Witness"]

#: How long a line that looks like a consequence waits for the failure it is a consequence of.
CAUSE_WAIT = 0.5
#: The most bytes of all ranks' output kept in the run's log file.
LOG_LIMIT = 64 << 20
#: The last lines of each rank kept for the card.
LAST_LINES = 3
#: Seconds between looks for a failure while a consequence-like line waits.
_WAIT_STEP = 0.01
#: How long to wait for the status of a rank the supervisor is reaping.
_REAP_WAIT = 0.5
#: The most bytes of one rank's dump read (a thousand threads' stacks are about 1 MiB).
_DUMP_LIMIT = 1 << 20


class RunDir:
    """The folder of one ``distenv run``: the output log and the fault files.

    By default a private one (mode 0700), kept when the job failed (the card names it), removed
    when it succeeded. With ``--log-dir DIR``, DIR (created), always kept, where each rank also
    keeps the log folder of `distenv.postmortem.ranklog`: ``rank-N.log``, ``rank-N.report`` and
    ``rank-N.fault``, which ``distenv why DIR`` reads.

    Args:
        path: The folder ``--log-dir`` names, if given.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.kept = path is not None
        if path is None:
            self.path = Path(tempfile.mkdtemp(prefix="distenv-run-"))
        else:
            path.mkdir(parents=True, exist_ok=True)
            self.path = path
        self.log = self.path / "output.log"

    def remove(self) -> None:
        """Remove the folder and what it holds (never a folder ``--log-dir`` named)."""
        if not self.kept:
            shutil.rmtree(self.path, ignore_errors=True)


@dataclass
class _Rank:
    rank: int
    local_rank: int
    shown: bool
    prefix: bytes
    report_fds: tuple[int, int]
    fault_fd: int
    hidden: frozenset[int] = frozenset()
    log: BoundedLog | None = None
    process: subprocess.Popen[bytes] | None = None
    report: Report | None = None
    end: End | None = None
    stuck: tuple[str, float] | None = None
    dumped: int = 0
    last: collections.deque[bytes] = field(
        default_factory=lambda: collections.deque(maxlen=LAST_LINES)
    )


class Witness:
    """One node's view of its ranks for the card (see the module docstring).

    Args:
        run_dir: The run's private folder.
        ranks: ``(rank, local_rank, shown)`` of each local rank.
        hidden: The descriptors of each rank kept off the console (``--redirects``).
        prefix: Whether shown lines are prefixed ``[rank N] `` (``--prefix-output``).
        hold: Whether consequences are held back (False with ``DISTENV_DEBUG=1``).
        hang_timeout: Seconds without progress after which a rank's watchdog says it is stuck
            (None: no watchdog).
    """

    def __init__(
        self,
        run_dir: RunDir,
        ranks: Sequence[tuple[int, int, bool]],
        *,
        hidden: Mapping[int, frozenset[int]] | None = None,
        prefix: bool = False,
        hold: bool = True,
        hang_timeout: float | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.hang_timeout = hang_timeout
        self.hold = hold
        self.started_at = time.time()
        self.stop_at: float | None = None
        self.held: collections.Counter[str] = collections.Counter()
        self.held_ranks: set[int] = set()
        self._seen: set[tuple[int, str]] = set()
        self._lock = threading.Lock()
        self._log: IO[bytes] | None = open(run_dir.log, "ab")  # noqa: SIM115  closed in close()
        self._logged = 0
        self._oom_before = oom_kills()
        self._ranks: dict[int, _Rank] = {}
        for rank, local_rank, shown in ranks:
            read, write = os.pipe()
            os.set_blocking(read, False)
            fault = os.open(
                run_dir.path / f"rank-{rank}.fault", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600
            )
            label = f"[rank {rank}] ".encode()
            self._ranks[rank] = _Rank(
                rank,
                local_rank,
                shown,
                label if prefix else b"",
                (read, write),
                fault,
                (hidden or {}).get(rank, frozenset()),
                BoundedLog(paths(run_dir.path, rank)[0]) if run_dir.kept else None,
            )

    # -- the supervisor's side -------------------------------------------------------------------

    def child_env(self, rank: int) -> tuple[dict[str, str], tuple[int, ...]]:
        """Return the variables and descriptors a rank gets to report its failure."""
        state = self._ranks[rank]
        write = state.report_fds[1]
        env = {REPORT_FD_VAR: str(write), FAULT_FD_VAR: str(state.fault_fd)}
        if self.hang_timeout is not None:
            env[HANG_VAR] = repr(self.hang_timeout)
        return env, (write, state.fault_fd)

    def started(self, rank: int, process: subprocess.Popen[bytes]) -> None:
        """Note the process of a rank that has started (named in its fault file, for why)."""
        state = self._ranks[rank]
        state.process = process
        if self.run_dir.kept:
            who = identity(rank, state.local_rank, self.started_at, process.pid)
            with contextlib.suppress(OSError):
                # Read past it: a dump or a crash is what the rank writes after it.
                state.dumped = os.write(state.fault_fd, who.encode())

    def stopping(self) -> None:
        """Note that distenv run began stopping the ranks (later ends are its doing)."""
        with self._lock:
            if self.stop_at is None:
                self._look()
                self.stop_at = time.time()

    def look(self) -> None:
        """Read new reports and notice ranks that ended (non-blocking)."""
        with self._lock:
            self._look()

    def line(self, rank: int, fd: int, data: bytes) -> bytes | None:
        """Log one line of `rank` and return what to print of it (None: held back or hidden)."""
        state = self._ranks[rank]
        with self._lock:
            self._write_log(state, data)
        waited = False
        while True:
            with self._lock:
                if fd == 2:  # a rank's traceback follows its report: not its last output
                    self._look()
                cause = self._cause_rank()
                failing = cause is not None or any(
                    r.report is not None and r.report.peer for r in self._ranks.values()
                )
                consequence = fd == 2 and self.hold and rank != cause
                if failing and consequence:
                    self.held_ranks.add(rank)
                    self.held["lines"] += 1
                    for kind, pattern in CONSEQUENCES.items():
                        # Tracebacks, dumps and aborts are counted by their one header line;
                        # the words of a lost peer once per rank (a traceback repeats them).
                        once = kind in ONCE_PER_RANK
                        if pattern.search(data) and (not once or (rank, kind) not in self._seen):
                            self._seen.add((rank, kind))
                            self.held[kind] += 1
                    return None
                looks = consequence and any(p.search(data) for p in CONSEQUENCES.values())
                if waited or not looks:
                    # A rank's stderr after its report is its traceback; its stdout may be read
                    # after the report, or its end, though written before (another pipe).
                    if fd == 1 or state.report is None:
                        state.last.append(data.rstrip(b"\n"))
                    shown = state.shown and fd not in state.hidden
                    return state.prefix + data if shown else None
            deadline = time.monotonic() + CAUSE_WAIT
            while time.monotonic() < deadline and not self._failed_yet():
                time.sleep(_WAIT_STEP)
            waited = True

    def stuck(self) -> tuple[int, str, float] | None:
        """Return the rank whose watchdog said first that it is stuck: rank, where, since when."""
        with self._lock:
            self._look()
            found = [(r.stuck[1], r.rank, r.stuck[0]) for r in self._ranks.values() if r.stuck]
        if not found:
            return None
        since, rank, frame = min(found)
        return rank, frame, since

    def fault_sizes(self) -> dict[int, int]:
        """Return the size of each rank's fault file (a dump appends to it)."""
        sizes = {}
        for rank in self._ranks:
            with contextlib.suppress(OSError):
                sizes[rank] = (self.run_dir.path / f"rank-{rank}.fault").stat().st_size
        return sizes

    def dumped(self, ranks: Sequence[int]) -> bool:
        """Return whether each of `ranks` wrote to its fault file since the last dump taken."""
        sizes = self.fault_sizes()
        return all(sizes.get(rank, 0) > self._ranks[rank].dumped for rank in ranks)

    def take_dumps(self) -> dict[int, bytes]:
        """Return what each rank's fault file holds since the last dump taken (bounded reads).

        A fatal signal's frames are read past the dumps only (`_end`).
        """
        dumps = {}
        with self._lock:
            for state in self._ranks.values():
                fault = self.run_dir.path / f"rank-{state.rank}.fault"
                with contextlib.suppress(OSError), fault.open("rb") as file:
                    file.seek(state.dumped)
                    data = file.read(_DUMP_LIMIT)
                    state.dumped += len(data)
                    if data:
                        dumps[state.rank] = data
        return dumps

    def ends(self, *, everyone: bool = False) -> list[End]:
        """Return how each rank that failed (or, `everyone`, ended) ended, the cause first."""
        with self._lock:
            self._look()
            for state in self._ranks.values():
                if state.end is not None:  # what was read of its pipes since it ended too
                    state.end.last = tuple(state.last)
            ended = [r.end for r in self._ranks.values() if r.end is not None]
            # A rank killed without a word (SIGKILL) is dated when it was seen dead; but it died
            # before any peer found its connections closed.
            broke = [e.at for e in ended if e.report is not None and e.report.peer]
            for end in ended:
                if end.returncode < 0 and end.report is None and not end.fault and broke:
                    end.at = min(end.at, *broke)
            return sorted((e for e in ended if everyone or e.failed), key=End.order)

    def cause(self) -> End | None:
        """Return the local rank that failed first on its own, None if none did."""
        own = [end for end in self.ends() if end.own]
        return own[0] if own else None

    def reports(self) -> dict[int, Report | None]:
        """Return each rank's report (None: it reported none)."""
        with self._lock:
            self._look()
            return {rank: state.report for rank, state in self._ranks.items()}

    def close(self) -> None:
        """Close the descriptors and the log (the rank-side ends too)."""
        with self._lock:
            for state in self._ranks.values():
                for fd in (*state.report_fds, state.fault_fd):
                    with contextlib.suppress(OSError):
                        os.close(fd)
                if state.log is not None:
                    state.log.close()
            if self._log is not None:
                self._log.close()
                self._log = None

    # -- inside the lock ---------------------------------------------------------------------------

    def _write_log(self, state: _Rank, data: bytes) -> None:
        if state.log is not None and self._log is not None:
            state.log.write(data)
        if self._log is None or self._logged > LOG_LIMIT:
            return
        line = f"[rank {state.rank}] ".encode() + data + (b"" if data.endswith(b"\n") else b"\n")
        self._logged += len(line)
        with contextlib.suppress(OSError):
            self._log.write(line)
            self._log.flush()

    def _failed_yet(self) -> bool:
        with self._lock:
            self._look()
            return any(
                r.report is not None or (r.end and r.end.failed) for r in self._ranks.values()
            )

    def _cause_rank(self) -> int | None:
        failed = [r.end for r in self._ranks.values() if r.end is not None and r.end.own]
        reported = [
            End(r.rank, r.local_rank, 0, 1, r.report.at, r.report)
            for r in self._ranks.values()
            if r.end is None and r.report is not None and not r.report.peer
        ]
        candidates = sorted([e for e in failed if e is not None] + reported, key=End.order)
        return candidates[0].rank if candidates else None

    def _look(self) -> None:
        for state in self._ranks.values():
            if state.report is None and self._log is not None:  # the pipes are open
                data = read_pipe(state.report_fds[0])
                state.report = Report.parse(data)
                state.stuck = state.stuck or parse_stuck(data)
            if state.end is None and state.process is not None:
                returncode = _ended(state.process)
                if returncode is not None:
                    state.end = self._end(state, returncode)

    def _record(self, state: _Rank, returncode: int, pid: int) -> None:
        """Write the rank's record into the log folder, as a rank of `distenv.postmortem.ranklog` does."""
        report = state.report
        if report is not None:
            report = dataclasses.replace(
                report,
                host=socket.gethostname(),
                pid=pid,
                local_rank=state.local_rank,
                started=self.started_at,
            )
        if report is not None or returncode == 0:
            write_record(paths(self.run_dir.path, state.rank)[1], report)

    def _end(self, state: _Rank, returncode: int) -> End:
        now = time.time()
        # A rank that raised before the stop failed on its own, even if it exited after it.
        failed_at = state.report.at if state.report is not None else now
        stopped = self.stop_at is not None and failed_at >= self.stop_at
        assert state.process is not None
        pid = state.process.pid
        end = End(state.rank, state.local_rank, pid, returncode, now, state.report)
        end.stopped = stopped
        if self.run_dir.kept:
            self._record(state, returncode, pid)
        end.last = tuple(state.last)
        if state.report is not None:
            end.at = state.report.at
        elif returncode < 0:
            fault = self.run_dir.path / f"rank-{state.rank}.fault"
            with contextlib.suppress(OSError):
                if fault.stat().st_size > state.dumped:
                    end.at = min(now, fault.stat().st_mtime)
                    end.fault = crash_frames(fault, state.dumped)
            if -returncode == signal.SIGKILL and not stopped:
                after = oom_kills()
                rose = (
                    after is not None and self._oom_before is not None and after > self._oom_before
                )
                end.oom = rose or oom_killed_by_kernel_log(pid)
        return end


def _ended(process: subprocess.Popen[bytes]) -> int | None:
    """Return how a rank ended (-N for signal N) without reaping it; None while it runs."""
    if process.returncode is not None:
        return process.returncode
    try:
        found = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # the supervisor reaps it right now: its status is being set
        deadline = time.monotonic() + _REAP_WAIT
        while process.returncode is None and time.monotonic() < deadline:
            time.sleep(0.001)
        return process.returncode
    if found is None or found.si_pid == 0:
        return None
    if found.si_code == os.CLD_EXITED:
        return found.si_status
    return -found.si_status
