"""The `skypilot` backend over environments recorded from SkyPilot's documentation and source."""

from __future__ import annotations

import pytest

from distenv.detection.pipeline import locate
from distenv.errors import (
    DistEnvError,
    InconsistentEnvironmentError,
    InvalidVariableError,
    MissingVariableError,
)
from distenv.launchers.registry import SKYPILOT, get_launcher
from distenv.local.plan import scheduler_layout
from distenv.master import scheduler_port
from tests.support import docblocks
from tests.support.envs import layout
from tests.support.envs.skypilot import (
    SKY_2N_NODE0,
    SKY_2N_NODE1,
    SKY_MANAGED_NODE1,
    SKY_TORCHRUN_RANK3,
)

TASK = SKY_2N_NODE1["SKYPILOT_TASK_ID"]


@pytest.mark.parametrize(
    ("env", "rank"),
    [pytest.param(SKY_2N_NODE0, 0, id="head"), pytest.param(SKY_2N_NODE1, 1, id="node1")],
)
def test_run_commands_on_each_node_are_one_rank_per_node(env: dict[str, str], rank: int) -> None:
    """`python train.py` in run: is rank SKYPILOT_NODE_RANK of SKYPILOT_NUM_NODES, with the
    first IP as master and a port every node derives alike from the task id."""
    info = locate("auto", env, runtime=False).info
    assert (info.launcher, *layout(info)) == ("skypilot", rank, 2, 0, 1, rank, 2)
    assert (info.master_addr, info.master_port) == ("10.128.0.14", scheduler_port(TASK, "0"))
    assert info.job_id == TASK


def test_a_managed_job_keeps_its_scope_across_recoveries() -> None:
    """The scope and port come from SKYPILOT_TASK_ID, which a managed job keeps."""
    detection = locate("auto", SKY_MANAGED_NODE1, runtime=False)
    task = SKY_MANAGED_NODE1["SKYPILOT_TASK_ID"]
    assert detection.job_tag == f"skypilot/{task}/-"
    assert detection.info.master_port == scheduler_port(task, "0")


def test_torchrun_in_run_commands_wins() -> None:
    """torchrun started in run: (SkyPilot's own example): torchrun's contract answers, and it
    agrees with SkyPilot's node (GROUP_RANK 1 on node 1)."""
    info = locate("auto", SKY_TORCHRUN_RANK3, runtime=False).info
    assert (info.launcher, *layout(info)) == ("pytorch", 3, 4, 1, 2, 1, 2)
    assert (info.master_addr, info.master_port) == ("10.128.0.14", 8008)


def test_mpi_ranks_take_the_first_ip_as_master() -> None:
    """mpirun on the head node over the IPs: MPI's ranks, the master from SkyPilot's first IP."""
    env = {
        **SKY_2N_NODE0,
        "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    }
    detection = locate("auto", env, runtime=False)
    assert detection.info.launcher == "mpi"
    assert detection.info.master_addr == "10.128.0.14"
    assert ("skypilot", "master taken from its allocation: 10.128.0.14") in detection.considered


def test_distenv_run_on_a_node_is_its_agent() -> None:
    """`distenv run` in run: takes node index, node count and master from SkyPilot."""
    found = scheduler_layout("run", SKY_2N_NODE1)
    assert found is not None
    info = found.info
    assert (info.launcher, info.node_rank, info.num_nodes, info.local_world_size) == (
        "skypilot",
        1,
        2,
        1,
    )
    assert info.master_addr == "10.128.0.14"
    assert found.scope == f"skypilot/{TASK}/-"


def test_the_name_and_its_alias() -> None:
    """`--launcher skypilot` and `--launcher sky` are the same backend."""
    assert get_launcher("sky") is SKYPILOT
    assert locate("sky", SKY_2N_NODE1, runtime=False).info.rank == 1


@pytest.mark.parametrize(
    "missing", ["SKYPILOT_NODE_RANK", "SKYPILOT_NODE_IPS", "SKYPILOT_NUM_NODES"]
)
@pytest.mark.parametrize("how", ["unset", "empty"])
def test_missing_required_variable(missing: str, how: str) -> None:
    """Each required variable, unset or empty, is named in the error with SkyPilot's hint."""
    env = dict(SKY_2N_NODE1)
    if how == "unset":
        del env[missing]
    else:
        env[missing] = ""
    with pytest.raises(MissingVariableError) as caught:
        SKYPILOT.rank_info(env)
    assert (caught.value.source, caught.value.variable) == ("skypilot", missing)
    assert f"${missing} is not set" in str(caught.value)
    assert "run: commands" in (caught.value.hint or "")


@pytest.mark.parametrize(
    ("change", "error", "variable", "match"),
    [
        ({"SKYPILOT_NODE_RANK": "worker1"}, InvalidVariableError, "SKYPILOT_NODE_RANK", "integer"),
        ({"SKYPILOT_NODE_RANK": "-1"}, InvalidVariableError, "SKYPILOT_NODE_RANK", "integer"),
        ({"SKYPILOT_NUM_NODES": "two"}, InvalidVariableError, "SKYPILOT_NUM_NODES", "integer"),
        ({"SKYPILOT_NUM_NODES": "0"}, InvalidVariableError, "SKYPILOT_NUM_NODES", r"in \[1,"),
        (
            {"SKYPILOT_NUM_NODES": "3"},
            InconsistentEnvironmentError,
            "SKYPILOT_NUM_NODES",
            "lists 2",
        ),
        (
            {"SKYPILOT_NODE_RANK": "2"},
            InconsistentEnvironmentError,
            "SKYPILOT_NODE_RANK",
            "not below",
        ),
        (
            {"SKYPILOT_NODE_IPS": "10.0.0.1,10.0.0.2"},
            InvalidVariableError,
            "SKYPILOT_NODE_IPS",
            "host name or address",
        ),
        (
            {"SKYPILOT_NODE_IPS": "10.0.0.1\n\n10.0.0.2"},
            InvalidVariableError,
            "SKYPILOT_NODE_IPS",
            "no empty line",
        ),
        (
            {"SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.1"},
            InvalidVariableError,
            "SKYPILOT_NODE_IPS",
            "distinct",
        ),
        (
            {"SKYPILOT_NODE_IPS": "10.0.0.1\n$(reboot)"},
            InvalidVariableError,
            "SKYPILOT_NODE_IPS",
            "host name or address",
        ),
    ],
    ids=[
        "rank-word",
        "rank-negative",
        "count-word",
        "count-zero",
        "count-vs-ips",
        "rank-vs-count",
        "ips-commas",
        "ips-empty-line",
        "ips-duplicate",
        "ips-shell",
    ],
)
def test_malformed_or_contradicting_values_are_named(
    change: dict[str, str], error: type[DistEnvError], variable: str, match: str
) -> None:
    """Every malformed value, and counts that disagree, are refused naming the launcher, the
    variable, its value and the fix, through auto detection as through the backend."""
    env = {**SKY_2N_NODE1, **change}
    with pytest.raises(error, match=match) as caught:
        locate("auto", env, runtime=False)
    exc = caught.value
    assert (exc.source, exc.variable) == ("skypilot", variable)
    assert exc.value is not None
    assert exc.value in env[variable]
    assert exc.hint


def test_a_trailing_newline_after_the_ips_is_no_node() -> None:
    """A trailing newline (as `echo` would add) leaves the list as it is."""
    env = {**SKY_2N_NODE1, "SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2\n"}
    assert SKYPILOT.rank_info(env).world_size == 2
    master = SKYPILOT.default_master(env)
    assert master is not None
    assert master.host == "10.0.0.1"


def test_user_master_wins() -> None:
    """MASTER_ADDR/MASTER_PORT set by the user win over the first IP."""
    env = {**SKY_2N_NODE1, "MASTER_ADDR": "head-ib", "MASTER_PORT": "29500"}
    info = locate("auto", env, runtime=False).info
    assert (info.master_addr, info.master_port) == ("head-ib", 29500)


def test_the_pages_refusal_is_what_distenv_prints() -> None:
    """docs/start/skypilot.md quotes the refusal of counts that disagree verbatim."""
    with pytest.raises(DistEnvError) as caught:
        locate("auto", {**SKY_2N_NODE1, "SKYPILOT_NUM_NODES": "3"}, runtime=False)
    page = docblocks.DOCS / "start" / "skypilot.md"
    quoted = [b.code.strip() for b in docblocks.blocks(page) if b.lang == "text"]
    assert f"distenv: {caught.value}" in quoted
