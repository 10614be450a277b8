"""``distenv run --max-restarts N``: when any rank fails, the whole job starts again, counted once.

Each node's ``distenv run`` is that node's agent. Node 0's agent hosts the job's store for the
whole run (`distenv.bootstrap.store.host_store`); the ranks are its clients
(``TORCHELASTIC_USE_AGENT_STORE``, as under torchrun), and each attempt is a rendezvous of its own
(``TORCHELASTIC_RESTART_COUNT`` is part of the ranks' scope, so no rank of one attempt joins
another's). Per attempt the agents meet, start their ranks, stop them all when any rank of any
node fails, and follow node 0's agent's decision (`distenv.local.attempts`): restart, or stop
with the failing rank's exit status because the restarts are spent or the failure is one a
restart repeats (a rank's own report says which: `distenv.local.reporting`).

torch's elastic agent is not used: it counts restarts per node by design
(torch/distributed/elastic/agent/server/api.py), the defect users report as pytorch/pytorch#108158.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import signal
import sys
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from distenv._hosts import this_host
from distenv.bootstrap.store import host_store
from distenv.deadline import Deadline, bounded, interruptible
from distenv.errors import RendezvousTimeoutError
from distenv.local.attempts import ACK_S, BEAT_S, Agents, Decision, Failure, StoreLostError
from distenv.local.plan import NodePlan
from distenv.local.stopping import StopPolicy, describe_exit, exit_status
from distenv.local.supervise import STOPPING_SIGNALS, Child, Supervisor, say
from distenv.local.witness import RunDir
from distenv.master import host_port
from distenv.postmortem.failure import Report
from distenv.settings import AGENT_STORE_VAR, RESTART_VAR
from distenv.timing import GRACE_S

__all__ = ["Restarts", "reporting_program"]

#: Seconds between an agent's looks for another node's failure while its ranks run.
PEER_POLL_S = 0.2
#: The slice of the back-off sleep in which a stopping signal is noticed.
SLICE_S = 0.05


def reporting_program(module: bool) -> list[str]:
    """Return the command that runs a rank's script so that it reports how it failed."""
    return [sys.executable, "-u", "-m", "distenv.local.reporting", *(["-m"] if module else [])]


@dataclasses.dataclass
class Restarts:
    """This node's agent: runs its ranks attempt after attempt, as node 0's agent decides.

    Attributes:
        children: This node's ranks (their command already runs through `reporting_program`).
        plan: This node's place in the job.
        max_restarts: Restarts allowed in the whole job.
        backoff: Seconds between an attempt's end and the next one's start.
        policy: How ranks are stopped.
        poll_interval: Seconds between checks of the ranks' state.
        timeout: The rendezvous timeout: how long the agents wait for each other.
    """

    children: Sequence[Child]
    plan: NodePlan
    max_restarts: int
    backoff: float
    policy: StopPolicy
    poll_interval: float
    timeout: float
    host: str = dataclasses.field(default_factory=this_host)
    _signals: list[int] = dataclasses.field(default_factory=list)
    _run_dir: RunDir = dataclasses.field(default_factory=RunDir)
    _last: Supervisor | None = None

    def run(self) -> int:
        """Run attempts until the job succeeds or stops; return the job's exit status.

        Raises:
            RendezvousTimeoutError: If the agents do not all meet within the timeout.
            DistEnvError: If node 0's agent cannot host the store.
        """
        previous = self._install_handlers()
        try:
            agents = Agents(
                self._store(), self.plan.run_id, self.plan.nnodes, self.plan.node_rank, self.host
            )
            try:
                status = self._attempts(agents)
                if not status:
                    self._run_dir.remove()
                return status
            except StoreLostError as exc:
                say(
                    f"node 0's agent at {host_port(self.plan.master_addr, self.plan.master_port)} "
                    f"is gone ({exc or 'its store stopped answering'}); the job ends without "
                    "restart"
                )
                return 1
        finally:
            for signum, handler in previous.items():
                if handler is not None:
                    signal.signal(signum, handler)

    def _install_handlers(self) -> dict[int, Any]:
        def note(signum: int, frame: FrameType | None) -> None:
            self._signals.append(signum)

        previous: dict[int, Any] = {}
        for signum in STOPPING_SIGNALS:
            with contextlib.suppress(ValueError):  # not the main thread
                previous[signum] = signal.signal(signum, note)
        return previous

    def _stopped(self) -> bool:
        return bool(self._signals)

    def _store(self) -> Any:
        """Host the job's store (node 0) or reach it, within the rendezvous timeout."""
        host, port = self.plan.master_addr, self.plan.master_port
        if self.plan.node_rank == 0:
            return host_store("run", host, port, self.timeout)
        from torch._C._distributed_c10d import TCPStore

        def unreached() -> RendezvousTimeoutError:
            return RendezvousTimeoutError(
                "run",
                f"node {self.plan.node_rank}'s agent could not reach node 0's agent at "
                f"{host_port(host, port)} within {self.timeout:g} s",
                hint="start node 0's distenv run too, with the same --master-addr and "
                "--master-port (its host and a port it may listen on); raise the limit with "
                "DISTENV_TIMEOUT",
                variable="--master-addr",
                value=host,
            )

        def connect() -> Any:
            wait = datetime.timedelta(seconds=self.timeout)
            try:
                return TCPStore(host, port, is_master=False, timeout=wait)
            except RuntimeError:  # torch's DistNetworkError, at its own timeout
                raise unreached() from None

        with interruptible("the connection to node 0's agent", "run"):
            return bounded(connect, Deadline.after(self.timeout + GRACE_S), unreached)

    def _attempts(self, agents: Agents) -> int:
        attempt = 0
        while True:
            if not agents.join(attempt, Deadline.after(self.timeout), self._stopped):
                agents.record(self._signalled(attempt))
                agents.over(attempt)
            else:
                failure = self._attempt(agents, attempt)
                if failure is not None:
                    agents.record(failure)
                agents.over(attempt)
            decision: Decision | None
            if self.plan.node_rank == 0:
                decision = agents.decide(attempt, self.max_restarts)
            else:
                # Stopped here, this agent waits for the decision only briefly.
                decision = agents.decision(attempt, ACK_S if self._stopped() else None)
            if decision is None:
                signum = signal.Signals(self._signals[0])
                say(f"attempt {attempt}: received {signum.name}; not restarted")
                return 128 + signum
            self._announce(attempt, decision)
            if decision.action != "restart":
                self._card(decision)
                return decision.status
            attempt += 1
            end = Deadline.after(self.backoff)
            while not end.passed() and not self._stopped():
                time.sleep(min(SLICE_S, max(end.left(), 0.0)))

    def _signalled(self, attempt: int) -> Failure:
        signum = self._signals[0]
        how = f"received {signal.Signals(signum).name}"
        node = self.plan.node_rank
        return Failure(attempt, node, -1, self.host, 128 + signum, how, "stopped", "", time.time())

    def _announce(self, attempt: int, decision: Decision) -> None:
        failure = decision.failure
        if failure is None:
            if attempt:
                say(f"attempt {attempt} succeeded, after {attempt} restart{'s' * (attempt > 1)}")
            return
        said = f"attempt {attempt} failed: {failure.describe()}"
        if decision.action == "stop":
            say(f"{said}; not restarted: {decision.reason}")
            return
        later = f", in {self.backoff:g} s" if self.backoff else ""
        say(
            f"{said}; restarting every rank of the job (restart {attempt + 1} of "
            f"{self.max_restarts}{later})"
        )

    def _card(self, decision: Decision) -> None:
        """Print the job's card: in full on the node of its first failure, else a pointer to it."""
        failure, last = decision.failure, self._last
        if failure is None or last is None or failure.kind == "stopped":
            return
        here = failure.node == self.plan.node_rank and failure.rank >= 0
        last.show_card(failure.describe(), failure.rank if here else None)

    def _peers(self, agents: Agents, attempt: int) -> Callable[[], str | None]:
        """Return the supervisor's question: has another node's rank (or agent) failed?

        Every agent looks for the attempt's first failure; node 0's also for a silent agent,
        once a second (one store round trip per node).
        """
        next_look, next_count = [0.0], [0.0]
        others = range(1, self.plan.nnodes) if self.plan.node_rank == 0 else range(0)

        def ask() -> str | None:
            now = time.monotonic()
            if now < next_look[0]:
                return None
            next_look[0] = now + PEER_POLL_S
            try:
                agents.beat()
                failure = agents.first_failure(attempt)
                if failure is None and others and now >= next_count[0]:
                    next_count[0] = now + BEAT_S
                    failure = agents.silent(attempt, others)
            except StoreLostError:
                return "node 0's agent is gone"
            return None if failure is None else f"attempt {attempt}: {failure.describe()}"

        return ask

    def _first(
        self,
        attempt: int,
        candidates: Sequence[Child],
        own: Sequence[Child],
        reports: dict[int, Report | None],
    ) -> Failure:
        """Return the failure of the rank that failed first among `candidates`.

        A rank killed by a signal (no report) comes first: a peer's failure makes a rank raise,
        not die by a signal. Among ranks that raised, the earliest report (one clock per node).
        A rank that did not end by itself (not in `own`: the stop ended it) reads as how it ended
        before the stop, its report, with the status Python was ending it with (its report's:
        1, or ``sys.exit``'s code).
        """

        def order(child: Child) -> tuple[int, bool, float]:
            report = reports.get(child.rank)
            return (0, False, 0.0) if report is None else (1, report.peer, report.at)

        first = min(candidates, key=order)
        assert first.process is not None
        code = first.process.returncode
        status, how = exit_status(code), describe_exit(code)
        if first not in own:  # the status Python was ending it with: 1, or sys.exit's code
            report = reports.get(first.rank)
            status, how = 1 if report is None else report.status, "failed"
        return Failure.of_rank(
            attempt,
            self.plan.node_rank,
            first.rank,
            self.host,
            status,
            how,
            reports.get(first.rank),
            signalled=code < 0 and -code in STOPPING_SIGNALS,
        )

    def _attempt(self, agents: Agents, attempt: int) -> Failure | None:
        """Run this node's ranks once; return how they failed here first (None: they did not)."""
        children = []
        for child in self.children:
            env = {**child.env, RESTART_VAR: str(attempt), AGENT_STORE_VAR: str(True)}
            children.append(dataclasses.replace(child, env=env))
        supervisor = Supervisor(
            children,
            policy=self.policy,
            poll_interval=self.poll_interval,
            peers=self._peers(agents, attempt),
            run_dir=self._run_dir,
            world_size=self.plan.nnodes * len(children),
            host=self.host,
            print_card=False,
        )
        self._last = supervisor
        supervisor.run()
        if supervisor.received is not None:
            self._signals.append(supervisor.received)
            return self._signalled(attempt)
        # A rank that raised first may still be exiting when a peer it broke has exited, here
        # or on another node (whose failure then stopped this node): every rank that reported
        # is a candidate; after another node's failure, those that reported before it was
        # seen here, which failed on their own.
        reports = supervisor.reports()
        own = list(supervisor.failed)
        seen = supervisor.peer_failed_at if not own else None
        candidates = own + [
            child
            for child in children
            if (report := reports[child.rank]) is not None
            and child not in own
            and (own or (seen is not None and report.at <= seen))
        ]
        if not candidates:
            return None
        if not own:  # those that exited with a status of their own ended by themselves
            own = [c for c in candidates if c.process is not None and c.process.returncode > 0]
        return self._first(attempt, candidates, own, reports)
