#!/usr/bin/env python3
"""One rank of an MPI job whose rank 0 stalls: for the exchange's deadline tests.

    python tests/support/integration/mpi_stall.py --stall {before-mpi,after-mpi} [--seconds S]
        [--peers-init-mpi] --dir DIR

Like a training script, it imports torch first. Every rank then writes ``DIR/rank-<r>.pid``.
Rank 0 sleeps `S` seconds: ``before-mpi`` before anything initialises MPI (its peers wait inside
MPI_Init), ``after-mpi`` after importing mpi4py.MPI (its peers reach the exchange and wait
there). With ``--peers-init-mpi`` the other ranks import mpi4py.MPI themselves first. Every rank
but the stalled one writes ``DIR/rank-<r>.start`` (`time.monotonic`, a clock every process of the
machine shares) just before it calls ``distenv.init_dist()`` with no MASTER_ADDR. A
`DistEnvError` is reported as one stderr line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def write(folder: str, name: str, text: str) -> None:
    """Write `text` to a new file `name` of `folder`, atomically (the test polls for it)."""
    path = os.path.join(folder, name)
    with open(path + ".tmp", "w") as out:
        out.write(text)
    os.rename(path + ".tmp", path)


def main() -> int:
    """Stall on rank 0 as asked, then bootstrap."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stall", choices=("before-mpi", "after-mpi"), required=True)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--peers-init-mpi", action="store_true")
    parser.add_argument("--dir", required=True)
    args = parser.parse_args()

    import torch.distributed  # noqa: F401  (as training scripts do: init_dist needs it first)

    import distenv  # detection only: no MPI_Init

    info = distenv.detect()
    write(args.dir, f"rank-{info.rank}.pid", str(os.getpid()))
    if info.rank == 0:
        if args.stall == "after-mpi":
            from mpi4py import MPI
        time.sleep(args.seconds)
    elif args.peers_init_mpi:
        from mpi4py import MPI  # noqa: F401
    if info.rank != 0:
        write(args.dir, f"rank-{info.rank}.start", repr(time.monotonic()))
    try:
        distenv.init_dist()
    except distenv.DistEnvError as exc:
        os.write(2, f"mpi_stall: {exc}\n".encode())
        return 1
    os.write(1, f"mpi_stall: rank {info.rank} initialised\n".encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
