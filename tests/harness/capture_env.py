#!/usr/bin/env python3
"""Write the launcher-related environment of this process as one JSON line.

Each rank of a launch runs this (directly, under srun/mpirun/mpiexec, or as a torchrun script):

    capture_env.py                 # one line to stdout, in a single os.write (no interleaving)
    capture_env.py --out DIR       # DIR/<hostname>-<pid>-<ns>.json instead (written, then renamed)

The line is ``{"hostname": ..., "env": {name: value, ...}}`` with every variable a launcher or
scheduler may set (see PREFIXES and NAMES). Standard library only: it must run before anything is
installed and must not import distenv, whose behaviour these captures are meant to pin.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence

PREFIXES = (
    "SLURM_",
    "SRUN_",
    "OMPI_",
    "PMI_",
    "PMIX_",
    "MPI_",  # MPI_LOCALRANKID, MPI_LOCALNRANKS (MPICH hydra)
    "MV2_",
    "PALS_",
    "HYDRA_",
    "I_MPI_",
    "TORCHELASTIC_",
    "LSB_",
    "JSM_",
    "DISTENV_",
    "CUDA_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "ROCR_VISIBLE_DEVICES",
)

NAMES = frozenset(
    {
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "OMP_NUM_THREADS",
        "SLURMD_NODENAME",  # the node a Slurm task runs on (not under the SLURM_ prefix)
    }
)


def captured(env: Mapping[str, str]) -> dict[str, str]:
    """Return the launcher-related subset of ``env``, sorted by name."""
    return {k: env[k] for k in sorted(env) if k in NAMES or k.startswith(PREFIXES)}


def main(argv: Sequence[str] | None = None) -> int:
    """Capture the environment and write it to stdout or ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", metavar="DIR", help="write DIR/<hostname>-<pid>-<ns>.json")
    args = parser.parse_args(argv)

    host = socket.gethostname()
    record = {"hostname": host, "env": captured(os.environ)}
    data = (json.dumps(record, sort_keys=True) + "\n").encode()
    if args.out is None:
        # One write: Hydra (and others) forward each write separately and interleave ranks mid-line.
        os.write(sys.stdout.fileno(), data)
        return 0
    name = f"{host}-{os.getpid()}-{time.monotonic_ns()}.json"
    final = os.path.join(args.out, name)
    tmp = os.path.join(args.out, f".{name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, final)  # readers never see half a file
    return 0


if __name__ == "__main__":
    sys.exit(main())
