"""The node agents' agreement on attempts: one count for the whole job, kept by node 0's agent.

Under ``distenv run --max-restarts N`` every node's ``distenv run`` (its *agent*) meets the others in
a torch TCPStore that node 0's agent hosts for the whole job (`distenv.bootstrap.store.host_store`),
under ``distenv-agents/<run id>/``. Per attempt k:

- ``join/k``: every agent arrives before any starts its ranks (`Agents.join`); a node missing at
  the rendezvous timeout is named;
- ``failed/k``: the first failure of the attempt (written once, ``compare_set``), which every other
  agent sees within its next poll and stops its ranks for; ``failed/k/<node>`` is each node's own;
- ``over/k/<node>``: the node's ranks of attempt k have all ended;
- ``decision/k``: node 0's agent alone decides, once every node is over: done, restart (attempt
  k+1) or stop. One decider is what keeps the count global: torchrun's agents each count their
  own node's restarts (pytorch/pytorch#108158).

While they wait, the agents beat (``alive/<node>``, a counter): node 0 names a node whose agent
stopped beating for `AGENT_SILENCE_S` and stops the job; the others notice node 0's agent gone when
its store stops answering. Every record read is checked (`Failure.parse`): what any process that
reaches the port writes there is not believed beyond its format.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from distenv.bootstrap.records import matches
from distenv.bootstrap.waits import peek
from distenv.deadline import Deadline
from distenv.errors import RendezvousTimeoutError
from distenv.postmortem.failure import RETRIED, Report

__all__ = ["ACK_S", "AGENT_SILENCE_S", "BEAT_S", "Agents", "Decision", "Failure", "StoreLostError"]

#: The kinds of failure an agent records: a rank's own `Report` kinds, ``crashed`` (ended by a
#: signal such as SIGKILL or SIGSEGV, or with no report), ``agent`` (a node's agent went silent);
#: and whether a new attempt could end otherwise.
KINDS = {**RETRIED, "crashed": True, "agent": False}
#: Why a failure of each kind that is not retried is not.
WHY_NOT = {
    "refused": "distenv refused the environment or the configuration, which a restart repeats",
    "import": "the script cannot be imported",
    "usage": "the script refused its arguments",
    "stopped": "the job was stopped (the scheduler's stop signal, scancel, Ctrl-C)",
    "agent": "a node's agent is gone",
}
#: Seconds between an agent's beats while it waits for the others.
BEAT_S = 1.0
#: Seconds without a beat after which node 0's agent takes a node's agent for gone.
AGENT_SILENCE_S = 10.0
#: Seconds node 0's agent waits, after its final decision, for the others to read it.
ACK_S = 5.0
#: Seconds between looks at the store while an agent waits.
POLL_S = 0.05
#: A record's most bytes.
MAX_RECORD_BYTES = 2048
_HOW = re.compile(r"[A-Za-z0-9 ]{1,60}")
_DECISIONS = ("done", "restart", "stop")


def _load(raw: bytes | None, limit: int) -> object:
    """Return the JSON value of `raw`, None if absent, longer than `limit` bytes or no JSON."""
    if raw is None or len(raw) > limit:
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: 1000 nested brackets fit the limit
        return None


class StoreLostError(Exception):
    """Node 0's agent's store stopped answering: the agent died or was killed."""


@dataclass(frozen=True)
class Failure:
    """How one attempt failed on one node, as its agent records it for the others.

    Attributes:
        attempt: The attempt (``TORCHELASTIC_RESTART_COUNT``).
        node: The node's index.
        rank: The global rank that failed, -1 for the agent itself (a stopping signal).
        host: The node's host name.
        status: The exit status the job ends with if it is not restarted (128+N for signal N).
        how: ``exited with status 1``, ``was killed by SIGKILL``, ``received SIGTERM``.
        kind: One of `KINDS`.
        what: The rank's exception, ``Type: message`` (empty when it reported none).
        at: When it failed (``time.time()``): its report's time, else when its agent saw it.
    """

    attempt: int
    node: int
    rank: int
    host: str
    status: int
    how: str
    kind: str
    what: str = ""
    at: float = 0.0

    @classmethod
    def of_rank(
        cls,
        attempt: int,
        node: int,
        rank: int,
        host: str,
        status: int,
        how: str,
        report: Report | None,
        signalled: bool,
    ) -> Failure:
        """Return the failure of a rank that ended with `status`, from its own report if any.

        A rank killed by a stopping signal (`signalled`) that nobody here sent was stopped from
        outside; any other signal (SIGKILL of the OOM killer, SIGSEGV) is a crash, retried.
        """
        if report is not None:
            return cls(attempt, node, rank, host, status, how, report.kind, report.what, report.at)
        kind = "stopped" if signalled else "crashed"
        return cls(attempt, node, rank, host, status, how, kind, "", time.time())

    def cause_order(self) -> tuple[int, float]:
        """Sort key of the failures of one attempt, the cause first.

        A rank killed by a signal comes first (a peer's failure makes a rank raise, not die by a
        signal), then the earliest: the ranks a failure breaks fail after it.
        """
        return (0 if self.kind == "crashed" else 1, self.at)

    @property
    def retried(self) -> bool:
        """Return whether another attempt could end otherwise."""
        return KINDS[self.kind]

    def describe(self) -> str:
        """Return ``rank 3 on node-b exited with status 1 (ValueError: boom)``."""
        who = f"rank {self.rank}" if self.rank >= 0 else f"the agent of node {self.node}"
        return f"{who} on {self.host} {self.how}" + (f" ({self.what})" if self.what else "")

    def encode(self) -> bytes:
        """Return the record as the store holds it."""
        return json.dumps(asdict(self), ensure_ascii=True).encode()[:MAX_RECORD_BYTES]

    @classmethod
    def parse(cls, raw: bytes | None) -> Failure | None:
        """Return the record in `raw`, None if absent or not a well-formed record."""
        return cls.checked(_load(raw, MAX_RECORD_BYTES))

    @classmethod
    def checked(cls, fields: object) -> Failure | None:
        """Return the record of decoded JSON `fields`, None unless every field is well formed."""
        if not isinstance(fields, dict) or set(fields) != set(cls.__dataclass_fields__):
            return None
        numbers = ("attempt", "node", "rank", "status")
        if not all(type(fields[name]) is int for name in numbers):
            return None
        if type(fields["at"]) is not float or not 0 <= fields["at"] < 1e11:
            return None
        valid = (
            fields["attempt"] >= 0
            and fields["node"] >= 0
            and fields["rank"] >= -1
            and 0 <= fields["status"] <= 255
            and matches("hostname", fields["host"])
            and isinstance(fields["how"], str)
            and _HOW.fullmatch(fields["how"]) is not None
            and fields["kind"] in KINDS
            and isinstance(fields["what"], str)
            and len(fields["what"]) <= 300
            and fields["what"].isprintable()
        )
        return cls(**fields) if valid else None


@dataclass(frozen=True)
class Decision:
    """Node 0's decision at the end of an attempt.

    Attributes:
        action: ``done`` (every rank succeeded), ``restart`` or ``stop``.
        failure: The attempt's first failure (None when done).
        reason: Why not restarted (``stop``), empty otherwise.
    """

    action: str
    failure: Failure | None
    reason: str = ""

    @property
    def status(self) -> int:
        """Return the exit status of a job that ends here (the failing rank's, 0 when done)."""
        if self.failure is None:
            return 0
        return self.failure.status or 1

    def encode(self) -> bytes:
        """Return the decision as the store holds it."""
        failure = None if self.failure is None else asdict(self.failure)
        record = {"action": self.action, "failure": failure, "reason": self.reason}
        return json.dumps(record, ensure_ascii=True).encode()

    @classmethod
    def parse(cls, raw: bytes | None) -> Decision | None:
        """Return the decision in `raw`, None if absent or not a well-formed one."""
        fields = _load(raw, 2 * MAX_RECORD_BYTES)
        if not isinstance(fields, dict) or fields.get("action") not in _DECISIONS:
            return None
        reason = fields.get("reason")
        if not isinstance(reason, str) or len(reason) > 300 or not reason.isprintable():
            return None
        failure = None
        if fields.get("failure") is not None:
            failure = Failure.checked(fields["failure"])
            if failure is None:
                return None
        if (failure is None) != (fields["action"] == "done"):
            return None
        return cls(fields["action"], failure, reason)


class Agents:
    """One agent's view of the agents' agreement, over node 0's store.

    Args:
        store: Node 0's agent's TCPStore (hosted there, reached from the others).
        run_id: The run's identity (``--run-id``, the scheduler's job step).
        nnodes: The number of nodes (agents).
        node: This agent's node index.
        host: This node's host name, for its records.
    """

    def __init__(self, store: Any, run_id: str, nnodes: int, node: int, host: str) -> None:
        self.store, self.nnodes, self.node, self.host = store, nnodes, node, host
        self.prefix = f"distenv-agents/{run_id}"
        self._beat_at = 0.0
        self._heard: dict[int, tuple[int, float]] = {}

    def _key(self, *parts: object) -> str:
        return "/".join((self.prefix, *map(str, parts)))

    def _call(self, operation: Callable[[], Any]) -> Any:
        try:
            return operation()
        except RuntimeError as exc:  # torch's DistError: the server is gone
            raise StoreLostError(
                str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            ) from None

    def _peek(self, *parts: object) -> bytes | None:
        key = self._key(*parts)
        value: bytes | None = self._call(lambda: peek(self.store, key))
        return value

    def _add(self, amount: int, *parts: object) -> int:
        key = self._key(*parts)
        return int(self._call(lambda: self.store.add(key, amount)))

    def _set(self, value: str | bytes, *parts: object) -> None:
        key = self._key(*parts)
        self._call(lambda: self.store.set(key, value))

    def beat(self) -> None:
        """Tell node 0's agent this agent is alive (at most once per `BEAT_S`)."""
        now = time.monotonic()
        if now >= self._beat_at:
            self._beat_at = now + BEAT_S
            self._add(1, "alive", self.node)

    def join(self, attempt: int, deadline: Deadline, stopped: Callable[[], bool]) -> bool:
        """Arrive at attempt `attempt` and return True once every agent has; False if `stopped`.

        Raises:
            RendezvousTimeoutError: At `deadline`, naming the nodes whose agents did not arrive.
            StoreLostError: If node 0's store stops answering.
        """
        self._set(self.host, "join", attempt, self.node)
        self._add(1, "join", attempt)
        while not stopped():
            arrived = self._add(0, "join", attempt)
            if arrived >= self.nnodes:
                return True
            if deadline.passed():
                missing = [
                    node for node in range(self.nnodes) if self._peek("join", attempt, node) is None
                ]
                raise RendezvousTimeoutError(
                    "run",
                    f"attempt {attempt}: the agents of {len(missing)} of {self.nnodes} nodes did "
                    f"not arrive within {deadline.seconds:g} s: node "
                    + ", ".join(map(str, missing)),
                    hint="start one distenv run per node, each with the same --nnodes, "
                    "--master-addr, --master-port and --run-id (srun does this for you); raise "
                    "the limit with DISTENV_TIMEOUT",
                )
            self.beat()
            time.sleep(POLL_S)
        return False

    def first_failure(self, attempt: int) -> Failure | None:
        """Return the attempt's first recorded failure, if any (one round trip)."""
        return Failure.parse(self._peek("failed", attempt))

    def record(self, failure: Failure) -> None:
        """Record a node's failure of its attempt; the first in the job becomes the attempt's."""
        value = failure.encode()
        self._set(value, "failed", failure.attempt, failure.node)
        key = self._key("failed", failure.attempt)
        self._call(lambda: self.store.compare_set(key, "", value))

    def over(self, attempt: int) -> None:
        """Record that this node's ranks of `attempt` have all ended."""
        self._set("1", "over", attempt, self.node)

    def _silent(self, node: int) -> bool:
        """Return whether `node`'s agent has not beaten for `AGENT_SILENCE_S`."""
        count = self._add(0, "alive", node)
        now = time.monotonic()
        last = self._heard.get(node)
        if last is None or last[0] != count:
            self._heard[node] = (count, now)
            return False
        return now - last[1] > AGENT_SILENCE_S

    def silent(self, attempt: int, nodes: Iterable[int]) -> Failure | None:
        """Return, and record, the failure of the first of `nodes` whose agent went silent.

        Node 0's agent asks while the ranks run and while it waits for the attempt's end: a node
        whose agent died (its ranks die with it) never says it is over.
        """
        silent = [node for node in sorted(nodes) if node != self.node and self._silent(node)]
        if not silent:
            return None
        raw = self._peek("join", attempt, silent[0])
        host = raw.decode("ascii", "replace") if raw is not None else ""
        host = host if matches("hostname", host) else "its host"
        gone = Failure(
            attempt, silent[0], -1, host, 1, "stopped answering", "agent", "", time.time()
        )
        self.record(gone)
        return gone

    def decide(self, attempt: int, max_restarts: int) -> Decision:
        """Wait until every node is over, then decide the attempt's end (node 0's agent only)."""
        waiting = set(range(self.nnodes))
        while waiting:
            waiting = {node for node in waiting if self._peek("over", attempt, node) is None}
            if self.silent(attempt, waiting) is not None:
                break
            if waiting:
                self.beat()
                time.sleep(POLL_S)
        failures = [
            Failure.parse(self._peek("failed", attempt, node)) for node in range(self.nnodes)
        ]
        recorded = [f for f in failures if f is not None]
        first = min(recorded, key=Failure.cause_order) if recorded else self.first_failure(attempt)
        if first is None:
            decision = Decision("done", None)
        else:
            refused = [f for f in recorded if not f.retried]
            if refused or not first.retried:
                cause = first if not first.retried else refused[0]
                decision = Decision("stop", first, WHY_NOT[cause.kind])
            elif attempt >= max_restarts:
                spent = f"all {max_restarts} restart{'s' * (max_restarts != 1)} spent"
                decision = Decision("stop", first, spent if max_restarts else "no restarts allowed")
            else:
                decision = Decision("restart", first)
        self._set(decision.encode(), "decision", attempt)
        if decision.action != "restart":
            # The store ends with this agent: let the others read the decision first (those whose
            # agent went silent never will).
            gone = {f.node for f in recorded if f.kind == "agent"}
            deadline = Deadline.after(ACK_S)
            while not deadline.passed():
                read = self._add(0, "read", attempt)
                if read >= self.nnodes - 1 - len(gone):
                    break
                time.sleep(POLL_S)
        return decision

    def decision(self, attempt: int, limit: float | None = None) -> Decision | None:
        """Wait for node 0's agent's decision on `attempt` (every other node's agent).

        With `limit`, give up after that many seconds and return None.
        """
        deadline = None if limit is None else Deadline.after(limit)
        while deadline is None or not deadline.passed():
            raw = self._peek("decision", attempt)
            decision = Decision.parse(raw)
            if decision is not None:
                self._add(1, "read", attempt)
                return decision
            self.beat()
            time.sleep(POLL_S)
        return None
