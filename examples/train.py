"""Train a small MLP with DDP under any launcher, and check every rank ends with the same weights.

    python examples/train.py                               # alone: 1 rank
    torchrun --nproc-per-node 4 examples/train.py          # 4 ranks on this machine
    srun -n 8 python examples/train.py                     # 8 Slurm tasks
    mpirun -n 4 python examples/train.py --launcher mpi    # Open MPI / MPICH

Prints one line on rank 0, e.g.
``train: launcher=pytorch world_size=4 steps=20 loss=0.123 weights_identical=True``,
and exits 1 if the ranks' weights differ.
"""

from __future__ import annotations

import argparse
import sys

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
    return parser.parse_args(argv)


def weights_checksum(model: nn.Module) -> torch.Tensor:
    """Return a float64 digest of the parameters: equal on two ranks iff (almost surely) equal."""
    flat = torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])
    weights = torch.arange(1, flat.numel() + 1, dtype=torch.float64)
    return torch.stack([flat.sum(), (flat * weights).sum()])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Two ranks per core on a laptop: intra-op threads would only fight each other.
    torch.set_num_threads(1)
    info = distenv.init_dist(args.launcher, seed=args.seed)
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

    loss = torch.zeros(())
    for _ in range(args.steps):
        inputs = torch.randn(args.batch_size, 16, generator=generator)
        targets = (inputs @ target_weights).unsqueeze(1)
        if device is not None:
            inputs, targets = inputs.to(device), targets.to(device)
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(ddp(inputs), targets)
        loss.backward()
        optimizer.step()

    checksum = weights_checksum(model).to(device)
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
    dist.destroy_process_group()
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
