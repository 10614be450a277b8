"""The roll call: every rank checks in over rank 0's store before the process group exists.

Every rank claims its rank's key with its `CheckIn` (``compare_set``, so a second process claiming
the same rank finds the key taken and files its record as an extra claim: both are seen); rank 0
validates the records (`distenv.bootstrap.verdict`: nothing read from the store is trusted) and publishes a
verdict of structured problems, which every rank renders from its own templates. Where a launcher
named no node layout, the verdict numbers the nodes and counts their ranks
(`distenv.bootstrap.verdict.fill_layout`).

Where the job may span several hosts, the roll call also proves the network path the backends
will take (`distenv.bootstrap.paths`): rank 0's claim offers its node's addresses, each node's
first rank dials them before it checks in and offers its own node's in its check-in, rank 0 dials
those, and the verdict says which nodes move a backend to another interface (`network_exports`)
or refuses the job. No round trip is added: what is offered travels in the claim and the records.

The phases are the same for every rank; how a rank reaches rank 0 varies with its role, and its
`distenv.bootstrap.channel.Channel` hides it (flat, a node's leader, or a member, which checks in
through its leader). Rank 0 reads N records (in chunks) and every rank reads one verdict: O(N)
store traffic, not O(N^2). A rank other than 0 makes four round trips when nobody is late: peek at the scope, claim
its key, count itself written, peek at the verdict.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator
from typing import Any

from distenv._hosts import this_host
from distenv.bootstrap.channel import Channel, late
from distenv.bootstrap.flat import FLAT, publish
from distenv.bootstrap.guard import linger
from distenv.bootstrap.nodes import open_channel
from distenv.bootstrap.paths import judged, network_exports, probed_backends
from distenv.bootstrap.protocol import CLOSED, READ, Message
from distenv.bootstrap.records import CheckIn
from distenv.bootstrap.role import Role
from distenv.bootstrap.scope import ScopeCheck
from distenv.bootstrap.session import Bootstrap, Session
from distenv.bootstrap.verdict import Verdict, fill_layout
from distenv.bootstrap.waits import wait_count
from distenv.deadline import Deadline
from distenv.device import device_identity
from distenv.errors import DistEnvError, RendezvousTimeoutError, RollCallError
from distenv.rankinfo import RankInfo
from distenv.timing import COLLISION_LINGER_S, VERDICT_GRACE_S

#: Random bytes in a positive verdict's release value (`Verdict.release`).
RELEASE_BYTES = 8

__all__ = [
    "fill_layout",
    "make_checkin",
    "meet",
    "network_exports",
    "probed_backends",
    "roll_call",
]


def meet(boot: Bootstrap, checkin: CheckIn, phase: str, *, check: bool = True) -> Verdict:
    """Reach rank 0, prove its store is this job's, and hold the roll call under `phase`.

    The rank's `distenv.bootstrap.role.Role` chooses its channel once
    (`distenv.bootstrap.nodes.open_channel`), kept in ``boot.session.channel`` for the group-up
    check: the flat roll call's, a node leader's (which opens its node's socket first: its
    members connect as soon as they start) or a member's (which hands its check-in to its
    leader and reaches rank 0's store only later, for the process group). Where the job may
    span hosts, reaching rank 0 also probes the network path (`distenv.bootstrap.paths`):
    rank 0 offers its node's addresses in its claim, a probing rank dials them before it checks
    in and offers its own, and each listener closes when the roll call ends. Runs inside
    `Bootstrap.run`; leaves the store in ``boot.session.store``.

    Raises:
        StoreTakenError: The store belongs to another job (or to no distenv job).
        RendezvousTimeoutError: The store was not reached, or ranks are missing.
        RollCallError: The verdict found problems (with `check`).
        RendezvousError: The store went away, or this node has no route to the master.
        DistEnvError: Rank 0 cannot listen on the port, or the master does not resolve.
    """
    session = boot.session
    role = Role.of(session.info, session.leaders, session.scope, session.restart, checkin.hostname)
    channel = session.channel = open_channel(role, session.info)
    try:
        reached = channel.reach(boot, checkin, phase)
        try:
            with session.losing("during the roll call"):
                return roll_call(
                    reached.store,
                    boot,
                    reached.checkin,
                    check=check,
                    scope_check=reached.scope_check,
                    channel=channel,
                )
        finally:
            reached.close()
    except BaseException:
        channel.close()
        raise


def roll_call(
    store: Any,
    boot: Bootstrap,
    checkin: CheckIn,
    *,
    check: bool = True,
    scope_check: ScopeCheck | None = None,
    channel: Channel = FLAT,
) -> Verdict:
    """Check in, and on rank 0 gather, validate and publish; return the verdict or raise it.

    Rank 0 waits the rendezvous timeout (``boot.timeout``) for everybody, the others
    `VERDICT_GRACE_S` longer for the verdict; every wait ends by ``boot.waits``. Each step goes
    through this rank's `channel`: a node's leader first gathers its members' check-ins, writes
    them as one batch, and hands the verdict (and its node's place) on to them.

    Args:
        store: The store of this job's roll call (``Session.scoped``; None for a member).
        boot: This rank's bootstrap (its session, timeout and deadline).
        checkin: What this rank reports.
        check: Raise when the verdict is negative (`distenv doctor` passes False to print it).
        scope_check: A rank other than 0 whose scope is not confirmed yet: the wait for the
            verdict confirms it first.
        channel: How this rank reaches rank 0 (`distenv.bootstrap.channel.Channel`).

    Raises:
        StoreTakenError: The scope key names another job (`scope_check`).
        RendezvousTimeoutError: Ranks missing (rank 0), or no verdict arrived (others).
        RollCallError: The verdict found problems.
        RendezvousError: The verdict was not written by this job's rank 0.
    """
    info, timeout = boot.session.info, boot.timeout
    held = channel.check_in(boot, store, checkin)
    if held == CLOSED:
        channel.hand_on(boot, Message.LATE.encode())
        raise late(info, checkin, timeout, "rank 0 had stopped waiting for the ranks")
    if scope_check is not None:
        scope_check.wrote = True
    if info.rank == 0:
        with _collector_held():
            verdict, readers = channel.gather(boot, store, checkin)
        if verdict.ok and checkin.net is not None:
            verdict = judged(verdict, checkin)
        if verdict.ok:  # fresh: nothing written before the verdict can pass for the release
            verdict = verdict._replace(release=os.urandom(RELEASE_BYTES).hex())
        readable = channel.place_readers(verdict)
        published = publish(store, info, verdict, checkin, timeout, readable)
        place = verdict.place_of(checkin.hostname)
        own = "" if place is None else place.to_json(verdict.scope)
        channel.hand_on(boot, Message.VERDICT.encode(published, own))
        if not verdict.ok or not check:
            # Rank 0 may exit next (a negative verdict, `distenv doctor`), and its store with
            # it: let the others read first.
            wait_count(store, READ.name, readers, boot.waits.within(VERDICT_GRACE_S))
        if verdict.collided:
            linger(boot, Deadline.after(COLLISION_LINGER_S))
    else:
        verdict, raw, place_raw = channel.await_verdict(boot, store, checkin, scope_check, held)
        channel.hand_on(boot, Message.VERDICT.encode(raw.decode(), (place_raw or b"").decode()))
        if not verdict.ok or not check:
            channel.count_read(store)
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


def _negative(info: RankInfo, verdict: Verdict, timeout: float) -> DistEnvError:
    """Return the error of a negative verdict."""
    from distenv.bootstrap import problems

    error = RendezvousTimeoutError if verdict.missing else RollCallError
    hint = "run `distenv doctor` under the same launcher for a per-rank table"
    if any(isinstance(p, problems.OtherSize) for p in verdict.problems):
        hint = problems.SIZE_HINT
    elif verdict.collided:
        hint = problems.COLLISION_HINT
    return error(
        info.launcher, "roll call failed: " + "; ".join(verdict.describe(timeout)), hint=hint
    )


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
        hostname=this_host(),
        pid=os.getpid(),
        launcher=info.launcher,
        master=session.master,
        backend=backend,
        torch_version=str(torch.__version__),
        device=None if device is None else device_identity(device),
        allow_gpu_sharing=allow_gpu_sharing,
        scope=session.scope,
    )
