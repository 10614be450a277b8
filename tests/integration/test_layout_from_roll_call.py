"""The roll call fills a node layout the launcher leaves unknown, on real hosts under real srun.

Flux names no node index and no tasks per node (tests/support/envs/flux.py); Flux itself cannot be
installed here. tests/support/integration/as_flux_task.py turns each task of a real ``srun`` on the
simulated multi-node cluster (nodes with their own host names) into the Flux task it would be,
with every Slurm variable removed: distenv detects Flux, leaves node_rank and local_world_size
unknown, and init_dist's roll call must number the hosts in order of their lowest rank and count
the ranks on each. Every rank then finishes an all_reduce, and its filled layout, and the
LOCAL_WORLD_SIZE / GROUP_RANK it exported, are asserted against where Slurm really put it.
"""

from __future__ import annotations

import pytest

from tests.support.integration.helpers import (
    HERE,
    JOB_NAME,
    PYTHON,
    TWO_BY_TWO,
    Harness,
    Layout,
    check_world,
    rank_check,
    wait_all,
)

pytestmark = pytest.mark.slurm

AS_FLUX = [PYTHON, str(HERE / "as_flux_task.py")]
SRUN = ["srun", "-J", JOB_NAME, "-N", "2"]
# srun -N 2 -n 3 -m cyclic: ranks 0 and 2 on the first node, rank 1 alone on the second.
CYCLIC_3: list[Layout] = [(0, 3, 0, 2, 0, 2), (1, 3, 0, 1, 1, 2), (2, 3, 1, 2, 0, 2)]


def test_flux_tasks_get_their_node_and_local_size_from_the_roll_call(harness: Harness) -> None:
    """2 x 2 by block, and 3 tasks cyclic and uneven over 2 hosts: every rank's layout is filled."""
    block, cyclic = wait_all(
        [
            harness.start(
                [*SRUN, "--ntasks-per-node", "2", *AS_FLUX, *rank_check()], cluster="multi"
            ),
            harness.start(
                [*SRUN, "-n", "3", "-m", "cyclic", *AS_FLUX, *rank_check()], cluster="multi"
            ),
        ]
    )
    for result, layouts in ((block, TWO_BY_TWO), (cyclic, CYCLIC_3)):
        recs = check_world(result, launcher="flux", layouts=layouts)
        hosts = [r["hostname"] for r in recs]
        assert len(set(hosts)) == 2, hosts
        for rec in recs:
            info, env = rec["info"], rec["env"]
            assert info["job_id"].startswith("\u0192"), rec
            assert env["LOCAL_WORLD_SIZE"] == str(hosts.count(rec["hostname"])), rec
            assert env["GROUP_RANK"] == str(info["node_rank"]), rec
            assert env["LOCAL_RANK"] == str(info["local_rank"]), rec
