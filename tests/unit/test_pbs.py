"""PBS Professional / OpenPBS with Cray PALS (recorded environments: tests/support/envs/pbs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from distenv import detect, explain
from distenv.errors import InvalidVariableError, MissingVariableError, NotLaunchedError
from distenv.launchers.registry import PBS, get_launcher
from distenv.master import scheduler_port
from tests.support.envs import pbs


def with_nodefile(
    env: dict[str, str], tmp_path: Path, text: str = pbs.nodefile_2x2
) -> dict[str, str]:
    """Return `env` with PBS_NODEFILE pointing at a file holding `text`."""
    path = tmp_path / "nodefile"
    path.write_text(text)
    return {**env, "PBS_NODEFILE": str(path)}


@pytest.mark.parametrize("rank", range(4))
def test_pals_ranks_in_a_pbs_job(rank: int) -> None:
    """Each PALS rank of `mpiexec -n 4 --ppn 2` in a PBS job: MPI's layout, PALS_NODEID's node."""
    detection = explain("auto", pbs.PALS_2X2[rank])
    info = detection.info
    assert info.launcher == "mpi"
    layout = (info.rank, info.world_size, info.local_rank, info.local_world_size)
    assert (*layout, info.node_rank, info.num_nodes) == pbs.PALS_2X2_ANSWERS[rank]
    # The node file may be absent on the other nodes: no master from PBS, MPI exchanges it.
    assert info.master_addr is None
    assert detection.scope == "mpi/c7e5c58f-5a4f-4f87-9d41-6a0e3b2b3f11/4"
    assert (
        "pbs",
        "detected (PBS_JOBID='"
        + pbs.PALS_2X2[0]["PBS_JOBID"]
        + "', PBS_NODEFILE='"
        + pbs.PALS_2X2[0]["PBS_NODEFILE"]
        + "')",
    ) in detection.considered


def test_pals_ranks_never_read_the_node_file() -> None:
    """The recorded PBS_NODEFILE does not exist here: ranks never open it (sister MoMs may lack it)."""
    assert not Path(pbs.PALS_2X2[3]["PBS_NODEFILE"]).exists()
    assert detect("auto", pbs.PALS_2X2[3]).rank == 3


def test_pals_ranks_take_the_users_master() -> None:
    """MASTER_ADDR/MASTER_PORT set by the user win for PALS ranks in a PBS job."""
    env = {**pbs.PALS_2X2[2], "MASTER_ADDR": "x3006c0s13b0n0", "MASTER_PORT": "29400"}
    info = detect("auto", env)
    assert (info.master_addr, info.master_port) == ("x3006c0s13b0n0", 29400)


def test_pbs_script_is_refused(tmp_path: Path) -> None:
    """The job script of a 4-slot job is not rank 0 of 4: refused naming PBS_NODEFILE and mpiexec."""
    with pytest.raises(NotLaunchedError, match="rank 0 of 4") as caught:
        detect("auto", with_nodefile(pbs.PBS_SCRIPT, tmp_path))
    assert caught.value.source == "pbs"
    assert "PBS_NODEFILE" in str(caught.value)
    assert "mpiexec -n 8 --ppn 4" in str(caught.value)


def test_pbsdsh_task_is_refused_not_read_as_a_rank(tmp_path: Path) -> None:
    """A pbsdsh task's hexadecimal PBS_TASKNUM is no rank: the task is refused like the script."""
    with pytest.raises(NotLaunchedError, match="pbsdsh"):
        detect("auto", with_nodefile(pbs.PBSDSH_TASK, tmp_path))


def test_pbs_one_slot_script_runs_as_rank_0_of_1(tmp_path: Path) -> None:
    """A one-slot job's script is rank 0 of 1 on 127.0.0.1 (a fully qualified host is fine)."""
    info = detect("pbs", with_nodefile(pbs.PBS_SCRIPT, tmp_path, pbs.NODES[0] + "\n"))
    assert (info.launcher, info.world_size, info.master_addr) == ("pbs", 1, "127.0.0.1")
    assert info.job_id == pbs.PBS_SCRIPT["PBS_JOBID"]
    assert info.master_port == scheduler_port(pbs.PBS_SCRIPT["PBS_JOBID"], "script")


def test_pbs_script_node_file_errors(tmp_path: Path) -> None:
    """A missing or empty node file in the script is an InvalidVariableError naming the variable."""
    with pytest.raises(InvalidVariableError, match="PBS_NODEFILE"):
        detect("auto", pbs.PBS_SCRIPT)
    with pytest.raises(InvalidVariableError, match="at least one host"):
        detect("auto", with_nodefile(pbs.PBS_SCRIPT, tmp_path, ""))
    bad = with_nodefile(pbs.PBS_SCRIPT, tmp_path, "x1\nx2;rm\n")
    with pytest.raises(InvalidVariableError, match="a host name"):
        detect("auto", bad)
    with pytest.raises(MissingVariableError, match="PBS_NODEFILE"):
        detect("pbs", {"PBS_JOBID": "1.server"})


def test_pals_under_slurm_is_slurms() -> None:
    """PALS under `srun --mpi=cray_shasta`: both layers agree, Slurm's full layout answers."""
    detection = explain("auto", pbs.PALS_UNDER_SLURM_RANK3)
    info = detection.info
    assert info.launcher == "slurm"
    assert (info.rank, info.local_rank, info.node_rank, info.num_nodes) == (3, 1, 1, 2)
    assert info.master_addr == "nid001234"


def test_pbs_names_and_scope() -> None:
    """`pbs`, `openpbs` and `pbspro` name the backend; its scope is the job id."""
    assert get_launcher("openpbs") is PBS
    assert get_launcher("pbspro") is PBS
    assert PBS.scope({"PBS_JOBID": "7.srv"}) == "pbs/7.srv/-"
    assert PBS.world({"PBS_JOBID": "7.srv"}) is None


def test_open_mpi_in_a_pbs_job_is_mpis() -> None:
    """mpirun inside a PBS job: OMPI_* answer, the roll call counts the nodes, no master from PBS."""
    info = detect("auto", pbs.OMPI_UNDER_PBS_RANK3)
    assert (info.launcher, info.rank, info.local_rank, info.local_world_size) == ("mpi", 3, 1, 2)
    assert (info.node_rank, info.num_nodes, info.master_addr) == (None, None, None)
