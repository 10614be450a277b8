"""Grid Engine and HTCondor's parallel universe on this machine: recorded environments, real runs.

Neither can run here, so each job is this machine given the environment Grid Engine or HTCondor
gives (recorded in tests/support/envs/gridengine.py and htcondor.py): a PE host file written by
the test naming this host, or node 0's address replaced by 127.0.0.1 and a free port. What runs
is real and comes from the docs' pages: the qsub script of docs/start/gridengine.md under Open
MPI's mpirun on loopback, its refusal without mpirun, and the node script of
docs/start/htcondor.md as two "nodes", each finishing an all_reduce.
"""

from __future__ import annotations

import socket
import stat
from pathlib import Path

import pytest

from distenv.master import free_port, scheduler_port
from tests.support.docblocks import recipe
from tests.support.envs import gridengine as sge
from tests.support.envs import htcondor as condor
from tests.support.integration.helpers import (
    OMPI,
    PYTHON,
    RANK_CHECK,
    REPO,
    Harness,
    check_world,
    wait_all,
)

HERE = "tests/integration/test_gridengine.py"


@pytest.fixture
def harness(tmp_path_factory: pytest.TempPathFactory) -> Harness:
    """Launches on this machine only: no Slurm cluster; mpirun.openmpi from the system."""
    return Harness.local(tmp_path_factory.mktemp("gridengine"))


def _job_dir(tmp_path: Path) -> Path:
    """Return a job directory holding `train.py` (the rank program) and a `bin/` for stand-ins."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "train.py").write_text(
        f"import runpy\nrunpy.run_path({str(RANK_CHECK)!r}, run_name='__main__')\n"
    )
    return tmp_path


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _sge_env(harness: Harness, job: Path, slots: int) -> dict[str, str]:
    """The recorded PE job's script environment with `slots` slots on this host.

    ARC and SGE_ROOT are not recorded (distenv reads neither): without them Open MPI's own Grid
    Engine support stays off, and mpirun starts its ranks locally instead of by qrsh.
    """
    host = socket.gethostname()
    hostfile = job / "pe_hostfile"
    hostfile.write_text(f"{host} {slots} all.q@{host} UNDEFINED\n")
    env = {
        **sge.SGE_PE_SCRIPT,
        "NSLOTS": str(slots),
        "NHOSTS": "1",
        "HOSTNAME": host,
        "PE_HOSTFILE": str(hostfile),
        "DISTENV_TIMEOUT": "20",
        "PYTHONPATH": str(REPO),  # the checkout's distenv, from the job directory too
    }
    child = harness.env(extra=env)
    child["PATH"] = f"{job / 'bin'}:{child['PATH']}"
    return child


def test_the_qsub_script_runs_mpirun_with_the_master_from_pe_hostfile(
    harness: Harness, tmp_path: Path
) -> None:
    """The page's qsub script, run as the job script: `mpirun -np $NSLOTS python train.py` (Open
    MPI, 2 slots); every rank is `mpi` with the master on PE_HOSTFILE's first host (this one,
    not found over MPI: no --mpi) and the job's port, and the all_reduce finishes."""
    (block,) = recipe(
        f"{HERE}::{test_the_qsub_script_runs_mpirun_with_the_master_from_pe_hostfile.__name__}",
        "bash",
    )
    job = _job_dir(tmp_path)
    script = _executable(job / "job.sh", block.code)
    ompi = " ".join(OMPI)
    _executable(job / "bin" / "mpirun", f'#!/bin/sh\nexec {ompi} --oversubscribe "$@"\n')
    env = _sge_env(harness, job, 2)
    (result,) = wait_all([harness.start(["bash", str(script)], env=env, cwd=job)])
    layouts = [(r, 2, r, 2, 0, 1) for r in range(2)]
    records = check_world(result, launcher="mpi", layouts=layouts, master=socket.gethostname())
    # The job's port, not one rank 0 picked and sent over MPI: the master came from the file.
    assert {r["info"]["master_port"] for r in records} == {scheduler_port("4242", "mpi")}


def test_the_job_script_without_mpirun_is_refused(harness: Harness, tmp_path: Path) -> None:
    """`python train.py` as the script of a 4-slot PE job: exit 1 before any rendezvous, naming
    NSLOTS, its value and mpirun."""
    job = _job_dir(tmp_path)
    env = _sge_env(harness, job, 4)
    (result,) = wait_all([harness.start([PYTHON, "train.py"], env=env, cwd=job)])
    assert result.returncode == 1, result.text
    assert "sge: this process is job 4242's script" in result.stderr, result.text
    assert "$NSLOTS is 4 in parallel environment 'mpi'" in result.stderr, result.text
    # The hint quotes the script that runs (runpy made it sys.argv[0]; distenv.hints).
    assert f"mpirun -np $NSLOTS python {RANK_CHECK}" in result.stderr, result.text
    assert not result.records(), result.text


def _two_condor_nodes(
    harness: Harness, tmp_path: Path, test: str, master: dict[str, str], port: int
) -> None:
    """Run the page's node script marked for `test` as the executable of both nodes of a
    2-machine parallel job (`master`: the submit description's MASTER_* for every node); assert
    four ranks, one collective, one scope (the cluster id)."""
    (block,) = recipe(f"{HERE}::{test}", "bash")
    job = _job_dir(tmp_path)
    code = block.code.replace("gpu01.example.edu", "127.0.0.1").replace("29500", str(port))
    script = _executable(job / "train.sh", code)
    launches = []
    for node in (condor.NODE0_OF_2, condor.NODE1_OF_2):
        extra = {**node, **master, "DISTENV_TIMEOUT": "20", "PYTHONPATH": str(REPO)}
        env = harness.env(extra=extra)
        launches.append(harness.start(["bash", str(script)], env=env, cwd=job))
    records = sorted(
        [rec for result in wait_all(launches) for rec in result.ok().records()],
        key=lambda r: r["info"]["rank"],
    )
    assert [r["info"]["rank"] for r in records] == [0, 1, 2, 3]
    for rec in records:
        info = rec["info"]
        assert info["launcher"] == "pytorch", rec
        assert (info["world_size"], info["local_world_size"], info["num_nodes"]) == (4, 2, 2)
        assert info["node_rank"] == info["rank"] // 2, rec
        assert (info["master_addr"], info["master_port"]) == ("127.0.0.1", port), rec
        assert rec["all_reduce"] == 10, rec
    assert len({r["info"]["job_id"] for r in records}) == 1, records


def test_distenv_run_on_each_htcondor_node_finishes_an_all_reduce(
    harness: Harness, tmp_path: Path
) -> None:
    """The page's node script: `distenv run --nproc-per-node 2` reads _CONDOR_PROCNO and
    _CONDOR_NPROCS, and node 0's address from the submit description's MASTER_ADDR."""
    test = test_distenv_run_on_each_htcondor_node_finishes_an_all_reduce.__name__
    port = free_port()
    # The submit description's, for node 0's machine.
    master = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    _two_condor_nodes(harness, tmp_path, test, master, port)


def test_distenv_run_takes_node_0s_address_from_its_flags_under_htcondor(
    harness: Harness, tmp_path: Path
) -> None:
    """The page's other node script: node 0's address in `--master-addr`, none in the
    environment. distenv run's flags are the master, so the scheduler's layout, which has none,
    does not refuse the node."""
    test = test_distenv_run_takes_node_0s_address_from_its_flags_under_htcondor.__name__
    _two_condor_nodes(harness, tmp_path, test, {}, free_port())
