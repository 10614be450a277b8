"""The network topologies of issue #24, each from a real report, as data for `netlab.Lab`.

Node i is named ``node<i>`` and, on a routable network, has address ``10.213.<net>.<10 + i>``:
net 1 is the data (Ethernet) network, 2 the ``-ib`` network, 9 the management network, 17 the
docker0-like bridge. Every /etc/hosts starts with ``127.0.0.1 localhost``; peers are listed in it
as DNS would answer them. MASTER_ADDR is what a user of each cluster would set: node 0's name
where it reaches node 0, else the name of node 0's address on the network that works.

Gloo binds the first address its host name resolves to that it can bind and advertises it; only
the clean control has that address on a network the nodes share (issue #24).
"""

from __future__ import annotations

from tests.support.netlab import Network, Nic, Node, Topology

DATA, IB, MGMT, DOCKER = 1, 2, 9, 17
LOCALHOST = ("127.0.0.1", "localhost")
DEBIAN_SELF = "127.0.1.1"  # Debian's installer maps the host name here


def address(net: int, node: int) -> str:
    """Node `node`'s address on network `net` (no prefix length)."""
    return f"10.213.{net}.{10 + node}"


def nic(name: str, net: int, node: int, network: str | None) -> Nic:
    """A NIC with node `node`'s /24 address on network `net`."""
    return Nic(name, f"{address(net, node)}/24", network)


def _peers(
    count: int, net: int, suffix: str = "", skip: int | None = None
) -> list[tuple[str, str]]:
    return [(address(net, j), f"node{j}{suffix}") for j in range(count) if j != skip]


def control(count: int = 3) -> Topology:
    """Every host name resolves, on every node, to its address on the one shared network."""
    return Topology(
        name="control",
        report="the clean control",
        networks=(Network("data"),),
        nodes=tuple(
            Node(f"node{i}", (nic("eth0", DATA, i, "data"),), (LOCALHOST, *_peers(count, DATA)))
            for i in range(count)
        ),
        master_addr="node0",
    )


def debian_loopback(count: int = 3) -> Topology:
    """Each node's own name is on 127.0.1.1 (Debian's /etc/hosts); peers resolve to data addresses."""
    return Topology(
        name="hostname-127.0.1.1",
        report="Debian's 127.0.1.1 <hostname> (aws-samples/aws-do-eks#50: remote=[127.0.0.1])",
        networks=(Network("data"),),
        nodes=tuple(
            Node(
                f"node{i}",
                (nic("eth0", DATA, i, "data"),),
                (LOCALHOST, (DEBIAN_SELF, f"node{i}"), *_peers(count, DATA, skip=i)),
            )
            for i in range(count)
        ),
        master_addr="node0",
    )


def management_first(count: int = 3) -> Topology:
    """A management NIC made first carries the host name; nodes cannot reach each other on it."""
    return Topology(
        name="management-nic-first",
        report="a management NIC first in /etc/hosts with the host name on it (pytorch/pytorch#150532)",
        networks=(Network("data"), Network("mgmt", isolated=True)),
        nodes=tuple(
            Node(
                f"node{i}",
                (nic("mgmt0", MGMT, i, "mgmt"), nic("eth0", DATA, i, "data")),
                (LOCALHOST, *_peers(count, MGMT), *_peers(count, DATA, "-data")),
            )
            for i in range(count)
        ),
        master_addr="node0-data",
    )


NIC_NAMES = ("eth0", "ens5", "enp1s0", "eno1")


def nic_names_differ(count: int = 3) -> Topology:
    """The data NIC has another name on every node, and each host name is on 127.0.1.1.

    One GLOO_SOCKET_IFNAME for all nodes cannot fix it; a name chosen per node can.
    """
    return Topology(
        name="nic-names-differ",
        report="interface names that differ between nodes (horovod/horovod#2431)",
        networks=(Network("data"),),
        nodes=tuple(
            Node(
                f"node{i}",
                (nic(NIC_NAMES[i], DATA, i, "data"),),
                (LOCALHOST, (DEBIAN_SELF, f"node{i}"), *_peers(count, DATA, skip=i)),
            )
            for i in range(count)
        ),
        master_addr="node0",
    )


def docker_same_address(count: int = 3) -> Topology:
    """Every node has a docker0 with the same address, and its own host name resolves to it."""
    shared = f"10.213.{DOCKER}.1"
    return Topology(
        name="docker0-same-address",
        report="a docker0 with the same address on every node (aws-samples/aws-do-eks#50)",
        networks=(Network("data"),),
        nodes=tuple(
            Node(
                f"node{i}",
                (Nic("docker0", f"{shared}/24", None), nic("eth0", DATA, i, "data")),
                (LOCALHOST, (shared, f"node{i}"), *_peers(count, DATA, skip=i)),
            )
            for i in range(count)
        ),
        master_addr="node0",
    )


def ib_master_name(count: int = 3) -> Topology:
    """Host names name the Ethernet side, which nodes cannot reach; the job must use ``-ib`` names."""
    return Topology(
        name="ib-second-network",
        report="a host name on the Ethernet side, the job on host-ib (pytorch/gloo#367)",
        networks=(Network("eth", isolated=True), Network("ib")),
        nodes=tuple(
            Node(
                f"node{i}",
                (nic("eth0", DATA, i, "eth"), nic("ib0", IB, i, "ib")),
                (LOCALHOST, *_peers(count, DATA), *_peers(count, IB, "-ib")),
            )
            for i in range(count)
        ),
        master_addr="node0-ib",
    )


def first_address_unroutable(count: int = 3) -> Topology:
    """The data NIC's first address is on a subnet of its own (no peer has a route to it), its
    second on the shared one; each host name is on 127.0.1.1.

    Told the NIC's name, gloo advertises its first address: no choice of interface works, so the
    topology is not routable for gloo, and distenv must refuse it before init_process_group.
    """
    return Topology(
        name="first-address-unroutable",
        report="an interface with several addresses, the first one not routable",
        networks=(Network("data"),),
        nodes=tuple(
            Node(
                f"node{i}",
                (Nic("eth0", f"10.213.{30 + i}.10/24", "data", (f"{address(DATA, i)}/24",)),),
                (LOCALHOST, (DEBIAN_SELF, f"node{i}"), *_peers(count, DATA, skip=i)),
            )
            for i in range(count)
        ),
        master_addr="node0",
        routable=False,
    )


def link_local_name(count: int = 3) -> Topology:
    """Each host name resolves to the node's own IPv6 link-local address (no scope in /etc/hosts).

    gloo cannot bind a link-local address without its interface, falls back to 127.0.0.1, and
    the peers fail (pytorch/gloo#268); peers resolve each other's names to data addresses. Rank
    0's own name is no address its store's client can dial there either: MASTER_ADDR is node 0's
    data address, as such a cluster's users set it.
    """
    return Topology(
        name="link-local-host-name",
        report="a host name on a link-local IPv6 address (pytorch/gloo#268)",
        networks=(Network("data"),),
        nodes=tuple(
            Node(
                f"node{i}",
                (Nic("eth0", f"{address(DATA, i)}/24", "data", (f"fe80::d:{10 + i}/64",)),),
                (LOCALHOST, (f"fe80::d:{10 + i}", f"node{i}"), *_peers(count, DATA, skip=i)),
            )
            for i in range(count)
        ),
        master_addr=address(DATA, 0),
    )


def ipv6_some_nodes(count: int = 3) -> Topology:
    """Nodes 0 and 1 also share an IPv6 network, and their host names resolve to their IPv6
    address there; the last node has IPv4 only, and its name resolves to its data address.

    gloo advertises IPv6 on the first nodes and IPv4 on the last, which cannot reach IPv6 at all.
    """
    last = count - 1

    def nics(i: int) -> tuple[Nic, ...]:
        data = nic("eth0", DATA, i, "data")
        return (data,) if i == last else (data, Nic("eth1", f"fd13:6::{10 + i}/64", "v6"))

    def own(i: int) -> tuple[str, str]:
        return (address(DATA, i) if i == last else f"fd13:6::{10 + i}", f"node{i}")

    return Topology(
        name="ipv6-some-nodes",
        report="dual-stack, with an IPv6 address only some nodes reach (pytorch/gloo#268)",
        networks=(Network("data"), Network("v6")),
        nodes=tuple(
            Node(f"node{i}", nics(i), (LOCALHOST, own(i), *_peers(count, DATA, skip=i)))
            for i in range(count)
        ),
        master_addr="node0",
    )


def no_route(count: int = 3) -> Topology:
    """The last node has no NIC but loopback: it cannot reach the master on any address."""
    last = count - 1
    return Topology(
        name="no-route",
        report="a node with no route at all",
        networks=(Network("data"),),
        nodes=tuple(
            Node(
                f"node{i}",
                () if i == last else (nic("eth0", DATA, i, "data"),),
                (LOCALHOST, *_peers(count, DATA)),
            )
            for i in range(count)
        ),
        master_addr="node0",
        routable=False,
    )


# Every topology at 3 nodes (so that every wrong address is dialled by some peer), in the
# benchmark's order: the control first.
TOPOLOGIES: dict[str, Topology] = {
    t.name: t
    for t in (
        control(),
        debian_loopback(),
        management_first(),
        nic_names_differ(),
        docker_same_address(),
        ib_master_name(),
        link_local_name(),
        ipv6_some_nodes(),
        first_address_unroutable(),
        no_route(),
    )
}
