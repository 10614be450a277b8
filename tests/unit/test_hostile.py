"""A catalogue of malformed and hostile environments: each a DistEnvError, fast, never a hang."""

from __future__ import annotations

import time
import tracemalloc

import pytest

from distenv import DistEnvError, detect
from tests.support.envs import flux, lsf, mpi, pbs, slurm, torchrun

STEP = dict(slurm.SRUN_2N_4T[1])
TORCH = dict(torchrun.TORCHRUN_4[1])
OMPI = dict(mpi.OMPI_4[1])
HYDRA = dict(mpi.HYDRA_4[1])
JSRUN = dict(lsf.JSRUN_PLAIN_RANK5)
BLAUNCH = {**lsf.BLAUNCH_2X2[1], "LSB_DJOB_HOSTFILE": ""}  # slots from LSB_MCPU_HOSTS
FLUX = dict(flux.FLUX_2X1[1])
PBS_SCRIPT = dict(pbs.PBS_SCRIPT)


def case(name: str, launcher: str, base: dict[str, str], **change: str | None) -> object:
    env = {**base}
    for key, value in change.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return pytest.param(launcher, env, id=name)


CATALOGUE = [
    # --- Slurm: missing, empty, non-integer, negative, out of range, contradictory
    case("slurm-procid-missing", "slurm", STEP, SLURM_PROCID=None),
    case("slurm-procid-empty", "slurm", STEP, SLURM_PROCID=""),
    case("slurm-procid-word", "slurm", STEP, SLURM_PROCID="one"),
    case("slurm-procid-negative", "slurm", STEP, SLURM_PROCID="-1"),
    case("slurm-procid-too-big", "slurm", STEP, SLURM_PROCID="4"),
    case("slurm-procid-float", "slurm", STEP, SLURM_PROCID="1.0"),
    case("slurm-procid-hex", "slurm", STEP, SLURM_PROCID="0x1"),
    case("slurm-procid-huge", "slurm", STEP, SLURM_PROCID="9" * 400),
    case("slurm-ntasks-zero", "slurm", STEP, SLURM_STEP_NUM_TASKS="0"),
    case("slurm-localid-out-of-node", "slurm", STEP, SLURM_LOCALID="2"),
    case("slurm-nodeid-out-of-range", "slurm", STEP, SLURM_NODEID="2"),
    case("slurm-nodes-disagree", "slurm", STEP, SLURM_STEP_NUM_NODES="3"),
    case("slurm-tpn-sum-wrong", "slurm", STEP, SLURM_STEP_TASKS_PER_NODE="3(x2)"),
    case("slurm-tpn-malformed", "slurm", STEP, SLURM_STEP_TASKS_PER_NODE="2(x2"),
    case("slurm-tpn-zero", "slurm", STEP, SLURM_STEP_TASKS_PER_NODE="0(x2)"),
    case("slurm-tpn-million", "slurm", STEP, SLURM_STEP_TASKS_PER_NODE="1(x9999999)"),
    case("slurm-nodelist-unbalanced", "slurm", STEP, SLURM_STEP_NODELIST="n[1-2"),
    case("slurm-nodelist-nested", "slurm", STEP, SLURM_STEP_NODELIST="n[[1-2]]"),
    case("slurm-nodelist-reversed", "slurm", STEP, SLURM_STEP_NODELIST="n[2-1]"),
    case("slurm-nodelist-semicolon", "slurm", STEP, SLURM_STEP_NODELIST="n1;reboot"),
    case("slurm-nodelist-subshell", "slurm", STEP, SLURM_STEP_NODELIST="$(touch /tmp/x)"),
    case("slurm-nodelist-backticks", "slurm", STEP, SLURM_STEP_NODELIST="`id`,n2"),
    case("slurm-nodelist-space", "slurm", STEP, SLURM_STEP_NODELIST="n1 n2"),
    case("slurm-nodelist-newline", "slurm", STEP, SLURM_STEP_NODELIST="n1\nn2"),
    case("slurm-nodelist-bomb", "slurm", STEP, SLURM_STEP_NODELIST="n[0-99999999]"),
    case("slurm-nodelist-bomb-product", "slurm", STEP, SLURM_STEP_NODELIST="a[0-9999][0-9999]"),
    case("slurm-nodelist-unicode", "slurm", STEP, SLURM_STEP_NODELIST="nöde[1-2]"),
    case("slurm-distribution-arbitrary", "slurm", STEP, SLURM_DISTRIBUTION="arbitrary"),
    case("slurm-master-port-word", "slurm", STEP, MASTER_PORT="http"),
    case("slurm-master-port-too-big", "slurm", STEP, MASTER_PORT="70000"),
    case("slurm-master-addr-shell", "slurm", STEP, MASTER_ADDR="h;rm -rf ~"),
    case("slurm-addr-format-no-host", "slurm", STEP, DISTENV_MASTER_ADDR_FORMAT="ib0"),
    case("slurm-batch-4-tasks", "auto", {"SLURM_JOB_ID": "1", "SLURM_NTASKS": "4"}),
    case("slurm-batch-ntasks-word", "auto", {"SLURM_JOB_ID": "1", "SLURM_NTASKS": "four"}),
    case("slurm-step-id-word", "slurm", STEP, SLURM_STEP_ID="batch"),
    # --- torchrun
    case("torchrun-rank-missing", "pytorch", TORCH, RANK=None),
    case("torchrun-rank-too-big", "pytorch", TORCH, RANK="4"),
    case("torchrun-world-zero", "pytorch", TORCH, WORLD_SIZE="0"),
    case("torchrun-local-too-big", "pytorch", TORCH, LOCAL_RANK="4"),
    case("torchrun-local-world-zero", "pytorch", TORCH, LOCAL_WORLD_SIZE="0"),
    case("torchrun-master-missing", "pytorch", TORCH, MASTER_ADDR=None),
    case("torchrun-port-zero", "pytorch", TORCH, MASTER_PORT="0"),
    case("torchrun-group-rank-out", "pytorch", TORCH, GROUP_RANK="1"),
    case("torchrun-master-backtick", "pytorch", TORCH, MASTER_ADDR="`hostname`"),
    # --- MPI
    case("ompi-size-missing", "mpi", OMPI, OMPI_COMM_WORLD_SIZE=None),
    case("ompi-rank-too-big", "mpi", OMPI, OMPI_COMM_WORLD_RANK="4"),
    case("ompi-local-size-zero", "mpi", OMPI, OMPI_COMM_WORLD_LOCAL_SIZE="0"),
    case("ompi-local-size-too-big", "mpi", OMPI, OMPI_COMM_WORLD_LOCAL_SIZE="5"),
    case("ompi-local-rank-word", "mpi", OMPI, OMPI_COMM_WORLD_LOCAL_RANK="x"),
    case("hydra-no-local-rank", "mpi", HYDRA, MPI_LOCALRANKID=None),
    case("hydra-size-negative", "mpi", HYDRA, PMI_SIZE="-4"),
    case("pmix-alone", "auto", {"PMIX_RANK": "3"}),
    # --- nested launchers that disagree, named wrongly
    case("slurm-under-mpirun", "slurm", {**STEP, **mpi.OMPI_4[2]}),
    case("slurm-under-torchrun", "slurm", {**STEP, **TORCH}),
    case("lsf-under-torchrun", "lsf", {**JSRUN, **TORCH}),
    # --- LSF
    case("lsf-mcpu-odd", "lsf", JSRUN, LSB_MCPU_HOSTS="hostA 4 hostB"),
    case("lsf-mcpu-slots-word", "lsf", JSRUN, LSB_MCPU_HOSTS="hostA four"),
    case("lsf-mcpu-shell", "lsf", JSRUN, LSB_MCPU_HOSTS="hostA 4 $(id) 4"),
    case("lsf-jsm-rank-too-big", "lsf", JSRUN, JSM_NAMESPACE_RANK="8"),
    case("lsf-jsm-uneven", "lsf", JSRUN, JSM_NAMESPACE_LOCAL_SIZE="3"),
    case("lsf-rankfile-missing", "lsf", JSRUN, LSB_DJOB_RANKFILE="/nonexistent/rankfile"),
    case("lsf-batch-multi-slot", "auto", {"LSB_JOBID": "1", "LSB_MCPU_HOSTS": "a 2 b 2"}),
    case("lsf-no-hosts", "lsf", {"LSB_JOBID": "1", "JSM_NAMESPACE_RANK": "0"}),
    # --- LSF blaunch, PBS, Flux
    case("blaunch-taskid-word", "lsf", BLAUNCH, LSF_PM_TASKID="two"),
    case("blaunch-taskid-zero", "lsf", BLAUNCH, LSF_PM_TASKID="0"),
    case("blaunch-taskid-past-slots", "lsf", BLAUNCH, LSF_PM_TASKID="5"),
    case("blaunch-numproc-contradicts", "lsf", BLAUNCH, LSB_DJOB_NUMPROC="3"),
    case("blaunch-hostfile-missing", "lsf", BLAUNCH, LSB_DJOB_HOSTFILE="/nonexistent/hostfile"),
    case("pbs-nodefile-missing", "pbs", PBS_SCRIPT, PBS_NODEFILE="/nonexistent/nodefile"),
    case("pbs-nodefile-unset", "pbs", PBS_SCRIPT, PBS_NODEFILE=None),
    case("pbs-nodefile-directory", "pbs", PBS_SCRIPT, PBS_NODEFILE="/"),
    case("flux-rank-word", "flux", FLUX, FLUX_TASK_RANK="one"),
    case("flux-rank-too-big", "flux", FLUX, FLUX_TASK_RANK="2"),
    case("flux-size-zero", "flux", FLUX, FLUX_JOB_SIZE="0"),
    case("flux-local-id-nonzero", "flux", FLUX, FLUX_TASK_LOCAL_ID="1"),
    case("flux-nnodes-missing", "flux", FLUX, FLUX_JOB_NNODES=None),
    case("flux-nnodes-uneven", "flux", FLUX, FLUX_JOB_SIZE="3", FLUX_TASK_RANK="2"),
    case("flux-job-id-word", "flux", FLUX, FLUX_JOB_ID="ƒ0OIl"),
    case("flux-job-id-missing", "flux", FLUX, FLUX_JOB_ID=None),
    case("flux-job-id-huge", "flux", FLUX, FLUX_JOB_ID="ƒ" + "z" * 400),
    # --- unknown names
    case("unknown-launcher", "condor", {}),
]


def test_catalogue_is_large_enough() -> None:
    """The issue asks for at least 40 hostile environments across every backend."""
    assert len(CATALOGUE) >= 40


@pytest.mark.parametrize(("launcher", "env"), CATALOGUE)
def test_hostile_environment_raises_a_clear_error_fast(launcher: str, env: dict[str, str]) -> None:
    """Each hostile environment yields a DistEnvError naming its launcher, in bounded time/memory."""
    tracemalloc.start()
    start = time.perf_counter()
    with pytest.raises(DistEnvError) as caught:
        detect(launcher, env)
    elapsed = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert elapsed < 0.5
    assert peak < 5_000_000
    message = str(caught.value)
    assert message.split(":")[0] in {"slurm", "pytorch", "mpi", "lsf", "pbs", "flux", "distenv"}
    assert "Hint:" in message or "expected" in message or "not set" in message, message
    assert "\n" not in message.replace(repr("n1\nn2"), "")
