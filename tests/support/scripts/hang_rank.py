"""A rank of an all_reduce loop in which one rank hangs, for the hang autopsy's tests.

    hang_rank.py OUT --hang RANK:STEP:MODE [--hang-timeout S]

Every rank joins the group with ``distenv.init_dist(backend="gloo")``, writes its pid to
``OUT/pid<RANK>``, then all_reduces a tensor step after step. Rank RANK, at step STEP, writes the
time to ``OUT/fault`` and hangs as MODE says (each rank also writes when it entered its latest
collective to ``OUT/entered-<RANK>``): ``sleep`` (it sleeps in its own code while the others
wait in the all_reduce), ``skip`` (it skips that step's all_reduce: one collective ahead, it reaches
the final barrier while the others wait in the loop's last all_reduce), ``none`` (nobody hangs: the
loop runs until SIGTERM, for a dump on demand), ``slow`` (nobody hangs: every rank's steps take
1.6 s each, most of it on one line, for `SLOW_STEPS` steps). ``--hang-timeout S`` passes
``hang_timeout=S`` to init_dist (else ``$DISTENV_HANG_TIMEOUT`` applies, if set).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

import distenv

STEPS = 30
SLOW_STEPS = 6


def train(out: Path, rank: int, hang_step: int, mode: str) -> None:
    x = torch.ones(1)
    steps = {"none": 10**9, "slow": SLOW_STEPS}.get(mode, STEPS)
    for step in range(steps):
        if mode == "slow":
            time.sleep(1.6)
        if dist.get_rank() == rank and step == hang_step:
            (out / "fault").write_text(str(time.time()))
            if mode == "sleep":
                time.sleep(600)
            if mode == "skip":
                continue
        entered(out)
        dist.all_reduce(x)
        time.sleep(0.01)


def entered(out: Path) -> None:
    """Write when this rank entered a collective to ``OUT/entered-<RANK>``: the latest such time
    over the ranks is when the last rank blocked, the moment a hang begins."""
    (out / f"entered-{dist.get_rank()}").write_text(str(time.time()))


def finish(out: Path) -> None:
    entered(out)
    dist.barrier()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--hang", required=True)
    parser.add_argument("--hang-timeout", type=float, default=None)
    args = parser.parse_args()
    rank, step, mode = args.hang.split(":")
    distenv.init_dist(backend="gloo", hang_timeout=args.hang_timeout)
    (args.out / f"pid{dist.get_rank()}").write_text(str(os.getpid()))
    train(args.out, int(rank), int(step), mode)
    finish(args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
