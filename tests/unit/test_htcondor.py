"""HTCondor's parallel universe (recorded environments: tests/support/envs/htcondor.py)."""

from __future__ import annotations

import pytest

from distenv import detect, explain
from distenv.errors import InconsistentEnvironmentError, InvalidVariableError, MissingVariableError
from distenv.launchers.registry import HTCONDOR
from distenv.master import scheduler_port
from tests.support.envs import htcondor as condor


def test_a_node_with_the_submit_descriptions_master_is_rank_node_of_nodes() -> None:
    """Node 1 of 2, MASTER_ADDR from the submit description: rank 1 of 2, one per node."""
    info = detect("auto", condor.NODE1_OF_2_WITH_MASTER)
    assert info.launcher == "htcondor"
    layout = (info.rank, info.world_size, info.local_rank, info.local_world_size)
    assert (*layout, info.node_rank, info.num_nodes) == (1, 2, 0, 1, 1, 2)
    assert info.master_addr == "gpu01.example.edu"
    assert info.master_port == scheduler_port("1234", "parallel")
    assert info.job_id == "1234"


@pytest.mark.parametrize("env", [condor.NODE0_OF_2, condor.NODE1_OF_2], ids=["node0", "node1"])
def test_several_nodes_without_a_master_are_refused_naming_the_fix(env: dict[str, str]) -> None:
    """No variable names node 0's address: every node, node 0 too, is refused alike, naming
    _CONDOR_PROCNO, _CONDOR_NPROCS and both ways to give the master."""
    with pytest.raises(MissingVariableError) as caught:
        detect("auto", env)
    error = caught.value
    assert (error.source, error.variable) == ("htcondor", "MASTER_ADDR")
    hint = error.hint or ""
    node = env["_CONDOR_PROCNO"]
    assert f"($_CONDOR_PROCNO={node}, $_CONDOR_NPROCS=2)" in hint
    assert 'environment = "MASTER_ADDR=gpu01.example.edu"' in hint
    assert "distenv run --master-addr gpu01.example.edu" in hint
    assert "openmpiscript" in hint


def test_one_node_is_its_own_master() -> None:
    """machine_count = 1: rank 0 of 1 on 127.0.0.1."""
    info = detect("auto", condor.NODE0_OF_1)
    assert (info.launcher, info.world_size, info.master_addr) == ("htcondor", 1, "127.0.0.1")
    assert info.job_id == "20417"


def test_mpi_ranks_of_openmpiscript_are_mpis_and_exchange_the_master() -> None:
    """Open MPI's ranks under openmpiscript: MPI answers, HTCondor gives no master (no refusal:
    rank 0 sends its own over MPI), and the node's _CONDOR_PROCNO numbers no rank."""
    detection = explain("auto", condor.OMPI_UNDER_OPENMPISCRIPT_RANK3)
    info = detection.info
    assert (info.launcher, info.rank, info.world_size, info.local_rank) == ("mpi", 3, 4, 1)
    assert info.master_addr is None
    assert ("htcondor", "outer layer: no rank vs mpi's rank 3 of 4") in detection.considered


def test_torchrun_on_a_node_wins() -> None:
    """torchrun (or distenv run) started by the node's executable: its own contract answers."""
    info = detect("auto", condor.TORCHRUN_ON_NODE1_RANK3)
    assert (info.launcher, info.rank, info.world_size) == ("pytorch", 3, 4)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("_CONDOR_PROCNO", "node1"),
        ("_CONDOR_PROCNO", "-1"),
        ("_CONDOR_NPROCS", "two"),
        ("_CONDOR_NPROCS", "0"),
        ("_CONDOR_REMOTE_SPOOL_DIR", "/var/lib/condor/spool/1234/0/job1234"),
    ],
)
def test_malformed_values_are_named(variable: str, value: str) -> None:
    """Every malformed value is an InvalidVariableError naming htcondor, the variable, the value."""
    with pytest.raises(InvalidVariableError) as caught:
        detect("auto", {**condor.NODE1_OF_2_WITH_MASTER, variable: value})
    assert (caught.value.source, caught.value.variable, caught.value.value) == (
        "htcondor",
        variable,
        value,
    )


def test_a_node_index_outside_the_node_count_is_refused() -> None:
    """_CONDOR_PROCNO must be below _CONDOR_NPROCS: both are named."""
    env = {**condor.NODE1_OF_2_WITH_MASTER, "_CONDOR_PROCNO": "2"}
    with pytest.raises(InconsistentEnvironmentError, match="_CONDOR_PROCNO") as caught:
        detect("auto", env)
    assert "_CONDOR_NPROCS" in str(caught.value)


@pytest.mark.parametrize("missing", ["_CONDOR_PROCNO", "_CONDOR_NPROCS"])
def test_a_missing_variable_is_named(missing: str) -> None:
    """Either of the pair alone is an incomplete parallel-universe node: the other is named."""
    env = {k: v for k, v in condor.NODE1_OF_2_WITH_MASTER.items() if k != missing}
    with pytest.raises(MissingVariableError) as caught:
        detect("auto", env)
    assert (caught.value.source, caught.value.variable) == ("htcondor", missing)


def test_scope_is_the_cluster_id() -> None:
    """The scope is the job's cluster id, from proc 0's spool directory (never the job ad file)."""
    assert HTCONDOR.scope(condor.NODE1_OF_2) == "htcondor/1234/-"
    bare = {k: v for k, v in condor.NODE1_OF_2.items() if k != "_CONDOR_REMOTE_SPOOL_DIR"}
    assert HTCONDOR.scope(bare) == "htcondor/-/-"
    assert HTCONDOR.world(condor.NODE1_OF_2) is None
