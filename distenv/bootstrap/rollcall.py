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

import os
import socket
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any

from distenv.bootstrap.limits import ensure_descriptors
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
    connect_store,
    poll_cap,
    read_many,
    wait_count,
    wait_keys,
    wait_value,
)
from distenv.bootstrap.verdict import (
    Verdict,
    host_sizes,
    node_hosts,
    parse_verdict,
    refusal,
    validate,
)
from distenv.deadline import Deadline
from distenv.device import device_identity
from distenv.errors import DistEnvError, RendezvousError, RendezvousTimeoutError
from distenv.rankinfo import RankInfo
from distenv.settings import TIMEOUT_VAR
from distenv.timing import MIN_POLL_S, NET_PROBE_S, VERDICT_GRACE_S

if TYPE_CHECKING:
    from distenv.bootstrap.probe import Listener
    from distenv.netpath import Prediction

__all__ = [
    "check_in",
    "fill_layout",
    "make_checkin",
    "meet",
    "network_exports",
    "probed_backends",
    "roll_call",
]

# Extra claims rank 0 reads: beyond this many, the verdict already says enough.
MAX_EXTRA = 64
#: What rank 0 writes under an absent rank's key when it stops waiting (never a record: JSON).
CLOSED = b"closed"


def meet(boot: Bootstrap, checkin: CheckIn, phase: str, *, check: bool = True) -> Verdict:
    """Reach rank 0's store, prove it is this job's, and hold the roll call under `phase`.

    Where the job may span hosts, the roll call also probes the network path
    (`probed_backends`): rank 0 offers its node's addresses in its claim, a probing rank dials
    them before it checks in and offers its own, and each listener closes when the roll call ends.
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
    backends = probed_backends(info, checkin.backend)
    prediction = _predict(info, backends) if backends else None
    hosts_store = info.rank == 0 and not session.agent_store
    ensure_descriptors(
        info, checkin.backend, hosts_store=hosts_store, probes=info.rank == 0 and bool(backends)
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
                scope_check.wait(boot.waits.within(boot.timeout), poll_cap(info.world_size))
                net0 = scope_check.net0
                if net0 is not None and scope_check.host0 != checkin.hostname:
                    listener, checkin = _offer(prediction, checkin, _dial(net0))
        return roll_call(session.scoped(phase), boot, checkin, check=check, scope_check=scope_check)
    except RuntimeError as exc:  # torch's DistError
        raise session.lost("during the roll call", exc) from None
    finally:
        if listener is not None:
            listener.close()


def probed_backends(info: RankInfo, backend: str) -> tuple[str, ...]:
    """Return the backends whose network path this rank's roll call probes (none: no probe).

    Only where the job may span hosts (its launcher does not say one node), only on rank 0 and
    each node's first rank (every rank where the launcher names no layout), and never a backend
    whose path the user chose (`distenv.netpath.USER_CHOICE`).
    """
    if info.world_size == 1 or info.num_nodes == 1:
        return ()
    if info.rank != 0 and info.layout_known and info.local_rank != 0:
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
    if not verdict.paths:
        return {}
    from distenv.netpath import backends_to_probe, export

    probed = backends_to_probe(checkin.backend, os.environ)
    return dict(
        export(switch.backend, switch.interface)
        for switch in verdict.paths
        if switch.host == checkin.hostname and switch.backend in probed
    )


def roll_call(
    store: Any,
    boot: Bootstrap,
    checkin: CheckIn,
    *,
    check: bool = True,
    scope_check: ScopeCheck | None = None,
) -> Verdict:
    """Check in, and on rank 0 gather, validate and publish; return the verdict or raise it.

    Rank 0 waits the rendezvous timeout (``boot.timeout``) for everybody, the others
    `VERDICT_GRACE_S` longer for the verdict; every wait ends by ``boot.waits``.

    Args:
        store: The store of this job's roll call (``Session.scoped``).
        boot: This rank's bootstrap (its session, timeout and deadline).
        checkin: What this rank reports.
        check: Raise when the verdict is negative (`distenv doctor` passes False to print it).
        scope_check: A rank other than 0 whose scope is not confirmed yet: the wait for the
            verdict confirms it first.

    Raises:
        StoreTakenError: The scope key names another job (`scope_check`).
        RendezvousTimeoutError: Ranks missing (rank 0), or no verdict arrived (others).
        RendezvousError: The verdict found problems, or was not written by this job's rank 0.
    """
    info, timeout = boot.session.info, boot.timeout
    held = check_in(store, checkin)
    if held == CLOSED:
        raise RendezvousTimeoutError(
            info.launcher,
            f"rank {info.rank} of {info.world_size} reached the roll call at {checkin.master} "
            f"after rank 0 had stopped waiting for the ranks ({timeout:g} s from its own start), "
            "or a process outside this job closed this rank's key",
            hint="start every rank within the rendezvous timeout of rank 0 (raise it with "
            f"rendezvous_timeout= or ${TIMEOUT_VAR}); rank 0's log names every missing rank",
        )
    if scope_check is not None:
        scope_check.wrote = True
    if info.rank == 0:
        verdict = _gather(store, info, checkin.scope, boot.waits.within(timeout))
        if verdict.ok and checkin.net is not None:
            verdict = _judged(verdict, checkin)
        # The others need the outcome, not every record: a verdict carrying N check-ins, read by
        # N - 1 ranks, would make rank 0's store serve O(N^2) bytes.
        published = verdict.to_json()
        if store.compare_set("verdict", "", published) != published.encode():
            own = "; ".join(verdict.describe(timeout)) if not verdict.ok else "all is well"
            raise RendezvousError(
                info.launcher,
                f"rank 0: a process outside this job wrote this job's roll-call verdict in the "
                f"store at {checkin.master} before rank 0 did; rank 0's own verdict: {own}",
                hint=FOREIGN_HINT,
            )
        if not verdict.ok or not check:
            # Rank 0 may exit next (a negative verdict, `distenv doctor`), and its store with
            # it: let the others read first.
            arrived = len(verdict.checkins) - 1
            wait_count(store, "read", arrived, boot.waits.within(VERDICT_GRACE_S))
    else:
        verdict = _await_verdict(store, boot, checkin, scope_check, holds_key=held is None)
        if not verdict.ok or not check:
            store.add("read", 1)
    if check and not verdict.ok:
        error = RendezvousTimeoutError if verdict.missing else RendezvousError
        raise error(
            info.launcher,
            "roll call failed: " + "; ".join(verdict.describe(timeout)),
            hint="run `distenv doctor` under the same launcher for a per-rank table",
        )
    return verdict


def fill_layout(info: RankInfo, verdict: Verdict, checkin: CheckIn) -> RankInfo:
    """Return `info` with the node layout its launcher left unknown, from the roll call's verdict.

    The verdict numbers the hosts in order of their lowest rank (`distenv.bootstrap.verdict.node_hosts`);
    this rank's node is the position of the host name it checked in with, and its local world
    size, where unknown, the verdict's count of ranks on that host (`distenv.bootstrap.verdict.host_sizes`).
    A known layout is kept as the launcher stated it (the roll call checked it against the hosts).

    Raises:
        RendezvousError: The verdict does not name this rank's host, or does not count its ranks
            (not this job's rank 0's).
    """
    if info.layout_known or not verdict.ok:
        return info
    node = verdict.node_of(checkin.hostname)
    size = None if node is None else verdict.size_of(node)
    if node is None or (info.local_world_size is None and size is None):
        what = (
            f"numbers {len(verdict.nodes)} node(s) but not this rank's host "
            f"{checkin.hostname!r}, so its node is unknown"
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
        num_nodes=len(verdict.nodes) if info.num_nodes is None else info.num_nodes,
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
    held = bytes(store.compare_set(f"checkin/{checkin.rank}", "", record))
    if held == record.encode():
        store.add("written", 1)
        return None
    if held != CLOSED:
        store.set(f"extra/{int(store.add('extras', 1))}", record)
        store.add("written", 1)
    return held


def _await_verdict(
    store: Any,
    boot: Bootstrap,
    checkin: CheckIn,
    scope_check: ScopeCheck | None,
    *,
    holds_key: bool,
) -> Verdict:
    """Return rank 0's verdict, confirming the scope first where `scope_check` has not yet.

    A verdict that contradicts what this rank knows (`Verdict.contradicts`) is refused as forged.
    """
    info = boot.session.info
    deadline = boot.waits.within(boot.timeout + VERDICT_GRACE_S)
    ready = None if scope_check is None else scope_check.poll
    raw = wait_value(store, "verdict", deadline, poll_cap(info.world_size), ready)
    if raw is None:
        if scope_check is not None and not scope_check.confirmed:
            raise scope_check.absent()
        raise RendezvousTimeoutError(
            info.launcher,
            f"rank {info.rank} checked in at {checkin.master} but rank 0 published no "
            f"verdict within {deadline.seconds:.0f} s",
            hint="rank 0 may have died or be stuck before init_dist; check its log",
        )
    try:
        verdict = parse_verdict("verdict", raw, scope=checkin.scope, world_size=info.world_size)
        why = verdict.contradicts(checkin, holds_key=holds_key)
        if why is not None:
            raise ForeignRecordError("verdict", why)
    except ForeignRecordError as exc:
        raise RendezvousError(
            info.launcher,
            f"rank {info.rank}: the roll-call verdict in the store at {checkin.master} was not "
            f"written by this job's distenv ({exc.why})",
            hint=FOREIGN_HINT,
        ) from None
    return verdict


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
    wait_count(store, "written", world, deadline)
    counted = int(store.add("written", 0))
    extras = min(int(store.add("extras", 0)), MAX_EXTRA)
    keys = [f"checkin/{rank}" for rank in range(world)]
    keys += [f"extra/{n}" for n in range(1, extras + 1)]
    raws = read_many(store, keys)
    present = len(raws) - raws.count(None)
    ahead = (counted, present) if counted > present else None
    checkins, foreign = _records(keys, raws, scope, world)
    absent = [key for key, raw in zip(keys, raws[:world], strict=False) if raw is None]
    if absent and (ahead or foreign):
        wait_keys(store, absent, deadline, MIN_POLL_S)
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
