"""The `vertex` backend over CLUSTER_SPECs recorded from Vertex AI's documentation."""

from __future__ import annotations

import json

import pytest

from distenv import RankInfo
from distenv.detection.pipeline import locate
from distenv.errors import (
    DistEnvError,
    InconsistentEnvironmentError,
    InvalidVariableError,
    MissingVariableError,
    NotLaunchedError,
)
from distenv.launchers.registry import VERTEX
from distenv.local.plan import scheduler_layout
from tests.support.envs import layout
from tests.support.envs.vertex import (
    JOB_ID,
    TORCHRUN_IN_VERTEX_RANK5,
    VERTEX_1P2W_PRIMARY,
    VERTEX_1P2W_WORKER1,
    VERTEX_PYTORCH_1P2W_WORKER1,
    VERTEX_REDUCTION_SERVER,
    VERTEX_REDUCTION_WORKER0,
    VERTEX_SINGLE,
    cluster_spec,
)

PRIMARY = ("cmle-training-workerpool0-ab123cd4e5-0", 2222)


def _layout(info: RankInfo) -> tuple[object, ...]:
    return (info.launcher, *layout(info))


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param(VERTEX_1P2W_PRIMARY, ("vertex", 0, 3, 0, 1, 0, 3), id="primary"),
        pytest.param(VERTEX_1P2W_WORKER1, ("vertex", 2, 3, 0, 1, 2, 3), id="worker1"),
        pytest.param(VERTEX_PYTORCH_1P2W_WORKER1, ("vertex", 2, 3, 0, 1, 2, 3), id="prebuilt"),
        pytest.param(VERTEX_REDUCTION_WORKER0, ("vertex", 1, 3, 0, 1, 1, 3), id="reduction"),
        pytest.param(VERTEX_SINGLE, ("vertex", 0, 1, 0, 1, 0, 1), id="single"),
    ],
)
def test_one_process_per_replica_primary_first(
    env: dict[str, str], expected: tuple[object, ...]
) -> None:
    """Rank = the replica's place in workerpool0 then workerpool1 (workerpool2's Reduction
    Server counts no rank); the master is workerpool0's replica with its port; scope the job id."""
    detection = locate("auto", env, runtime=False)
    assert _layout(detection.info) == expected
    assert (detection.info.master_addr, detection.info.master_port) == PRIMARY
    assert detection.info.job_id == JOB_ID
    assert VERTEX.scope(env) == f"vertex/{JOB_ID}/-"


def test_prebuilt_pytorch_container_is_vertex_not_a_torchrun_rank() -> None:
    """The prebuilt container's RANK/WORLD_SIZE/MASTER_* (no LOCAL_RANK) are Kubeflow-style to
    the pytorch backend; CLUSTER_SPEC vetoes that, and vertex checks them instead."""
    detection = locate("auto", VERTEX_PYTORCH_1P2W_WORKER1, runtime=False)
    assert detection.launcher is VERTEX
    assert ("pytorch", "not detected: no variables") in detection.considered


def test_master_addr_of_the_container_wins_over_workerpool0() -> None:
    """MASTER_ADDR/MASTER_PORT (the prebuilt container's, or the user's) are the master used."""
    env = {**VERTEX_PYTORCH_1P2W_WORKER1, "MASTER_ADDR": "10.128.0.2", "MASTER_PORT": "29400"}
    info = locate("auto", env, runtime=False).info
    assert (info.master_addr, info.master_port) == ("10.128.0.2", 29400)


@pytest.mark.parametrize(("name", "value"), [("RANK", "1"), ("WORLD_SIZE", "4")])
def test_prebuilt_rank_or_size_disagreeing_with_cluster_spec_is_refused(
    name: str, value: str
) -> None:
    """RANK and WORLD_SIZE must be the replica's place and count in CLUSTER_SPEC."""
    env = {**VERTEX_PYTORCH_1P2W_WORKER1, name: value}
    with pytest.raises(InconsistentEnvironmentError) as caught:
        VERTEX.rank_info(env)
    assert (caught.value.source, caught.value.variable, caught.value.value) == (
        "vertex",
        name,
        value,
    )
    with pytest.raises(InconsistentEnvironmentError, match="contradict vertex"):
        locate("auto", env, runtime=False)


def test_torchrun_inside_a_replica_wins() -> None:
    """torchrun started in a replica: its own contract answers, marked by TORCHELASTIC_RUN_ID."""
    detection = locate("auto", TORCHRUN_IN_VERTEX_RANK5, runtime=False)
    assert _layout(detection.info) == ("pytorch", 5, 6, 1, 2, 2, 3)
    assert ("vertex", "not detected: no variables") not in detection.considered


def test_distenv_run_in_a_replica_takes_node_count_rank_and_master() -> None:
    """`distenv run -n K` as a worker pool's command: node 2 of 3, master workerpool0[0]."""
    detection = scheduler_layout("run", VERTEX_1P2W_WORKER1)
    assert detection is not None
    info = detection.info
    assert (info.node_rank, info.num_nodes, info.local_world_size) == (2, 3, 1)
    assert (info.master_addr, info.master_port) == PRIMARY
    assert detection.job_tag == f"vertex/{JOB_ID}/-"


@pytest.mark.parametrize(
    ("env", "pool"),
    [
        pytest.param(VERTEX_REDUCTION_SERVER, "workerpool2", id="reduction-server"),
        pytest.param(
            {"CLUSTER_SPEC": cluster_spec("workerpool3", 0, (1, 2, 0, 1))},
            "workerpool3",
            id="evaluator",
        ),
    ],
)
def test_replicas_outside_the_training_world_are_refused(env: dict[str, str], pool: str) -> None:
    """Parameter servers, Reduction Server and evaluators are no ranks: refused, naming the pool."""
    with pytest.raises(NotLaunchedError, match=f"{pool}\\[0\\]") as caught:
        locate("auto", env, runtime=False)
    assert (caught.value.source, caught.value.variable) == ("vertex", "CLUSTER_SPEC")
    assert "--launcher none" in (caught.value.hint or "")


GOOD = json.loads(VERTEX_1P2W_WORKER1["CLUSTER_SPEC"])


def _with(**changes: object) -> str:
    return json.dumps({**GOOD, **changes})


@pytest.mark.parametrize(
    ("spec", "error", "match"),
    [
        pytest.param("workerpool1", InvalidVariableError, "no JSON", id="not-json"),
        pytest.param(
            VERTEX_1P2W_WORKER1["CLUSTER_SPEC"][:150],
            InvalidVariableError,
            "no JSON",
            id="truncated",
        ),
        pytest.param("[" * 100_000, InvalidVariableError, "nests too deeply", id="nested"),
        pytest.param(" " * 1_000_001 + "{}", InvalidVariableError, "at most 1000000", id="huge"),
        pytest.param("[]", InvalidVariableError, "no JSON object", id="list"),
        pytest.param(
            _with(cluster={}), InvalidVariableError, "no object of worker pools", id="no-pools"
        ),
        pytest.param(
            _with(cluster={"chief": ["h:1"]}), InvalidVariableError, "a pool 'chief'", id="tf-pool"
        ),
        pytest.param(
            _with(cluster={"workerpool0": "h:1"}), InvalidVariableError, "no list", id="pool-str"
        ),
        pytest.param(
            _with(cluster={"workerpool0": ["h"]}),
            InvalidVariableError,
            "no 'host:port'",
            id="no-port",
        ),
        pytest.param(
            _with(cluster={"workerpool0": ["h:70000"]}),
            InvalidVariableError,
            "no 'host:port'",
            id="big-port",
        ),
        pytest.param(
            _with(cluster={"workerpool0": ["a b:1"]}),
            InvalidVariableError,
            "host name",
            id="bad-host",
        ),
        pytest.param(
            _with(task={"type": "workerpool0"}),
            InvalidVariableError,
            'integer "index"',
            id="no-index",
        ),
        pytest.param(
            _with(task={"type": "workerpool0", "index": True}),
            InvalidVariableError,
            "integer",
            id="bool-index",
        ),
        pytest.param(
            _with(task={"type": "workerpool5", "index": 0}),
            InconsistentEnvironmentError,
            "none of its pools",
            id="unknown-pool",
        ),
        pytest.param(
            _with(task={"type": "workerpool1", "index": 2}),
            InconsistentEnvironmentError,
            "outside workerpool1's 2",
            id="index-beyond",
        ),
        pytest.param(
            _with(task={"type": "workerpool1", "index": -1}),
            InconsistentEnvironmentError,
            "outside",
            id="negative",
        ),
        pytest.param(
            _with(
                cluster={"workerpool0": [], "workerpool1": ["h:1"]},
                task={"type": "workerpool1", "index": 0},
            ),
            InconsistentEnvironmentError,
            "no replica",
            id="no-primary",
        ),
    ],
)
def test_malformed_cluster_spec_is_refused_naming_it(
    spec: str, error: type[DistEnvError], match: str
) -> None:
    """Malformed, truncated, nested or contradicting CLUSTER_SPECs: refused in one short line,
    naming CLUSTER_SPEC and what is wrong with it, never read as rank 0 of 1."""
    with pytest.raises(error, match=match) as caught:
        locate("auto", {"CLUSTER_SPEC": spec}, runtime=False)
    assert (caught.value.source, caught.value.variable, caught.value.value) == (
        "vertex",
        "CLUSTER_SPEC",
        spec,
    )
    assert len(str(caught.value)) < 800


def test_missing_cluster_spec_with_launcher_vertex_names_how_to_start() -> None:
    """--launcher vertex off Vertex AI says how a job starts there."""
    with pytest.raises(DistEnvError, match="Vertex AI custom job"):
        locate("vertex", {}, runtime=False)
    with pytest.raises(MissingVariableError):
        VERTEX.rank_info({})
