"""The process group: created under the bootstrap's deadline, then proven up over the store.

After the roll call, `join_group` calls ``torch.distributed.init_process_group`` with the time left
before the bootstrap's deadline as its timeout (gloo's connect phase honours it), in a thread the
main thread can abandon (`distenv.bootstrap.session.Bootstrap.run`), then restores the user's collective
timeout. A returned init proves nothing about the peers (a stopped peer still lets rank 0's init
return), so every rank then meets the others once more over the store (`group_up`). When a rank
does not come up, the others name it, with its host and the state it recorded
(`distenv.bootstrap.session.Session.mark`): a rank that died after checking in is named at the deadline, not
waited for.
"""

from __future__ import annotations

import datetime
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from distenv.bootstrap.batches import UpBatch, parse_up_batches, shard_key, shard_keys
from distenv.bootstrap.leaders import SLACK_S, Link, NodeListener
from distenv.bootstrap.protocol import ACK, COUNT, PG, UP, Message
from distenv.bootstrap.records import MAX_SHOWN
from distenv.bootstrap.session import FOREIGN_HINT, Bootstrap, Session
from distenv.bootstrap.store import (
    CHUNK,
    connect_store,
    first_line,
    read_many,
    wait_count,
    wait_value,
)
from distenv.deadline import Deadline, bounded
from distenv.errors import DistEnvError, InitError, RendezvousError, RendezvousTimeoutError
from distenv.rankinfo import RankInfo
from distenv.timing import FAILED_MARK_S, LOOKUP_S, MIN_CONNECT_S

__all__ = ["group_up", "init_failure", "join_group", "torch_timeout"]

# Random bytes in a rank's group-up token (`distenv.bootstrap.session.Session.mark`).
TOKEN_BYTES = 8
# Ranks whose state the others read when the group does not come up: a failure-only cost, bounded.
MAX_LOOKED_UP = 4096


def _absent(session: Session, wanted: str, hosts: Mapping[int, str]) -> str:
    """Name the ranks that did not reach `wanted`, with their host and state, for a message.

    `hosts` are the hosts the roll call's check-ins named (rank 0 has them all): a rank that died
    without a word is named with its host from there.
    """
    ranks = range(min(session.info.world_size, MAX_LOOKED_UP))
    try:
        # Bounded: rank 0's store itself may be what stopped answering.
        states = bounded(lambda: session.read_states(ranks), Deadline.after(LOOKUP_S), TimeoutError)
    except RuntimeError:
        return "rank 0's store is gone too (rank 0 died?)"
    except TimeoutError:
        return "rank 0's store does not answer either (rank 0 stopped or its node overloaded?)"
    order = {"joining": 0, "up": 1}
    late = [
        (rank, state)
        for rank, state in states.items()
        if state is None or order.get(state[0], -1) < order[wanted]
    ]
    parts = []
    for rank, state in late[:MAX_SHOWN]:
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
    more = f" and {len(late) - MAX_SHOWN} more" if len(late) > MAX_SHOWN else ""
    if parts:
        return ", ".join(parts) + more
    if wanted == "up":  # rank 0 reads the others' records and acknowledges them
        return "every rank recorded itself up, but rank 0 acknowledged none (rank 0 stopped?)"
    return "no rank could be named"


def join_group(
    boot: Bootstrap,
    *,
    backend: str,
    device: int | None,
    timeout: float | None,
    hosts: Mapping[int, str],
) -> None:
    """Create the default process group over the session's store by the deadline; check it is up.

    Runs inside `Bootstrap.run`, after the roll call. `timeout` is the group's collective timeout
    (torch's default if None); `hosts` maps ranks to the hosts their check-ins named, for
    messages (rank 0 knows them).

    Raises:
        RendezvousTimeoutError: A rank did not join or come up by the deadline (named).
        InitError: torch refused the group (a backend this build lacks, ...).
        RendezvousError: A signal interrupted.
    """
    import torch
    import torch.distributed as dist

    session, deadline = boot.session, boot.deadline
    info = session.info
    if session.store is None:  # a member of a batched roll call: the store only now
        session.store = connect_store(
            info,
            boot.watch,
            boot.waits,
            agent_store=session.agent_store,
            master_from=session.master_from,
        )
    store = session.store
    where = f"rank {info.rank} of {info.world_size} (store {session.master})"
    options: dict[str, Any] = {}
    if device is not None and "nccl" in backend.lower():
        # Binds the communicator to this device and lets NCCL connect eagerly (torch >= 2.3).
        options["device_id"] = torch.device("cuda", device)

    collective = torch_timeout(timeout)
    # Private since torch 2.1; without it the group keeps the user's timeout from the start and
    # only the abandoned thread bounds the connect phase.
    restore = getattr(dist.distributed_c10d, "_set_pg_timeout", None)

    def init() -> None:
        if device is not None and torch.cuda.is_available():
            torch.cuda.set_device(device)  # the current device is per thread
        # gloo's connect phase honours the timeout: give it the time left, when torch lets us
        # give collectives the user's afterwards.
        connect = datetime.timedelta(seconds=max(boot.waits.left(), MIN_CONNECT_S))
        try:
            session.mark("joining")
            dist.init_process_group(
                backend=backend,
                store=session.scoped(PG),
                rank=info.rank,
                world_size=info.world_size,
                timeout=connect if restore is not None else collective,
                **options,
            )
        except dist.DistStoreError:
            raise RendezvousTimeoutError(
                info.launcher,
                f"{where}: not every rank joined the process group within {deadline.seconds:g} "
                f"s: {_absent(session, 'joining', hosts)}",
                hint="a rank died or was stopped after checking in; its log (or the launcher's "
                "exit codes) says why",
            ) from None
        except dist.DistNetworkError as exc:
            raise session.lost("during init_process_group", exc) from None
        except (RuntimeError, ValueError) as exc:  # DistError is a RuntimeError
            session.mark("failed", wait=FAILED_MARK_S)
            raise init_failure(info.launcher, where, backend, first_line(exc)) from None

    def not_joined() -> DistEnvError:
        return RendezvousTimeoutError(
            info.launcher,
            f"{where}: init_process_group did not return within {deadline.seconds:g} s: "
            f"{_absent(session, 'joining', hosts)}",
            hint="a rank died or was stopped after checking in; its log (or the launcher's exit "
            "codes) says why",
        )

    boot.enter("init_process_group", deadline, not_joined)
    try:
        init()
        if restore is not None:
            restore(collective, None)
        group_up(boot, hosts)
    finally:
        if session.node is not None:
            session.node.close()
            session.node = None
    # From here on the store serves new_group and barriers: give it the group's patience, not the
    # check-in limit.
    store.set_timeout(collective)


# How gloo names the peer it could not reach, an IPv4 or IPv6 address (with its zone):
# "... SO_ERROR: Connection refused, remote=[127.0.1.1]:4350".
_ADDRESS = r"[0-9A-Fa-f.:]{2,45}(?:%[A-Za-z0-9_.-]{1,32})?"
_REMOTE = re.compile(rf"(?:SO_ERROR: |: )?([A-Za-z][A-Za-z ]{{2,40}}), remote=\[({_ADDRESS})\]")


def init_failure(launcher: str, where: str, backend: str, text: str) -> InitError:
    """Return the error of an ``init_process_group`` that raised `text` (its first line).

    Where the backend names a peer it could not connect to, that address is what the peer
    advertised for itself (gloo: the first address its host name resolves to there), the field's
    most common multi-node failure: the message names it and the hint is the network's, not the
    build's.
    """
    found = _REMOTE.search(text)
    if found is None and "ss_family" in text:
        return InitError(
            launcher,
            f"{where}: init_process_group(backend={backend!r}) failed: the ranks' backends "
            "advertise addresses of two families (IPv4 and IPv6), and gloo connects addresses of "
            f"one family only ({text})",
            hint="make every node's host name resolve to an address of one family, or set "
            "GLOO_SOCKET_IFNAME on every node to an interface of the same family (docs/network.md)",
        )
    if found is None:
        return InitError(
            launcher,
            f"{where}: init_process_group(backend={backend!r}) failed: {text}",
            hint="check that the backend is available in this torch build (nccl needs CUDA)",
        )
    reason, remote = found.groups()
    return InitError(
        launcher,
        f"{where}: init_process_group(backend={backend!r}) could not connect to another rank "
        f"at {remote} ({reason.strip()}), the address that rank's backend advertised",
        hint="a backend advertises what its node's host name resolves to there (127.0.1.1 from "
        "a Debian-style /etc/hosts, a management or docker NIC): on every node, set "
        "GLOO_SOCKET_IFNAME (NCCL_SOCKET_IFNAME for nccl) to the interface of the network the "
        "nodes share, or make the host name resolve to that network's address "
        "(docs/troubleshooting.md)",
    )


def torch_timeout(timeout: float | None) -> datetime.timedelta:
    """Return the process group's collective timeout: the user's, else torch's default."""
    import torch.distributed as dist

    return dist.default_pg_timeout if timeout is None else datetime.timedelta(seconds=timeout)


def group_up(boot: Bootstrap, hosts: Mapping[int, str]) -> None:
    """Return once rank 0 has seen every rank's own "up" record; name the ranks that did not.

    Every rank records itself up with a fresh token and counts itself. Rank 0 waits for the count,
    then reads the records themselves: the count only says when to look, and a count that runs
    ahead of the records (which every rank writes first) was raised by a process outside the job.
    Once every rank's record says up, rank 0 echoes each rank's token under that rank's own key;
    a rank returns when it reads its own token back. No single key decides for anybody: a value
    written in advance cannot echo a token drawn now, and a wrong one is named as forged. Where
    node leaders batch the bootstrap, a member hands its token to its leader, the leader reports
    its node's tokens as one record, and rank 0 echoes them to the leader, which echoes each
    member's to it (`_up_batched`).

    Raises:
        RendezvousTimeoutError: Naming the ranks that never came up, their hosts and states.
        RendezvousError: A count or an echo that this job's ranks did not write.
    """
    session, deadline = boot.session, boot.deadline
    info, store = session.info, session.store
    keys = session.keys(UP)
    batched = session.node is not None

    def missing() -> DistEnvError:
        if batched and info.rank != 0:
            who = (
                "rank 0 acknowledged no group-up of this rank's node (rank 0's log names the "
                "ranks that did not come up)"
            )
        else:
            who = _absent(session, "up", hosts)
        return RendezvousTimeoutError(
            info.launcher,
            f"rank {info.rank} of {info.world_size}: the process group did not come up on "
            f"every rank within {deadline.seconds:g} s: {who}",
            hint="a rank died or was stopped (SIGSTOP, a debugger, an overloaded node) after "
            "joining; its log (or the launcher's exit codes) says why",
        )

    boot.enter("the check that the group is up", deadline, missing)
    token = os.urandom(TOKEN_BYTES).hex()
    try:
        if session.node is not None:
            _up_batched(boot, session.node, token, hosts, missing)
            return
        session.mark("up", token=token)
        store.add(f"{keys}/{COUNT.name}", 1)
        if info.rank == 0:
            _acknowledge(boot, hosts, missing)
            return
        echo = wait_value(store, f"{keys}/{ACK.of(info.rank)}", boot.waits)
        if echo is None:
            raise missing()
    except RuntimeError as exc:  # torch's DistError: the store went away
        raise session.lost("after joining the group", exc) from None
    if echo != token.encode():
        raise _forged_echo(session)


def _forged_echo(session: Session) -> RendezvousError:
    info = session.info
    return RendezvousError(
        info.launcher,
        f"rank {info.rank} of {info.world_size}: the group-up acknowledgement under this "
        f"rank's key in the store at {session.master} was not written by this job's rank 0 "
        "(it does not echo the token this rank just drew)",
        hint=FOREIGN_HINT,
    )


def _up_batched(
    boot: Bootstrap,
    node: NodeListener | Link,
    token: str,
    hosts: Mapping[int, str],
    missing: Callable[[], DistEnvError],
) -> None:
    """The group-up check where node leaders batch it: a member through its leader, a leader
    for its node (and rank 0, a leader too, for the whole job)."""
    session = boot.session
    info, store = session.info, session.store
    keys = session.keys(UP)
    if isinstance(node, Link):
        if not node.send(Message.UP.encode(token), boot.waits):
            raise node.gone()
        line = node.receive(boot.waits)
        if line is None:
            raise missing()
        if line != Message.ACK.encode(token):
            raise _forged_echo(session)
        return
    slack = min(SLACK_S, boot.timeout / 4)
    tokens, gone, late = node.collect_up(boot.waits.sooner(slack))
    tokens[info.rank] = token
    up = UpBatch(info.rank, tuple(sorted(tokens.items())), tuple(gone), tuple(late))
    # Appended before it is counted: rank 0 reads the reports once the count is complete.
    store.append(f"{keys}/{shard_key(info.rank)}", up.to_line())
    store.add(f"{keys}/{COUNT.name}", up.ranks)
    if info.rank == 0:
        _acknowledge_batches(boot, hosts, missing)
    else:
        echo = wait_value(store, f"{keys}/{ACK.of(info.rank)}", boot.waits)
        if echo is None:
            raise missing()
        if echo != up.echo().encode():
            raise _forged_echo(session)
    node.acknowledge(tokens, boot.waits)


def _acknowledge_batches(
    boot: Bootstrap, hosts: Mapping[int, str], missing: Callable[[], DistEnvError]
) -> None:
    """Rank 0 of a batched group-up: once every node's report is in, echo each node's tokens
    under its leader's key; name the ranks that did not come up."""
    session = boot.session
    info, store, world = session.info, session.store, session.info.world_size
    keys = session.keys(UP)
    count = wait_count(store, f"{keys}/{COUNT.name}", world, boot.waits)
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
    echoes = [(f"{keys}/{ACK.of(r.leader)}", r.echo()) for r in reports if r.leader != 0]
    for start in range(0, len(echoes), CHUNK):
        chunk = echoes[start : start + CHUNK]
        store.multi_set([key for key, _ in chunk], [value for _, value in chunk])


def _not_up(
    info: RankInfo, reports: list[UpBatch], up: set[int], hosts: Mapping[int, str], seconds: float
) -> DistEnvError:
    """Return rank 0's error naming the ranks its nodes' leaders did not report up."""
    gone = {rank for report in reports for rank in report.gone}
    late = {rank for report in reports for rank in report.late}
    absent = [rank for rank in range(info.world_size) if rank not in up]
    parts = []
    for rank in absent[:MAX_SHOWN]:
        where = f" on {hosts[rank]!r}" if rank in hosts else ""
        if rank in gone:
            why = "its connection to its node's leader closed before it came up: died or killed?"
        elif rank in late:
            why = "had not come up when its node's leader reported"
        else:
            why = "its node's leader never reported: the leader died or was stopped?"
        parts.append(f"rank {rank}{where} ({why})")
    more = f" and {len(absent) - MAX_SHOWN} more" if len(absent) > MAX_SHOWN else ""
    return RendezvousTimeoutError(
        info.launcher,
        f"rank 0 of {info.world_size}: the process group did not come up on every rank within "
        f"{seconds:g} s: " + ", ".join(parts) + more,
        hint="a rank died or was stopped (SIGSTOP, a debugger, an overloaded node) after "
        "joining; its log (or the launcher's exit codes) says why",
    )


def _acknowledge(
    boot: Bootstrap, hosts: Mapping[int, str], missing: Callable[[], DistEnvError]
) -> None:
    """Rank 0: once every rank's record says up, echo each rank's token under its own key."""
    session = boot.session
    info, store, world = session.info, session.store, session.info.world_size
    keys = session.keys(UP)
    count = wait_count(store, f"{keys}/{COUNT.name}", world, boot.waits)
    tokens = session.up_tokens(range(world))
    up = [rank for rank, token in tokens.items() if token is not None]
    if len(up) < world and count < world:
        raise missing()
    if len(up) < world or count > world:
        raise RendezvousError(
            info.launcher,
            f"rank 0 of {world}: the group-up count in the store at {session.master} reads "
            f"{count} while {len(up)} of {world} ranks have recorded themselves up: a process "
            "outside this job wrote to it; not up yet: "
            f"{_absent(session, 'up', hosts) if len(up) < world else 'none'}",
            hint=FOREIGN_HINT,
        )
    echoes = [(f"{keys}/{ACK.of(rank)}", str(tokens[rank])) for rank in range(1, world)]
    for start in range(0, len(echoes), CHUNK):
        chunk = echoes[start : start + CHUNK]
        store.multi_set([key for key, _ in chunk], [value for _, value in chunk])
