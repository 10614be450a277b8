"""Grid Engine (recorded environments: tests/support/envs/gridengine.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from distenv import detect, explain
from distenv.errors import (
    InconsistentEnvironmentError,
    InvalidVariableError,
    MissingVariableError,
    NotLaunchedError,
)
from distenv.launchers.registry import SGE, get_launcher
from distenv.master import scheduler_port
from tests.support.envs import gridengine as sge


def with_pe_hostfile(
    env: dict[str, str], tmp_path: Path, text: str = sge.pe_hostfile_2x4
) -> dict[str, str]:
    """Return `env` with PE_HOSTFILE pointing at a file holding `text`."""
    path = tmp_path / "pe_hostfile"
    path.write_text(text)
    return {**env, "PE_HOSTFILE": str(path)}


@pytest.mark.parametrize("rank", range(8))
def test_open_mpi_ranks_take_the_master_from_the_pe_hostfile(rank: int, tmp_path: Path) -> None:
    """Each rank of `mpirun -np 8` in a 2 x 4 PE job: MPI's layout, PE_HOSTFILE's first host."""
    detection = explain("auto", with_pe_hostfile(sge.OMPI_UNDER_SGE_2X4[rank], tmp_path))
    info = detection.info
    layout = (info.rank, info.world_size, info.local_rank, info.local_world_size)
    assert (*layout, info.node_rank, info.num_nodes) == sge.OMPI_UNDER_SGE_2X4_ANSWERS[rank]
    assert info.launcher == "mpi"
    assert (info.master_addr, info.master_port) == (sge.HOSTS[0], scheduler_port("4242", "mpi"))
    assert ("sge", f"master taken from its allocation: {sge.HOSTS[0]}") in detection.considered


def test_the_pe_script_with_several_slots_is_refused(tmp_path: Path) -> None:
    """`python train.py` in an 8-slot PE job's script is not rank 0 of 8: refused naming NSLOTS,
    its value and mpirun."""
    with pytest.raises(NotLaunchedError) as caught:
        detect("auto", with_pe_hostfile(sge.SGE_PE_SCRIPT, tmp_path))
    error = caught.value
    assert (error.source, error.variable, error.value) == ("sge", "NSLOTS", "8")
    assert "job 4242's script" in str(error)
    assert "$NSLOTS is 8 in parallel environment 'mpi'" in str(error)
    assert "rank 0 of 8" in str(error)
    assert "mpirun -np $NSLOTS python train.py" in (error.hint or "")


def test_a_serial_job_is_rank_0_of_1() -> None:
    """A serial job's script (NSLOTS 1, no PE) is rank 0 of 1 on 127.0.0.1, port from its id."""
    info = detect("auto", sge.SGE_SERIAL_SCRIPT)
    assert (info.launcher, info.world_size, info.master_addr) == ("sge", 1, "127.0.0.1")
    assert (info.job_id, info.master_port) == ("4242", scheduler_port("4242", "script"))


def test_a_one_slot_pe_job_is_rank_0_of_1(tmp_path: Path) -> None:
    """NSLOTS 1 in a parallel environment is a legitimate single process."""
    env = {**sge.SGE_PE_SCRIPT, "NSLOTS": "1", "NHOSTS": "1"}
    assert detect("auto", env).world_size == 1


def test_array_tasks_have_their_own_scope_and_port() -> None:
    """An array task's scope and port hold its SGE_TASK_ID ('undefined' outside arrays)."""
    assert SGE.scope(sge.SGE_SERIAL_SCRIPT) == "sge/4242/-"
    assert SGE.scope(sge.SGE_ARRAY_TASK7) == "sge/4242[7]/-"
    info = detect("sge", sge.SGE_ARRAY_TASK7)
    assert (info.job_id, info.master_port) == ("4242[7]", scheduler_port("4242[7]", "script"))


def test_a_rank_without_pe_hostfile_is_refused_naming_it() -> None:
    """A rank whose MPI launcher did not forward PE_HOSTFILE (the execd gives it to the master
    task only) is refused, naming it and the fix, instead of exchanging while others read it."""
    with pytest.raises(MissingVariableError) as caught:
        detect("auto", sge.RANK5_WITHOUT_PE_HOSTFILE)
    assert caught.value.variable == "PE_HOSTFILE"
    assert "export MASTER_ADDR=$(hostname)" in (caught.value.hint or "")


def test_the_users_master_wins_without_reading_the_file() -> None:
    """With MASTER_ADDR set, ranks never read PE_HOSTFILE (absent here, or only on the master
    task's host); the port is MASTER_PORT, else rank 0 sends one over MPI."""
    env = {**sge.OMPI_UNDER_SGE_2X4[5], "MASTER_ADDR": "node01-ib"}
    assert not Path(env["PE_HOSTFILE"]).exists()
    info = detect("auto", env)
    assert (info.master_addr, info.master_port) == ("node01-ib", None)
    info = detect("auto", {**env, "MASTER_PORT": "29400"})
    assert (info.master_addr, info.master_port) == ("node01-ib", 29400)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", "at least one host", id="empty"),
        pytest.param("node01.cluster\n", "lines of 'host slots queue processors'", id="no-slots"),
        pytest.param("node01.cluster four all.q@n UNDEFINED\n", "an integer", id="slots-word"),
        pytest.param("node01.cluster 0 all.q@n UNDEFINED\n", "an integer in", id="zero-slots"),
        pytest.param("node;01 4 all.q@n UNDEFINED\n", "a host name", id="bad-host"),
    ],
)
def test_a_malformed_pe_hostfile_is_named(tmp_path: Path, text: str, expected: str) -> None:
    """A PE host file that is not 'host slots queue processors' lines: InvalidVariableError."""
    with pytest.raises(InvalidVariableError, match=expected) as caught:
        detect("auto", with_pe_hostfile(sge.OMPI_UNDER_SGE_2X4[0], tmp_path, text))
    assert (caught.value.source, caught.value.variable) == ("sge", "PE_HOSTFILE")


@pytest.mark.parametrize(
    ("variable", "value", "counted"),
    [("NSLOTS", "16", "lists 8 slots"), ("NHOSTS", "3", "lists 2 hosts")],
)
def test_counts_that_disagree_with_the_pe_hostfile_are_refused(
    tmp_path: Path, variable: str, value: str, counted: str
) -> None:
    """NSLOTS and NHOSTS must agree with the host file (one line per queue, hosts counted once)."""
    env = {**with_pe_hostfile(sge.OMPI_UNDER_SGE_2X4[0], tmp_path), variable: value}
    with pytest.raises(InconsistentEnvironmentError, match=counted) as caught:
        detect("auto", env)
    assert (caught.value.variable, caught.value.value) == (variable, value)


def test_a_host_in_two_queues_counts_once(tmp_path: Path) -> None:
    """A host granted slots in two queues has two lines [sge_pe(5)]: NHOSTS counts it once."""
    text = "node01.cluster 2 all.q@node01.cluster UNDEFINED\n" + sge.pe_hostfile_2x4.replace(
        "node01.cluster 4", "node01.cluster 2", 1
    )
    env = with_pe_hostfile(sge.OMPI_UNDER_SGE_2X4[0], tmp_path, text)
    assert detect("auto", env).master_addr == "node01.cluster"


def test_a_fifo_as_pe_hostfile_is_refused_at_once(tmp_path: Path) -> None:
    """A FIFO never blocks detection: it is no regular file."""
    fifo = tmp_path / "pe_fifo"
    os.mkfifo(fifo)
    env = {**sge.OMPI_UNDER_SGE_2X4[0], "PE_HOSTFILE": str(fifo)}
    with pytest.raises(InvalidVariableError, match="a FIFO"):
        detect("auto", env)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("JOB_ID", "job42"),
        ("JOB_ID", "0"),
        ("SGE_TASK_ID", "seven"),
        ("NSLOTS", "eight"),
        ("NSLOTS", "0"),
        ("RESTARTED", "yes"),
    ],
)
def test_malformed_values_are_named(variable: str, value: str) -> None:
    """Every malformed value is an InvalidVariableError naming sge, the variable and the value."""
    with pytest.raises(InvalidVariableError) as caught:
        detect("auto", {**sge.SGE_SERIAL_SCRIPT, variable: value})
    assert (caught.value.source, caught.value.variable, caught.value.value) == (
        "sge",
        variable,
        value,
    )
    assert f"${variable} is {value!r}" in str(caught.value)


def test_restarted_counts_one_restart() -> None:
    """RESTARTED=1 (a job restarted after a crash) is restart_count 1."""
    assert detect("auto", {**sge.SGE_SERIAL_SCRIPT, "RESTARTED": "1"}).restart_count == 1


def test_detection_needs_the_jobs_own_variables() -> None:
    """JOB_ID alone is too common a name: detection needs SGE_JOB_SPOOL_DIR or PE_HOSTFILE."""
    assert not SGE.detect({"JOB_ID": "12"})
    assert SGE.detect({"JOB_ID": "12", "PE_HOSTFILE": "/x"})
    assert detect("auto", {"JOB_ID": "12"}).launcher == "none"


def test_torchrun_inside_a_grid_engine_job_wins() -> None:
    """torchrun started in the job script is innermost: its own contract answers."""
    env = {
        **sge.SGE_SERIAL_SCRIPT,
        "TORCHELASTIC_RUN_ID": "4242",
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }
    assert detect("auto", env).launcher == "pytorch"


def test_names_and_world() -> None:
    """`sge`, `gridengine` and `uge` name the backend; it states no rank of its own."""
    assert get_launcher("gridengine") is SGE
    assert get_launcher("uge") is SGE
    assert SGE.world(sge.SGE_PE_SCRIPT) is None
    assert SGE.daemon_nodes(sge.SGE_PE_SCRIPT) is None
