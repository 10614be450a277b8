"""Grid Engine jobs, recorded from its sources and manual pages (Grid Engine cannot run here).

Sources, cited beside each value as [key]:
  [exec]   gridengine/gridengine 6a5407d (the Sun/Oracle tree Son of Grid Engine carries),
           source/daemons/execd/exec_job.c `sge_exec_job`: the job's environment gets JOB_ID,
           SGE_TASK_ID (and _FIRST/_LAST/_STEPSIZE; "undefined" outside array jobs), NSLOTS,
           NHOSTS, NQUEUES, RESTARTED, PE and, for the master task only ("forward PE_HOSTFILE
           only to master task"), PE_HOSTFILE = <execd spool>/active_jobs/<job>.<task>/pe_hostfile.
           The file has one line per granted queue: "%s %d %s %s\\n", host, slots, queue,
           processors ("UNDEFINED" unless the queue sets a processor set).
  [submit] same tree, doc/man/man1/submit.1 "ENVIRONMENTAL VARIABLES": JOB_ID a decimal number,
           SGE_JOB_SPOOL_DIR the shepherd's job directory, NSLOTS/NHOSTS of a parallel job, PE,
           PE_HOSTFILE, RESTARTED 0 or 1.
  [pe]     same tree, doc/man/man5/sge_pe.5 "$pe_hostfile": "hostname, number of parallel
           processes, queue, processor range"; the master queue's host comes first (Open MPI's
           ras/gridengine, which reads this file for mpirun, puts rank 0 there).
  [ompi]   Open MPI starts its daemons under Grid Engine with `qrsh -inherit -nostdin -V <host>`
           (plm:rsh's launch line, as its users' list shows it): -V hands every daemon, and so every
           rank, mpirun's environment, PE_HOSTFILE included; each rank gets OMPI_COMM_WORLD_*
           (Open MPI v4.1 docs, "Environment variables set for MPI applications").
Host and queue names are illustrative (the execd spools locally under /var/spool/sge/<host>).
"""

HOSTS = ("node01.cluster", "node02.cluster")  # illustrative
# [pe] `qsub -pe mpi 8` granted 4 slots on each host of all.q; the master queue's host first.
pe_hostfile_2x4 = "".join(f"{host} 4 all.q@{host} UNDEFINED\n" for host in HOSTS)  # [exec]

_SPOOL = "/var/spool/sge/node01.cluster/active_jobs/4242.1"  # [exec] <spool>/active_jobs/job.task
_JOB = {
    "JOB_ID": "4242",  # [submit] decimal
    "JOB_NAME": "train.sh",  # [exec]
    "SGE_JOB_SPOOL_DIR": _SPOOL,  # [submit]
    "SGE_TASK_ID": "undefined",  # [exec] not an array job
    "SGE_TASK_FIRST": "undefined",  # [exec]
    "SGE_TASK_LAST": "undefined",  # [exec]
    "SGE_TASK_STEPSIZE": "undefined",  # [exec]
    "ENVIRONMENT": "BATCH",  # [exec]
    "QUEUE": "all.q",  # [exec] the master queue
    "HOSTNAME": "node01.cluster",  # [exec] the master queue's host
    "NQUEUES": "2",  # [exec] one per granted queue instance
    "RESTARTED": "0",  # [submit]
}

# The job script of `qsub -pe mpi 8 train.sh` on node01: 8 slots on 2 hosts. Without mpirun it
# is refused, naming NSLOTS, instead of running as rank 0 of 8.
SGE_PE_SCRIPT = {
    **_JOB,
    "PE": "mpi",  # [exec]
    "NSLOTS": "8",  # [exec]
    "NHOSTS": "2",  # [exec]
    "PE_HOSTFILE": f"{_SPOOL}/pe_hostfile",  # [exec] the master task's
}

# A serial job's script (`qsub train.sh`): no PE, NSLOTS 1 (submit(1)); rank 0 of 1.
SGE_SERIAL_SCRIPT = {**_JOB, "NSLOTS": "1", "NHOSTS": "1", "NQUEUES": "1"}

# Element 7 of an array job (`qsub -t 1-10 train.sh`): SGE_TASK_ID and its range are numbers.
SGE_ARRAY_TASK7 = {
    **SGE_SERIAL_SCRIPT,
    "SGE_JOB_SPOOL_DIR": "/var/spool/sge/node01.cluster/active_jobs/4242.7",  # [exec]
    "SGE_TASK_ID": "7",  # [exec]
    "SGE_TASK_FIRST": "1",  # [exec]
    "SGE_TASK_LAST": "10",  # [exec]
    "SGE_TASK_STEPSIZE": "1",  # [exec]
}


def _ompi_rank(rank: int) -> dict[str, str]:
    return {
        **SGE_PE_SCRIPT,  # [ompi] qrsh -inherit -V: mpirun's environment on every host
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_RANK": str(rank % 4),
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    }


# `mpirun -np 8 python train.py` in that script: 2 hosts x 4 ranks, by slot. MPI answers; the
# master is PE_HOSTFILE's first host; the roll call counts the nodes.
OMPI_UNDER_SGE_2X4 = [_ompi_rank(rank) for rank in range(8)]
OMPI_UNDER_SGE_2X4_ANSWERS = [(r, 8, r % 4, 4, None, None) for r in range(8)]

# Pitfall: a rank on node02 whose MPI launcher did not forward PE_HOSTFILE (the execd gives it to
# the master task only [exec]): refused, not left to guess while the others read the file.
RANK5_WITHOUT_PE_HOSTFILE = {k: v for k, v in OMPI_UNDER_SGE_2X4[5].items() if k != "PE_HOSTFILE"}
