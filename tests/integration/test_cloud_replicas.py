"""Vertex AI replicas and Azure ML's PyTorch distribution on this machine, on loopback.

Neither service can run here, so each replica or process is started with the environment the
service gives it (recorded in tests/support/envs/vertex.py and azureml.py from the vendors'
documentation), every address replaced by 127.0.0.1 and a free port. What runs is real: `distenv
run` reading CLUSTER_SPEC in each "replica" and starting its node's ranks, or the processes Azure
ML would start, each finishing an all_reduce across the job.
"""

from __future__ import annotations

from typing import Any

import pytest

from distenv.master import free_port
from tests.support.envs.azureml import pytorch_processes
from tests.support.envs.vertex import JOB_ID, two_replicas
from tests.support.integration.helpers import (
    DISTENV_RUN,
    REPO,
    Harness,
    Result,
    rank_check,
    wait_all,
)


@pytest.fixture
def harness(tmp_path_factory: pytest.TempPathFactory) -> Harness:
    """Launches on this machine only: the "replicas" need no Slurm cluster and no MPI."""
    return Harness.local(tmp_path_factory.mktemp("cloud"))


def _start(harness: Harness, argv: list[str], envs: list[dict[str, str]]) -> list[Result]:
    # PYTHONPATH: the ranks import this checkout's distenv, not another one the venv may hold.
    extra = {"DISTENV_TIMEOUT": "20", "PYTHONPATH": str(REPO)}
    return wait_all([harness.start(argv, env=harness.env(extra={**env, **extra})) for env in envs])


def _records(results: list[Result]) -> list[dict[str, Any]]:
    return sorted(
        [rec for result in results for rec in result.ok().records()],
        key=lambda r: r["info"]["rank"],
    )


def test_distenv_run_in_each_vertex_replica_starts_its_nodes_ranks(harness: Harness) -> None:
    """`distenv run -n 2` as the command of workerpool0's and workerpool1's replica: four ranks,
    one collective; node index, count and master from CLUSTER_SPEC, the run id from the job id."""
    replicas = two_replicas(free_port())
    records = _records(_start(harness, [*DISTENV_RUN, "-n", "2", *rank_check()[1:]], replicas))
    assert [r["info"]["rank"] for r in records] == [0, 1, 2, 3]
    for rec in records:
        info = rec["info"]
        assert info["launcher"] == "pytorch", rec
        assert (info["world_size"], info["local_world_size"], info["num_nodes"]) == (4, 2, 2)
        assert info["node_rank"] == info["rank"] // 2, rec
        assert info["master_addr"] == "127.0.0.1", rec
        assert rec["all_reduce"] == 10, rec
    assert {r["info"]["job_id"] for r in records} == {f"vertex/{JOB_ID}/-"}, records


def test_azureml_pytorch_processes_started_directly_finish_a_collective(harness: Harness) -> None:
    """2 nodes x 2 processes as Azure ML's PyTorch distribution starts them (RANK, LOCAL_RANK,
    WORLD_SIZE, NODE_RANK, MASTER_*, no LOCAL_WORLD_SIZE): azureml's layout, one all_reduce."""
    records = _records(_start(harness, rank_check(), pytorch_processes(free_port())))
    assert [r["info"]["rank"] for r in records] == [0, 1, 2, 3]
    for rec in records:
        info = rec["info"]
        assert info["launcher"] == "azureml", rec
        assert (info["world_size"], info["local_world_size"], info["num_nodes"]) == (4, 2, 2)
        assert (info["node_rank"], info["local_rank"]) == divmod(info["rank"], 2), rec
        assert info["master_addr"] == "127.0.0.1", rec
        assert rec["all_reduce"] == 10, rec
        assert rec["env"]["LOCAL_WORLD_SIZE"] == "2", rec
