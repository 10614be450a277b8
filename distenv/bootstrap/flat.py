"""The flat roll call's channel: every rank a client of rank 0's store, and what store-side channels share.

`StoreChannel` reaches rank 0's store (probing the network path where the job may span hosts,
`distenv.bootstrap.paths`) and reads the verdict from it, for a flat rank and a node's leader
alike; `FlatChannel` checks each rank in under its own key (`check_in`), lets rank 0 gather them
(`distenv.bootstrap.gather.gather_checkins`) and echoes each rank's group-up token to it. Rank 0
publishes its verdict (`publish`) whatever its channel.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from distenv.bootstrap.channel import Channel, Reached, absent, forged_echo, refused_group
from distenv.bootstrap.gather import gather_checkins
from distenv.bootstrap.guard import await_release, extra_claims, refuse, release
from distenv.bootstrap.limits import ensure_descriptors
from distenv.bootstrap.paths import dial, offer, predict, probed_backends
from distenv.bootstrap.protocol import (
    ACK,
    ALL,
    CHECKIN,
    CLOSED,
    COLLIDED,
    COUNT,
    EXTRA,
    EXTRAS,
    PLACE,
    SEEN,
    UP,
    VERDICT,
    WRITTEN,
    scope_key,
)
from distenv.bootstrap.records import CheckIn, ForeignRecordError, parse_scope
from distenv.bootstrap.scope import ScopeCheck
from distenv.bootstrap.session import FOREIGN_HINT, Bootstrap, Session
from distenv.bootstrap.store import connect_store
from distenv.bootstrap.verdict import Verdict, parse_place, parse_verdict
from distenv.bootstrap.waits import count_to, wait_count, wait_counted, wait_value, write_many
from distenv.deadline import bounded
from distenv.errors import DistEnvError, RendezvousError, RendezvousTimeoutError
from distenv.rankinfo import RankInfo
from distenv.timing import COLLISION_PEEK_S, VERDICT_GRACE_S

__all__ = [
    "FLAT",
    "FlatChannel",
    "StoreChannel",
    "channel_of",
    "check_in",
    "parse_for",
    "publish",
    "read_verdict",
    "with_place",
]


class StoreChannel(Channel):
    """A channel whose rank is a client of rank 0's store in the roll call (flat, or a leader)."""

    def backends(self, info: RankInfo, backend: str) -> tuple[str, ...]:
        """Return the backends whose network path this rank's roll call probes."""
        return probed_backends(info, backend)

    def reach(self, boot: Bootstrap, checkin: CheckIn, phase: str) -> Reached:
        session = boot.session
        info = session.info
        backends = self.backends(info, checkin.backend)
        prediction = predict(info, backends) if backends else None
        ensure_descriptors(
            info,
            checkin.backend,
            hosts_store=info.rank == 0 and not session.agent_store,
            probes=info.rank == 0 and bool(backends),
            members=self.members,
        )
        try:
            session.store = connect_store(
                info,
                boot.watch,
                boot.waits.within(boot.timeout),
                agent_store=session.agent_store,
                master_from=session.master_from,
            )
        except DistEnvError as exc:
            # The port is taken (the one plain DistEnvError naming MASTER_PORT that rank 0's
            # store raises): by another rank 0 of this job's identity, perhaps.
            if type(exc) is DistEnvError and exc.variable == "MASTER_PORT" and info.rank == 0:
                raise second_rank0(boot, checkin, phase, exc) from None
            raise

        def stalled() -> DistEnvError:
            return RendezvousTimeoutError(
                info.launcher,
                f"{info.who}: rank 0's store at {checkin.master} "
                f"stopped answering during the roll call (no reply within "
                f"{boot.deadline.seconds:g} s of the start)",
                hint="rank 0 may be stopped (SIGSTOP, a debugger) or its node overloaded; check "
                "its log and state",
            )

        boot.enter("the roll call", boot.deadline, stalled)
        listener, scope_check = None, None
        try:
            with session.losing("during the roll call"):
                if info.rank == 0:
                    if prediction is not None:
                        listener, checkin = offer(prediction, checkin, None)
                    session.claim(checkin.hostname, checkin.net)
                else:
                    scope_check = session.check(boot.waits.within(boot.timeout), phase)
                    scope_check.poll()  # another job's store: refused before writing anything
                    if prediction is not None:
                        # Rank 0's node's addresses are in its claim: dial them before checking
                        # in.
                        scope_check.wait()
                        net0 = scope_check.net0
                        if net0 is not None and scope_check.host0 != checkin.hostname:
                            listener, checkin = offer(prediction, checkin, dial(net0))
        except BaseException:
            if listener is not None:
                listener.close()
            raise
        close = (lambda: None) if listener is None else listener.close
        return Reached(session.scoped(phase), checkin, scope_check, close)

    def await_verdict(
        self,
        boot: Bootstrap,
        store: Any,
        checkin: CheckIn,
        scope_check: ScopeCheck | None,
        held: bytes | None,
    ) -> tuple[Verdict, bytes, bytes | None]:
        # A batch can be spoiled by a forger's fragment after it was written (rank 0 then names
        # its ranks missing, beside the foreign line): only a rank's own key proves it arrived.
        return read_verdict(store, boot, checkin, scope_check, holds_key=self.holds_key(held))

    def holds_key(self, held: bytes | None) -> bool:
        """Return whether this rank's check-in holds a key of its own (`held`: `check_in`'s)."""
        return held is None

    def release(self, boot: Bootstrap, value: str) -> None:
        release(boot, value, self.hand_release)

    def await_release(
        self, boot: Bootstrap, value: str, missing: Callable[[], DistEnvError]
    ) -> None:
        await_release(boot, value, missing, self.hand_release)

    def hand_release(self, boot: Bootstrap, line: str) -> None:
        """Hand rank 0's release (a `Message.RELEASE` line) on to those this rank speaks for:
        nobody but for a leader (`distenv.bootstrap.nodes.LeaderChannel` overrides)."""


class FlatChannel(StoreChannel):
    """Every rank a client of rank 0's store: its own check-in, its own verdict read and ack."""

    def check_in(self, boot: Bootstrap, store: Any, checkin: CheckIn) -> bytes | None:
        return check_in(store, checkin)

    def await_verdict(
        self,
        boot: Bootstrap,
        store: Any,
        checkin: CheckIn,
        scope_check: ScopeCheck | None,
        held: bytes | None,
    ) -> tuple[Verdict, bytes, bytes | None]:
        """Return rank 0's verdict; refuse a positive one where this rank lost its key.

        A process that found its rank's key taken filed an extra claim: a positive verdict did
        not count it (rank 0 names every claimer), so the group rank 0 forms is another
        process's: a second job of this identity, whose rank 0 learns of the extra claim before
        it acknowledges the group (`acknowledge`).
        """
        found = super().await_verdict(boot, store, checkin, scope_check, held)
        if held is not None and found[0].ok:
            raise boot.session.collided(
                f"another process claimed rank {checkin.rank} before this one, and rank 0's "
                "verdict does not count this one"
            )
        return found

    def gather(self, boot: Bootstrap, store: Any, checkin: CheckIn) -> tuple[Verdict, int]:
        info = boot.session.info
        verdict = gather_checkins(store, info, checkin.scope, boot.waits.within(boot.timeout))
        return verdict, len(verdict.checkins) - 1

    def report_up(self, boot: Bootstrap, token: str) -> str:
        session = boot.session
        session.mark("up", token=token)
        keys, world = session.keys(UP), session.info.world_size
        count_to(session.store, f"{keys}/{COUNT.name}", 1, world, f"{keys}/{ALL.name}")
        return token

    def acknowledge(
        self, boot: Bootstrap, hosts: Mapping[int, str], missing: Callable[[], DistEnvError]
    ) -> None:
        """Rank 0: once every rank's record says up, echo each rank's token under its own key.

        Rank 0 waits in the store for the word of the rank that completed the count (`ALL`),
        then reads the count and the records as it would have after polling the count.
        """
        session = boot.session
        info, store, world = session.info, session.store, session.info.world_size
        keys = session.keys(UP)
        count = wait_counted(store, f"{keys}/{COUNT.name}", world, f"{keys}/{ALL.name}", boot.waits)
        tokens = session.up_tokens(range(world))
        up = [rank for rank, token in tokens.items() if token is not None]
        if len(up) < world and count < world:
            raise missing()
        if len(up) < world or count > world:
            raise RendezvousError(
                info.launcher,
                f"rank 0 of {world}: the group-up count in the store at {session.master} reads "
                f"{count} while {len(up)} of {world} ranks have recorded themselves up: a "
                "process outside this job wrote to it; not up yet: "
                f"{absent(session, 'up', hosts, boot.deadline) if len(up) < world else 'none'}",
                hint=FOREIGN_HINT,
            )
        if extra_claims(session):
            write_many(
                store, [(f"{keys}/{ACK.of(rank)}", COLLIDED.decode()) for rank in range(1, world)]
            )
            wait_count(store, f"{keys}/{SEEN.name}", world - 1, boot.waits.within(VERDICT_GRACE_S))
            raise refuse(boot)
        write_many(
            store, [(f"{keys}/{ACK.of(rank)}", str(tokens[rank])) for rank in range(1, world)]
        )

    def await_ack(self, boot: Bootstrap, echo: str, missing: Callable[[], DistEnvError]) -> None:
        session = boot.session
        found = wait_value(
            session.store, f"{session.keys(UP)}/{ACK.of(session.info.rank)}", boot.waits
        )
        if found is None:
            raise missing()
        if found == COLLIDED:
            session.store.add(f"{session.keys(UP)}/{SEEN.name}", 1)
            raise refused_group(session)
        if found != echo.encode():
            raise forged_echo(session)


#: The flat roll call's channel: it holds nothing, so one serves every session.
FLAT = FlatChannel()


def channel_of(session: Session) -> Channel:
    """Return the channel the session's roll call chose (flat where none was chosen: a roll
    call held without `distenv.bootstrap.rollcall.meet`)."""
    channel = session.channel
    return channel if isinstance(channel, Channel) else FLAT


def check_in(store: Any, checkin: CheckIn) -> bytes | None:
    """Write this rank's record under its rank's key (or, if taken, as an extra claim); count it.

    Two round trips: the claim (``compare_set``) and the count, made after the write so that rank 0
    never reads a missing key. A process that finds its rank's key taken (a second claimer, or a
    forger that came first) files its record under ``extra/<n>``, so rank 0 sees both claims.
    Returns None when this rank holds its key, else what holds it (`CLOSED`: rank 0 stopped
    waiting, and nothing is written).
    """
    record = checkin.to_json()
    held = bytes(store.compare_set(CHECKIN.of(checkin.rank), "", record))
    if held == record.encode():
        count_to(store, WRITTEN.name, 1, checkin.world_size, ALL.name)
        return None
    if held != CLOSED:
        store.set(EXTRA.of(int(store.add(EXTRAS.name, 1))), record)
        count_to(store, WRITTEN.name, 1, checkin.world_size, ALL.name)
    return held


def second_rank0(
    boot: Bootstrap, checkin: CheckIn, phase: str, taken: DistEnvError
) -> DistEnvError:
    """Return the error of a rank 0 whose port another rank 0 of this identity holds, after
    claiming its rank there; `taken`, the port's own error, where the port holds no store of
    this job's scope.

    Its check-in, filed beside the other rank 0's (`check_in`), is what tells that one's job:
    two claims of rank 0 in the roll call, or an extra claim found before the group is
    acknowledged. Bounded by `COLLISION_PEEK_S` (and the bootstrap's deadline): a port held by
    anything else answers late or never, and the port's own error is then the one to raise.
    """
    session = boot.session
    peeks = boot.waits.within(COLLISION_PEEK_S)
    boot.enter("a look at the holder of the port", boot.deadline, lambda: taken)

    def peek_and_claim() -> bool:
        session.store = session.connection(max(peeks.left(), 0.1))
        # The other rank 0 claims its scope as soon as it listens.
        claimed = wait_value(session.store, scope_key(session.restart), peeks)
        if claimed is None or parse_scope(scope_key(session.restart), claimed) != session.scope:
            return False
        check_in(session.scoped(phase), checkin)
        return True

    try:
        ours = bounded(peek_and_claim, peeks, TimeoutError)
    except (TimeoutError, RuntimeError, ForeignRecordError):
        ours = False
    finally:
        session.store = None
    if not ours:
        return taken
    return session.collided(
        "another rank 0 of this identity holds its port; this one claimed rank 0 in that "
        "roll call too, so that neither job trains"
    )


def publish(
    store: Any,
    info: RankInfo,
    verdict: Verdict,
    own: CheckIn,
    timeout: float,
    readers: Sequence[CheckIn],
) -> str:
    """Rank 0: write each reader's place (where the verdict places ranks), then the verdict;
    return the verdict as published.

    The others need the outcome and their own place, not every record: a verdict carrying N
    check-ins or N host names, read by N - 1 ranks, would make rank 0's store serve O(N^2) bytes.
    A place is keyed by the rank that reads it (`Channel.place_readers`). The places go first, so
    that a rank that reads a placed verdict finds its own at once.
    """
    if verdict.placed:
        write_many(
            store,
            [
                (PLACE.of(c.rank), place.to_json(verdict.scope))
                for c in readers
                if (place := verdict.place_of(c.hostname)) is not None
            ],
        )
    published = verdict.to_json()
    if store.compare_set(VERDICT.name, "", published) != published.encode():
        said = "; ".join(verdict.describe(timeout)) if not verdict.ok else "all is well"
        raise RendezvousError(
            info.launcher,
            f"rank 0: a process outside this job wrote this job's roll-call verdict in the "
            f"store at {own.master} before rank 0 did; rank 0's own verdict: {said}",
            hint=FOREIGN_HINT,
        )
    return published


def read_verdict(
    store: Any,
    boot: Bootstrap,
    checkin: CheckIn,
    scope_check: ScopeCheck | None,
    *,
    holds_key: bool,
) -> tuple[Verdict, bytes, bytes | None]:
    """Return rank 0's verdict from the store (with this rank's place), and both as read.

    Confirms the scope first where `scope_check` has not yet. A verdict that contradicts what
    this rank knows (`Verdict.contradicts`) is refused as forged.
    """
    info = boot.session.info
    deadline = boot.waits.within(boot.timeout + VERDICT_GRACE_S)
    if scope_check is not None:
        # Rank 0 claims the scope before it gathers: no later than the verdict.
        scope_check.wait()
    raw = wait_value(store, VERDICT.name, deadline)
    if raw is None:
        raise RendezvousTimeoutError(
            info.launcher,
            f"rank {info.rank} checked in at {checkin.master} but rank 0 published no "
            f"verdict within {deadline.seconds:.0f} s",
            hint="rank 0 may have died or be stuck before init_dist; check its log",
        )
    verdict, placed = parse_for(info, checkin, raw, holds_key=holds_key)
    if not placed:
        return verdict, raw, None
    # Written before the verdict: found at the first look unless someone deleted it.
    place = wait_value(store, PLACE.of(info.rank), deadline)
    return with_place(info, checkin, verdict, place), raw, place


def parse_for(
    info: RankInfo, checkin: CheckIn, raw: bytes, *, holds_key: bool
) -> tuple[Verdict, bool]:
    """Return the verdict in `raw`, validated, and whether it places ranks (`with_place`).

    Raises:
        RendezvousError: It was not written by this job's rank 0.
    """
    try:
        verdict, placed = parse_verdict(
            VERDICT.name, raw, scope=checkin.scope, world_size=info.world_size
        )
        why = verdict.contradicts(checkin, holds_key=holds_key)
        if why is not None:
            raise ForeignRecordError(VERDICT.name, why)
    except ForeignRecordError as exc:
        raise RendezvousError(
            info.launcher,
            f"rank {info.rank}: the roll-call verdict in the store at {checkin.master} was not "
            f"written by this job's distenv ({exc.why})",
            hint=FOREIGN_HINT,
        ) from None
    return verdict, placed


def with_place(info: RankInfo, checkin: CheckIn, verdict: Verdict, raw: bytes | None) -> Verdict:
    """Return a verdict that places ranks with this rank's place, read from `raw`.

    Raises:
        RendezvousError: This rank's place is missing or forged.
    """
    try:
        if raw is None:
            raise ForeignRecordError(PLACE.of(info.rank), "absent")
        place = parse_place(
            PLACE.of(info.rank), raw, scope=checkin.scope, world_size=info.world_size
        )
    except ForeignRecordError as exc:
        raise RendezvousError(
            info.launcher,
            f"rank {info.rank}: the verdict in the store at {checkin.master} places the ranks, "
            f"but this rank's place is not this job's rank 0's ({exc.why})",
            hint=FOREIGN_HINT,
        ) from None
    return verdict._replace(place=place)
