"""The supervisor of ``distenv run``: start the local ranks, watch them, stop them all at once.

torchrun-style: the first failure stops every rank under the `distenv.local.stopping.StopPolicy`,
stopping signals are forwarded and start the grace period (a second one kills at once), SIGUSR1
and SIGUSR2 are forwarded only, and nothing the ranks started outlives the run. How the four
safeguards against survivors fit together (process groups, the parent-death signal, the group
killer, adoption) is described in docs/architecture.md. The ranks' output passes through the
node's `distenv.local.witness.Witness`, and a failed job ends with its first-failure card
(`distenv.local.card`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from distenv.deadline import Deadline
from distenv.exits import DEBUG_VAR
from distenv.local.autopsy import HANG_STATUS, Autopsy
from distenv.local.card import card, elsewhere_card, log_line
from distenv.local.group_killer import GroupKiller
from distenv.local.output import copy_output, drain, tell
from distenv.local.stopping import KILL_WAIT, StopPolicy, exit_status
from distenv.local.witness import RunDir, Witness
from distenv.postmortem.failure import Report
from distenv.system.processes import Adopter, live_groups, with_parent_death

__all__ = ["Child", "Supervisor", "say"]

#: The program named at the start of each message the supervisor prints.
PROGRAM = "distenv run"
# Signals that stop the job: forwarded, then the grace period, then SIGKILL (torchrun handles the
# same set). SIGUSR1/SIGUSR2 are only forwarded: schedulers send them as "checkpoint soon" warnings.
STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
FORWARDED_SIGNALS = (*STOPPING_SIGNALS, signal.SIGUSR1, signal.SIGUSR2)
# Seconds between reapings of adopted orphans that exited while the ranks run (/proc is read then).
REAP_INTERVAL = 1.0


def say(message: str) -> None:
    """Print one line of ``distenv run``'s own to stderr, prefixed with its name (`tell`)."""
    tell(f"{PROGRAM}: {message}")


@dataclass
class Child:
    """One local rank to start.

    Attributes:
        rank: Its global rank (for messages and output prefixes).
        command: The program and its arguments (no shell).
        env: Its complete environment.
        show_output: Whether its stdout/stderr reach the launcher's; else they go to /dev/null.
        prefix_output: Whether each of its lines is prefixed with ``[rank N] ``.
        hidden_streams: Its descriptors (1, 2) kept off the console, in the logs only
            (``--redirects``).
        pass_fds: Descriptors it inherits (the pipe of its failure report).
        cpus: The CPUs it is bound to as it starts (``--numa-binding``), or None.
    """

    rank: int
    command: list[str]
    env: dict[str, str]
    show_output: bool = True
    prefix_output: bool = False
    hidden_streams: frozenset[int] = frozenset()
    pass_fds: tuple[int, ...] = ()
    cpus: frozenset[int] | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)


class Supervisor:
    """Run children to completion, torchrun-style: the first failure stops all.

    Args:
        children: The local ranks to start, in rank order.
        policy: How ranks are stopped, and the messages that say so.
        poll_interval: Seconds between checks of the children's state.
        peers: Asked every poll whether another node's rank failed (``distenv run
            --max-restarts``): a message for the stop it calls for, or None.
        run_dir: The run's private folder (the output log); one of its own if None, kept only
            when the job failed.
        world_size: The job's number of ranks (for the card).
        host: This node's host name (for the card).
        print_card: Whether a failed job ends with the card here (``--max-restarts`` prints it
            once the agents decided the job's end).
        hang_timeout: Seconds without progress on a rank after which the job is found hung:
            every rank dumps its stacks, the hang card names the one(s) whose stack differs, and
            the ranks are stopped (exit status `HANG_STATUS`). None: no watchdog.
    """

    def __init__(
        self,
        children: Sequence[Child],
        *,
        policy: StopPolicy,
        poll_interval: float = 0.1,
        peers: Callable[[], str | None] | None = None,
        run_dir: RunDir | None = None,
        world_size: int | None = None,
        host: str = "",
        print_card: bool = True,
        hang_timeout: float | None = None,
    ) -> None:
        self.children = list(children)
        self._own_dir = run_dir is None
        self.run_dir = run_dir or RunDir()
        self.world_size = world_size or len(self.children)
        self.host = host or os.uname().nodename
        self.print_card = print_card
        debug = os.environ.get(DEBUG_VAR, "").strip().lower() not in ("", "0", "false", "no")
        prefix = any(c.prefix_output for c in self.children)
        self.witness = Witness(
            self.run_dir,
            [(c.rank, i, c.show_output) for i, c in enumerate(self.children)],
            hidden={c.rank: c.hidden_streams for c in self.children},
            prefix=prefix,
            hold=not debug,
            hang_timeout=hang_timeout,
        )
        self.autopsy = Autopsy(self.witness, [c.rank for c in self.children], hang_timeout)
        self.policy = policy
        self.poll_interval = poll_interval
        self.peers = peers
        #: The local ranks found failed at the poll that first found one, if that came before
        #: anything else stopped the ranks (several may have failed within one poll).
        self.failed: list[Child] = []
        #: The first stopping signal this launcher received, if it received one first.
        self.received: int | None = None
        #: When (``time.time()``) `peers` reported another node's failure, if that came first: a
        #: rank here that failed on its own before then, but had not exited yet, failed too.
        self.peer_failed_at: float | None = None
        self._signals: list[int] = []
        self._threads: list[threading.Thread] = []
        self._group_killer = GroupKiller()
        self._deadline: Deadline | None = None
        self._killed = False
        self._stop_signal = signal.SIGTERM
        self._adopter = Adopter()
        self._next_reaping = 0.0
        self.status: int | None = None

    # -- signals -------------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Runs in the main thread between bytecodes, so plain Python is safe here; forwarding at
        # once keeps SIGUSR1 (a checkpoint warning) from waiting for the next poll.
        # Stopping signals are forwarded by the loop, which also starts the grace period.
        self._signals.append(signum)
        if signum not in STOPPING_SIGNALS:
            self._signal_all(signum)

    def _install_handlers(self) -> dict[int, Any]:
        previous: dict[int, Any] = {}
        for signum in FORWARDED_SIGNALS:
            try:
                previous[signum] = signal.signal(signum, self._on_signal)
            except ValueError:  # not the main thread: the caller keeps its own handling
                break
        return previous

    # -- processes -----------------------------------------------------------------------------

    def _groups(self) -> set[int]:
        return {c.process.pid for c in self.children if c.process is not None}

    def _own(self) -> set[int]:
        """Return the pids of the processes this supervisor started (ranks and group killer)."""
        own = self._groups()
        if self._group_killer.pid is not None:
            own.add(self._group_killer.pid)
        return own

    def _orphans(self) -> tuple[list[int], bool]:
        """Reap exited orphans; return the live ones (sent the current stop signal if stopping)."""
        live, found = self._adopter.orphans(self._own())
        if self._deadline is not None:
            self._adopter.send(live, self._stop_signal)
        return live, found

    def _end_orphans(self) -> None:
        """SIGKILL and reap every adopted orphan, their own orphans too (KILL_WAIT at most)."""
        deadline = Deadline.after(KILL_WAIT)
        while not deadline.passed():
            live, found = self._adopter.orphans(self._own())
            if not found:
                return
            self._adopter.send(live, signal.SIGKILL)
            time.sleep(0.01)

    def _pids(self) -> dict[int, int]:
        """Return the pid of each rank still running."""
        return {c.rank: c.process.pid for c in self._running() if c.process is not None}

    def _running(self) -> list[Child]:
        return [c for c in self.children if c.process is not None and c.process.poll() is None]

    def _signal_all(self, signum: int) -> None:
        for group in self._groups():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signum)

    def _start(self, child: Child) -> None:
        env, fds = self.witness.child_env(child.rank)
        child.process = subprocess.Popen(
            with_parent_death(child.command, os.getpid(), PROGRAM),
            env={**child.env, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            pass_fds=(*child.pass_fds, *fds),
        )
        if child.cpus:
            # Now, while the parent-death wrapper still starts (it execs the rank in place): the
            # rank's interpreter and every thread and process it starts inherit the binding.
            with contextlib.suppress(OSError):  # it already ended: its status tells
                os.sched_setaffinity(child.process.pid, child.cpus)
        self._group_killer.watch(child.process.pid)
        self.witness.started(child.rank, child.process)

        def gate(fd: int, line: bytes, rank: int = child.rank) -> bytes | None:
            return self.witness.line(rank, fd, line)

        self._threads += copy_output(child.rank, child.process.stdout, child.process.stderr, gate)

    def _begin_stop(self, signum: int) -> None:
        """Send `signum` to every group and start the grace period (a second stop kills now)."""
        if self._deadline is not None:
            self._kill_all()
            return
        self.witness.stopping()
        self._signal_all(signum)
        self._stop_signal = signal.Signals(signum)
        self._deadline = Deadline.after(self.policy.grace_period)
        self._orphans()

    def _kill_all(self) -> None:
        stragglers = [f"{c.rank} (pid {c.process.pid})" for c in self._running() if c.process]
        if stragglers:
            self._say(self.policy.killed(stragglers))
        self._signal_all(signal.SIGKILL)
        self._stop_signal = signal.SIGKILL
        orphans, _ = self._orphans()
        if orphans:
            count = f"{len(orphans)} process{'es' * (len(orphans) > 1)}"
            self._say(
                f"{count} the ranks left behind (pid {', '.join(map(str, orphans))}) still running "
                f"{self.policy.grace_period:g}s after the stop signal; sent SIGKILL"
            )
        self._killed = True

    def _say(self, message: str) -> None:
        say(message)

    def _check_signals(self) -> None:
        while self._signals:
            signum = self._signals.pop(0)
            if signum not in STOPPING_SIGNALS:
                if signum == signal.SIGUSR1:  # each rank dumps its stacks
                    self.autopsy.on_demand()
                continue
            if self.status is None:
                self.status = 128 + signum
                self.received = signum
                count = len(self._running())
                self._say(
                    f"received {signal.Signals(signum).name}; forwarded it to {count} "
                    f"rank{'s' * (count != 1)}"
                )
            self._begin_stop(signum)

    def _check_children(self) -> None:
        # Which rank failed first, and how, is the card's to say (the first to exit may be a
        # survivor whose collective the cause broke): here, only that the ranks must stop.
        self._running()  # polls: the ranks that ended since the last look have their status
        for child in self.children:
            process = child.process
            if process is None or process.returncode in (None, 0) or self.status is not None:
                continue
            self.status = exit_status(process.returncode)
            self.failed = [
                c for c in self.children if c.process is not None and c.process.returncode
            ]
            self._begin_stop(signal.SIGTERM)

    def _check_peers(self) -> None:
        if self.peers is None or self.status is not None:
            return
        message = self.peers()
        if message is not None:
            self.peer_failed_at = time.time()
            self.status = 1  # the failing rank's own status is the job's (its agent's record)
            count = len(self._running())
            ranks = (
                f"stopping the {count} rank{'s' * (count != 1)} here"
                if count
                else "no rank runs here"
            )
            self._say(f"{message}; {ranks}")
            self._begin_stop(signal.SIGTERM)

    def _loop(self) -> None:
        running = self._running()
        while True:
            self._check_signals()
            self._check_peers()
            self.witness.look()
            if self.autopsy.poll(self._pids(), watch=self.status is None):
                self.status = HANG_STATUS
                self._begin_stop(signal.SIGTERM)
            # Orphans are reaped before the ranks are polled, by pid: were it waitpid(-1), a rank
            # that exited meanwhile would lose its status here (test_rank_status_survives_...).
            # While ranks run, /proc is read only every REAP_INTERVAL.
            now = time.monotonic()
            scan = not running or self._deadline is not None or now >= self._next_reaping
            orphans: tuple[list[int], bool] = ([], False)
            if scan:
                orphans = self._orphans()
                self._next_reaping = now + REAP_INTERVAL
            self._check_children()
            running = self._running()
            if not running:
                # Every rank is done; grandchildren they left behind, in their groups or adopted,
                # get the same treatment.
                if not scan:
                    orphans = self._orphans()
                left = live_groups(self._groups()) or orphans[1]
                if self._deadline is None:
                    if not left:
                        return
                    self._begin_stop(signal.SIGTERM)
                elif not left:
                    return
            if self._deadline is not None and self._deadline.passed():
                if not self._killed:
                    self._kill_all()
                if not self._running():
                    return
                # A process that survives SIGKILL is stuck in the kernel: wait, but not forever.
                if self._deadline.later(KILL_WAIT).passed():
                    return
            time.sleep(self.poll_interval)

    def run(self) -> int:
        """Start every child, supervise them to the end, and return the exit status.

        Returns:
            0 when every rank succeeded; else the first failure's status (128+N for signal N), or
            128+N when the launcher itself received stopping signal N.
        """
        previous = self._install_handlers()
        try:
            self._adopter.start()
            self._group_killer.start()
            for child in self.children:
                try:
                    self._start(child)
                except OSError as exc:  # fork refused (EAGAIN, ENOMEM): stop the ones started
                    self._say(f"cannot start rank {child.rank}: {exc}")
                    self.status = 1
                    self._begin_stop(signal.SIGTERM)
                    break
                self._check_signals()
                if self._deadline is not None:
                    break
            self._loop()
        finally:
            if self._running() or live_groups(self._groups()):
                self._signal_all(signal.SIGKILL)
            for child in self.children:
                if child.process is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        child.process.wait(timeout=KILL_WAIT)
            self._end_orphans()
            self._adopter.stop()
            self._group_killer.stop()
            drain(self._threads)
            for signum, handler in previous.items():
                if handler is not None:  # None: installed outside Python, nothing to restore
                    signal.signal(signum, handler)
            self._conclude()
        return self.status or 0

    def reports(self) -> dict[int, Report | None]:
        """Return each local rank's report of its failure (None: it reported none)."""
        return self.witness.reports()

    def _conclude(self) -> None:
        """Take the cause's exit status as the job's, print the card, keep or remove the log."""
        cause = self.witness.cause()
        if self.autopsy.card is not None:
            self.witness.close()
            tell(
                self.autopsy.ending(self.policy.grace_period, self._killed, log_line(self.witness))
            )
            return
        if cause is not None and self.received is None and self.peer_failed_at is None:
            self.status = cause.status
        self.witness.close()
        if self.print_card and self.status and self.received is None:
            self.show_card(None)
        if self._own_dir and not self.status:
            self.run_dir.remove()

    def show_card(self, first: str | None, rank: int | None = None) -> None:
        """Print the card: of local `rank` (the cause here by default), else of a peer's cause.

        Args:
            first: The job's first failure in words, when it happened on another node.
            rank: The local rank the agents found first (``--max-restarts``).
        """
        ends = self.witness.ends()
        found = [e for e in ends if e.rank == rank] if rank is not None else []
        cause = found[0] if found else (self.witness.cause() if rank is None else None)
        lines = (
            card(self.witness, cause, self.world_size, self.host, log_line(self.witness))
            if cause is not None
            else elsewhere_card(self.witness, first)
        )
        tell("\n".join(lines))
