"""Flux environments, recorded from flux-core's and flux-coral2's sources (Flux cannot be
installed here).

Sources, cited beside each value as [key]:
  [env]    flux-core v0.88 (flux-framework/flux-core 4a5e79f), doc/man7/flux-environment.rst,
           "JOB ENVIRONMENT": FLUX_JOB_ID (F58), FLUX_JOB_SIZE, FLUX_JOB_NNODES (job shells
           running tasks), FLUX_TASK_RANK ("block" by default, --taskmap may choose others),
           FLUX_TASK_LOCAL_ID, FLUX_URI, FLUX_KVS_NAMESPACE, FLUX_JOB_TMPDIR; PMI_RANK, PMI_SIZE,
           PMI_FD, PMI_SPAWNED from the `pmi` shell plug-in. Set by src/shell/shell.c
           (shell_env_init) and src/shell/task.c (shell_task_create).
  [init]   the same page, "INITIAL PROGRAM ENVIRONMENT": flux batch's script and flux alloc's
           shell see FLUX_URI (and FLUX_ENCLOSING_ID); the broker unsets FLUX_JOB_ID,
           FLUX_JOB_SIZE, FLUX_JOB_NNODES, FLUX_TASK_RANK, FLUX_TASK_LOCAL_ID, PMI_*, SLURM_*.
  [f58]    src/common/libutil/fluid.c: F58 is "ƒ" + base 58, or "f" + base 58 where the shell's
           locale is not UTF-8 (or FLUX_F58_FORCE_ASCII is set); each node's shell encodes
           FLUX_JOB_ID itself. src/common/libutil/test/fluid.c pairs 6731191091817518 with
           "ƒuZZybuNNy" / "fuZZybuNNy".
  [pals]   flux-coral2 (flux-framework/flux-coral2 913a154) src/shell/plugins/cray_pals.c, with
           `-o pmi=cray-pals`: PALS_NODEID (the shell rank), PALS_APID (the job id as a number),
           PALS_SPOOL_DIR, PALS_APINFO and, per task, PALS_RANKID = FLUX_TASK_RANK; no
           PALS_LOCAL_RANKID, no PMI_LOCAL_SIZE.
Paths and the URI are illustrative; names and value formats are the sources'.
"""

JOB_ID = "ƒuZZybuNNy"  # [f58] the FLUID 6731191091817518
JOB_NUMBER = 6731191091817518


def _task(rank: int, local: int, size: int, nodes: int) -> dict[str, str]:
    return {
        "FLUX_URI": "local:///var/tmp/flux-Hx2lZ3/local-0",  # [env]
        "FLUX_JOB_ID": JOB_ID,  # [env] [f58]
        "FLUX_JOB_SIZE": str(size),  # [env]
        "FLUX_JOB_NNODES": str(nodes),  # [env]
        "FLUX_TASK_RANK": str(rank),  # [env]
        "FLUX_TASK_LOCAL_ID": str(local),  # [env]
        "FLUX_KVS_NAMESPACE": "job-6731191091817518",  # [env]
        "FLUX_JOB_TMPDIR": "/var/tmp/flux-Hx2lZ3/jobtmp-0-" + JOB_ID,  # [env]
        "PMI_RANK": str(rank),  # [env] the pmi shell plug-in
        "PMI_SIZE": str(size),  # [env]
        "PMI_FD": "9",  # [env]
        "PMI_SPAWNED": "0",  # [env]
    }


# `flux run -N2 --tasks-per-node=2 python train.py`: 2 nodes x 2 tasks, block task map [env].
FLUX_2X2 = [_task(rank, rank % 2, 4, 2) for rank in range(4)]
# What detection answers: no node index and no local size (None), which init_dist's roll call
# fills from the tasks' host names; then the answers after the roll call, tasks 0-1 on one host.
FLUX_2X2_DETECTED = [(r, 4, r % 2, None, None, 2) for r in range(4)]
FLUX_2X2_ANSWERS = [(r, 4, r % 2, 2, r // 2, 2) for r in range(4)]

# `flux run -N2 -n5 --taskmap=cyclic ...`: uneven and cyclic, tasks 0, 2, 4 on the first node.
FLUX_CYCLIC_5 = [_task(rank, rank // 2, 5, 2) for rank in range(5)]
FLUX_CYCLIC_5_HOSTS = ["fluke1", "fluke2", "fluke1", "fluke2", "fluke1"]
FLUX_CYCLIC_5_ANSWERS = [(r, 5, r // 2, 3 - r % 2, r % 2, 2) for r in range(5)]

# `flux run -N2 --tasks-per-node=1 ...`: one task per node; node index = rank.
FLUX_2X1 = [_task(rank, 0, 2, 2) for rank in range(2)]
FLUX_2X1_ANSWERS = [(0, 2, 0, 1, 0, 2), (1, 2, 0, 1, 1, 2)]

# `flux run -N1 -n4 ...`: one node.
FLUX_1X4 = [_task(rank, rank, 4, 1) for rank in range(4)]
FLUX_1X4_ANSWERS = [(r, 4, r, 4, 0, 1) for r in range(4)]

# Pitfall: the second node's shell runs in an ASCII locale: its FLUX_JOB_ID is "fuZZybuNNy" [f58].
FLUX_2X1_ASCII_NODE = {**FLUX_2X1[1], "FLUX_JOB_ID": "fuZZybuNNy"}

# Pitfall: the initial program of `flux batch -N2 job.sh` (or a `flux alloc` shell): FLUX_URI and
# FLUX_ENCLOSING_ID only [init]. No launch: rank 0 of 1, never rank 0 of N.
FLUX_BATCH_SCRIPT = {
    "FLUX_URI": "local:///var/tmp/flux-Qm3aZ1/local-0",  # [init]
    "FLUX_ENCLOSING_ID": JOB_ID,  # [init]
}

# Pitfall: `flux run -N2 --tasks-per-node=1 -o pmi=cray-pals ...` [pals]: PALS_RANKID beside the
# FLUX_* and the pmi plug-in's PMI_*; no PALS_LOCAL_RANKID. Flux and PALS agree: Flux answers.
FLUX_PALS_2X1 = [
    {
        **_task(rank, 0, 2, 2),
        "PALS_RANKID": str(rank),  # [pals] = FLUX_TASK_RANK
        "PALS_NODEID": str(rank),  # [pals] the shell rank
        "PALS_APID": str(JOB_NUMBER),  # [pals] "%ju" of the job id
        "PALS_SPOOL_DIR": "/var/tmp/flux-Hx2lZ3/jobtmp-0-" + JOB_ID,  # [pals] FLUX_JOB_TMPDIR
        "PALS_APINFO": "/var/tmp/flux-Hx2lZ3/jobtmp-0-" + JOB_ID + "/libpals_apinfo",  # [pals]
    }
    for rank in range(2)
]
