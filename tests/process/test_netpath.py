"""`distenv info --network` on the network lab's nodes: what gloo and NCCL would use, and the route.

Each node of a topology (tests/support/topologies.py) runs the real command in its own network
namespace, with RANK, WORLD_SIZE and MASTER_* set as a user would: the route to the master is the
kernel's, the address gloo would advertise is its host name's first bindable address there, and a
loopback address advertised while the master is reached over a network is warned about, with the
interface to export (issue #24, item 1).
"""

from __future__ import annotations

import json
import sys

import pytest

from distenv.system.netpath import Interface, Path, Route, nccl_default
from tests.conftest import scrubbed_environ
from tests.support.netlab import Lab
from tests.support.topologies import DATA, TOPOLOGIES, address

INFO = [sys.executable, "-m", "distenv", "info", "--network", "--json"]


@pytest.mark.netns
@pytest.mark.parametrize(
    ("name", "nic", "gloo"),
    [
        ("control", "eth0", address(DATA, 1)),
        ("hostname-127.0.1.1", "eth0", "127.0.1.1"),
        ("nic-names-differ", "ens5", "127.0.1.1"),  # node 1's data NIC has its own name
    ],
)
def test_info_shows_the_backends_defaults_and_the_route(name: str, nic: str, gloo: str) -> None:
    """Node 1 of each topology: the route to node0 leaves from its data address on its data NIC;
    gloo would advertise `gloo`; a loopback there is warned about, naming that NIC."""
    topology = TOPOLOGIES[name]
    env = {**scrubbed_environ(), "RANK": "1", "WORLD_SIZE": str(len(topology.nodes)),
           "MASTER_ADDR": topology.master_addr, "MASTER_PORT": "29500"}  # fmt: skip
    with Lab(topology) as lab:
        result = lab.run(1, INFO, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)["network"]
    assert seen["hostname"] == "node1"
    assert seen["route_to_master"] == {
        "host": topology.master_addr,
        "address": address(DATA, 1),
        "interface": nic,
    }
    assert seen["gloo_address"] == gloo
    assert seen["nccl_interface"] == nic
    warned = [w for w in seen["warnings"] if w.startswith("gloo would advertise")]
    if gloo == "127.0.1.1":
        assert warned == [
            f"gloo would advertise 127.0.1.1, but this node reaches the master from "
            f"{address(DATA, 1)} on {nic}: the other nodes cannot reach a loopback address "
            f"(export GLOO_SOCKET_IFNAME={nic} on this node)"
        ]
    else:
        assert warned == []


def _iface(name: str, *addresses: str, loopback: bool = False, up: bool = True) -> Interface:
    return Interface(name, up, loopback, addresses)


LO = _iface("lo", "127.0.0.1", loopback=True)


@pytest.mark.parametrize(
    ("found", "expected"),
    [
        ((LO, _iface("eth0", "10.0.0.2"), _iface("ib0", "10.1.0.2")), "ib0"),
        ((LO, _iface("docker0", "172.17.0.1"), _iface("eth0", "10.0.0.2")), "eth0"),
        ((LO, _iface("docker0", "172.17.0.1"), _iface("eth0", up=False)), "docker0"),
        ((LO, _iface("eth0")), "lo"),  # an interface with no address is no candidate
    ],
)
def test_nccl_takes_its_fixed_order(found: tuple[Interface, ...], expected: str) -> None:
    """InfiniBand first, then any but docker and loopback, then docker, then loopback."""
    assert nccl_default(found, {})[0] == expected
    assert nccl_default(found, {"NCCL_SOCKET_IFNAME": "=eth9"}) == (
        "=eth9",
        "NCCL_SOCKET_IFNAME==eth9",
    )


def _path(gloo: str, route: Route | None, nccl: str = "eth0") -> Path:
    return Path("n1", (gloo,), (gloo, "why"), (nccl, "why"), route, None, ())


def test_warnings_only_where_a_network_is_crossed() -> None:
    """A master reached over loopback is on this node: no warning, whatever gloo advertises."""
    assert _path("127.0.1.1", Route("n0", "127.0.0.1", "lo")).warnings() == []
    assert _path("127.0.1.1", None).warnings() == []
    assert _path("10.0.0.2", Route("n0", "10.0.0.2", "eth0")).warnings() == []
    (nccl,) = _path("10.0.0.2", Route("n0", "10.1.0.2", "ib0")).warnings()
    assert nccl.startswith("NCCL would use eth0, but this node reaches the master on ib0")
