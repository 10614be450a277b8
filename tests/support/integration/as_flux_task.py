#!/usr/bin/env python3
"""Run a command as the Flux task that this Slurm task would be: the node layout left unknown.

    python tests/support/integration/as_flux_task.py PROGRAM [ARGS...]

Flux cannot be installed here, but its contract is recorded (tests/support/envs/flux.py): a task knows
its rank, the job's size, its local rank and the node count, and no node index, tasks per node or
host. This wrapper gives a task of a real ``srun`` on the simulated multi-node cluster exactly
that: SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID and SLURM_STEP_NUM_NODES become
FLUX_TASK_RANK, FLUX_JOB_SIZE, FLUX_TASK_LOCAL_ID and FLUX_JOB_NNODES, the job id becomes an F58
FLUX_JOB_ID ("ƒ..."), and every SLURM_*/PMI*_ variable is removed, so distenv detects Flux and
its roll call must number the hosts and count the tasks on each. Each rank still runs on its own
host (its own host name). MASTER_ADDR is the step's first host, as docs/start/flux.md's recipe
takes ``flux hostlist --nth=0``. The program replaces this process (``os.execve``): no shell.
"""

from __future__ import annotations

import os
import sys

from distenv._hosts import expand_nodelist

F58_DIGITS = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"  # flux-core fluid.c
RENAMED = {
    "SLURM_PROCID": "FLUX_TASK_RANK",
    "SLURM_STEP_NUM_TASKS": "FLUX_JOB_SIZE",
    "SLURM_LOCALID": "FLUX_TASK_LOCAL_ID",
    "SLURM_STEP_NUM_NODES": "FLUX_JOB_NNODES",
}


def f58(number: int) -> str:
    """Return `number` as Flux writes a job id in a UTF-8 locale ("ƒ" and base 58)."""
    digits = ""
    while True:
        number, digit = divmod(number, 58)
        digits = F58_DIGITS[digit] + digits
        if not number:
            return "\u0192" + digits


def main(argv: list[str]) -> None:
    slurm = os.environ
    env = {k: v for k, v in slurm.items() if not k.startswith(("SLURM_", "PMI_", "PMIX_"))}
    env.update({flux: slurm[name] for name, flux in RENAMED.items()})
    env["FLUX_JOB_ID"] = f58(int(slurm["SLURM_JOB_ID"]))
    env["FLUX_URI"] = "local:///var/tmp/flux-distenv-test/local-0"
    env["MASTER_ADDR"] = expand_nodelist(
        "test", "SLURM_STEP_NODELIST", slurm["SLURM_STEP_NODELIST"]
    )[0]
    os.execve(argv[0], argv, env)  # noqa: S606  (no shell is the point: replace this process)


if __name__ == "__main__":
    main(sys.argv[1:])
