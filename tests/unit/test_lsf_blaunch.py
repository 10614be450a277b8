"""LSF without jsrun: `blaunch` tasks and Open MPI's mpirun inside an LSF job (recorded envs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from distenv import detect, explain
from distenv.errors import InconsistentEnvironmentError, InvalidVariableError, NotLaunchedError
from distenv.master import scheduler_port
from tests.support.envs import lsf


def with_hostfile(env: dict[str, str], tmp_path: Path, text: str) -> dict[str, str]:
    """Return `env` with LSB_DJOB_HOSTFILE pointing at a file holding `text`."""
    path = tmp_path / "hostfile"
    path.write_text(text)
    return {**env, "LSB_DJOB_HOSTFILE": str(path)}


@pytest.mark.parametrize("task", range(4))
def test_blaunch_2x2_every_task(task: int, tmp_path: Path) -> None:
    """Each blaunch task of a 2-node x 2-slot job gets its rank, local rank and node from the slots."""
    env = with_hostfile(lsf.BLAUNCH_2X2[task], tmp_path, lsf.blaunch_hostfile)
    info = detect("auto", env)
    assert info.launcher == "lsf"
    layout = (info.rank, info.world_size, info.local_rank, info.local_world_size)
    assert (*layout, info.node_rank, info.num_nodes) == lsf.BLAUNCH_2X2_ANSWERS[task]
    assert info.master_addr == "c01"
    assert info.master_port == scheduler_port("7001", "0")
    assert info.job_id == "7001"


def test_blaunch_uneven_slots(tmp_path: Path) -> None:
    """Nodes holding different numbers of slots keep their own local sizes (3 on c01, 1 on c02)."""
    env = with_hostfile(lsf.BLAUNCH_2X2[3], tmp_path, "c01\nc01\nc01\nc02\n")
    info = detect("auto", env)
    assert (info.rank, info.local_rank, info.local_world_size, info.node_rank) == (3, 0, 1, 1)


def test_blaunch_without_hostfile_uses_the_slot_list() -> None:
    """Without LSB_DJOB_HOSTFILE the slots come from LSB_MCPU_HOSTS."""
    env = {k: v for k, v in lsf.BLAUNCH_2X2[2].items() if k != "LSB_DJOB_HOSTFILE"}
    info = detect("lsf", env)
    assert (info.rank, info.node_rank, info.local_rank) == (2, 1, 0)


def test_blaunch_batch_script_is_refused(tmp_path: Path) -> None:
    """The batch script of the 4-slot job is not rank 0 of 4: refused naming jsrun and blaunch."""
    env = with_hostfile(lsf.BLAUNCH_BATCH_SCRIPT, tmp_path, lsf.blaunch_hostfile)
    with pytest.raises(NotLaunchedError, match=r"blaunch python train\.py") as caught:
        detect("auto", env)
    assert "rank 0 of 4" in str(caught.value)


def test_blaunch_task_id_beyond_the_slots_is_refused(tmp_path: Path) -> None:
    """A task id past the job's slots (blaunch given a host list) is refused with the fix."""
    env = with_hostfile(
        {**lsf.BLAUNCH_2X2[0], "LSF_PM_TASKID": "5"}, tmp_path, lsf.blaunch_hostfile
    )
    with pytest.raises(InvalidVariableError, match="LSF_PM_TASKID") as caught:
        detect("auto", env)
    assert "'5'" in str(caught.value)
    assert "--launcher pytorch" in str(caught.value)
    zero = with_hostfile({**lsf.BLAUNCH_2X2[0], "LSF_PM_TASKID": "0"}, tmp_path, "c01\n")
    with pytest.raises(InvalidVariableError, match=r"in \[1, "):
        detect("auto", zero)


def test_blaunch_numproc_must_match_the_host_file(tmp_path: Path) -> None:
    """LSB_DJOB_NUMPROC contradicting the host file is refused naming both."""
    env = with_hostfile({**lsf.BLAUNCH_2X2[0], "LSB_DJOB_NUMPROC": "8"}, tmp_path, "c01\nc02\n")
    with pytest.raises(InconsistentEnvironmentError, match="LSB_DJOB_NUMPROC=8"):
        detect("auto", env)


def test_blaunch_unreadable_hostfile_is_refused() -> None:
    """A host file that cannot be read is an InvalidVariableError naming the variable."""
    with pytest.raises(InvalidVariableError, match="LSB_DJOB_HOSTFILE"):
        detect("auto", lsf.BLAUNCH_2X2[0])


@pytest.mark.parametrize("rank", range(4))
def test_open_mpi_under_lsf_every_rank(rank: int, tmp_path: Path) -> None:
    """mpirun inside an LSF job: OMPI_* answer, an orted's LSF_PM_TASKID is ignored, master c01."""
    env = with_hostfile(lsf.OMPI_UNDER_LSF[rank], tmp_path, lsf.blaunch_hostfile)
    detection = explain("auto", env)
    info = detection.info
    assert info.launcher == "mpi"
    layout = (info.rank, info.world_size, info.local_rank, info.local_world_size)
    assert (*layout, info.node_rank, info.num_nodes) == lsf.OMPI_UNDER_LSF_ANSWERS[rank]
    assert info.master_addr == "c01"
    assert info.master_port == scheduler_port("7001", "0")


def test_open_mpi_under_lsf_never_takes_a_one_slot_first_host_as_master() -> None:
    """A one-slot first host is a CSM launch node or rank 0's host: the master is left to MPI."""
    detection = explain("auto", lsf.OMPI_UNDER_LSF_CSM_RANK0)
    info = detection.info
    assert (info.launcher, info.rank, info.node_rank, info.num_nodes) == ("mpi", 0, None, None)
    assert info.master_addr is None  # neither batch2 nor a guess: rank 0's host over MPI
    assert not any("allocation" in verdict for _, verdict in detection.considered)
    plain = {**lsf.OMPI_UNDER_LSF_CSM_RANK0, "LSB_MCPU_HOSTS": "h22n07 2 h22n08 2"}
    assert detect("auto", plain).master_addr == "h22n07"


def test_lsf_named_under_open_mpi_is_refused(tmp_path: Path) -> None:
    """--launcher lsf for an MPI rank whose orted blaunch started: LSF is the outer layer."""
    env = with_hostfile(lsf.OMPI_UNDER_LSF[3], tmp_path, lsf.blaunch_hostfile)
    with pytest.raises(Exception, match="use --launcher mpi"):
        detect("lsf", env)
