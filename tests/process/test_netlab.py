"""The network lab itself: nodes get their names, addresses and reachability; nothing outlives it.

Each test builds namespaces with tests/support/netlab.py (root, iproute2) and runs small Python
probes on the nodes, without torch: what a node's host name is, what each name in its /etc/hosts
resolves to there, which interfaces it has, and which peer addresses it can connect to.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support import netlab
from tests.support.netlab import Lab, Topology
from tests.support.topologies import TOPOLOGIES, address, control

pytestmark = pytest.mark.netns

# What a node sees: its host name, each name's address, its interfaces.
SEEN = """
import json, socket, sys
print(json.dumps({
    "hostname": socket.gethostname(),
    "resolves": {name: socket.getaddrinfo(name, None)[0][4][0] for name in sys.argv[1:]},
    "interfaces": sorted(name for _, name in socket.if_nameindex()),
}))
"""
# Listen on every address of the node, say so, and wait to be killed.
LISTEN = """
import socket, time
s = socket.socket()
s.bind(("0.0.0.0", 29400))
s.listen()
print("ready", flush=True)
time.sleep(60)
"""
# Try to connect to each address on port 29400 within 1.5 s; print what happened.
DIAL = """
import errno, json, socket, sys
out = {}
for host in sys.argv[1:]:
    try:
        socket.create_connection((host, 29400), timeout=1.5).close()
        out[host] = "ok"
    except socket.timeout:
        out[host] = "timeout"
    except OSError as exc:
        out[host] = errno.errorcode.get(exc.errno or 0, str(exc))
print(json.dumps(out))
"""


def python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-I", "-S", "-c", code, *args]


def root_links() -> list[str]:
    """The interfaces of the root namespace (the lab must never add or remove one)."""
    return sorted(netlab.ip("-o", "link", "show").splitlines())


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for a reaper does not count)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.parametrize("topology", TOPOLOGIES.values(), ids=TOPOLOGIES.keys())
def test_every_node_has_its_name_hosts_and_interfaces(topology: Topology) -> None:
    """On each node, the host name, every /etc/hosts name's address and the NICs are the topology's.

    Afterwards no namespace or /etc/netns directory of the lab is left and the root namespace has
    the same interfaces as before.
    """
    before = root_links()
    with Lab(topology) as lab:
        assert netlab.namespaces(lab.prefix) == sorted(
            [lab.switch, *(lab.namespace(i) for i in range(len(topology.nodes)))]
        )
        for index, node in enumerate(topology.nodes):
            names = [name for _, name in node.hosts]
            done = lab.run(index, python(SEEN, *names), timeout=10)
            assert done.returncode == 0, done.stderr
            seen = json.loads(done.stdout)
            assert seen == {
                "hostname": node.hostname,
                "resolves": {name: node.resolves(name) for name in names},
                "interfaces": sorted(["lo", *(nic.name for nic in node.nics)]),
            }
    assert netlab.leftovers(lab.prefix) == []
    assert root_links() == before


@pytest.mark.parametrize(
    ("topology", "dialled"),
    [
        pytest.param("control", {address(1, 0): "ok"}, id="control"),
        pytest.param(
            "management-nic-first",
            {address(9, 0): "EHOSTUNREACH|timeout", address(1, 0): "ok"},
            id="management-first",
        ),
        pytest.param("docker0-same-address", {"10.213.17.1": "ECONNREFUSED"}, id="docker0"),
        pytest.param("no-route", {address(1, 0): "ENETUNREACH"}, id="no-route"),
    ],
)
def test_the_last_node_reaches_node0_as_the_topology_says(
    topology: str, dialled: dict[str, str]
) -> None:
    """From the last node, node 0's data address answers; its management address does not, its
    docker0 address is the dialler's own, and a node with no NIC has no route."""
    topo = TOPOLOGIES[topology]
    last = len(topo.nodes) - 1
    with Lab(topo) as lab:
        listener = lab.popen(0, python(LISTEN))
        assert listener.stdout is not None
        assert listener.stdout.readline() == b"ready\n"
        done = lab.run(last, python(DIAL, *dialled), timeout=15)
        assert done.returncode == 0, done.stderr
        got = json.loads(done.stdout)
    assert {host: got[host] in want.split("|") for host, want in dialled.items()} == dict.fromkeys(
        dialled, True
    ), got
    assert listener.poll() is not None


def test_teardown_on_failure_kills_every_process_and_removes_everything() -> None:
    """An exception in the `with` body: the lab's processes, a grandchild that left the session
    included, are killed, and the namespaces and /etc/netns directories are gone."""
    escape = (
        "import subprocess, sys; "
        "p = subprocess.Popen(['sleep', '60'], start_new_session=True, "
        "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid, flush=True)"
    )
    with pytest.raises(RuntimeError, match="inside the lab"), Lab(control(2)) as lab:  # noqa: PT012
        sleeper = lab.popen(1, ["sleep", "60"])
        done = lab.run(0, python(escape), timeout=10)
        grandchild = int(done.stdout)
        assert alive(grandchild)
        raise RuntimeError("inside the lab")
    assert sleeper.poll() is not None
    assert not alive(grandchild)
    assert netlab.leftovers(lab.prefix) == []


def test_sweep_removes_a_lab_that_was_never_closed() -> None:
    """The conftest's safety net: `sweep` finds a lab left standing by its prefix and removes it."""
    lab = Lab(control(2)).__enter__()
    try:
        made = netlab.leftovers(lab.prefix)
        assert len(made) == 5  # the switch, 2 nodes, their 2 /etc/netns directories
        assert sorted(netlab.sweep(lab.prefix)) == sorted(Path(p).name for p in made[:3])
        assert netlab.leftovers(lab.prefix) == []
    finally:
        lab.close()
