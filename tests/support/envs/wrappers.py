"""torchrun's variables as a per-task wrapper script or enroot's PyTorch hook sets them.

Built, not captured: each constant is a captured launch (tests/support/envs/slurm.py, mpi.py)
with the variables a documented formula derives from it added, task by task; the integration
tests (tests/integration/test_wrappers.py) run the same formulas under the real srun and mpirun.
"""

from __future__ import annotations

from distenv._hosts import expand_nodelist
from tests.support.envs import mpi, slurm


def enroot_hook(env: dict[str, str]) -> dict[str, str]:
    """Return `env` with what NVIDIA/enroot conf/hooks/extra/50-slurm-pytorch.sh exports."""
    hook = {
        "RANK": env["SLURM_PROCID"],
        "WORLD_SIZE": env["SLURM_NTASKS"],
        "LOCAL_RANK": env["SLURM_LOCALID"],
        "MASTER_ADDR": expand_nodelist("test", "SLURM_STEP_NODELIST", env["SLURM_STEP_NODELIST"])[
            0
        ],
        "MASTER_PORT": str(int(env["SLURM_JOB_ID"]) % 4536 + 61000),
    }
    if int(env["SLURM_NTASKS"]) > int(env["SLURM_NNODES"]):
        hook["OMP_NUM_THREADS"] = "1"
    return {**env, **hook}


def srun_wrapper(env: dict[str, str]) -> dict[str, str]:
    """Return `env` with a cluster guide's `srun wrapper.sh`: export RANK=$SLURM_PROCID
    LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS MASTER_ADDR=<first host of the job>
    MASTER_PORT=29500; exec python train.py."""
    first = expand_nodelist("test", "SLURM_JOB_NODELIST", env["SLURM_JOB_NODELIST"])[0]
    return {
        **env,
        "RANK": env["SLURM_PROCID"],
        "LOCAL_RANK": env["SLURM_LOCALID"],
        "WORLD_SIZE": env["SLURM_NTASKS"],
        "MASTER_ADDR": first,
        "MASTER_PORT": "29500",
    }


def mpirun_wrapper(env: dict[str, str]) -> dict[str, str]:
    """Return `env` with an `mpirun wrapper.sh` that exports torchrun's names from Open MPI's."""
    return {
        **env,
        "RANK": env["OMPI_COMM_WORLD_RANK"],
        "WORLD_SIZE": env["OMPI_COMM_WORLD_SIZE"],
        "LOCAL_RANK": env["OMPI_COMM_WORLD_LOCAL_RANK"],
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }


# enroot's hook in every task of `srun -N 2 -n 4` (captured as slurm.SRUN_2N_4T).
ENROOT_HOOK_2N_4T = tuple(enroot_hook(env) for env in slurm.SRUN_2N_4T)
# enroot's hook in `srun -N 2 -r 2 -n 4` inside `salloc -N 4` (slurm.SRUN_SUBSET_R2): rank 0 on n3.
ENROOT_HOOK_SUBSET_R2 = tuple(enroot_hook(env) for env in slurm.SRUN_SUBSET_R2)
# A guide's wrapper in every task of `srun -N 2 -n 4`, and of `srun -n 4` on one node.
SRUN_WRAPPER_2N_4T = tuple(srun_wrapper(env) for env in slurm.SRUN_2N_4T)
SRUN_WRAPPER_1N_4T = tuple(srun_wrapper(env) for env in slurm.SRUN_1N_4T)
# The hook over `srun --mpi=pmix -n 4` (slurm.SRUN_PMIX_4): PMIx's variables agree with srun's.
ENROOT_HOOK_PMIX_4 = tuple(enroot_hook(env) for env in slurm.SRUN_PMIX_4)
# `mpirun.openmpi -np 4 wrapper.sh` on one node (mpi.OMPI_4).
MPIRUN_WRAPPER_4 = tuple(mpirun_wrapper(env) for env in mpi.OMPI_4)
