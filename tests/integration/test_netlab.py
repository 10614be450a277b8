"""`distenv run` across two "nodes" that are network namespaces (tests/support/netlab.py).

The first test on the network lab of issue #24: the clean control, where each node's host name
resolves to its bridge address; no Slurm needed. The lab's own behaviour is pinned in
tests/process/test_netlab.py; the matrix of broken topologies runs in benchmarks/network_matrix.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import netlab
from tests.support.integration.helpers import PYTHON, Harness, rank_check, wait_all
from tests.support.netlab import Lab
from tests.support.topologies import control

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
