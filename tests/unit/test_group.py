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
