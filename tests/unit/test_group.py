"""What `init_process_group`'s failures say (`distenv.bootstrap.group.init_failure`).

The texts are gloo's own first lines, recorded by benchmarks/lab/network_matrix.py on the network
lab's topologies (docs/benchmarks/network.json): a peer's advertised address that this rank could
not reach is the network's problem, and the message says so instead of blaming the torch build.
"""

from __future__ import annotations

import pytest

from distenv.bootstrap.group import init_failure

GLOO = (
    "Gloo connectFullMesh failed with [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
    "pair.cc:152] timed out connecting: SO_ERROR: {reason}, remote=[{remote}]:4350$0"
)


@pytest.mark.parametrize(
    ("reason", "remote"),
    [
        ("Connection refused", "127.0.1.1"),  # hostname-127.0.1.1: Debian's line in /etc/hosts
        ("No route to host", "10.213.9.10"),  # management-nic-first
        ("Network is unreachable", "fe80::1%eth0"),
    ],
)
def test_an_unreachable_peer_address_is_named_with_the_network_hint(
    reason: str, remote: str
) -> None:
    """The address and gloo's reason are in the message; the hint is the interface variables'."""
    error = init_failure(
        "pytorch", "rank 0 of 3", "gloo", GLOO.format(reason=reason, remote=remote)
    )
    assert str(error).startswith(
        f"pytorch: rank 0 of 3: init_process_group(backend='gloo') could not connect to another "
        f"rank at {remote} ({reason}), the address that rank's backend advertised. Hint: "
    )
    assert "GLOO_SOCKET_IFNAME" in str(error)
    assert "NCCL_SOCKET_IFNAME" in str(error)
    assert "nccl needs CUDA" not in str(error)
    assert "pair.cc" not in str(error)


def test_any_other_failure_keeps_the_build_hint() -> None:
    """A backend missing from the build is still said to be one."""
    error = init_failure(
        "none", "rank 0 of 1", "nccl", "Distributed package doesn't have NCCL built in"
    )
    assert str(error) == (
        "none: rank 0 of 1: init_process_group(backend='nccl') failed: Distributed package "
        "doesn't have NCCL built in. Hint: check that the backend is available in this torch "
        "build (nccl needs CUDA)"
    )


def test_two_address_families_are_named_as_such() -> None:
    """gloo's enforce on the families of two ranks' addresses (recorded on the ipv6-some-nodes
    topology with the family rule of distenv.bootstrap.paths turned off): the message says it is
    IPv4 against IPv6, and the hint is the network's."""
    text = (
        "[enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/device.cc:285]"
        " ss1.ss_family == ss2.ss_family. 2 vs 10"
    )
    error = init_failure("pytorch", "rank 0 of 3", "gloo", text)
    assert "advertise addresses of two families (IPv4 and IPv6)" in str(error)
    assert "GLOO_SOCKET_IFNAME on every node to an interface of the same family" in str(error)
    assert "nccl needs CUDA" not in str(error)


def test_the_ranks_named_absent_are_the_others_never_this_one() -> None:
    """A rank whose init did not return names the ranks not yet up from their records (a peer
    stopped in its gloo connect is still at joining), and never itself."""
    import datetime

    from torch.distributed import TCPStore

    from distenv import RankInfo
    from distenv.bootstrap.channel import absent
    from distenv.bootstrap.session import Session
    from distenv.deadline import Deadline

    server = TCPStore(
        "127.0.0.1", 0, 4, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False
    )
    sessions = []
    for rank in range(4):
        info = RankInfo(
            launcher="pytorch", rank=rank, world_size=4, local_rank=rank, local_world_size=4,
            node_rank=0, num_nodes=1, master_addr="127.0.0.1", master_port=server.port,
        )  # fmt: skip
        session = Session(info, "pytorch/none/4")
        session.store = server
        sessions.append(session)
    sessions[0].mark("joining")
    sessions[1].mark("up", token="0123456789abcdef")  # noqa: S106 - a group-up token
    sessions[3].mark("joining")  # rank 2 wrote nothing
    hosts = {2: "n2"}
    named = absent(sessions[0], "up", hosts, Deadline.after(30))
    assert named.startswith("rank 2 on 'n2' (checked in, then never got this far")
    assert ", rank 3 on " in named
    assert "(still at joining)" in named
    assert "rank 0 on" not in named
    assert "rank 1 on" not in named
    assert absent(sessions[3], "up", hosts, Deadline.after(30)).count("(still at joining)") == 1
