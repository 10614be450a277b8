"""distenv across "nodes" that are network namespaces (tests/support/netlab.py).

Tests on the network lab of issue #24, no Slurm needed. On every topology of
tests/support/topologies.py, with no variable set by the user, distenv's roll call probes the
address each node's gloo would advertise and moves exactly the nodes whose default cannot be
reached (docs/network.md): every routable topology finishes an all_reduce, the one without a route
is refused naming the node. `distenv run --nnodes` runs per node namespace where the data NIC has
another name on each node; a path the user chose is never probed or changed, and where it cannot
work the error names the peer's address. The lab's own behaviour is pinned in
tests/process/test_netlab.py; bare torch against distenv on the whole matrix runs in
benchmarks/lab/network_matrix.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import scrubbed_environ
from tests.support import netlab
from tests.support.integration.helpers import DISTENV_RUN, PYTHON, Harness, rank_check, wait_all
from tests.support.netlab import Lab
from tests.support.nodes import node_options
from tests.support.topologies import TOPOLOGIES, debian_loopback, nic_names_differ

BOUND_S = 20.0  # both nodes' launchers, torch's import on 2 busy cores included
PORT = "29500"  # free in a namespace made for this test


@pytest.mark.netns
def test_distenv_run_per_node_namespace_moves_each_node_to_its_own_nic(tmp_path: Path) -> None:
    """`distenv run --nnodes 2 --node-rank N --master-addr node0 --run-id ... -n 2` in each node,
    where each host name is on 127.0.1.1 and the data NIC is eth0 on node0, ens5 on node1.

    The four ranks agree on the master by name, every rank of a node exports its own node's
    interface (the probe ran on each node's first rank only), finish the gloo all_reduce
    (1 + 2 + 3 + 4) and exit 0 within the bound; no process is left in the namespaces when the
    launchers have returned, and no namespace after the lab.
    """
    harness = Harness.local(tmp_path)
    env = harness.env(extra={"DISTENV_TIMEOUT": "10"})
    env.pop("GLOO_SOCKET_IFNAME", None)
    with Lab(nic_names_differ(2)) as lab:
        nodes = node_options(2, ranks=2, run_id="netlab", master="node0", port=PORT)
        launches = [
            harness.start(
                lab.command(node, [*DISTENV_RUN, *options, *rank_check()[1:]]),
                env=env,
                timeout=BOUND_S,
            )
            for node, options in enumerate(nodes)
        ]
        results = wait_all(launches)
        left = {lab.namespace(node): netlab.pids(lab.namespace(node)) for node in (0, 1)}
    for result in results:
        assert result.returncode == 0, result.text
        assert result.seconds < BOUND_S, result.text
    records = [rec for result in results for rec in result.records()]
    assert [
        (r["hostname"], r["info"]["rank"], r["info"]["node_rank"], r["env"]["GLOO_SOCKET_IFNAME"])
        for r in records
    ] == [("node0", 0, 0, "eth0"), ("node0", 1, 0, "eth0"), ("node1", 2, 1, "ens5"),
          ("node1", 3, 1, "ens5")]  # fmt: skip
    assert {r["info"]["master_addr"] for r in records} == {"node0"}
    assert {r["info"]["job_id"] for r in records} == {"netlab"}
    assert [r["all_reduce"] for r in records] == [10] * 4
    assert left == {lab.namespace(0): [], lab.namespace(1): []}
    assert netlab.leftovers(lab.prefix) == []


PROBED = r"""
import json, os, sys
import torch
import distenv
import torch.distributed as dist
try:
    distenv.init_dist(launcher="pytorch")
except distenv.DistEnvError as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
    sys.exit(1)
t = torch.tensor([dist.get_rank() + 1])
dist.all_reduce(t)
print(json.dumps({"sum": int(t.item()), "ifname": os.environ.get("GLOO_SOCKET_IFNAME")}),
      flush=True)
"""
# What each node exports, per topology: None where its default was reached (never touched).
EXPORTED = {
    "control": [None, None, None],
    "hostname-127.0.1.1": ["eth0"] * 3,
    "management-nic-first": ["eth0"] * 3,
    "nic-names-differ": ["eth0", "ens5", "enp1s0"],
    "docker0-same-address": ["eth0"] * 3,
    "ib-second-network": ["ib0"] * 3,
    "link-local-host-name": ["eth0"] * 3,
    "ipv6-some-nodes": ["eth0", "eth0", None],
}


def node_launcher(node: int, master: str, script: Path) -> list[str]:
    """`distenv run` for the one rank of node `node` of three, as a user starts it there."""
    options = node_options(3, run_id="netlab", master=master, port=PORT)[node]
    return [*DISTENV_RUN, *options, str(script)]


PROBE_TIMEOUT_S = 4  # the rendezvous timeout: the refused topology's others wait this long
PROBE_BOUND_S = 30.0  # three ranks importing torch on 2 busy cores, and the deadline


@pytest.mark.netns
@pytest.mark.parametrize("name", TOPOLOGIES)
def test_every_routable_topology_passes_and_the_unroutable_ones_are_refused(
    name: str, tmp_path: Path
) -> None:
    """Three nodes, `distenv run -n 1 --nnodes 3 --node-rank N --master-addr M` on each, with
    MASTER_ADDR as a user of each cluster would give it and no interface variable (bare torch
    fails all but the control: benchmarks/lab/network_matrix.py).

    A routable topology: every rank finishes the all_reduce (1 + 2 + 3), and exactly the nodes
    whose gloo default cannot be reached export the interface toward the master, each its own
    name; the log says so once per node. The node with no route: it refuses at once, naming its
    host, the master and the fix, well before the others' deadline, and they name it missing.
    NICs whose first address no peer can route to: every rank is refused by the verdict, before
    init_process_group, naming every node and what was tried. Every launcher exits with its rank's
    status within the bound, and nothing is left in the namespaces.
    """
    topology = TOPOLOGIES[name]
    script = tmp_path / "probed.py"
    script.write_text(PROBED)
    env = {**scrubbed_environ(), "DISTENV_TIMEOUT": str(PROBE_TIMEOUT_S)}
    env.pop("GLOO_SOCKET_IFNAME", None)
    with Lab(topology) as lab:
        procs = [
            lab.popen(node, node_launcher(node, topology.master_addr, script), env=env)
            for node in range(3)
        ]
        began = time.monotonic()
        outs, took = [], []
        for proc in procs:
            outs.append(proc.communicate(timeout=PROBE_BOUND_S))
            took.append(time.monotonic() - began)
        left = [netlab.pids(lab.namespace(node)) for node in range(3)]
    reports = [[json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
               for out, _ in outs]  # fmt: skip
    logs = [err.decode() for _, err in outs]
    assert left == [[], [], []]
    if topology.routable:
        assert [proc.returncode for proc in procs] == [0, 0, 0], (reports, logs)
        assert [r[-1]["sum"] for r in reports] == [6, 6, 6]
        assert [r[-1]["ifname"] for r in reports] == EXPORTED[name]
        for log, nic in zip(logs, EXPORTED[name], strict=True):
            said = log.count("the network probe found")
            assert said == (0 if nic is None else 1), log
            assert nic is None or f"exported GLOO_SOCKET_IFNAME={nic}" in log
        return
    assert [proc.returncode for proc in procs] == [1, 1, 1], (reports, logs)
    errors = [r[-1]["error"] for r in reports]
    if name == "no-route":
        # Waited for in rank order: node2's refusal was over before the others' deadline.
        assert max(took) < PROBE_BOUND_S
        assert "rank 2 of 3 on 'node2' has no route to the master 'node0'" in errors[2]
        assert "Hint: this node shares no network with rank 0's node" in errors[2]
        for error in errors[:2]:
            assert "rank 2 (expected on node 2)" in error
        return
    # Every node's only alternative is its NIC's first address, which no peer can route to: the
    # verdict refuses the job on every rank, a refusal and not the deadline's timeout.
    assert max(took) < PROBE_TIMEOUT_S + 10, took
    for error in errors:
        assert error.startswith("RollCallError: pytorch: roll call failed: "), error
        for node in range(3):
            assert f"gloo on 'node{node}' (rank {node}'s node) would advertise" in error
        assert "10.213.31.10 on eth0: no route to it" in error
        assert "export GLOO_SOCKET_IFNAME=" in error


RANK = r"""
import sys
import torch
import distenv
try:
    distenv.init_dist(launcher="pytorch")
except distenv.DistEnvError as exc:
    print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
    sys.exit(1)
print("OK", flush=True)
"""
TIMEOUT_S = 3  # the deadline: 3 + 10 s


@pytest.mark.netns
def test_a_peer_address_that_cannot_be_reached_is_named_with_the_network_fix() -> None:
    """Three nodes whose host names resolve to Debian's 127.0.1.1, and a user who exported
    GLOO_SOCKET_IFNAME=lo on every node: distenv neither probes nor changes a path the user chose,
    so gloo advertises 127.0.0.1 and the peers that dial it fail. The rank that reports it names
    the address and the interface variables (0.2.0.dev: "check that the backend is available in
    this torch build (nccl needs CUDA)"); every rank exits 1 by the deadline and nothing is
    left."""
    topology = debian_loopback(3)
    env = {**scrubbed_environ(), "WORLD_SIZE": "3", "MASTER_ADDR": topology.master_addr,
           "MASTER_PORT": PORT, "DISTENV_TIMEOUT": str(TIMEOUT_S),
           "GLOO_SOCKET_IFNAME": "lo"}  # fmt: skip
    with Lab(topology) as lab:
        procs = [
            lab.popen(node, [PYTHON, "-c", RANK], env={**env, "RANK": str(node)})
            for node in range(3)
        ]
        outs = [proc.communicate(timeout=TIMEOUT_S + 10 + 30)[0].decode() for proc in procs]
        left = [netlab.pids(lab.namespace(node)) for node in range(3)]
    assert [proc.returncode for proc in procs] == [1, 1, 1], outs
    named = [out for out in outs if "could not connect to another rank at 127.0.0.1" in out]
    assert named, outs
    for out in named:
        assert "GLOO_SOCKET_IFNAME" in out, out
    assert not any("nccl needs CUDA" in out for out in outs), outs
    assert left == [[], [], []]


@pytest.mark.netns
def test_doctor_says_what_init_dist_would_export_on_each_node() -> None:
    """`distenv doctor` on two nodes whose host names are on 127.0.1.1 runs the same probe and
    prints, for each host, the interface `init_dist` would move gloo to; both exit 0."""
    topology = debian_loopback(2)
    env = {**scrubbed_environ(), "WORLD_SIZE": "2", "MASTER_ADDR": topology.master_addr,
           "MASTER_PORT": PORT, "DISTENV_TIMEOUT": str(PROBE_TIMEOUT_S)}  # fmt: skip
    env.pop("GLOO_SOCKET_IFNAME", None)
    with Lab(topology) as lab:
        procs = [
            lab.popen(
                node,
                [PYTHON, "-m", "distenv", "doctor", "--launcher", "pytorch"],
                env={**env, "RANK": str(node)},
            )
            for node in range(2)
        ]
        outs = [proc.communicate(timeout=PROBE_BOUND_S)[0].decode() for proc in procs]
        left = [netlab.pids(lab.namespace(node)) for node in range(2)]
    assert [proc.returncode for proc in procs] == [0, 0], outs
    for host in ("node0", "node1"):
        assert (
            f"network: '{host}': gloo's default address did not pass the probe, eth0's did: "
            "init_dist exports GLOO_SOCKET_IFNAME=eth0 there"
        ) in outs[0]
    assert "verdict: OK: 2 of 2 ranks checked in" in outs[0]
    assert left == [[], []]
