"""PBS Professional / OpenPBS jobs with Cray PALS ranks, recorded from sources (PBS and PALS
cannot be installed here).

Sources, cited beside each value as [key]:
  [pbs]    OpenPBS v23.06 (openpbs/openpbs cd7ab5e), src/resmom/start_exec.c: the job script gets
           PBS_JOBID, PBS_NODEFILE, PBS_NODENUM, PBS_TASKNUM (decimal, "%u") and PBS_ENVIRONMENT;
           a task spawned through the TM interface (pbsdsh) gets PBS_TASKNUM in hexadecimal
           ("%8.8X"). generate_pbs_nodefile() writes one line per vnode entry (an MPI process of
           the chunk), mother superior first, a host's short name or its vnode host name (fully
           qualified on Polaris). No PBS_NUM_NODES anywhere in OpenPBS (Torque had it).
  [sister] OpenPBS v23.06 src/resmom/catch_child.c and mom_comm.c: sister MoMs write the node file
           only when gen_nodefile_on_sister_mom is set.
  [pals]   The PALS launch contract libpals reads, as HPE wrote it for Slurm's `--mpi=cray_shasta`
           (SchedMD/slurm b507641, src/plugins/mpi/cray_shasta/mpi_cray_shasta.c,
           mpi_p_slurmstepd_task): PALS_APID, PALS_APINFO, PALS_LOCAL_RANKID, PALS_NODEID,
           PALS_RANKID, PALS_SPOOL_DIR, PMI_JOBID, PMI_LOCAL_RANK, PMI_LOCAL_SIZE, PMI_RANK,
           PMI_SIZE, PMI_UNIVERSE_SIZE. PBS's PALS mpiexec is HPE's own launcher for the same
           libpals, which reads these names whoever launches. No node count, no host list.
  [alcf]   ALCF Polaris user guide (docs.alcf.anl.gov/polaris/running-jobs): jobs are
           `qsub -l select=N`, ranks started with `mpiexec -n N --ppn P`. The host and job names
           below are illustrative, of the Polaris form (fully qualified, as [pbs] allows).
The node file's contents are kept beside the environments; tests write them to a temporary file.
"""

# `qsub -l select=2:mpiprocs=2 job.pbs` on Polaris; job.pbs runs `mpiexec -n 4 --ppn 2 python ...`.
NODES = (
    "x3006c0s13b0n0.hsn.cm.polaris.alcf.anl.gov",  # [alcf] mother superior first [pbs]
    "x3006c0s19b1n0.hsn.cm.polaris.alcf.anl.gov",  # [alcf]
)
nodefile_2x2 = "".join(f"{host}\n" * 2 for host in NODES)  # [pbs] one line per mpiprocs

_JOB = {
    "PBS_JOBID": "2024713.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov",  # [pbs] jobid.server
    "PBS_NODEFILE": "/var/spool/pbs/aux/2024713.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov",  # [pbs]
    "PBS_ENVIRONMENT": "PBS_BATCH",  # [pbs]
    "PBS_NODENUM": "0",  # [pbs] the MoM's node id: 0 on the mother superior
    "PBS_TASKNUM": "1",  # [pbs] the script's task number, decimal
}


def _pals_rank(rank: int) -> dict[str, str]:
    return {
        **_JOB,  # inherited from the script: mpiexec forwards the environment
        "PALS_APID": "c7e5c58f-5a4f-4f87-9d41-6a0e3b2b3f11",  # [pals] one per mpiexec launch
        "PALS_APINFO": "/var/run/palsd/c7e5c58f-5a4f-4f87-9d41-6a0e3b2b3f11/apinfo",  # [pals]
        "PALS_SPOOL_DIR": "/var/run/palsd/c7e5c58f-5a4f-4f87-9d41-6a0e3b2b3f11",  # [pals]
        "PALS_RANKID": str(rank),  # [pals] global rank
        "PALS_LOCAL_RANKID": str(rank % 2),  # [pals] rank on this node
        "PALS_NODEID": str(rank // 2),  # [pals] node index of this launch
        "PMI_RANK": str(rank),  # [pals]
        "PMI_SIZE": "4",  # [pals]
        "PMI_LOCAL_RANK": str(rank % 2),  # [pals]
        "PMI_LOCAL_SIZE": "2",  # [pals]
        "PMI_UNIVERSE_SIZE": "4",  # [pals]
        "PMI_JOBID": "c7e5c58f-5a4f-4f87-9d41-6a0e3b2b3f11",  # [pals]
    }


# The four ranks of that launch; distenv answers (rank, world, local, local world, node, nodes)
# before init_dist: PALS names the node (PALS_NODEID) but no node count, which init_dist's roll
# call counts from the ranks' host names (2 here).
PALS_2X2 = [_pals_rank(rank) for rank in range(4)]
PALS_2X2_ANSWERS = [(r, 4, r % 2, 2, r // 2, None) for r in range(4)]

# Pitfall: the job script itself (`python train.py` without mpiexec): refused, not rank 0 of 4.
PBS_SCRIPT = dict(_JOB)

# Pitfall: a task pbsdsh started on the second vnode: PBS_TASKNUM is hexadecimal and counts TM
# tasks, not ranks ("0000000A" is task 10). Refused like the script.
PBSDSH_TASK = {**_JOB, "PBS_TASKNUM": "0000000A", "PBS_NODENUM": "1"}  # [pbs] "%8.8X"

# Pitfall: PALS under Slurm (`srun --mpi=cray_shasta -N2 --ntasks-per-node 2`): the step and PALS
# number the task alike, so Slurm answers with its full layout (srun(1) OUTPUT ENVIRONMENT).
PALS_UNDER_SLURM_RANK3 = {
    "SLURM_JOB_ID": "88123",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "3",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NODELIST": "nid[001234-001235]",
    "PALS_APID": "88123.0",  # [pals] "%u.%u" job.step
    "PALS_RANKID": "3",  # [pals]
    "PALS_LOCAL_RANKID": "1",  # [pals]
    "PALS_NODEID": "1",  # [pals]
    "PMI_RANK": "3",  # [pals]
    "PMI_SIZE": "4",  # [pals]
    "PMI_LOCAL_RANK": "1",  # [pals]
    "PMI_LOCAL_SIZE": "2",  # [pals]
    "PMI_JOBID": "88123",  # [pals]
}

# Open MPI's mpirun (built with PBS's TM support) inside the same job: OMPI_* (Open MPI v5.0.x docs,
# "Environment variables set for MPI applications") beside the job's PBS_* that the ranks inherit.
# The mpi launcher answers; PBS gives no master (the node file may be absent on the other node).
OMPI_UNDER_PBS_RANK3 = {
    **_JOB,
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}
