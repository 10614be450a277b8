"""`distenv run` on the real Slurm: one local launcher per node inside an srun step."""

from __future__ import annotations

import pytest

from tests.support.integration.helpers import (
    DISTENV_RUN,
    JOB_NAME,
    TWO_BY_TWO,
    Harness,
    Result,
    check_world,
    rank_check,
    wait_all,
)
from tests.support.nodes import node_options


@pytest.mark.slurm
def test_one_distenv_run_per_node_inside_srun(harness: Harness) -> None:
    """`srun -N 2 --ntasks-per-node 1 distenv run -n 2 ...`: nodes, node rank and master from Slurm.

    Four ranks, two per node; the master is the step's first node; every child sees the torchrun
    contract (the `pytorch` backend) and finishes the all_reduce.
    """
    result = harness.run(
        ["srun", "-J", JOB_NAME, "-N", "2", "--ntasks-per-node", "1", *DISTENV_RUN, "-n", "2",
         *rank_check()[1:]],
        cluster="multi",
    )  # fmt: skip
    recs = check_world(result, launcher="pytorch", layouts=TWO_BY_TWO)
    hosts = [r["hostname"] for r in recs]
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3], hosts
    assert recs[0]["info"]["master_addr"] == hosts[0]


def _two_nodes(harness: Harness, run_ids: tuple[str, str]) -> list[Result]:
    """docs/start/local.md's two-node recipe, both "nodes" on this machine (127.0.0.1)."""
    env = harness.env(extra={"DISTENV_TIMEOUT": "5"})
    return wait_all(
        [
            harness.start([*DISTENV_RUN, *node, *rank_check()[1:]], env=env)
            for node in node_options(2, ranks=2, run_id=run_ids)
        ]
    )


def test_two_node_recipe_with_a_shared_run_id(harness: Harness) -> None:
    """`distenv run --nnodes 2 --node-rank K --master-addr ... --run-id exp1` on each node: 4 ranks.

    Ranks of both nodes carry the run id as their job id and meet under it.
    """
    node0, node1 = _two_nodes(harness, ("exp1", "exp1"))
    records = sorted(node0.ok().records() + node1.ok().records(), key=lambda r: r["info"]["rank"])
    assert [r["info"]["rank"] for r in records] == [0, 1, 2, 3]
    assert {r["info"]["job_id"] for r in records} == {"exp1"}
    assert {r["info"]["node_rank"] for r in records[2:]} == {1}


def test_two_nodes_with_different_run_ids_never_meet(harness: Harness) -> None:
    """A node given another --run-id is another run: its ranks refuse node 0's store at once,
    node 0's ranks name the ranks that never came, each within the bound."""
    node0, node1 = _two_nodes(harness, ("exp1", "exp2"))
    assert node1.returncode == 1, node1.text
    assert "is another job's: pytorch/exp1/-/n4; this job is pytorch/exp2/-/n4" in node1.text
    assert node0.returncode == 1, node0.text
    assert "2 of 4 ranks did not check in within 5 s: rank 2" in node0.text, node0.text
