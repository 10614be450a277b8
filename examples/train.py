"""Train a small MLP with DDP under any launcher, and check every rank ends with the same weights.

    python examples/train.py                               # alone: 1 rank
    torchrun --nproc-per-node 4 examples/train.py          # 4 ranks on this machine
    srun -n 8 python examples/train.py                     # 8 Slurm tasks
    mpirun -n 4 python examples/train.py --launcher mpi    # Open MPI / MPICH
    srun python examples/train.py --checkpoint ckpt/       # save, requeue and resume on a warning

Prints one line on rank 0, e.g.
``train: launcher=pytorch world_size=4 steps=20 loss=0.123 weights_identical=True``,
and exits 1 if the ranks' weights differ.

With ``--checkpoint DIR`` it watches the scheduler's warning signal (``--warning-signal``,
``sbatch --signal=USR1@120``): at the first step boundary after any rank got it, every rank saves
its state to DIR and the job requeues itself (``--on-stop exit`` exits instead). A restarted job
(`RankInfo.restart_count` above 0) resumes from DIR at the step it stopped. docs/preemption.md
explains the recipe.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import distenv


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    distenv.add_launcher_argument(parser)
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps (default: 20)")
    parser.add_argument("--batch-size", type=int, default=32, help="per-rank batch size")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and the data")
    parser.add_argument(
        "--checkpoint",
        metavar="DIR",
        type=Path,
        help="on the scheduler's warning signal save here and stop; resume from here on a restart",
    )
    parser.add_argument(
        "--warning-signal", default="USR1", help="the warning signal: USR1, USR2 or TERM"
    )
    parser.add_argument(
        "--check-every",
        type=int,
        default=10,
        help="ask the ranks whether a warning arrived every N steps (default 10: on this small "
        "model one all-reduce per step costs ~10 %% of a step, see docs/preemption.md)",
    )
    parser.add_argument(
        "--on-stop",
        choices=("requeue", "exit"),
        default="requeue",
        help="after saving: requeue the job (Slurm, LSF) or just exit (default: requeue)",
    )
    parser.add_argument(
        "--step-time",
        type=float,
        default=0.0,
        help="seconds of simulated extra work per step, to demonstrate preemption (default: 0)",
    )
    return parser.parse_args(argv)


def save_checkpoint(
    directory: Path,
    rank: int,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
) -> None:
    """Write this rank's state at `step` (atomically: a kill mid-write leaves the old file)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"rank{rank}.pt"
    state = {
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "generator": generator.get_state(),
    }
    torch.save(state, path.with_suffix(".tmp"))
    os.replace(path.with_suffix(".tmp"), path)


def load_checkpoint(
    directory: Path,
    rank: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
) -> int:
    """Restore this rank's state; return the step to resume at (0 without a checkpoint)."""
    path = directory / f"rank{rank}.pt"
    if not path.exists():
        return 0
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    generator.set_state(state["generator"])
    return int(state["step"])


def weights_checksum(model: nn.Module) -> torch.Tensor:
    """Return a float64 digest of the parameters: equal on two ranks iff (almost surely) equal."""
    flat = torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])
    weights = torch.arange(1, flat.numel() + 1, dtype=torch.float64, device=flat.device)
    return torch.stack([flat.sum(), (flat * weights).sum()])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Two ranks per core on a laptop: intra-op threads would only fight each other.
    torch.set_num_threads(1)
    # --8<-- [start:watch]
    if args.checkpoint is not None:
        # Before init_dist: a warning that arrives while the ranks meet is not lost.
        distenv.watch_preemption([args.warning_signal], every=args.check_every)
    info = distenv.init_dist(args.launcher, seed=args.seed)
    # --8<-- [end:watch]
    device = (
        torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    )

    # Same seed everywhere: every rank builds identical initial weights (DDP would broadcast
    # rank 0's anyway). The data differ per rank, as each rank reads its own shard.
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(args.seed + 1000 * info.rank)
    target_weights = torch.linspace(-1, 1, 16)

    # --8<-- [start:loop]
    start = 0
    if args.checkpoint is not None and info.restart_count > 0:
        start = load_checkpoint(args.checkpoint, info.rank, model, optimizer, generator)
    if info.rank == 0 and args.checkpoint is not None:
        print(f"train: started at step {start} (restart {info.restart_count})", flush=True)

    loss = torch.zeros((), device=device)
    for step in range(start, args.steps):
        if args.checkpoint is not None and distenv.stop_requested():
            save_checkpoint(args.checkpoint, info.rank, step, model, optimizer, generator)
            if info.rank == 0:
                print(f"train: stop requested; saved step {step} of {args.steps}", flush=True)
            if args.on_stop == "requeue":
                distenv.requeue()  # a barrier first: every rank's checkpoint is written
            return 0
        # --8<-- [end:loop]
        time.sleep(args.step_time)
        inputs = torch.randn(args.batch_size, 16, generator=generator)
        targets = (inputs @ target_weights).unsqueeze(1)
        if device is not None:
            inputs, targets = inputs.to(device), targets.to(device)
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(ddp(inputs), targets)
        loss.backward()
        optimizer.step()

    checksum = weights_checksum(model)
    gathered = [torch.empty_like(checksum) for _ in range(info.world_size)]
    dist.all_gather(gathered, checksum)
    identical = all(torch.equal(g, gathered[0]) for g in gathered)
    mean_loss = loss.detach().clone()
    dist.all_reduce(mean_loss)
    if info.rank == 0:
        print(
            f"train: launcher={info.launcher} world_size={info.world_size} steps={args.steps} "
            f"loss={mean_loss.item() / info.world_size:.3f} weights_identical={identical}",
            flush=True,
        )
    # No destroy_process_group() here: with the DDP wrapper alive it would not stop gloo's worker
    # threads, which can then abort the exit. init_dist ends the group at exit, once they are idle.
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
