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
