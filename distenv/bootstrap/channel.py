"""How one rank reaches rank 0: the `Channel` interface, and the errors every channel names a rank with.

The roll call (`distenv.bootstrap.rollcall`) and the group-up check (`distenv.bootstrap.group`) are
the same phases for every rank: reach rank 0, check in, (rank 0) gather and publish, await the
verdict and hand it on, report up, await the acknowledgement (or, where the backend proves the
group, `distenv.bootstrap.proof`, only await rank 0's release). What varies is the path, and a
`Channel` hides it, chosen once from the rank's `distenv.bootstrap.role.Role`
(`distenv.bootstrap.nodes.open_channel`) and held by the session:

- `distenv.bootstrap.flat.FlatChannel`: every rank is a client of rank 0's store;
- `distenv.bootstrap.nodes.LeaderChannel`: a node's leader speaks to the store for its node;
- `distenv.bootstrap.nodes.MemberChannel`: a member speaks to its leader only.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from distenv.bootstrap.protocol import COLLIDED, READ
from distenv.bootstrap.records import MAX_SHOWN, CheckIn
from distenv.bootstrap.scope import ScopeCheck
from distenv.bootstrap.session import FOREIGN_HINT, Bootstrap, Session
from distenv.bootstrap.verdict import Verdict
from distenv.deadline import Deadline, bounded
from distenv.errors import DistEnvError, RendezvousError, RendezvousTimeoutError
from distenv.rankinfo import RankInfo
from distenv.settings import TIMEOUT_VAR
from distenv.timing import LOOKUP_S

__all__ = [
    "NODE_UNACKNOWLEDGED",
    "Channel",
    "Reached",
    "absent",
    "check_release",
    "forged_echo",
    "forged_release",
    "late",
    "refused_group",
]

# Ranks whose state the others read when the group does not come up: a failure-only cost, bounded.
MAX_LOOKED_UP = 4096
#: What a rank says of its node when rank 0 acknowledged none of its group-up.
NODE_UNACKNOWLEDGED = (
    "rank 0 acknowledged no group-up of this rank's node (rank 0's log names the ranks that did "
    "not come up)"
)


class Reached(NamedTuple):
    """A rank that reached rank 0 (or its node's leader) for the roll call.

    `store` is the roll call's store (None: a member, which has none), `checkin` what this rank
    reports (with what it offers the network probe), `scope_check` the check of the store's
    claim still to finish (a rank other than 0), `close` what ends the probe's listener.
    """

    store: Any
    checkin: CheckIn
    scope_check: ScopeCheck | None = None
    close: Callable[[], None] = lambda: None


class Channel(abc.ABC):
    """The part of the bootstrap that varies with the rank's role: how it reaches rank 0.

    Every method is a step of the roll call or of the group-up check; the phases call them in
    order, and never ask which channel they hold. Rank 0's steps (`gather`, `acknowledge`) are
    not a member's: rank 0 always leads its own node (`distenv.bootstrap.role.Role.of`).
    """

    #: Members whose connections this rank's node socket holds (file descriptors it needs).
    members = 0

    @abc.abstractmethod
    def reach(self, boot: Bootstrap, checkin: CheckIn, phase: str) -> Reached:
        """Reach rank 0 for the roll call held under `phase`; start the phase's watch."""
        raise NotImplementedError

    @abc.abstractmethod
    def check_in(self, boot: Bootstrap, store: Any, checkin: CheckIn) -> bytes | None:
        """Report this rank (and those it speaks for); return `CLOSED` if rank 0 had stopped
        waiting, what holds this rank's key if another claim came first, else None."""
        raise NotImplementedError

    def gather(self, boot: Bootstrap, store: Any, checkin: CheckIn) -> tuple[Verdict, int]:
        """Rank 0: return the verdict on what was reported, and how many ranks will read it."""
        raise NotImplementedError(f"{type(self).__name__} is never rank 0's")

    def place_readers(self, verdict: Verdict) -> list[CheckIn]:
        """Rank 0: return the ranks whose place it writes (they read the verdict themselves)."""
        return list(verdict.checkins)

    @abc.abstractmethod
    def await_verdict(
        self,
        boot: Bootstrap,
        store: Any,
        checkin: CheckIn,
        scope_check: ScopeCheck | None,
        held: bytes | None,
    ) -> tuple[Verdict, bytes, bytes | None]:
        """Return rank 0's verdict (with this rank's place), and both as read."""
        raise NotImplementedError

    def hand_on(self, boot: Bootstrap, line: str) -> None:
        """Hand a node-socket line (`distenv.bootstrap.protocol.Message`) on to those this rank
        speaks for: nobody but for a leader."""
        return  # nobody to hand on to (`distenv.bootstrap.nodes.LeaderChannel` overrides)

    def count_read(self, store: Any) -> None:
        """Tell rank 0 this rank has read a verdict it may exit after (negative, or doctor's)."""
        store.add(READ.name, 1)

    def connect_for_group(self, boot: Bootstrap) -> None:
        """Reach rank 0's store for the process group, where the roll call did not."""
        return  # reached in the roll call (`distenv.bootstrap.nodes.MemberChannel` overrides)

    @abc.abstractmethod
    def report_up(self, boot: Bootstrap, token: str) -> str:
        """Report this rank (and those it speaks for) up with `token`; return the echo that
        rank 0's acknowledgement must hold."""
        raise NotImplementedError

    def acknowledge(
        self, boot: Bootstrap, hosts: Mapping[int, str], missing: Callable[[], DistEnvError]
    ) -> None:
        """Rank 0: once every rank is reported up, acknowledge each; name those that are not."""
        raise NotImplementedError(f"{type(self).__name__} is never rank 0's")

    @abc.abstractmethod
    def await_ack(self, boot: Bootstrap, echo: str, missing: Callable[[], DistEnvError]) -> None:
        """Return once rank 0's acknowledgement of this rank holds `echo`; hand it on."""
        raise NotImplementedError

    def release(self, boot: Bootstrap, value: str) -> None:
        """Rank 0, where the backend proves the group: release it with the verdict's `value`,
        or refuse it (COLLIDED) where a process of this identity claimed a rank since."""
        raise NotImplementedError(f"{type(self).__name__} is never rank 0's")

    @abc.abstractmethod
    def await_release(
        self, boot: Bootstrap, value: str, missing: Callable[[], DistEnvError]
    ) -> None:
        """Return once rank 0 released the group with `value`; hand it on."""
        raise NotImplementedError

    def unacknowledged(self, session: Session, hosts: Mapping[int, str], by: Deadline) -> str:
        """Return whom this rank names when the group-up check was not acknowledged in time,
        having looked by `by`."""
        return absent(session, "up", hosts, by)

    def close(self) -> None:
        """Close what this channel holds open (idempotent)."""
        return  # nothing held open by default


def late(info: RankInfo, checkin: CheckIn, timeout: float, after: str) -> DistEnvError:
    """Return the error of a rank that reached the roll call too late."""
    return RendezvousTimeoutError(
        info.launcher,
        f"{info.who} reached the roll call at {checkin.master} "
        f"after {after} ({timeout:g} s from its own start), or a process outside this job closed "
        "this rank's key",
        hint="start every rank within the rendezvous timeout of rank 0 (raise it with "
        f"rendezvous_timeout= or ${TIMEOUT_VAR}); rank 0's log names every missing rank",
    )


def forged_release(session: Session) -> RendezvousError:
    """Return the error of a group release that is not the value of rank 0's verdict."""
    info = session.info
    return RendezvousError(
        info.launcher,
        f"{info.who}: the release of the process group in the store at {session.master} was "
        "not written by this job's rank 0 (it is not the value rank 0's verdict announced)",
        hint=FOREIGN_HINT,
    )


def refused_group(session: Session) -> RendezvousError:
    """Return the error of a rank whose group rank 0 refused (its acknowledgement or release
    said COLLIDED): a second process of this job's identity."""
    return session.collided(
        "rank 0 found another process of this identity in the roll call after its verdict, "
        "and refused the group"
    )


def check_release(
    session: Session, found: bytes | None, value: str, missing: Callable[[], DistEnvError]
) -> None:
    """Return if `found`, the group's release as read, is the `value` of rank 0's verdict.

    Raises:
        RendezvousTimeoutError: None was found in time (`missing`).
        RendezvousError: Rank 0 refused the group (COLLIDED), or another process wrote it.
    """
    if found is None:
        raise missing()
    if found == COLLIDED:
        raise refused_group(session)
    if not value or found != value.encode():
        raise forged_release(session)


def forged_echo(session: Session) -> RendezvousError:
    """Return the error of a group-up acknowledgement that does not echo this rank's token."""
    info = session.info
    return RendezvousError(
        info.launcher,
        f"{info.who}: the group-up acknowledgement under this "
        f"rank's key in the store at {session.master} was not written by this job's rank 0 "
        "(it does not echo the token this rank just drew)",
        hint=FOREIGN_HINT,
    )


def absent(session: Session, wanted: str, hosts: Mapping[int, str], by: Deadline) -> str:
    """Name the ranks that did not reach `wanted`, with their host and state, for a message.

    `hosts` are the hosts the roll call's check-ins named (rank 0 has them all): a rank that died
    without a word is named with its host from there. The states are read within `LOOKUP_S` and
    by `by` (the bootstrap's deadline, which a message states): rank 0's store itself may be what
    stopped answering.
    """
    ranks = range(min(session.info.world_size, MAX_LOOKED_UP))
    try:
        states = bounded(lambda: session.read_states(ranks), by.within(LOOKUP_S), TimeoutError)
    except RuntimeError:
        return "rank 0's store is gone too (rank 0 died?)"
    except TimeoutError:
        return "rank 0's store does not answer either (rank 0 stopped or its node overloaded?)"
    order = {"joining": 0, "up": 1}
    missing = [
        (rank, state)
        for rank, state in states.items()
        if rank != session.info.rank  # this rank knows where it is: naming itself helps nobody
        and (state is None or order.get(state[0], -1) < order[wanted])
    ]
    parts = []
    for rank, state in missing[:MAX_SHOWN]:
        if state is None:
            where = f" on {hosts[rank]!r}" if rank in hosts else ""
            parts.append(
                f"rank {rank}{where} (checked in, then never got this far: died or stopped?)"
            )
        elif state[0] in ("SIGINT", "SIGTERM"):
            parts.append(f"rank {rank} on {state[1]!r} (stopped by {state[0]})")
        elif state[0] == "failed":
            parts.append(f"rank {rank} on {state[1]!r} (its init_process_group failed)")
        else:
            parts.append(f"rank {rank} on {state[1]!r} (still at {state[0]})")
    more = f" and {len(missing) - MAX_SHOWN} more" if len(missing) > MAX_SHOWN else ""
    if parts:
        return ", ".join(parts) + more
    if wanted == "up":  # rank 0 reads the others' records and acknowledges them
        return "every rank recorded itself up, but rank 0 acknowledged none (rank 0 stopped?)"
    return "no rank could be named"
