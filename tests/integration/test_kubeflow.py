"""Kubeflow pods on this machine: the operators' PET_* environment, real processes on loopback.

Kubernetes cannot run here, so each "pod" is a process given the environment the operator gives a
pod (recorded in tests/support/envs/kubeflow.py from training-operator v1.8.0 and trainer v2.1.0), with
the master pod's name replaced by 127.0.0.1 and a free port. What runs is real: `distenv run`
reading PET_* and starting its node's ranks, or the training script started directly, each
finishing an all_reduce across both "pods".
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from distenv.master import free_port
from tests.support.envs.kubeflow import (
    POD_V1_2X1_WORKER0,
    POD_V1_2X2_WORKER0,
    TRAINJOB_2X2_NODE1,
    two_pods,
)
from tests.support.integration.helpers import (
    DISTENV_RUN,
    RANK_CHECK,
    Harness,
    Result,
    rank_check,
    wait_all,
)


@pytest.fixture
def harness(tmp_path_factory: pytest.TempPathFactory) -> Harness:
    """Launches on this machine only: the "pods" need no Slurm cluster and no MPI."""
    return Harness.local(tmp_path_factory.mktemp("kubeflow"))


def _start(harness: Harness, argv: list[str], pods: list[dict[str, str]]) -> list[Result]:
    return wait_all(
        [
            harness.start(argv, env=harness.env(extra={**pod, "DISTENV_TIMEOUT": "20"}))
            for pod in pods
        ]
    )


@pytest.mark.parametrize(
    "recorded",
    [
        pytest.param(POD_V1_2X2_WORKER0, id="pytorchjob-v1"),
        pytest.param(TRAINJOB_2X2_NODE1, id="trainjob-v2"),
    ],
)
def test_distenv_run_in_each_pod_starts_its_nodes_ranks(
    harness: Harness, recorded: Mapping[str, str]
) -> None:
    """`distenv run -n 2` as the command of both pods of a 2 x 2 job: four ranks, one collective.

    Node index, node count and master come from PET_*; pod 1's ranks are 2 and 3.
    """
    pods = two_pods(recorded, free_port())
    results = _start(harness, [*DISTENV_RUN, "-n", "2", *rank_check()[1:]], pods)
    records = sorted(
        [rec for result in results for rec in result.ok().records()],
        key=lambda r: r["info"]["rank"],
    )
    assert [r["info"]["rank"] for r in records] == [0, 1, 2, 3]
    for rec in records:
        info = rec["info"]
        assert info["launcher"] == "pytorch", rec
        assert (info["world_size"], info["local_world_size"], info["num_nodes"]) == (4, 2, 2)
        assert info["node_rank"] == info["rank"] // 2, rec
        assert info["master_addr"] == "127.0.0.1", rec
        assert rec["all_reduce"] == 10, rec
    assert len({r["info"]["job_id"] for r in records}) == 1, records


def test_a_directly_started_process_in_a_two_process_pod_is_refused(harness: Harness) -> None:
    """`python train.py` as the container's command with nprocPerNode 2: refused, naming the fix."""
    pods = two_pods(POD_V1_2X2_WORKER0, free_port())
    results = _start(harness, rank_check(), pods)
    for result in results:
        assert result.returncode == 1, result.text
        assert "$PET_NPROC_PER_NODE is '2' ($WORLD_SIZE=4)" in result.text, result.text
        # The hint's example command runs the job's own script (distenv.hints).
        assert f"distenv run --nproc-per-node 2 {RANK_CHECK}" in result.text, result.text


def test_distenv_run_with_another_count_than_nproc_per_node_is_refused(harness: Harness) -> None:
    """`distenv run -n 3` as the command of a job with nprocPerNode 2: no rank starts, the error
    names PET_NPROC_PER_NODE, its value and the option to pass."""
    pods = two_pods(TRAINJOB_2X2_NODE1, free_port())
    results = _start(harness, [*DISTENV_RUN, "-n", "3", *rank_check()[1:]], pods)
    for result in results:
        assert result.returncode != 0, result.text
        assert "$PET_NPROC_PER_NODE='2' per node" in result.text, result.text
        assert "`distenv run --nproc-per-node 2 ...`" in result.text, result.text
        assert not result.records(), result.text


def test_one_process_per_pod_started_directly_is_a_complete_launch(harness: Harness) -> None:
    """nprocPerNode 1 (v1): `python train.py` in each pod is rank PET_NODE_RANK of PET_NNODES."""
    pods = two_pods(POD_V1_2X1_WORKER0, free_port())
    results = _start(harness, rank_check(), pods)
    records = sorted(
        [rec for result in results for rec in result.ok().records()],
        key=lambda r: r["info"]["rank"],
    )
    assert [r["info"]["rank"] for r in records] == [0, 1]
    for rec in records:
        info = rec["info"]
        assert info["launcher"] == "kubeflow", rec
        assert (info["world_size"], info["local_world_size"], info["num_nodes"]) == (2, 1, 2)
        assert info["node_rank"] == info["rank"], rec
        assert rec["all_reduce"] == 3, rec
