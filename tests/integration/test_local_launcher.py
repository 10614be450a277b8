"""`distenv run` on the real Slurm: one local launcher per node inside an srun step."""

from __future__ import annotations

import pytest

from tests.integration.helpers import JOB_NAME, PYTHON, TWO_BY_TWO, Harness, check_world, rank_check

DISTENV_RUN = [PYTHON, "-m", "distenv", "run"]


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
