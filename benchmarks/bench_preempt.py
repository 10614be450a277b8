"""Benchmark 6: the cost of `distenv.stop_requested()` per step of examples/train.py, 4 gloo ranks.

Ranks are started with ``distenv.launch``. Each runs examples/train.py's step (DDP over the
16-32-1 MLP, batch 32, SGD; one gradient all-reduce per step) in blocks of ``--steps`` steps,
three ways, in an order shuffled per round (the same on every rank), each block after a barrier:

  plain      the step alone
  check      the step, then ``distenv.stop_requested()`` (one 4-byte all-reduce)
  check_10   the same with ``watch_preemption(every=10)`` (the all-reduce on every 10th call)

A block's time is the maximum over ranks; per-step times are block time / steps. The overhead of
a method is the ratio of its median per-step time to plain's, minus 1. The issue's budget is 2 %.

    python benchmarks/bench_preempt.py [--rounds 15] [--steps 200] [--nprocs 4] [--smoke] [--out F]
"""

from __future__ import annotations

import random
import time
from typing import Any

from _common import SEED, emit, machine, median, parser, summary

METHODS = ("plain", "check", "check_10")


def rank_main(config: dict[str, Any]) -> dict[str, Any] | None:
    """Run on every rank (module-level: distenv.launch's spawned workers import it by name)."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    import distenv

    torch.set_num_threads(1)
    rank = dist.get_rank()
    torch.manual_seed(SEED)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(SEED + 1000 * rank)
    target_weights = torch.linspace(-1, 1, 16)

    def step() -> None:  # examples/train.py's step
        inputs = torch.randn(32, 16, generator=generator)
        targets = (inputs @ target_weights).unsqueeze(1)
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(ddp(inputs), targets)
        loss.backward()
        optimizer.step()

    watches = {
        "check": distenv.watch_preemption(["USR1"]),
        "check_10": distenv.watch_preemption(["USR1"], every=10),
    }

    def block(method: str) -> float:
        # watch_preemption replaced the module's watch; ask each one directly.
        ask = watches[method].stop_requested if method in watches else None
        dist.barrier()
        started = time.perf_counter()
        for _ in range(config["steps"]):
            step()
            if ask is not None and ask():
                raise AssertionError("no warning was sent, yet a stop was requested")
        return time.perf_counter() - started

    times: dict[str, list[float]] = {m: [] for m in METHODS}
    shuffle = random.Random(SEED)
    for round_ in range(config["warmup"] + config["rounds"]):
        order = list(METHODS)
        shuffle.shuffle(order)
        for method in order:
            mine = torch.tensor([block(method)], dtype=torch.float64)
            dist.all_reduce(mine, op=dist.ReduceOp.MAX)
            if round_ >= config["warmup"]:
                times[method].append(mine.item() / config["steps"])
    return {"per_step_s": times} if rank == 0 else None


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=200, help="steps per timed block")
    p.add_argument("--nprocs", type=int, default=4)
    args = p.parse_args(argv)

    import distenv

    config = {
        "rounds": 1 if args.smoke else args.rounds,
        "warmup": 0 if args.smoke else args.warmup,
        "steps": 5 if args.smoke else args.steps,
    }
    nprocs = 2 if args.smoke else args.nprocs
    started = time.perf_counter()
    out = distenv.launch(rank_main, nprocs=nprocs, args=(config,))[0]
    assert out is not None
    times = out["per_step_s"]
    plain = median(times["plain"])
    methods = {
        name: {
            **summary(values),
            "p50": median(values),
            "overhead_vs_plain": median(values) / plain - 1,
            "raw_s": values,
        }
        for name, values in times.items()
    }
    result = {
        "benchmark": "preempt",
        "smoke": args.smoke,
        "nprocs": nprocs,
        "backend": "gloo",
        **config,
        "total_s": time.perf_counter() - started,
        "machine": machine(),
        "methods": methods,
    }
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
