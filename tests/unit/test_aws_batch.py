"""The `aws-batch` backend over environments recorded from the AWS Batch User Guide."""

from __future__ import annotations

import pytest

from distenv.detection.pipeline import locate
from distenv.errors import (
    DistEnvError,
    InconsistentEnvironmentError,
    InvalidVariableError,
    MissingVariableError,
)
from distenv.launchers import awsbatch
from distenv.launchers.registry import AWS_BATCH, get_launcher
from distenv.local.plan import scheduler_layout
from distenv.master import scheduler_port
from distenv.system.netpath import Interface
from tests.support import docblocks
from tests.support.envs import layout
from tests.support.envs.awsbatch import (
    MNP_2N_CHILD,
    MNP_2N_CHILD_ATTEMPT2,
    MNP_2N_MAIN,
    MNP_3N_MAIN1_NODE0,
    MNP_TORCHRUN_RANK3,
)

JOB = MNP_2N_MAIN["AWS_BATCH_JOB_ID"].partition("#")[0]
INDEX, MAIN, IP = (
    "AWS_BATCH_JOB_NODE_INDEX",
    "AWS_BATCH_JOB_MAIN_NODE_INDEX",
    "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS",
)


def test_child_node_is_rank_1_with_the_main_nodes_address() -> None:
    """The child's container command is rank 1 of 2; the master is the main node's private
    IPv4, and the port derives from the job id without the node's '#1'."""
    info = locate("auto", MNP_2N_CHILD, runtime=False).info
    assert (info.launcher, *layout(info)) == ("aws-batch", 1, 2, 0, 1, 1, 2)
    assert (info.master_addr, info.master_port) == ("10.0.1.27", scheduler_port(JOB, "1"))
    assert (info.job_id, info.restart_count) == (JOB, 0)


@pytest.fixture
def main_address(monkeypatch: pytest.MonkeyPatch) -> str:
    """The main node's interfaces as an MNP container has them: the ECS agent's link-local
    bridge first, then its elastic network interface with the private IPv4 AWS hands the
    children (10.0.1.27 in the recorded child)."""
    found = (
        Interface("lo", True, True, ("127.0.0.1", "::1")),
        Interface("ecs-eth0", True, False, ("169.254.172.2",)),
        Interface("eth0", True, False, ("fe80::1%eth0", "10.0.1.27")),
    )
    monkeypatch.setattr("distenv.system.netpath.interfaces", lambda: found)
    return "10.0.1.27"


def test_main_node_is_rank_0_on_the_address_the_children_get(main_address: str) -> None:
    """The main node, which AWS does not tell its address, is rank 0 and names the master as the
    children do: its interface's private IPv4 (not loopback, not the link-local bridge), on the
    same port."""
    info = locate("auto", MNP_2N_MAIN, runtime=False).info
    assert (info.launcher, *layout(info)) == ("aws-batch", 0, 2, 0, 1, 0, 2)
    child = locate("auto", MNP_2N_CHILD, runtime=False).info
    assert (info.master_addr, info.master_port) == (main_address, child.master_port)
    assert child.master_addr == main_address


def test_a_main_node_without_a_private_address_needs_master_addr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No up interface with a routable IPv4: MASTER_ADDR is asked for, never loopback."""
    monkeypatch.setattr(awsbatch, "this_address", lambda: None)
    with pytest.raises(MissingVariableError, match="main node") as caught:
        locate("auto", MNP_2N_MAIN, runtime=False)
    assert caught.value.variable == "MASTER_ADDR"


def test_every_node_shares_one_scope(main_address: str) -> None:
    """AWS_BATCH_JOB_ID ends in each node's '#N': stripped, both nodes name one job."""
    tags = {locate("auto", env, runtime=False).job_tag for env in (MNP_2N_MAIN, MNP_2N_CHILD)}
    assert tags == {f"aws-batch/{JOB}/-"}


def test_nodes_are_numbered_from_the_main_node(main_address: str) -> None:
    """mainNode 1 of 3: rank 0 must be where the children connect, so node index 0 (a child)
    is node 2 of distenv's numbering, index 1 node 0, index 2 node 1."""
    info = locate("auto", MNP_3N_MAIN1_NODE0, runtime=False).info
    assert (info.rank, info.world_size, info.node_rank) == (2, 3, 2)
    assert info.master_addr == "10.0.1.28"
    main = {**MNP_3N_MAIN1_NODE0, "AWS_BATCH_JOB_NODE_INDEX": "1", "AWS_BATCH_JOB_ID": f"{JOB}#1"}
    del main["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"]
    assert AWS_BATCH.rank_info(main).rank == 0


def test_a_retry_is_a_restart_on_another_port() -> None:
    """Attempt 2 is restart 1, and its store does not meet the first attempt's port."""
    info = locate("auto", MNP_2N_CHILD_ATTEMPT2, runtime=False).info
    assert info.restart_count == 1
    assert info.master_port == scheduler_port(JOB, "2") != scheduler_port(JOB, "1")


def test_torchrun_as_the_command_wins() -> None:
    """torchrun as the container command: its contract answers, agreeing with the node."""
    info = locate("auto", MNP_TORCHRUN_RANK3, runtime=False).info
    assert (info.launcher, *layout(info)) == ("pytorch", 3, 4, 1, 2, 1, 2)
    assert (info.master_addr, info.master_port) == ("10.0.1.27", 29500)


def test_mpi_ranks_take_the_children_address_or_leave_it_to_the_exchange() -> None:
    """MPI ranks (mpirun on the main node, AWS's MNP example): on a child the main node's IPv4;
    with the main node's variables (mpirun -x copies them) no address every rank shares, so
    MPI's exchange decides (rank 0's host name)."""
    mpi = {
        "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    }
    child = locate("auto", {**MNP_2N_CHILD, **mpi}, runtime=False)
    assert (child.info.launcher, child.info.master_addr) == ("mpi", "10.0.1.27")
    main = locate("auto", {**MNP_2N_MAIN, **mpi}, runtime=False)
    assert (main.info.launcher, main.info.master_addr) == ("mpi", None)


def test_distenv_run_on_a_node_is_its_agent() -> None:
    """`distenv run` as the container command takes the node layout and master from AWS Batch."""
    found = scheduler_layout("run", MNP_2N_CHILD)
    assert found is not None
    assert (found.info.node_rank, found.info.num_nodes, found.info.master_addr) == (
        1,
        2,
        "10.0.1.27",
    )
    assert found.scope == f"aws-batch/{JOB}/-"


def test_the_name_and_its_aliases() -> None:
    """`--launcher aws-batch`, `awsbatch` and `batch` are one backend."""
    assert get_launcher("awsbatch") is get_launcher("batch") is AWS_BATCH


def test_a_child_without_the_main_nodes_address_needs_master_addr() -> None:
    """A child node without AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS is asked for
    MASTER_ADDR (never its own host name); with MASTER_ADDR set it runs."""
    env = dict(MNP_2N_CHILD)
    del env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"]
    with pytest.raises(MissingVariableError, match="child node") as caught:
        locate("auto", env, runtime=False)
    assert caught.value.variable == "MASTER_ADDR"
    assert "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS" in (caught.value.hint or "")
    assert locate("auto", {**env, "MASTER_ADDR": "10.0.1.27"}, runtime=False).info.rank == 1


@pytest.mark.parametrize(
    "missing",
    ["AWS_BATCH_JOB_NUM_NODES", "AWS_BATCH_JOB_NODE_INDEX", "AWS_BATCH_JOB_MAIN_NODE_INDEX"],
)
@pytest.mark.parametrize("how", ["unset", "empty"])
def test_missing_required_variable(missing: str, how: str) -> None:
    """Each required variable, unset or empty, is named in the error with AWS Batch's hint."""
    env = dict(MNP_2N_CHILD)
    if how == "unset":
        del env[missing]
    else:
        env[missing] = ""
    with pytest.raises(MissingVariableError) as caught:
        AWS_BATCH.rank_info(env)
    assert (caught.value.source, caught.value.variable) == ("aws-batch", missing)
    assert f"${missing} is not set" in str(caught.value)
    assert "multi-node parallel job" in (caught.value.hint or "")


@pytest.mark.parametrize(
    ("change", "error", "variable", "match"),
    [
        ({INDEX: "one"}, InvalidVariableError, INDEX, "integer"),
        (
            {"AWS_BATCH_JOB_NUM_NODES": "0"},
            InvalidVariableError,
            "AWS_BATCH_JOB_NUM_NODES",
            r"in \[1,",
        ),
        ({MAIN: "x"}, InvalidVariableError, MAIN, "integer"),
        ({INDEX: "2", "AWS_BATCH_JOB_ID": "j#2"}, InconsistentEnvironmentError, INDEX, "not below"),
        ({MAIN: "5"}, InconsistentEnvironmentError, MAIN, "not below"),
        (
            {"AWS_BATCH_JOB_ID": "job#0"},
            InconsistentEnvironmentError,
            "AWS_BATCH_JOB_ID",
            "names node 0",
        ),
        ({"AWS_BATCH_JOB_ID": "job#one"}, InvalidVariableError, "AWS_BATCH_JOB_ID", "node index"),
        ({"AWS_BATCH_JOB_ATTEMPT": "0"}, InvalidVariableError, "AWS_BATCH_JOB_ATTEMPT", r"in \[1,"),
        ({IP: "10.0.1"}, InvalidVariableError, IP, "IPv4"),
        ({IP: "main-node"}, InvalidVariableError, IP, "IPv4"),
    ],
    ids=[
        "index-word",
        "count-zero",
        "main-word",
        "index-vs-count",
        "main-vs-count",
        "job-suffix-vs-index",
        "job-suffix-word",
        "attempt-zero",
        "ip-short",
        "ip-name",
    ],
)
def test_malformed_or_contradicting_values_are_named(
    change: dict[str, str], error: type[DistEnvError], variable: str, match: str
) -> None:
    """Every malformed value, and values that disagree, are refused through auto detection,
    naming the launcher, the variable, its value and the fix."""
    env = {**MNP_2N_CHILD, **change}
    with pytest.raises(error, match=match) as caught:
        locate("auto", env, runtime=False)
    exc = caught.value
    assert (exc.source, exc.variable) == ("aws-batch", variable)
    assert exc.value is not None
    assert exc.value in env[variable]
    assert exc.hint


def test_an_array_job_is_not_a_multi_node_job() -> None:
    """An array job's child (AWS_BATCH_JOB_ARRAY_INDEX, no MNP variable) is a job of its own."""
    env = {
        "AWS_BATCH_JOB_ID": "j:3",
        "AWS_BATCH_JOB_ARRAY_INDEX": "3",
        "AWS_BATCH_JOB_ATTEMPT": "1",
    }
    assert not AWS_BATCH.detect(env)
    assert locate("auto", env, runtime=False).info.world_size == 1


def test_the_pages_refusal_is_what_distenv_prints() -> None:
    """docs/start/aws-batch.md quotes the refusal of a node index that is no number verbatim."""
    with pytest.raises(DistEnvError) as caught:
        locate("auto", {**MNP_2N_CHILD, INDEX: "one"}, runtime=False)
    page = docblocks.DOCS / "start" / "aws-batch.md"
    quoted = [b.code.strip() for b in docblocks.blocks(page) if b.lang == "text"]
    assert f"distenv: {caught.value}" in quoted
