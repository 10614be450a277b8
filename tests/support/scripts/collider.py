"""A rank that trains for a while: init_dist, then all-reduces until told to stop.

It stops after `--seconds`, or earlier once `--stop-file` exists (rank 0 looks, and the decision
travels in the all-reduce, so every rank stops at the same step); with a stop file, each rank
creates ``init-<rank>`` beside it once init_dist returned (the test waits for those, not a
guessed while). Used by the collision tests: one job trains while another job's ranks reach its
store. Prints
``INIT <rank> <world>`` after init_dist and ``DONE <rank> <sum>`` at the end; a DistEnvError is
one ``ERROR <class>: <message>`` line and exit status 1.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=0.0)
    parser.add_argument("--stop-file", type=Path)
    parser.add_argument("--launcher", default="auto")
    args = parser.parse_args()
    import torch
    import torch.distributed as dist

    import distenv

    try:
        info = distenv.init_dist(args.launcher)
    except distenv.DistEnvError as exc:
        print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
        return 1
    print(f"INIT {info.rank} {info.world_size}", flush=True)
    if args.stop_file is not None:
        (args.stop_file.parent / f"init-{info.rank}").touch()
    end = time.monotonic() + args.seconds
    while True:
        asked = info.rank == 0 and args.stop_file is not None and args.stop_file.exists()
        value = torch.tensor([info.rank + 1.0, 1.0 if asked else 0.0])
        dist.all_reduce(value)
        if value[1] > 0 or time.monotonic() >= end:
            break
        time.sleep(0.05)
    dist.barrier()
    print(f"DONE {info.rank} {value[0].item():g}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
