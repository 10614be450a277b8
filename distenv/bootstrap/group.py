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
from collections.abc import Mapping
from typing import Any

from distenv.bootstrap.channel import absent
from distenv.bootstrap.flat import channel_of
from distenv.bootstrap.proof import proves_group
from distenv.bootstrap.protocol import PG
from distenv.bootstrap.session import Bootstrap
from distenv.bootstrap.store import first_line
from distenv.device import set_current_device
from distenv.errors import DistEnvError, InitError, RendezvousTimeoutError
from distenv.timing import FAILED_MARK_S, LOOKUP_S, MIN_CONNECT_S

__all__ = ["group_up", "init_failure", "join_group", "release_group", "torch_timeout"]

# Random bytes in a rank's group-up token (`distenv.bootstrap.session.Session.mark`).
TOKEN_BYTES = 8


def join_group(
    boot: Bootstrap,
    *,
    backend: str,
    device: int | None,
    timeout: float | None,
    hosts: Mapping[int, str],
    release: str = "",
) -> None:
    """Create the default process group over the session's store by the deadline; check it is up.

    Runs inside `Bootstrap.run`, after the roll call. `timeout` is the group's collective timeout
    (torch's default if None); `hosts` maps ranks to the hosts their check-ins named, for
    messages (rank 0 knows them); `release` is the release value of rank 0's verdict
    (`release_group`).

    Raises:
        RendezvousTimeoutError: A rank did not join or come up by the deadline (named).
        InitError: torch refused the group (a backend this build lacks, ...).
        RendezvousError: A signal interrupted.
    """
    import torch
    import torch.distributed as dist

    session, deadline = boot.session, boot.deadline
    # Waits end early enough to name a missing rank by the deadline, rank 0's store frozen too.
    named = boot.leave_time_to_name()
    info = session.info
    channel = channel_of(session)
    channel.connect_for_group(boot)  # a member reaches the store only now
    store = session.store
    where = f"{info.who} (store {session.master})"
    options: dict[str, Any] = {}
    if device is not None and "nccl" in backend.lower():
        # Binds the communicator to this device and lets NCCL connect eagerly (torch >= 2.3).
        options["device_id"] = torch.device("cuda", device)
    proven = proves_group(backend, eager_device="device_id" in options, environ=os.environ)

    collective = torch_timeout(timeout)
    # Private since torch 2.1; without it the group keeps the user's timeout from the start and
    # only the abandoned thread bounds the connect phase.
    restore = getattr(dist.distributed_c10d, "_set_pg_timeout", None)

    def init() -> None:
        if device is not None:
            set_current_device(device)  # the current device is per thread
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
                f"s: {absent(session, 'joining', hosts, deadline)}",
                hint="a rank died or was stopped after checking in; its log (or the launcher's "
                "exit codes) says why",
            ) from None
        except dist.DistNetworkError as exc:
            raise session.lost("during init_process_group", exc) from None
        except (RuntimeError, ValueError) as exc:  # DistError is a RuntimeError
            session.mark("failed", wait=FAILED_MARK_S)
            raise init_failure(info.launcher, where, backend, first_line(exc)) from None

    def not_joined() -> DistEnvError:
        # Where the group-up check follows, a rank whose init returned has recorded itself up
        # by now: the others are still in their connect (gloo: a peer stopped in its connect
        # holds some peers' inits, docs/faults.md). Where the release follows, nobody records it.
        wanted = "joining" if proven else "up"
        return RendezvousTimeoutError(
            info.launcher,
            f"{where}: init_process_group did not return within {deadline.seconds:g} s: "
            f"{absent(session, wanted, hosts, deadline)}",
            hint="a rank died or was stopped after checking in; its log (or the launcher's exit "
            "codes) says why",
        )

    boot.enter("init_process_group", named, not_joined)
    try:
        init()
        if restore is not None:
            restore(collective, None)
        if proven:
            release_group(boot, release)
        else:
            group_up(boot, hosts)
    finally:
        channel.close()
        session.channel = None
    # From here on the store serves new_group and barriers: give it the group's patience, not the
    # check-in limit.
    store.set_timeout(collective)


# How gloo names the peer it could not reach, an IPv4 or IPv6 address (with its zone):
# "... SO_ERROR: Connection refused, remote=[127.0.1.1]:4350".
_ADDRESS = r"[0-9A-Fa-f.:]{2,45}(?:%[A-Za-z0-9_.-]{1,32})?"
_REMOTE = rf"(?:SO_ERROR: |: )?([A-Za-z][A-Za-z ]{{2,40}}), remote=\[({_ADDRESS})\]"


def init_failure(launcher: str, where: str, backend: str, text: str) -> InitError:
    """Return the error of an ``init_process_group`` that raised `text` (its first line).

    Where the backend names a peer it could not connect to, that address is what the peer
    advertised for itself (gloo: the first address its host name resolves to there), the field's
    most common multi-node failure: the message names it and the hint is the network's, not the
    build's.
    """
    found = re.search(_REMOTE, text)
    if found is None and "ss_family" in text:
        return InitError(
            launcher,
            f"{where}: init_process_group(backend={backend!r}) failed: the ranks' backends "
            "advertise addresses of two families (IPv4 and IPv6), and gloo connects addresses of "
            f"one family only ({text})",
            hint="make every node's host name resolve to an address of one family, or set "
            "GLOO_SOCKET_IFNAME on every node to an interface of the same family (docs/network.md)",
            consequence=False,
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
    written in advance cannot echo a token drawn now, and a wrong one is named as forged. Each
    step goes through the session's channel: where node leaders batch the bootstrap, a member
    hands its token to its leader, the leader reports its node's tokens as one record, and rank 0
    echoes them to the leader, which echoes each member's to it
    (`distenv.bootstrap.nodes.LeaderChannel`).

    Raises:
        RendezvousTimeoutError: Naming the ranks that never came up, their hosts and states.
        RendezvousError: A count or an echo that this job's ranks did not write.
    """
    session, deadline = boot.session, boot.deadline
    info = session.info
    channel = channel_of(session)

    def missing() -> DistEnvError:
        return RendezvousTimeoutError(
            info.launcher,
            f"{info.who}: the process group did not come up on "
            f"every rank within {deadline.seconds:g} s: "
            f"{channel.unacknowledged(session, hosts, deadline)}",
            hint="a rank died or was stopped (SIGSTOP, a debugger, an overloaded node) after "
            "joining; its log (or the launcher's exit codes) says why",
        )

    boot.enter("the check that the group is up", deadline.sooner(LOOKUP_S), missing)
    token = os.urandom(TOKEN_BYTES).hex()
    with session.losing("after joining the group"):
        echo = channel.report_up(boot, token)
        if info.rank == 0:
            channel.acknowledge(boot, hosts, missing)
        else:
            channel.await_ack(boot, echo, missing)


def release_group(boot: Bootstrap, value: str) -> None:
    """Where the backend's init proved the group: rank 0 releases it, the others await that.

    Rank 0's init returned, so every rank joined; what the backend cannot tell is whether two
    jobs of one identity joined one group (docs/security.md). Rank 0 reads the roll call's extra
    claims once and writes the release, `value` (the fresh value its verdict announced, so that
    nothing written before the verdict passes for it), or COLLIDED; every other rank waits for
    it once (a member through its node's leader). A rank released by nobody names rank 0.

    Raises:
        RendezvousTimeoutError: Rank 0 released nothing by the deadline.
        RendezvousError: Rank 0 refused the group (a collision), or another process wrote it.
    """
    session, deadline = boot.session, boot.deadline
    info = session.info
    channel = channel_of(session)

    def unreleased() -> DistEnvError:
        return RendezvousTimeoutError(
            info.launcher,
            f"{info.who}: this rank's init_process_group returned, but rank 0 did not release "
            f"the process group within {deadline.seconds:g} s (rank 0, or this node's leader, "
            "stopped after its init returned?)",
            hint="rank 0's log (or the launcher's exit codes) says why",
        )

    boot.enter("the release of the group", deadline.sooner(LOOKUP_S), unreleased)
    with session.losing("after joining the group"):
        if info.rank == 0:
            channel.release(boot, value)
        else:
            channel.await_release(boot, value, unreleased)
