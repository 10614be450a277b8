"""LSF environments, recorded from IBM's documentation (LSF cannot be installed here).

Sources: IBM Spectrum LSF 10.1.0 "Environment variables set for job execution" (LSB_JOBID,
LSB_JOBINDEX, LSB_HOSTS, LSB_MCPU_HOSTS, LSB_DJOB_RANKFILE) and the jsrun(1) man page of IBM Job
Step Manager (JSM_NAMESPACE_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE; jsrun also sets Spectrum MPI's
OMPI_COMM_WORLD_* for every task). The CORAL host list (a launch node with one slot before the
compute nodes) is the documented Summit/Sierra layout: "batch2 1 h22n07 42 h22n08 42".
"""

# Rank 7 of 12 under `jsrun -n 12 -r 6 -a 1` on Summit: two compute nodes with six tasks each.
JSRUN_CORAL_RANK7 = {
    "LSB_JOBID": "1032931",
    "LSB_JOBINDEX": "0",
    "LSB_MCPU_HOSTS": "batch2 1 h22n07 42 h22n08 42",
    "LSB_HOSTS": "batch2 " + "h22n07 " * 42 + "h22n08 " * 41 + "h22n08",
    "JSM_NAMESPACE_RANK": "7",
    "JSM_NAMESPACE_SIZE": "12",
    "JSM_NAMESPACE_LOCAL_RANK": "1",
    "JSM_NAMESPACE_LOCAL_SIZE": "6",
    "OMPI_COMM_WORLD_RANK": "7",
    "OMPI_COMM_WORLD_SIZE": "12",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "6",
}

# The batch script of the same job, on the launch node: no jsrun variables.
BSUB_BATCH_CORAL = {
    "LSB_JOBID": "1032931",
    "LSB_JOBINDEX": "0",
    "LSB_MCPU_HOSTS": "batch2 1 h22n07 42 h22n08 42",
}

# Ordinary LSF (no launch node): `bsub -n 8 -R "span[ptile=4]"`; the first host runs ranks.
JSRUN_PLAIN_RANK5 = {
    "LSB_JOBID": "4242",
    "LSB_MCPU_HOSTS": "hostA 4 hostB 4",
    "JSM_NAMESPACE_RANK": "5",
    "JSM_NAMESPACE_SIZE": "8",
    "JSM_NAMESPACE_LOCAL_RANK": "1",
    "JSM_NAMESPACE_LOCAL_SIZE": "4",
}

# A one-slot job's batch script: rank 0 of 1.
BSUB_ONE_SLOT = {"LSB_JOBID": "77", "LSB_MCPU_HOSTS": "hostA 1", "LSB_HOSTS": "hostA"}

# Element 3 of a job array `bsub -J "train[1-10]"`: elements share LSB_JOBID.
JSRUN_ARRAY_ELEMENT3 = {
    "LSB_JOBID": "5150",
    "LSB_JOBINDEX": "3",
    "LSB_HOSTS": "hostA hostA hostB hostB",
    "JSM_NAMESPACE_RANK": "0",
    "JSM_NAMESPACE_SIZE": "4",
    "JSM_NAMESPACE_LOCAL_RANK": "0",
    "JSM_NAMESPACE_LOCAL_SIZE": "2",
}


# --- LSF without jsrun --------------------------------------------------------------------------
# Sources, one per variable (cited again beside each value below):
#   [env]     IBM Spectrum LSF 10.1.0, "Environment variables set for job execution":
#             LSB_JOBID, LSB_JOBINDEX, LSB_HOSTS, LSB_MCPU_HOSTS, LSB_DJOB_HOSTFILE (path of a file
#             listing one host per slot), LSB_DJOB_NUMPROC (number of slots of the job).
#   [blaunch] IBM Spectrum LSF 10.1.0 blaunch(1): "When no host names are specified, LSF runs tasks
#             on all allocated hosts, one remote task per job slot."
#   [res]     the RES of openlava-derived LSF (lsf/res/res.c, the daemon blaunch talks to) sets
#             LSF_PM_TASKID to the remote task's id; Open MPI v4 orte/mca/ess/lsf/ess_lsf_module.c
#             names each daemon `vpid + LSF_PM_TASKID - 1`: the id counts from 1.
#   [ompi]    Open MPI v5.0.x docs, "Environment variables set for MPI applications":
#             OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE.
# The file contents that LSB_DJOB_HOSTFILE names are kept beside each environment; tests write
# them to a temporary file and point the variable at it.

# `bsub -n 4 -R "span[ptile=2]"` whose script runs `blaunch python train.py`: hosts c01, c02.
blaunch_hostfile = "c01\nc01\nc02\nc02\n"  # [env] one line per slot, in LSF's order


def _blaunch(task: int) -> dict[str, str]:
    return {
        "LSB_JOBID": "7001",  # [env]
        "LSB_JOBINDEX": "0",  # [env] 0 outside job arrays
        "LSB_MCPU_HOSTS": "c01 2 c02 2",  # [env]
        "LSB_HOSTS": "c01 c01 c02 c02",  # [env]
        "LSB_DJOB_HOSTFILE": "/home/u/.lsbatch/1700000000.7001.hostfile",  # [env] file, see above
        "LSB_DJOB_NUMPROC": "4",  # [env]
        "LSF_PM_TASKID": str(task),  # [blaunch] one task per slot; [res] counted from 1
    }


# The four tasks of that job, as blaunch starts them (task 1 .. 4 = rank 0 .. 3).
BLAUNCH_2X2 = [_blaunch(task) for task in (1, 2, 3, 4)]
# What distenv must answer for each: (rank, world, local_rank, local_world, node_rank, num_nodes).
BLAUNCH_2X2_ANSWERS = [
    (0, 4, 0, 2, 0, 2),
    (1, 4, 1, 2, 0, 2),
    (2, 4, 0, 2, 1, 2),
    (3, 4, 1, 2, 1, 2),
]
# Under mpirun the same ranks' node index and count are unknown before init_dist (Open MPI names
# neither, LSF numbers no MPI rank): its roll call numbers the hosts (c01: 0, c02: 1).
OMPI_UNDER_LSF_ANSWERS = [(r, 4, r % 2, 2, None, None) for r in range(4)]

# Pitfall: the same job's batch script (no LSF_PM_TASKID, no JSM_*): refused, not rank 0 of 4.
BLAUNCH_BATCH_SCRIPT = {k: v for k, v in _blaunch(1).items() if k != "LSF_PM_TASKID"}

# Open MPI's mpirun in the same job (`mpirun -np 4 python train.py`, no jsrun). Ranks on c02 run
# under an orted that blaunch/lsb_launch started, and inherit its LSF_PM_TASKID ([res]: Open MPI's
# ess/lsf names the daemon from it); ranks on c01, mpirun's own node, have none. OMPI_* answer.
OMPI_UNDER_LSF = [
    {
        **{k: v for k, v in _blaunch(1).items() if k != "LSF_PM_TASKID"},
        **({"LSF_PM_TASKID": "1"} if rank >= 2 else {}),  # [res] the orted's task id
        "OMPI_COMM_WORLD_RANK": str(rank),  # [ompi]
        "OMPI_COMM_WORLD_SIZE": "4",  # [ompi]
        "OMPI_COMM_WORLD_LOCAL_RANK": str(rank % 2),  # [ompi]
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",  # [ompi]
    }
    for rank in range(4)
]

# Pitfall: Open MPI under LSF on a CSM (CORAL) site, whose host list starts with the launch node
# holding one slot (the Summit/Sierra layout above). A one-slot first host may as well be where
# mpirun put rank 0 on an ordinary site: distenv names no master (rank 0's host goes over MPI).
OMPI_UNDER_LSF_CSM_RANK0 = {
    "LSB_JOBID": "1032932",  # [env]
    "LSB_MCPU_HOSTS": "batch2 1 h22n07 2 h22n08 2",  # [env] launch node first
    "OMPI_COMM_WORLD_RANK": "0",  # [ompi]
    "OMPI_COMM_WORLD_SIZE": "4",  # [ompi]
    "OMPI_COMM_WORLD_LOCAL_RANK": "0",  # [ompi]
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",  # [ompi]
}
