"""HTCondor parallel-universe nodes, recorded from HTCondor's sources (HTCondor cannot run here).

Sources, cited beside each value as [key]:
  [proc]   htcondor/htcondor 7491a14, src/condor_starter.V6.1/parallel_proc.cpp `addEnvVars`:
           every node's executable gets _CONDOR_PROCNO (the job ad's Node, "%d"),
           _CONDOR_NPROCS (CurrentHosts, "%d") and _CONDOR_REMOTE_SPOOL_DIR (RemoteSpoolDir).
  [hosts]  src/condor_schedd.V6/dedicated_scheduler.cpp: CurrentHosts is "the total number of
           nodes for all procs" of the job (machine_count summed over its `queue`s).
  [spool]  src/condor_shadow.V6.1/parallelshadow.cpp gives every node proc 0's spool directory;
           src/condor_utils/spooled_job_files.cpp `gen_ckpt_name`: SPOOL/<cluster % 10000>/
           <proc % 10000>/cluster<C>.proc<P>.subproc0.
  [env]    docs/users-manual/env-of-job.rst: every job gets BATCH_SYSTEM=HTCondor,
           _CONDOR_SCRATCH_DIR, _CONDOR_SLOT, _CONDOR_JOB_AD and _CONDOR_MACHINE_AD (file paths in
           the scratch directory); "Parallel Jobs": $(Node) runs 0 to N-1, node 0's exit ends
           the job, several `queue`s with their own requirements share one ClusterId.
  [ompi]   src/condor_examples/openmpiscript: node 0 runs `mpirun -hostfile` over nodes 0..N-1,
           the other nodes run orted_launcher.sh, whose orted (and so its ranks) keep the node's
           own _CONDOR_PROCNO; ranks get OMPI_COMM_WORLD_* (Open MPI v4.1 docs).
The spool path and slot names are illustrative, of the recorded forms.
"""

_SCRATCH = "/var/lib/condor/execute/dir_31842"  # [env] illustrative


def _node(node: int, nodes: int, cluster: int = 1234) -> dict[str, str]:
    return {
        "BATCH_SYSTEM": "HTCondor",  # [env]
        "_CONDOR_SCRATCH_DIR": _SCRATCH,  # [env]
        "_CONDOR_SLOT": "slot1_1",  # [env]
        "_CONDOR_JOB_AD": f"{_SCRATCH}/.job.ad",  # [env] a file: never read by distenv
        "_CONDOR_MACHINE_AD": f"{_SCRATCH}/.machine.ad",  # [env]
        "_CONDOR_PROCNO": str(node),  # [proc]
        "_CONDOR_NPROCS": str(nodes),  # [proc] [hosts]
        # [spool] proc 0's directory on every node
        "_CONDOR_REMOTE_SPOOL_DIR": f"/var/lib/condor/spool/{cluster % 10000}/0/"
        f"cluster{cluster}.proc0.subproc0",
    }


# `machine_count = 2`, `universe = parallel`: node 1's process. Rank 1 of 2, one per node; no
# master address anywhere, so without MASTER_ADDR it is refused.
NODE1_OF_2 = _node(1, 2)
NODE0_OF_2 = _node(0, 2)

# The submit description gives the master: node 0 pinned to gpu01 by its own `requirements` and
# `queue`, `environment = "MASTER_ADDR=gpu01.example.edu"` for every node [env].
NODE1_OF_2_WITH_MASTER = {**NODE1_OF_2, "MASTER_ADDR": "gpu01.example.edu"}

# `machine_count = 1`: one node, its own master (127.0.0.1).
NODE0_OF_1 = _node(0, 1, cluster=20417)

# openmpiscript on 2 nodes, 2 ranks each: rank 3 runs under node 1's orted [ompi]. MPI answers,
# the master is exchanged over MPI (HTCondor names none).
OMPI_UNDER_OPENMPISCRIPT_RANK3 = {
    **NODE1_OF_2,
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}

# torchrun (or `distenv run`) started on node 1 by the executable: its own contract answers.
TORCHRUN_ON_NODE1_RANK3 = {
    **NODE1_OF_2_WITH_MASTER,
    "TORCHELASTIC_RUN_ID": "cluster1234",
    "TORCHELASTIC_RESTART_COUNT": "0",
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2",
    "MASTER_PORT": "29500",
}
