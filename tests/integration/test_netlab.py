"""distenv across "nodes" that are network namespaces (tests/support/netlab.py).

Tests on the network lab of issue #24, no Slurm needed: the clean control, where each node's host
name resolves to its bridge address, runs `distenv run` on two nodes; the Debian topology, where
each name resolves to 127.0.1.1 on its own node, must fail naming the address and the fix. The
lab's own behaviour is pinned in tests/process/test_netlab.py; the whole matrix of broken
topologies runs in benchmarks/network_matrix.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import scrubbed_environ
from tests.support import netlab
from tests.support.integration.helpers import PYTHON, Harness, rank_check, wait_all
from tests.support.netlab import Lab
from tests.support.topologies import control, debian_loopback

BOUND_S = 20.0  # both nodes' launchers, torch's import on 2 busy cores included
PORT = "29500"  # free in a namespace made for this test


@pytest.mark.netns
def test_distenv_run_per_node_namespace_finishes_an_all_reduce(tmp_path: Path) -> None:
    """`distenv run --nnodes 2 --node-rank N --master-addr node0 --run-id ... -n 1` in each node.

    Both ranks run on their own node under their node's host name, agree on the master by name,
    finish the gloo all_reduce (1 + 2), and exit 0 within the bound; no process is left in the
    namespaces when the launchers have returned, and no namespace after the lab.
    """
    harness = Harness.local(tmp_path)
    env = harness.env(extra={"DISTENV_TIMEOUT": "10"})
    with Lab(control(2)) as lab:
        launches = [
            harness.start(
                lab.command(node, [PYTHON, "-m", "distenv", "run", "-n", "1", "--nnodes", "2",
                                   "--node-rank", str(node), "--master-addr", "node0",
                                   "--master-port", PORT, "--run-id", "netlab",
                                   *rank_check()[1:]]),
                env=env,
                timeout=BOUND_S,
            )
            for node in (0, 1)
        ]  # fmt: skip
        results = wait_all(launches)
        left = {lab.namespace(node): netlab.pids(lab.namespace(node)) for node in (0, 1)}
    for result in results:
        assert result.returncode == 0, result.text
        assert result.seconds < BOUND_S, result.text
    records = [rec for result in results for rec in result.records()]
    assert [(r["hostname"], r["info"]["rank"], r["info"]["node_rank"]) for r in records] == [
        ("node0", 0, 0),
        ("node1", 1, 1),
    ]
    assert {r["info"]["master_addr"] for r in records} == {"node0"}
    assert {r["info"]["job_id"] for r in records} == {"netlab"}
    assert [r["all_reduce"] for r in records] == [3, 3]
    assert left == {lab.namespace(0): [], lab.namespace(1): []}
    assert netlab.leftovers(lab.prefix) == []


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
    """Three nodes whose host names resolve to Debian's 127.0.1.1 on their own node: gloo
    advertises that, and the peers that dial it fail. The rank that reports it names the address
    and the interface variables (0.2.0.dev: "check that the backend is available in this torch
    build (nccl needs CUDA)"); every rank exits 1 by the deadline and nothing is left."""
    topology = debian_loopback(3)
    env = {**scrubbed_environ(), "WORLD_SIZE": "3", "MASTER_ADDR": topology.master_addr,
           "MASTER_PORT": PORT, "DISTENV_TIMEOUT": str(TIMEOUT_S)}  # fmt: skip
    with Lab(topology) as lab:
        procs = [
            lab.popen(node, [PYTHON, "-c", RANK], env={**env, "RANK": str(node)})
            for node in range(3)
        ]
        outs = [proc.communicate(timeout=TIMEOUT_S + 10 + 30)[0].decode() for proc in procs]
        left = [netlab.pids(lab.namespace(node)) for node in range(3)]
    assert [proc.returncode for proc in procs] == [1, 1, 1], outs
    named = [out for out in outs if "could not connect to another rank at 127.0.1.1" in out]
    assert named, outs
    for out in named:
        assert "GLOO_SOCKET_IFNAME" in out, out
    assert not any("nccl needs CUDA" in out for out in outs), outs
    assert left == [[], [], []]
