"""The roll call: every rank checks in over rank 0's store before the process group exists.

Every rank claims its rank's key with its `CheckIn` (``compare_set``, so a second process claiming
the same rank finds the key taken and files its record as an extra claim: both are seen); rank 0
validates the records (`distenv.bootstrap.verdict`: nothing read from the store is trusted) and publishes a
verdict of structured problems, which every rank renders from its own templates. Where a launcher
named no node layout, the verdict numbers the nodes and counts their ranks (`fill_layout`).

Where the job may span several hosts, the roll call also proves the network path the backends
will take (`distenv.bootstrap.paths`): rank 0's claim offers its node's addresses, each node's
first rank dials them before it checks in and offers its own node's in its check-in, rank 0 dials
those, and the verdict says which nodes move a backend to another interface (`network_exports`)
or refuses the job. No round trip is added: what is offered travels in the claim and the records.

Rank 0 reads N records (in chunks) and every rank reads one verdict: O(N) store traffic, not
O(N^2). A rank other than 0 makes four round trips when nobody is late: peek at the scope, claim
its key, count itself written, peek at the verdict.
"""

from __future__ import annotations

import contextlib
import gc
import os
import socket
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any

from distenv.bootstrap.batches import Batch, parse_batches, shard_key, shard_keys
from distenv.bootstrap.leaders import SLACK_S, Link, NodeListener, Role
from distenv.bootstrap.limits import ensure_descriptors
from distenv.bootstrap.protocol import (
    CHECKIN,
    CLOSED,
    CUT,
    EXTRA,
    EXTRAS,
    PLACE,
    READ,
    VERDICT,
    WRITTEN,
    Message,
)
from distenv.bootstrap.records import (
    MAX_CANDIDATES,
    MAX_SHOWN,
    CheckIn,
    ForeignRecordError,
    NetRecord,
    parse_checkin,
)
from distenv.bootstrap.scope import ScopeCheck
from distenv.bootstrap.session import FOREIGN_HINT, Bootstrap, Session
from distenv.bootstrap.store import (
    CHUNK,
    connect_store,
    pauses,
    read_many,
    wait_count,
    wait_keys,
    wait_value,
)
from distenv.bootstrap.verdict import (
    Verdict,
    host_sizes,
    node_hosts,
    parse_place,
    parse_verdict,
    refusal,
    validate,
)
from distenv.deadline import Deadline, pause
from distenv.device import device_identity
from distenv.errors import DistEnvError, RendezvousError, RendezvousTimeoutError
from distenv.rankinfo import RankInfo
from distenv.settings import TIMEOUT_VAR
from distenv.timing import NET_PROBE_S, VERDICT_GRACE_S

if TYPE_CHECKING:
    from distenv.bootstrap.probe import Listener
    from distenv.netpath import Prediction

__all__ = [
    "check_in",
    "fill_layout",
    "gather_batches",
    "make_checkin",
    "meet",
    "network_exports",
    "probed_backends",
    "roll_call",
]

# Extra claims rank 0 reads: beyond this many, the verdict already says enough.
MAX_EXTRA = 64


def meet(boot: Bootstrap, checkin: CheckIn, phase: str, *, check: bool = True) -> Verdict:
    """Reach rank 0's store, prove it is this job's, and hold the roll call under `phase`.

    Where the job may span hosts, the roll call also probes the network path
    (`probed_backends`): rank 0 offers its node's addresses in its claim, a probing rank dials
    them before it checks in and offers its own, and each listener closes when the roll call ends.
    Where node leaders batch the roll call (`distenv.bootstrap.leaders.Role`), a member hands its
    check-in to its node's leader and reaches rank 0's store only later, for the process group;
    the leader keeps its node's connections in ``boot.session.node`` for the group-up check.
    Runs inside `Bootstrap.run`; leaves the store in ``boot.session.store``.

    Raises:
        StoreTakenError: The store belongs to another job (or to no distenv job).
        RendezvousTimeoutError: The store was not reached, or ranks are missing.
        RendezvousError: The verdict found problems (with `check`), the store went away, or this
            node has no route to the master.
        DistEnvError: Rank 0 cannot listen on the port, or the master does not resolve.
    """
    session = boot.session
    info = session.info
    role = Role.of(info, session.leaders, session.scope, session.restart, checkin.hostname)
    if role is not None and not role.leader:
        return _as_member(boot, checkin, role, check=check)
    # The node's socket first: its members connect as soon as they start.
    node = None if role is None else NodeListener(role, info)
    try:
        verdict = _meet(boot, checkin, phase, node, check=check)
    except BaseException:
        if node is not None:
            node.close()
        raise
    session.node = node
    return verdict


def _meet(
    boot: Bootstrap, checkin: CheckIn, phase: str, node: NodeListener | None, *, check: bool
) -> Verdict:
    """`meet` for rank 0, a rank of a flat roll call, or a node's leader (`node`)."""
    session = boot.session
    info = session.info
    backends = probed_backends(info, checkin.backend, batched=node is not None)
    prediction = _predict(info, backends) if backends else None
    hosts_store = info.rank == 0 and not session.agent_store
    ensure_descriptors(
        info,
        checkin.backend,
        hosts_store=hosts_store,
        probes=info.rank == 0 and bool(backends),
        members=0 if node is None else int(info.local_world_size or 1) - 1,
    )
    session.store = connect_store(
        info,
        boot.watch,
        boot.waits.within(boot.timeout),
        agent_store=session.agent_store,
        master_from=session.master_from,
    )

    def stalled() -> DistEnvError:
        return RendezvousTimeoutError(
            info.launcher,
            f"rank {info.rank} of {info.world_size}: rank 0's store at {checkin.master} stopped "
            f"answering during the roll call (no reply within {boot.deadline.seconds:g} s of the "
            "start)",
            hint="rank 0 may be stopped (SIGSTOP, a debugger) or its node overloaded; check its "
            "log and state",
        )

    boot.enter("the roll call", boot.deadline, stalled)
    listener = None
    try:
        scope_check = None
        if info.rank == 0:
            if prediction is not None:
                listener, checkin = _offer(prediction, checkin, None)
            session.claim(checkin.hostname, checkin.net)
        else:
            scope_check = session.check(boot.waits.within(boot.timeout))
            scope_check.poll()  # another job's store: refused before writing anything
            if prediction is not None:
                # Rank 0's node's addresses are in its claim: dial them before checking in.
                scope_check.wait()
                net0 = scope_check.net0
                if net0 is not None and scope_check.host0 != checkin.hostname:
                    listener, checkin = _offer(prediction, checkin, _dial(net0))
        return roll_call(
            session.scoped(phase), boot, checkin, check=check, scope_check=scope_check, node=node
        )
    except RuntimeError as exc:  # torch's DistError
        raise session.lost("during the roll call", exc) from None
    finally:
        if listener is not None:
            listener.close()


def _as_member(boot: Bootstrap, checkin: CheckIn, role: Role, *, check: bool) -> Verdict:
    """Check in through this node's leader and return the verdict it hands on (or raise it)."""
    session = boot.session
    info, timeout = session.info, boot.timeout
    ensure_descriptors(info, checkin.backend, hosts_store=False, probes=False)
    link = Link.connect(role, info, boot.waits.within(timeout))
    session.node = link

    def silent() -> DistEnvError:
        return RendezvousTimeoutError(
            info.launcher,
            f"rank {info.rank} of {info.world_size} checked in with its node's leader (pid "
            f"{link.leader_pid}) but received no verdict within {boot.deadline.seconds:g} s",
            hint="the leader may be stopped (SIGSTOP, a debugger) or cannot reach rank 0's "
            "store: its log says which",
        )

    boot.enter("the roll call (through its node's leader)", boot.deadline, silent)
    if not link.send(Message.CHECKIN.encode(checkin.to_json()), boot.waits):
        raise link.gone()
    line = link.receive(boot.waits.within(timeout + VERDICT_GRACE_S))
    if line is None:
        raise silent()
    kind, tag, rest = Message.decode(line)
    if kind is Message.LATE:
        raise _late(info, checkin, timeout, "its node's leader had reported the node")
    if kind is not Message.VERDICT:
        raise RendezvousError(
            info.launcher,
            f"rank {info.rank} of {info.world_size}: its node's leader (pid {link.leader_pid}) "
            f"refused its check-in ({tag!r}): it belongs to another job or world",
            hint="two jobs share this node's socket name: give each job its own MASTER_PORT, or "
            "export DISTENV_NODE_LEADERS=off",
        )
    raw, _, place = rest.partition("\t")
    verdict, placed = _read_verdict(info, checkin, raw.encode(), holds_key=False)
    if placed:
        verdict = _placed(info, checkin, verdict, place.encode() or None)
    if check and not verdict.ok:
        raise _negative(info, verdict, timeout)
    return verdict


def probed_backends(info: RankInfo, backend: str, *, batched: bool = False) -> tuple[str, ...]:
    """Return the backends whose network path this rank's roll call probes (none: no probe).

    Only where the job may span hosts (its launcher does not say one node), only on rank 0 and
    each node's first rank (every rank where the launcher names no layout and no leader leads
    the node: `batched`), and never a backend whose path the user chose
    (`distenv.netpath.USER_CHOICE`).
    """
    if info.world_size == 1 or info.num_nodes == 1:
        return ()
    if info.rank != 0 and (info.layout_known or batched) and info.local_rank != 0:
        return ()
    from distenv.netpath import backends_to_probe

    return backends_to_probe(backend, os.environ)


def _predict(info: RankInfo, backends: tuple[str, ...]) -> Prediction:
    """Return this node's candidates for the probe; refuse at once a node with no route at all.

    Raises:
        RendezvousError: The kernel knows no route to the master (ENETUNREACH): this node can
            reach neither rank 0's store nor any rank, however long it waits.
    """
    from distenv.netpath import predict

    master = str(info.master_addr)
    prediction = predict(
        master,
        int(info.master_port or 0),
        backends,
        os.environ,
        limit=MAX_CANDIDATES,
        every_interface=info.rank == 0,
    )
    if prediction.unreachable is not None and info.rank != 0:
        offered = ", ".join(
            c.address + (f" on {c.interface}" if c.interface else "") for c in prediction.candidates
        )
        raise RendezvousError(
            info.launcher,
            f"rank {info.rank} of {info.world_size} on {prediction.hostname!r} has no route to "
            f"the master {master!r} ({prediction.unreachable}); this node's addresses: "
            f"{offered or 'none but loopback'}",
            hint="this node shares no network with rank 0's node: check its interfaces "
            "(`distenv info --network`), or give MASTER_ADDR an address on a network every node "
            "reaches (DISTENV_MASTER_ADDR_FORMAT='{host}-ib' for -ib names)",
            variable="MASTER_ADDR",
            value=master,
        )
    return prediction


def _offer(
    prediction: Prediction, checkin: CheckIn, reached: int | None
) -> tuple[Listener | None, CheckIn]:
    """Listen on this node's candidates; return the listener and `checkin` offering them."""
    if not prediction.defaults:
        return None, checkin
    from distenv.bootstrap.probe import Listener

    token = os.urandom(8).hex()
    listener = Listener([c.address for c in prediction.candidates], token.encode())
    addresses = tuple(
        (c.address, port, c.interface)
        for c, port in zip(prediction.candidates, listener.ports, strict=True)
    )
    net = NetRecord(token, addresses, prediction.defaults, prediction.route, reached)
    return listener, checkin._replace(net=net)


def _dial(net: NetRecord) -> int:
    """Dial each address `net` offers; return the bit mask of those its owner answered on."""
    from distenv.bootstrap.probe import reach

    token = net.token.encode()
    results = reach([(a, port, token) for a, port, _ in net.addresses], NET_PROBE_S)
    return sum(1 << i for i, result in enumerate(results) if result is None)


def _judged(verdict: Verdict, own: CheckIn) -> Verdict:
    """Return rank 0's verdict with the network probe's decisions (`distenv.bootstrap.paths`).

    Imported here: a job on one host never pays for the probe's modules.
    """
    from distenv.bootstrap.paths import judge, targets
    from distenv.bootstrap.probe import reach

    dial = targets(verdict.checkins, own.hostname)
    flat = [
        (address, port, c.net.token.encode())
        for c in dial
        if c.net is not None
        for address, port, _ in c.net.addresses
    ]
    results = reach(flat, NET_PROBE_S) if flat else []
    dialled = []
    start = 0
    for c in dial:
        assert c.net is not None
        dialled.append((c, results[start : start + len(c.net.addresses)]))
        start += len(c.net.addresses)
    switches, problems = judge(verdict.checkins, own, dialled)
    if problems:
        return Verdict(False, tuple(problems), verdict.checkins, verdict.scope)
    return verdict._replace(paths=tuple(switches))


def network_exports(verdict: Verdict, checkin: CheckIn) -> dict[str, str]:
    """Return the variables this rank exports for its node's switches in `verdict`.

    Never a backend whose path the user chose: this rank's own environment is asked again.
    """
    place = verdict.place_of(checkin.hostname)
    if place is None or not place.paths:
        return {}
    from distenv.netpath import backends_to_probe, export

    probed = backends_to_probe(checkin.backend, os.environ)
    return dict(
        export(backend, interface) for backend, interface in place.paths if backend in probed
    )


def roll_call(
    store: Any,
    boot: Bootstrap,
    checkin: CheckIn,
    *,
    check: bool = True,
    scope_check: ScopeCheck | None = None,
    node: NodeListener | None = None,
) -> Verdict:
    """Check in, and on rank 0 gather, validate and publish; return the verdict or raise it.

    Rank 0 waits the rendezvous timeout (``boot.timeout``) for everybody, the others
    `VERDICT_GRACE_S` longer for the verdict; every wait ends by ``boot.waits``. A node's leader
    (`node`) first gathers its members' check-ins, writes them as one batch, and hands the
    verdict (and its node's place) on to them.

    Args:
        store: The store of this job's roll call (``Session.scoped``).
        boot: This rank's bootstrap (its session, timeout and deadline).
        checkin: What this rank reports.
        check: Raise when the verdict is negative (`distenv doctor` passes False to print it).
        scope_check: A rank other than 0 whose scope is not confirmed yet: the wait for the
            verdict confirms it first.
        node: This node's socket, where this rank leads its node.

    Raises:
        StoreTakenError: The scope key names another job (`scope_check`).
        RendezvousTimeoutError: Ranks missing (rank 0), or no verdict arrived (others).
        RendezvousError: The verdict found problems, or was not written by this job's rank 0.
    """
    info, timeout = boot.session.info, boot.timeout
    readers = info.world_size - 1
    if node is None:
        held = check_in(store, checkin)
        if held == CLOSED:
            raise _late(info, checkin, timeout, "rank 0 had stopped waiting for the ranks")
    else:
        # Reported before rank 0 stops waiting, so that it names a missing member with its node.
        slack = min(SLACK_S, timeout / 4)
        batch = Batch(
            info.rank,
            node.gather(checkin, info.local_world_size or 1, boot.waits.within(timeout - slack)),
        )
        held = _check_in_batch(store, batch)
        if held == CLOSED:
            node.answer(Message.LATE.encode(), boot.waits)
            raise _late(info, checkin, timeout, "rank 0 had stopped waiting for the ranks")
    if scope_check is not None:
        scope_check.wrote = True
    if info.rank == 0:
        with _collector_held():
            if node is None:
                verdict = _gather(store, info, checkin.scope, boot.waits.within(timeout))
            else:
                verdict, readers = gather_batches(
                    store, info, checkin.scope, boot.waits.within(timeout)
                )
        if verdict.ok and checkin.net is not None:
            verdict = _judged(verdict, checkin)
        _publish(store, info, verdict, checkin, timeout, batched=node is not None)
        if node is not None:
            place = verdict.place_of(checkin.hostname)
            own = "" if place is None else place.to_json(verdict.scope)
            node.answer(Message.VERDICT.encode(verdict.to_json(), own), boot.waits)
        if not verdict.ok or not check:
            # Rank 0 may exit next (a negative verdict, `distenv doctor`), and its store with
            # it: let the others read first.
            arrived = readers if node is not None else len(verdict.checkins) - 1
            wait_count(store, READ.name, arrived, boot.waits.within(VERDICT_GRACE_S))
    else:
        # A batch can be spoiled by a forger's fragment after it was written (rank 0 then names
        # its ranks missing, beside the foreign line): only a rank's own key proves it arrived.
        verdict, raw, place_raw = _await_verdict(
            store, boot, checkin, scope_check, holds_key=held is None and node is None
        )
        if node is not None:
            node.answer(
                Message.VERDICT.encode(raw.decode(), (place_raw or b"").decode()), boot.waits
            )
        if not verdict.ok or not check:
            store.add(READ.name, 1)
    if check and not verdict.ok:
        raise _negative(info, verdict, timeout)
    return verdict


@contextlib.contextmanager
def _collector_held() -> Iterator[None]:
    """Hold Python's cyclic garbage collector off while rank 0 gathers and validates the records.

    Parsing a large world's records allocates millions of small objects and makes no cycle, but
    the allocations trigger full collections that walk the whole heap, torch's included: 0.4 to
    0.9 s of rank 0's roll call at 131 072 ranks (benchmarks/bench_rendezvous_scale.py).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _late(info: RankInfo, checkin: CheckIn, timeout: float, after: str) -> DistEnvError:
    """Return the error of a rank that reached the roll call too late."""
    return RendezvousTimeoutError(
        info.launcher,
        f"rank {info.rank} of {info.world_size} reached the roll call at {checkin.master} "
        f"after {after} ({timeout:g} s from its own start), or a process outside this job closed "
        "this rank's key",
        hint="start every rank within the rendezvous timeout of rank 0 (raise it with "
        f"rendezvous_timeout= or ${TIMEOUT_VAR}); rank 0's log names every missing rank",
    )


def _negative(info: RankInfo, verdict: Verdict, timeout: float) -> DistEnvError:
    """Return the error of a negative verdict."""
    error = RendezvousTimeoutError if verdict.missing else RendezvousError
    return error(
        info.launcher,
        "roll call failed: " + "; ".join(verdict.describe(timeout)),
        hint="run `distenv doctor` under the same launcher for a per-rank table",
    )


def _publish(
    store: Any, info: RankInfo, verdict: Verdict, own: CheckIn, timeout: float, *, batched: bool
) -> None:
    """Rank 0: write each rank's place (where the verdict places ranks), then the verdict.

    The others need the outcome and their own place, not every record: a verdict carrying N
    check-ins or N host names, read by N - 1 ranks, would make rank 0's store serve O(N^2) bytes.
    A place is keyed by the rank that reads it: each rank's in a flat roll call, each leader's
    (for its node) in a batched one. The places go first, so that a rank that reads a placed
    verdict finds its own at once.
    """
    if verdict.placed:
        readers = [c for c in verdict.checkins if not batched or c.local_rank == 0]
        items = [
            (PLACE.of(c.rank), place.to_json(verdict.scope))
            for c in readers
            if (place := verdict.place_of(c.hostname)) is not None
        ]
        for start in range(0, len(items), CHUNK):
            chunk = items[start : start + CHUNK]
            store.multi_set([key for key, _ in chunk], [value for _, value in chunk])
    published = verdict.to_json()
    if store.compare_set(VERDICT.name, "", published) != published.encode():
        said = "; ".join(verdict.describe(timeout)) if not verdict.ok else "all is well"
        raise RendezvousError(
            info.launcher,
            f"rank 0: a process outside this job wrote this job's roll-call verdict in the "
            f"store at {own.master} before rank 0 did; rank 0's own verdict: {said}",
            hint=FOREIGN_HINT,
        )


def fill_layout(info: RankInfo, verdict: Verdict, checkin: CheckIn) -> RankInfo:
    """Return `info` with the node layout its launcher left unknown, from the roll call's verdict.

    The verdict numbers the hosts in order of their lowest rank (`distenv.bootstrap.verdict.node_hosts`);
    this rank's node is the position of the host name it checked in with, and its local world
    size, where unknown, the verdict's count of ranks on that host (`distenv.bootstrap.verdict.host_sizes`):
    its `distenv.bootstrap.verdict.Place`.
    A known layout is kept as the launcher stated it (the roll call checked it against the hosts).

    Raises:
        RendezvousError: The verdict does not name this rank's host, or does not count its ranks
            (not this job's rank 0's).
    """
    if info.layout_known or not verdict.ok:
        return info
    place = verdict.place_of(checkin.hostname)
    node = None if place is None else place.node
    size = None if place is None else place.size
    if (
        place is None
        or place.nodes is None
        or node is None
        or (info.local_world_size is None and size is None)
    ):
        what = (
            f"does not place this rank's host {checkin.hostname!r} on a node, so its node is "
            "unknown"
            if node is None
            else f"does not count the ranks on this rank's host {checkin.hostname!r}, so its "
            "local world size is unknown"
        )
        raise RendezvousError(
            info.launcher,
            f"rank {info.rank}: the roll call's verdict {what}",
            hint="the verdict was not written by this job's rank 0, or a host's name changed "
            "during the start-up: see docs/security.md, and give the job its own MASTER_PORT",
        )
    return info.replace(
        node_rank=node if info.node_rank is None else info.node_rank,
        num_nodes=place.nodes if info.num_nodes is None else info.num_nodes,
        local_world_size=size if info.local_world_size is None else info.local_world_size,
    )


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
        store.add(WRITTEN.name, 1)
        return None
    if held != CLOSED:
        store.set(EXTRA.of(int(store.add(EXTRAS.name, 1))), record)
        store.add(WRITTEN.name, 1)
    return held


def _await_verdict(
    store: Any,
    boot: Bootstrap,
    checkin: CheckIn,
    scope_check: ScopeCheck | None,
    *,
    holds_key: bool,
) -> tuple[Verdict, bytes, bytes | None]:
    """Return rank 0's verdict (with this rank's place), and both as read.

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
    verdict, placed = _read_verdict(info, checkin, raw, holds_key=holds_key)
    if not placed:
        return verdict, raw, None
    # Written before the verdict: found at the first look unless someone deleted it.
    place = wait_value(store, PLACE.of(info.rank), deadline)
    return _placed(info, checkin, verdict, place), raw, place


def _read_verdict(
    info: RankInfo, checkin: CheckIn, raw: bytes, *, holds_key: bool
) -> tuple[Verdict, bool]:
    """Return the verdict in `raw`, validated, and whether it places ranks (`_placed`).

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


def _placed(info: RankInfo, checkin: CheckIn, verdict: Verdict, raw: bytes | None) -> Verdict:
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


def _check_in_batch(store: Any, batch: Batch) -> bytes | None:
    """Count a node's ranks in, then append their batch; return `CLOSED` if rank 0 stopped
    waiting first (nothing is written then), else None.

    Counted first: a count past `CUT` says rank 0 has made its cut (`gather_batches`), and rank 0
    waits for the batches of every count it saw before the cut.
    """
    if int(store.add(WRITTEN.name, len(batch.checkins))) >= CUT:
        return CLOSED
    store.append(shard_key(batch.leader), batch.to_line())
    return None


def gather_batches(
    store: Any, info: RankInfo, scope: str, deadline: Deadline
) -> tuple[Verdict, int]:
    """Rank 0 of a batched roll call: return the verdict on the nodes' batches by `deadline`,
    and how many leaders besides rank 0 will read it.

    The count says when to look. At `deadline` rank 0 adds `CUT` to it: a leader that counts
    its node after that learns it came late and writes nothing, and every leader that counted
    before is waited for (its append follows its count at once) for `VERDICT_GRACE_S` at most.
    Then the shards (`shard_keys`: a few keys at any scale) are read whole. Ranks in no batch are
    named missing; a count that exceeds the batches' ranks, or a line that does not parse, was
    written by a process outside the job.
    """
    world = info.world_size
    counted = wait_count(store, WRITTEN.name, world, deadline)
    if counted < world:
        counted = int(store.add(WRITTEN.name, CUT)) - CUT
    keys = shard_keys(world)
    grace = Deadline.after(VERDICT_GRACE_S)
    waits = pauses()
    while True:
        raws = read_many(store, keys)
        parsed = [
            parse_batches(key, raw, scope=scope, world_size=world)
            for key, raw in zip(keys, raws, strict=True)
        ]
        batches = [b for found, _ in parsed for b in found]
        carried = sum(len(b.checkins) for b in batches)
        foreign = [key for key, (_, bad) in zip(keys, parsed, strict=True) if bad]
        if carried >= counted or foreign or grace.passed():
            break
        pause(next(waits))
    found = tuple(sorted((c for b in batches for c in b.checkins), key=lambda c: c.rank))
    ahead = (counted, carried) if counted > carried else None
    readers = len(batches) - 1
    if carried == world and not foreign and ahead is None:
        problems = validate(found, world)
        nodes = () if problems else node_hosts(found, layout_known=info.layout_known)
        sizes = host_sizes(found, nodes)
        return Verdict(not problems, tuple(problems), found, scope, nodes, sizes), readers
    complete = {c.rank for c in found} == set(range(world))
    verdict = refusal(found, info, scope, foreign, complete=complete, ahead=ahead, batched=True)
    return verdict, readers


def _gather(store: Any, info: RankInfo, scope: str, deadline: Deadline) -> Verdict:
    """Return rank 0's verdict on the check-ins written by `deadline` (naming missing ranks).

    The "written" count says when to look; the records decide. Every rank writes its record
    before it counts itself, so a count ahead of the records was raised by a process outside the
    job (`ForeignCount`). Only honest claims may end the wait before every rank's key holds a
    record (two processes claiming one rank: the verdict says so at once); after a foreign write
    the absent ranks are awaited until `deadline`. Ranks still absent then have their keys
    closed (`CLOSED`) before they are named missing, so that a rank that checks in afterwards
    learns it came too late, and a rank that holds its own key knows that a verdict naming it
    missing is forged.
    """
    world = info.world_size
    counted = wait_count(store, WRITTEN.name, world, deadline)
    extras = min(int(store.add(EXTRAS.name, 0)), MAX_EXTRA)
    stem = CHECKIN.stem
    keys = [f"{stem}{rank}" for rank in range(world)]
    keys += [EXTRA.of(n) for n in range(1, extras + 1)]
    raws = read_many(store, keys)
    present = len(raws) - raws.count(None)
    ahead = (counted, present) if counted > present else None
    checkins, foreign = _records(keys, raws, scope, world)
    absent = [key for key, raw in zip(keys, raws[:world], strict=False) if raw is None]
    if absent and (ahead or foreign):
        wait_keys(store, absent, deadline)
        raws = read_many(store, keys)
        checkins, foreign = _records(keys, raws, scope, world)
    honest = counted >= world and ahead is None and not foreign
    closed: set[str] = set()
    if None in raws[:world] and not honest:
        raws[:world] = _close(store, keys[:world], raws[:world], closed)
        checkins, foreign = _records(keys, raws, scope, world, closed)
    complete = honest or all(
        raw is not None and key not in closed for key, raw in zip(keys, raws[:world], strict=False)
    )
    found = tuple(checkins)
    if complete and not foreign and ahead is None:
        problems = validate(found, world)
        nodes = () if problems else node_hosts(found, layout_known=info.layout_known)
        sizes = host_sizes(found, nodes)
        return Verdict(not problems, tuple(problems), found, scope, nodes, sizes)
    return refusal(found, info, scope, foreign, complete=complete, ahead=ahead)


def _records(
    keys: list[str],
    raws: list[bytes | None],
    scope: str,
    world: int,
    closed: AbstractSet[str] = frozenset(),
) -> tuple[list[CheckIn], list[str]]:
    """Return the valid check-ins among `raws`, and the keys of those this job did not write.

    Keys rank 0 `closed` hold no record; any other value, `CLOSED` included, is a record.
    """
    checkins: list[CheckIn] = []
    foreign: list[str] = []
    for rank, (key, raw) in enumerate(zip(keys, raws, strict=True)):
        if raw is None or key in closed:
            continue
        try:
            record = parse_checkin(key, raw)
        except ForeignRecordError:
            foreign.append(key)
            continue
        if (
            record.scope != scope
            or record.world_size != world
            or (rank < world and record.rank != rank)
        ):
            foreign.append(key)
            continue
        checkins.append(record)
    return checkins, foreign


def _close(
    store: Any, keys: list[str], raws: list[bytes | None], closed: set[str]
) -> list[bytes | None]:
    """Close the absent ranks' keys that the verdict will name (`MAX_SHOWN`), adding them to
    `closed`; return the records, with those that won the race to their key.

    ``compare_set`` is the cut: a key rank 0 closed is missing for good. Keys past the named ones
    stay open (they are only counted).
    """
    out = list(raws)
    for i, (key, raw) in enumerate(zip(keys, raws, strict=True)):
        if raw is not None:
            continue
        if len(closed) >= MAX_SHOWN:
            break
        value = bytes(store.compare_set(key, "", CLOSED))
        if value == CLOSED:
            closed.add(key)
        out[i] = value
    return out


def make_checkin(
    session: Session, backend: str, device: int | None, *, allow_gpu_sharing: bool
) -> CheckIn:
    """Return what this rank reports in the roll call."""
    import torch

    info = session.info
    return CheckIn(
        rank=info.rank,
        world_size=info.world_size,
        local_rank=info.local_rank,
        local_world_size=info.local_world_size,
        node_rank=info.node_rank,
        hostname=socket.gethostname(),
        pid=os.getpid(),
        launcher=info.launcher,
        master=session.master,
        backend=backend,
        torch_version=str(torch.__version__),
        device=None if device is None else device_identity(device),
        allow_gpu_sharing=allow_gpu_sharing,
        scope=session.scope,
    )
