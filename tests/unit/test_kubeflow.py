"""The `kubeflow` backend over environments recorded from the operators' sources."""

from __future__ import annotations

import pytest

from distenv import RankInfo
from distenv.detection.pipeline import locate
from distenv.errors import (
    DistEnvError,
    InconsistentEnvironmentError,
    InvalidVariableError,
    LauncherNotFoundError,
    MissingVariableError,
    NotLaunchedError,
)
from distenv.launchers.registry import KUBEFLOW
from distenv.local.plan import scheduler_layout
from tests.support.envs.kubeflow import (
    POD_V1_2X1_WORKER0,
    POD_V1_2X2_MASTER,
    POD_V1_2X2_WORKER0,
    POD_V1_AUTO_WORKER0,
    POD_V1_ELASTIC,
    TORCHRUN_IN_POD_V1_RANK3,
    TRAINJOB_2X1_NODE1,
    TRAINJOB_2X2_NODE1,
    TRAINJOB_AUTO_NODE1,
)


def _pod(launcher: str, rank: int, world: int, addr: str, port: int) -> RankInfo:
    return RankInfo(
        launcher=launcher,
        rank=rank,
        world_size=world,
        local_rank=0,
        local_world_size=1,
        node_rank=rank,
        num_nodes=world,
        master_addr=addr,
        master_port=port,
        job_id=addr,
    )


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param(POD_V1_2X1_WORKER0, _pod("kubeflow", 1, 2, "ddp-master-0", 23456), id="v1-1"),
        pytest.param(POD_V1_AUTO_WORKER0, _pod("kubeflow", 1, 2, "ddp-master-0", 23456), id="auto"),
        pytest.param(
            TRAINJOB_2X1_NODE1,
            _pod("kubeflow", 1, 2, "trainjob-node-0-0.trainjob", 29500),
            id="v2-1",
        ),
    ],
)
def test_one_process_per_pod_is_a_complete_launch(env: dict[str, str], expected: RankInfo) -> None:
    """nprocPerNode 1 (v1's 'auto' counts 1 in WORLD_SIZE): rank = node rank, master = PET_*."""
    assert locate("auto", env, runtime=False).info == expected


@pytest.mark.parametrize(
    "env",
    [
        pytest.param(POD_V1_2X2_MASTER, id="v1-master"),
        pytest.param(POD_V1_2X2_WORKER0, id="v1-worker"),
        pytest.param(TRAINJOB_2X2_NODE1, id="v2"),
        pytest.param(TRAINJOB_AUTO_NODE1, id="v2-auto"),
    ],
)
def test_a_direct_start_in_a_multi_process_pod_is_refused(env: dict[str, str]) -> None:
    """v1's RANK is the pod index, not a rank: a direct start is refused, naming the fix."""
    with pytest.raises(NotLaunchedError) as caught:
        locate("auto", env, runtime=False)
    exc = caught.value
    assert (exc.source, exc.variable, exc.value) == (
        "kubeflow",
        "PET_NPROC_PER_NODE",
        env["PET_NPROC_PER_NODE"],
    )
    assert "started directly in pod" in str(exc)
    assert "torchrun train.py" in str(exc)
    assert "distenv run --nproc-per-node" in str(exc)


def test_v1_refusal_names_world_size_and_the_number() -> None:
    """The message quotes what the operator set: nprocPerNode 2, WORLD_SIZE 4."""
    with pytest.raises(
        NotLaunchedError, match=r"pod 1 of 2 \(\$PET_NNODES\), but \$PET_NPROC_PER_NODE is '2' "
    ):
        KUBEFLOW.rank_info(POD_V1_2X2_WORKER0)
    with pytest.raises(NotLaunchedError, match=r"\(\$WORLD_SIZE=4\).*--nproc-per-node 2 train"):
        KUBEFLOW.rank_info(POD_V1_2X2_WORKER0)


def test_torchrun_in_a_pod_is_pytorch() -> None:
    """Rank 3 of a 2 x 2 PyTorchJob started by torchrun: torchrun's contract answers."""
    info = locate("auto", TORCHRUN_IN_POD_V1_RANK3, runtime=False).info
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.node_rank) == (
        "pytorch",
        3,
        4,
        1,
        1,
    )
    assert (info.master_addr, info.master_port) == ("ddp-master-0", 23456)


@pytest.mark.parametrize(
    ("env", "node", "addr"),
    [
        pytest.param(POD_V1_2X2_WORKER0, 1, "ddp-master-0", id="v1"),
        pytest.param(TRAINJOB_2X2_NODE1, 1, "trainjob-node-0-0.trainjob", id="v2"),
        pytest.param(TRAINJOB_2X1_NODE1, 1, "trainjob-node-0-0.trainjob", id="v2-1"),
    ],
)
def test_distenv_run_in_a_pod_is_the_nodes_agent(env: dict[str, str], node: int, addr: str) -> None:
    """`distenv run` in a pod takes node index, node count and master from PET_*."""
    layout = scheduler_layout("run", env)
    assert layout is not None
    info = layout.info
    assert (info.launcher, info.node_rank, info.num_nodes, info.local_world_size) == (
        "kubeflow",
        node,
        2,
        1,
    )
    assert info.master_addr == addr
    assert layout.scope == f"kubeflow/{addr}/-"


def test_elastic_job_needs_torchrun() -> None:
    """An elastic PyTorchJob's PET_NNODES is a range: torchrun's rendezvous decides."""
    with pytest.raises(NotLaunchedError, match=r"\$PET_NNODES is '1:4'.*`torchrun train.py") as c:
        locate("auto", POD_V1_ELASTIC, runtime=False)
    assert (c.value.variable, c.value.value) == ("PET_NNODES", "1:4")


@pytest.mark.parametrize(
    "missing", ["PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"], ids=lambda v: v
)
@pytest.mark.parametrize("how", ["unset", "empty"])
def test_missing_required_variable(missing: str, how: str) -> None:
    """Each required PET_* variable, unset or empty, is named in the error."""
    env = dict(TRAINJOB_2X1_NODE1)
    if how == "unset":
        del env[missing]
    else:
        env[missing] = ""
    with pytest.raises(MissingVariableError) as caught:
        KUBEFLOW.rank_info(env)
    assert (caught.value.source, caught.value.variable) == ("kubeflow", missing)
    assert f"${missing}" in str(caught.value) or missing in str(caught.value)


@pytest.mark.parametrize(
    ("change", "error", "variable"),
    [
        ({"WORLD_SIZE": "6"}, InconsistentEnvironmentError, "WORLD_SIZE"),
        ({"RANK": "0"}, InconsistentEnvironmentError, "RANK"),
        ({"PET_NODE_RANK": "2", "RANK": "2"}, InconsistentEnvironmentError, "PET_NODE_RANK"),
        ({"PET_MASTER_ADDR": "a b"}, DistEnvError, "PET_MASTER_ADDR"),
        ({"PET_MASTER_PORT": "70000"}, DistEnvError, "PET_MASTER_PORT"),
        ({"PET_NNODES": "two"}, DistEnvError, "PET_NNODES"),
        ({"PET_NNODES": "1:x"}, InvalidVariableError, "PET_NNODES"),
        ({"PET_MASTER_ADDR": "a" * 254}, InvalidVariableError, "PET_MASTER_ADDR"),
        ({"PET_NPROC_PER_NODE": "-1"}, InvalidVariableError, "PET_NPROC_PER_NODE"),
        ({"PET_NPROC_PER_NODE": "0"}, InvalidVariableError, "PET_NPROC_PER_NODE"),
        ({"PET_NPROC_PER_NODE": "2 gpus"}, InvalidVariableError, "PET_NPROC_PER_NODE"),
    ],
    ids=[
        "world",
        "rank",
        "node-rank",
        "addr",
        "port",
        "nnodes",
        "nnodes-range",
        "addr-254",
        "nproc-negative",
        "nproc-zero",
        "nproc-words",
    ],
)
def test_contradictions_and_bad_values_are_named(
    change: dict[str, str], error: type[DistEnvError], variable: str
) -> None:
    """A value the operator would never set is refused, naming the variable and the value."""
    env = {**POD_V1_2X1_WORKER0, **change}
    with pytest.raises(error) as caught:
        KUBEFLOW.rank_info(env)
    assert caught.value.variable == variable
    assert caught.value.value == env[variable]


def test_launcher_pytorch_in_a_pod_names_kubeflow() -> None:
    """--launcher pytorch where only the pod's variables are: refused, pointing at kubeflow."""
    with pytest.raises(LauncherNotFoundError, match="auto-detection finds 'kubeflow'"):
        locate("pytorch", POD_V1_2X2_WORKER0, runtime=False)


def test_distenv_run_children_in_a_pod_are_pytorch() -> None:
    """A rank `distenv run` started in a pod: its contract (marked DISTENV_RUN_ID) answers."""
    child = {
        **POD_V1_2X2_WORKER0,
        "RANK": "3",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "DISTENV_RUN_ID": "kubeflow/ddp-master-0/-",
    }
    info = locate("auto", child, runtime=False).info
    assert (info.launcher, info.rank, info.world_size, info.node_rank) == ("pytorch", 3, 4, 1)


@pytest.mark.parametrize(
    ("env", "nproc", "value"),
    [
        (POD_V1_2X2_WORKER0, "3", "2"),
        (TRAINJOB_2X2_NODE1, "1", "2"),  # the default -n 1 in a 2-process pod
        (TRAINJOB_2X1_NODE1, "2", "1"),
    ],
)
def test_distenv_run_with_another_nproc_than_the_job_is_refused(
    env: dict[str, str], nproc: str, value: str
) -> None:
    """`distenv run -n N` in a pod whose job states another nprocPerNode: refused with the fix."""
    from distenv.cli import build_parser
    from distenv.errors import ConfigurationError
    from distenv.local.run import build_children

    args = build_parser().parse_args(["run", "-n", nproc, "train.py"])
    with pytest.raises(ConfigurationError) as caught:
        build_children(args, env)
    error = caught.value
    assert (error.variable, error.value) == ("PET_NPROC_PER_NODE", value)
    assert f"$PET_NPROC_PER_NODE={value!r}" in str(error)
    assert f"`distenv run --nproc-per-node {value} ...`" in str(error)


@pytest.mark.parametrize(
    ("env", "nproc", "ranks"),
    [
        (POD_V1_2X2_WORKER0, "2", [2, 3]),
        (TRAINJOB_2X1_NODE1, "1", [1]),
        (TRAINJOB_AUTO_NODE1, "3", [3, 4, 5]),  # 'auto' is the pod's to resolve: not compared
    ],
)
def test_distenv_run_with_the_jobs_nproc_starts_its_ranks(
    env: dict[str, str], nproc: str, ranks: list[int]
) -> None:
    """The job's own count (or a non-numeric nprocPerNode) starts the node's ranks."""
    from distenv.cli import build_parser
    from distenv.local.run import build_children

    args = build_parser().parse_args(["run", "-n", nproc, "train.py"])
    assert [child.rank for child in build_children(args, env)] == ranks


@pytest.mark.parametrize("value", ["-1", "0", "x" * 40])
def test_malformed_nproc_per_node_is_refused_by_every_hook(value: str) -> None:
    """PET_NPROC_PER_NODE=-1 was silently read as 'not one process per pod': now it is named."""
    env = {**TRAINJOB_2X1_NODE1, "PET_NPROC_PER_NODE": value}
    for hook in (KUBEFLOW.rank_info, KUBEFLOW.processes_per_node, KUBEFLOW.world):
        with pytest.raises(InvalidVariableError) as caught:
            hook(env)
        assert (caught.value.variable, caught.value.value) == ("PET_NPROC_PER_NODE", value)
