"""The `indexed-job` (Indexed Job, JobSet) and `volcano` backends over recorded pod environments."""

from __future__ import annotations

import pytest

from distenv.detection.pipeline import locate
from distenv.errors import InvalidVariableError, MissingVariableError, NotLaunchedError
from tests.support.envs.indexed_job import INDEXED_BARE_POD1, JOBSET_EXAMPLE_POD2, JOBSET_WORLD_POD2
from tests.support.envs.kubeflow import TRAINJOB_2X1_NODE1
from tests.support.envs.volcano import VOLCANO_SINGLE, VOLCANO_WORKER0_PYTORCH, VOLCANO_WORKER0_SVC


@pytest.mark.parametrize(
    "env",
    [
        pytest.param(JOBSET_EXAMPLE_POD2, id="jobset-example"),
        pytest.param(INDEXED_BARE_POD1, id="bare"),
    ],
)
def test_indexed_job_pod_without_a_pod_count_is_refused(env: dict[str, str]) -> None:
    """JOB_COMPLETION_INDEX numbers pods, not processes, and nothing says how many: refused
    (0.1.0 ran JobSet's example, started directly, as rank 0 of 1 on every pod)."""
    with pytest.raises(NotLaunchedError) as caught:
        locate("auto", env, runtime=False)
    exc = caught.value
    assert (exc.source, exc.variable) == ("indexed-job", "WORLD_SIZE")
    assert f"$JOB_COMPLETION_INDEX={env['JOB_COMPLETION_INDEX']}" in str(exc)
    assert "--node-rank $JOB_COMPLETION_INDEX" in str(exc)


def test_indexed_job_with_world_size_is_one_process_per_pod() -> None:
    """WORLD_SIZE set in the template: rank = completion index, master = the user's MASTER_*."""
    info = locate("auto", JOBSET_WORLD_POD2, runtime=False).info
    assert (info.launcher, info.rank, info.world_size, info.node_rank, info.num_nodes) == (
        "indexed-job",
        2,
        4,
        2,
        4,
    )
    assert (info.master_addr, info.master_port) == ("pytorch-workers-0-0.pytorch", 3389)


def test_indexed_job_without_master_addr_names_it() -> None:
    """Kubernetes does not say where pod 0 is: MASTER_ADDR is asked for, with its usual form."""
    env = {"JOB_COMPLETION_INDEX": "2", "WORLD_SIZE": "4"}
    with pytest.raises(MissingVariableError, match=r"<jobset>-<job>-0-0") as caught:
        locate("auto", env, runtime=False)
    assert (caught.value.source, caught.value.variable) == ("indexed-job", "MASTER_ADDR")


def test_trainjob_pod_is_kubeflows_not_the_indexed_jobs() -> None:
    """A TrainJob pod is also an Indexed Job's: the PET_* variables answer."""
    assert locate("auto", TRAINJOB_2X1_NODE1, runtime=False).info.launcher == "kubeflow"


def test_volcano_task_index_is_no_rank() -> None:
    """worker-0 and master-0 both have VC_TASK_INDEX 0: a direct start is refused with the fix."""
    with pytest.raises(NotLaunchedError) as caught:
        locate("auto", VOLCANO_WORKER0_SVC, runtime=False)
    exc = caught.value
    assert (exc.source, exc.variable, exc.value) == ("volcano", "VC_TASK_INDEX", "0")
    assert "master-0 and worker-0 are both 0" in str(exc)
    assert "VC_MASTER_HOSTS, VC_WORKER_HOSTS list 3 pods" in str(exc)
    assert "pytorch plugin" in str(exc)


def test_volcano_pytorch_plugin_is_one_process_per_pod() -> None:
    """The pytorch plugin's RANK/WORLD_SIZE/MASTER_*: worker-0 is rank 1 of 3."""
    info = locate("auto", VOLCANO_WORKER0_PYTORCH, runtime=False).info
    assert (info.launcher, info.rank, info.world_size, info.local_world_size) == (
        "pytorch",
        1,
        3,
        1,
    )
    assert (info.master_addr, info.master_port) == ("pt-master-0.pt", 23456)


def test_volcano_one_pod_job_is_a_single_process() -> None:
    """A one-pod Volcano job without the plugin runs as rank 0 of 1."""
    info = locate("auto", VOLCANO_SINGLE, runtime=False).info
    assert (info.launcher, info.rank, info.world_size) == ("volcano", 0, 1)


@pytest.mark.parametrize("value", [",,,", "pt-worker-0.pt,,pt-worker-1.pt", "pt-worker-0.pt,a b"])
def test_volcano_host_list_with_empty_or_bad_items_is_refused(value: str) -> None:
    """VC_WORKER_HOSTS=',,,' was counted as 4 pods: empty and malformed items are refused."""
    env = {**VOLCANO_SINGLE, "VC_WORKER_HOSTS": value}
    with pytest.raises(InvalidVariableError) as caught:
        locate("auto", env, runtime=False)
    assert (caught.value.source, caught.value.variable) == ("volcano", "VC_WORKER_HOSTS")
