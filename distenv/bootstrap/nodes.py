"""The node leaders' channels: a leader speaks to rank 0's store for its node, a member to its leader.

Where node leaders batch the bootstrap (`distenv.bootstrap.role.Role`), the node's local rank 0
gathers its members' check-ins over the node's socket, reports them as one `Batch`, reads rank
0's verdict once and hands it on (`LeaderChannel`); a member checks in through it and reaches
rank 0's store only for the process group (`MemberChannel`). The group-up check goes the same
way: the leader reports its node's tokens as one `UpBatch`, rank 0 echoes them to the leader, the
leader each member's to it; where the backend proves the group, the leader hands rank 0's release
on to its members instead. `open_channel` chooses the channel once, from the rank's role.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from distenv.bootstrap.batches import Batch, UpBatch, parse_up_batches, shard_key, shard_keys
from distenv.bootstrap.channel import (
    NODE_UNACKNOWLEDGED,
    Channel,
    Reached,
    absent,
    check_release,
    forged_echo,
    late,
)
from distenv.bootstrap.flat import FLAT, StoreChannel, parse_for, with_place
from distenv.bootstrap.gather import gather_batches
from distenv.bootstrap.leaders import SLACK_S, Link, NodeListener
from distenv.bootstrap.limits import ensure_descriptors
from distenv.bootstrap.paths import probed_backends
from distenv.bootstrap.protocol import ACK, ALL, CLOSED, COUNT, CUT, UP, WRITTEN, Message
from distenv.bootstrap.records import MAX_SHOWN, CheckIn
from distenv.bootstrap.role import Role
from distenv.bootstrap.scope import ScopeCheck
from distenv.bootstrap.session import FOREIGN_HINT, Bootstrap, Session
from distenv.bootstrap.store import connect_store
from distenv.bootstrap.verdict import Verdict
from distenv.bootstrap.waits import (
    count_to,
    read_many,
    wait_counted,
    wait_value,
    write_many,
)
from distenv.deadline import Deadline
from distenv.errors import DistEnvError, RendezvousError, RendezvousTimeoutError
from distenv.rankinfo import RankInfo
from distenv.timing import VERDICT_GRACE_S

__all__ = ["LeaderChannel", "MemberChannel", "check_in_batch", "open_channel"]


def open_channel(role: Role | None, info: RankInfo) -> Channel:
    """Return the channel of a rank of `role` (None: the flat roll call).

    A leader opens its node's socket at once: its members connect as soon as they start.
    """
    if role is None:
        return FLAT
    return LeaderChannel(role, info) if role.leader else MemberChannel(role)


class LeaderChannel(StoreChannel):
    """A node's leader: its node's socket (`NodeListener`), and its node's reports to rank 0."""

    def __init__(self, role: Role, info: RankInfo) -> None:
        self.node = NodeListener(role, info)
        self.members = int(info.local_world_size or 1) - 1
        self.tokens: dict[int, str] = {}

    def backends(self, info: RankInfo, backend: str) -> tuple[str, ...]:
        return probed_backends(info, backend, batched=True)

    def check_in(self, boot: Bootstrap, store: Any, checkin: CheckIn) -> bytes | None:
        info, timeout = boot.session.info, boot.timeout
        # Reported before rank 0 stops waiting, so that it names a missing member with its node.
        slack = min(SLACK_S, timeout / 4)
        deadline = boot.waits.within(timeout - slack)
        batch = Batch(info.rank, self.node.gather(checkin, info.local_world_size or 1, deadline))
        return check_in_batch(store, batch)

    def gather(self, boot: Bootstrap, store: Any, checkin: CheckIn) -> tuple[Verdict, int]:
        info = boot.session.info
        return gather_batches(store, info, checkin.scope, boot.waits.within(boot.timeout))

    def place_readers(self, verdict: Verdict) -> list[CheckIn]:
        return [c for c in verdict.checkins if c.local_rank == 0]

    def holds_key(self, held: bytes | None) -> bool:
        return False  # a batch holds no key of its own rank

    def hand_on(self, boot: Bootstrap, line: str) -> None:
        self.node.answer(line, boot.waits)

    def hand_release(self, boot: Bootstrap, line: str) -> None:
        self.node.tell(line, boot.waits)

    def report_up(self, boot: Bootstrap, token: str) -> str:
        session = boot.session
        info, keys = session.info, session.keys(UP)
        slack = min(SLACK_S, boot.timeout / 4)
        tokens, gone, silent = self.node.collect_up(boot.waits.sooner(slack))
        tokens[info.rank] = token
        self.tokens = tokens
        up = UpBatch(info.rank, tuple(sorted(tokens.items())), tuple(gone), tuple(silent))
        # Appended before it is counted: rank 0 reads the reports once the count is complete.
        session.store.append(f"{keys}/{shard_key(info.rank)}", up.to_line())
        count_to(
            session.store, f"{keys}/{COUNT.name}", up.ranks, info.world_size, f"{keys}/{ALL.name}"
        )
        return up.echo()

    def acknowledge(
        self, boot: Bootstrap, hosts: Mapping[int, str], missing: Callable[[], DistEnvError]
    ) -> None:
        """Rank 0: once every node's report is in, echo each node's tokens under its leader's
        key, then its own members'; name the ranks that did not come up."""
        session = boot.session
        info, store, world = session.info, session.store, session.info.world_size
        keys = session.keys(UP)
        count = wait_counted(store, f"{keys}/{COUNT.name}", world, f"{keys}/{ALL.name}", boot.waits)
        shards = [f"{keys}/{key}" for key in shard_keys(world)]
        reports: list[UpBatch] = []
        foreign = 0
        for key, raw in zip(shards, read_many(store, shards), strict=True):
            found, bad = parse_up_batches(key, raw, world_size=world)
            reports += found
            foreign += bad
        up = {rank for report in reports for rank, _ in report.tokens}
        accounted = sum(report.ranks for report in reports)
        if foreign or count > accounted:
            raise RendezvousError(
                info.launcher,
                f"rank 0 of {world}: the group-up reports in the store at {session.master} hold "
                f"{foreign} line(s) this job's leaders did not write, or a count ({count}) past "
                f"the ranks they report ({accounted}): a process outside this job wrote to them",
                hint=FOREIGN_HINT,
            )
        if len(up) < world:
            raise _not_up(info, reports, up, hosts, boot.deadline.seconds)
        write_many(store, [(f"{keys}/{ACK.of(r.leader)}", r.echo()) for r in reports if r.leader])
        self.node.acknowledge(self.tokens, boot.waits)

    def await_ack(self, boot: Bootstrap, echo: str, missing: Callable[[], DistEnvError]) -> None:
        session = boot.session
        key = f"{session.keys(UP)}/{ACK.of(session.info.rank)}"
        found = wait_value(session.store, key, boot.waits)
        if found is None:
            raise missing()
        if found != echo.encode():
            raise forged_echo(session)
        self.node.acknowledge(self.tokens, boot.waits)

    def unacknowledged(self, session: Session, hosts: Mapping[int, str], by: Deadline) -> str:
        if session.info.rank == 0:
            return absent(session, "up", hosts, by)
        return NODE_UNACKNOWLEDGED

    def close(self) -> None:
        self.node.close()


class MemberChannel(Channel):
    """A node's member: its check-in, the verdict and the group-up echo go through its leader.

    It reaches rank 0's store only for the process group (`connect_for_group`).
    """

    def __init__(self, role: Role) -> None:
        self.role = role
        self.link: Link | None = None

    def _link(self) -> Link:
        assert self.link is not None, "the member reaches its leader first"
        return self.link

    def reach(self, boot: Bootstrap, checkin: CheckIn, phase: str) -> Reached:
        info, timeout = boot.session.info, boot.timeout
        ensure_descriptors(info, checkin.backend, hosts_store=False, probes=False)
        self.link = Link.connect(self.role, info, boot.waits.within(timeout))
        boot.enter("the roll call (through its node's leader)", boot.deadline, self._silent(boot))
        return Reached(None, checkin)

    def _silent(self, boot: Bootstrap) -> Callable[[], DistEnvError]:
        info, link = boot.session.info, self._link()

        def silent() -> DistEnvError:
            return RendezvousTimeoutError(
                info.launcher,
                f"{info.who} checked in with its node's leader (pid "
                f"{link.leader_pid}) but received no verdict within {boot.deadline.seconds:g} s",
                hint="the leader may be stopped (SIGSTOP, a debugger) or cannot reach rank 0's "
                "store: its log says which",
            )

        return silent

    def check_in(self, boot: Bootstrap, store: Any, checkin: CheckIn) -> bytes | None:
        link = self._link()
        if not link.send(Message.CHECKIN.encode(checkin.to_json()), boot.waits):
            raise link.gone()
        return None

    def await_verdict(
        self,
        boot: Bootstrap,
        store: Any,
        checkin: CheckIn,
        scope_check: ScopeCheck | None,
        held: bytes | None,
    ) -> tuple[Verdict, bytes, bytes | None]:
        info, timeout, link = boot.session.info, boot.timeout, self._link()
        line = link.receive(boot.waits.within(timeout + VERDICT_GRACE_S))
        if line is None:
            raise self._silent(boot)()
        kind, tag, rest = Message.decode(line)
        if kind is Message.LATE:
            raise late(info, checkin, timeout, "its node's leader had reported the node")
        if kind is not Message.VERDICT:
            raise RendezvousError(
                info.launcher,
                f"{info.who}: its node's leader (pid "
                f"{link.leader_pid}) refused its check-in ({tag!r}): it belongs to another job "
                "or world",
                hint="two jobs share this node's socket name: give each job its own "
                "MASTER_PORT, or export DISTENV_NODE_LEADERS=off",
            )
        raw, _, place = rest.partition("\t")
        verdict, placed = parse_for(info, checkin, raw.encode(), holds_key=False)
        if placed:
            verdict = with_place(info, checkin, verdict, place.encode() or None)
        return verdict, raw.encode(), place.encode() or None

    def count_read(self, store: Any) -> None:
        """Nothing: rank 0 counts the leaders that read, and the leader has."""

    def connect_for_group(self, boot: Bootstrap) -> None:
        session = boot.session
        session.store = connect_store(
            session.info,
            boot.watch,
            boot.waits,
            agent_store=session.agent_store,
            master_from=session.master_from,
        )

    def report_up(self, boot: Bootstrap, token: str) -> str:
        link = self._link()
        if not link.send(Message.UP.encode(token), boot.waits):
            raise link.gone()
        return Message.ACK.encode(token)

    def await_ack(self, boot: Bootstrap, echo: str, missing: Callable[[], DistEnvError]) -> None:
        line = self._link().receive(boot.waits)
        if line is None:
            raise missing()
        if line != echo:
            raise forged_echo(boot.session)

    def await_release(
        self, boot: Bootstrap, value: str, missing: Callable[[], DistEnvError]
    ) -> None:
        line = self._link().receive(boot.waits)
        found = None
        if line is not None:
            kind, _, rest = Message.decode(line)
            found = rest.encode() if kind is Message.RELEASE else b"-"
        check_release(boot.session, found, value, missing)

    def unacknowledged(self, session: Session, hosts: Mapping[int, str], by: Deadline) -> str:
        return NODE_UNACKNOWLEDGED

    def close(self) -> None:
        if self.link is not None:
            self.link.close()


def check_in_batch(store: Any, batch: Batch) -> bytes | None:
    """Count a node's ranks in, then append their batch; return `CLOSED` if rank 0 stopped
    waiting first (nothing is written then), else None.

    Counted first: a count past `CUT` says rank 0 has made its cut
    (`distenv.bootstrap.gather.gather_batches`), and rank 0 waits for the batches of every count
    it saw before the cut.
    """
    world = batch.checkins[0].world_size
    if count_to(store, WRITTEN.name, len(batch.checkins), world, ALL.name) >= CUT:
        return CLOSED
    store.append(shard_key(batch.leader), batch.to_line())
    return None


def _not_up(
    info: RankInfo, reports: list[UpBatch], up: set[int], hosts: Mapping[int, str], seconds: float
) -> DistEnvError:
    """Return rank 0's error naming the ranks its nodes' leaders did not report up."""
    gone = {rank for report in reports for rank in report.gone}
    silent = {rank for report in reports for rank in report.late}
    missing = [rank for rank in range(info.world_size) if rank not in up]
    parts = []
    for rank in missing[:MAX_SHOWN]:
        where = f" on {hosts[rank]!r}" if rank in hosts else ""
        if rank in gone:
            why = "its connection to its node's leader closed before it came up: died or killed?"
        elif rank in silent:
            why = "had not come up when its node's leader reported"
        else:
            why = "its node's leader never reported: the leader died or was stopped?"
        parts.append(f"rank {rank}{where} ({why})")
    more = f" and {len(missing) - MAX_SHOWN} more" if len(missing) > MAX_SHOWN else ""
    return RendezvousTimeoutError(
        info.launcher,
        f"rank 0 of {info.world_size}: the process group did not come up on every rank within "
        f"{seconds:g} s: " + ", ".join(parts) + more,
        hint="a rank died or was stopped (SIGSTOP, a debugger, an overloaded node) after "
        "joining; its log (or the launcher's exit codes) says why",
    )
