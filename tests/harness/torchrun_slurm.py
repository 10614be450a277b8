#!/usr/bin/env python3
"""Start one torchrun per Slurm task, rendezvousing at the first node of the step.

Run it as the program of an ``srun --ntasks-per-node 1`` step, with the venv's python:

    srun -N 2 --ntasks-per-node 1 python torchrun_slurm.py [--static] [--nproc-per-node 2] \
        [--port 29500] -- script.py [args...]

The first node comes from ``$SLURM_STEP_NODELIST``, expanded in-process with python-hostlist (no
``scontrol`` per task). Default: c10d rendezvous (``--rdzv-backend c10d --rdzv-endpoint
FIRST:PORT --rdzv-id JOB.STEP``); ``--static``: ``--master-addr FIRST --master-port PORT
--node-rank $SLURM_NODEID``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import hostlist  # python-hostlist


def torchrun_argv(env: dict[str, str], args: argparse.Namespace) -> list[str]:
    """Build the torchrun command line for this task from the Slurm step variables."""
    nodes = hostlist.expand_hostlist(env["SLURM_STEP_NODELIST"])
    first = nodes[0]
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    argv = [torchrun, "--nnodes", str(len(nodes)), "--nproc-per-node", str(args.nproc_per_node)]
    if args.static:
        argv += ["--node-rank", env["SLURM_NODEID"], "--master-addr", first]
        argv += ["--master-port", str(args.port)]
    else:
        run_id = f"{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '0')}"
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{first}:{args.port}"]
        argv += ["--rdzv-id", run_id]
    return [*argv, *args.script]


def main(argv: Sequence[str] | None = None) -> int:
    """Exec torchrun for this node."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--static", action="store_true", help="static rendezvous (node rank)")
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--port", type=int, default=29500)
    parser.add_argument("script", nargs=argparse.REMAINDER, help="-- script.py [args...]")
    args = parser.parse_args(argv)
    if args.script and args.script[0] == "--":
        args.script = args.script[1:]
    if not args.script:
        parser.error("no script given (after --)")
    cmd = torchrun_argv(dict(os.environ), args)
    os.execv(cmd[0], cmd)  # noqa: S606  (no shell is the point: replace this process)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
