"""A rank of an all_reduce loop that fails at one step, for the first-failure card's tests.

    card_rank.py OUT --fail RANK:STEP:MODE [--launcher NAME]

Every rank joins the group with ``distenv.init_dist(backend="gloo")``, writes its pid to
``OUT/pid<RANK>-<attempt>``, then all_reduces a tensor step after step. Rank RANK, at step STEP,
prints ``rank RANK at step STEP``, writes the time to ``OUT/fault`` and fails as MODE says:
``raise`` (ValueError), ``exit3`` (``sys.exit(3)``), ``segv`` or ``kill`` (the signal, sent to
itself). The others print nothing: what they write after it is the failure's consequences.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import distenv

STEPS = 1500


def inject(mode: str, step: int) -> None:
    if mode == "raise":
        raise ValueError(f"bad batch at step {step}")
    if mode == "exit3":
        sys.exit(3)
    os.kill(os.getpid(), signal.SIGSEGV if mode == "segv" else signal.SIGKILL)


def train(out: Path, rank: int, fail_step: int, mode: str) -> None:
    x = torch.ones(1)
    for step in range(STEPS):
        if dist.get_rank() == rank and step == fail_step:
            print(f"rank {rank} at step {step}", flush=True)
            (out / "fault").write_text(str(time.time()))
            inject(mode, step)
        dist.all_reduce(x)
        time.sleep(0.02)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--fail", required=True)
    parser.add_argument("--launcher", default="auto")  # the templates pass it
    args = parser.parse_args()
    rank, step, mode = args.fail.split(":")
    distenv.init_dist(args.launcher, backend="gloo")
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    (args.out / f"pid{dist.get_rank()}-{attempt}").write_text(str(os.getpid()))
    train(args.out, int(rank), int(step), mode)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
