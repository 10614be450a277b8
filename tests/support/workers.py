"""Scenarios that tests/support/spawn.py runs on every rank of a real (gloo) process group.

Run as ``python tests/support/workers.py SCENARIO`` with torchrun's contract in the environment; prints one
``RESULT <json>`` line with what the test asserts on.
"""

from __future__ import annotations

import io
import json
import logging
import multiprocessing
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import distenv
from distenv.rankinfo import ENV_CONTRACT

CONTRACT = (*ENV_CONTRACT, "DISTENV_SCOPE")


class Grab(logging.Handler):
    """Keep the messages of the records it receives."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def scenario_init() -> dict[str, Any]:
    """init_dist under the contract: result, exports, log line, a second call, the seed."""
    grab = Grab()
    distenv_logger = logging.getLogger("distenv")
    distenv_logger.addHandler(grab)
    distenv_logger.setLevel(logging.INFO)
    before = distenv.get_dist_info()
    info = distenv.init_dist(seed=7)
    world = dist.group.WORLD
    again = distenv.init_dist()
    total = torch.tensor([float(info.rank + 1)])
    dist.all_reduce(total)
    return {
        "info": info.to_dict(),
        "before": before,
        "after": distenv.get_dist_info(),
        "same_info": again is info,
        "same_group": dist.group.WORLD is world,
        "env": {name: os.environ.get(name) for name in CONTRACT},
        "backend": dist.get_backend(),
        "log": grab.messages,
        "sum": total.item(),
        "start_method": multiprocessing.get_start_method(allow_none=True),
        "rand": torch.rand(3).tolist(),
    }


def _values(tensors: list[torch.Tensor]) -> list[list[float]]:
    return [t.detach().double().reshape(-1).tolist() for t in tensors]


def scenario_comm() -> dict[str, Any]:
    """The helpers of distenv.comm, seeding and logging on a real group."""
    info = distenv.init_dist()
    rank = info.rank
    calls: list[tuple[str, int]] = []
    all_reduce = dist.all_reduce

    def counting(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        calls.append((str(tensor.dtype), tensor.numel()))
        return all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = counting  # type: ignore[assignment]

    def make_params() -> list[nn.Parameter]:
        return [
            nn.Parameter(torch.full((4, 5), float(rank + 1))),  # float32, 80 bytes
            nn.Parameter(torch.arange(7, dtype=torch.float64) * (rank + 1)),  # 56 bytes
            nn.Parameter(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16) * (rank + 1)),
            nn.Parameter(torch.full((10,), float(rank))),  # float32, 40 bytes
        ]

    small = make_params()
    distenv.allreduce_params(small, bucket_size_mb=50 / 2**20)  # 50-byte buckets
    small_calls, calls[:] = list(calls), []
    default = make_params()
    distenv.allreduce_params(default)
    default_calls, calls[:] = list(calls), []

    grads = [
        nn.Parameter(torch.zeros(3)),
        nn.Parameter(torch.zeros(2, dtype=torch.float64)),
        nn.Parameter(torch.zeros(4)),  # no gradient
        nn.Parameter(torch.zeros(2, dtype=torch.float16)),
    ]
    grads[0].grad = torch.full((3,), float(rank))
    grads[1].grad = torch.tensor([0.5, 1.5], dtype=torch.float64) * (rank + 1)
    grads[3].grad = torch.tensor([4.0, -4.0], dtype=torch.float16) * (rank + 1)
    distenv.allreduce_grads(grads, bucket_size_mb=8 / 2**20)  # 8 bytes: one tensor per bucket
    grad_calls = list(calls)
    dist.all_reduce = all_reduce

    # Six float32 and four float64 tensors of 4000 bytes, in buckets of 8000 bytes: five buckets
    # of two in two dtypes, which one buffer of 8000 bytes serves; torch's allocations counted.
    from torch.profiler import ProfilerActivity, profile

    dtypes = [torch.float32, torch.float64] * 4 + [torch.float32] * 2
    many = [
        torch.full((4000 // dtype.itemsize,), float(rank + i), dtype=dtype)
        for i, dtype in enumerate(dtypes)
    ]
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        distenv.allreduce_params(many, bucket_size_mb=8000 / 2**20)
    allocated = [
        e.nbytes()
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.nbytes() > 0
    ]

    @distenv.master_only
    def times_ten(x: int) -> int:
        """Multiply by ten."""
        return x * 10

    stream = io.StringIO()
    logger = distenv.get_logger("workers", ranks=(0, 2))
    handler = logger.handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stream)
    logger.info("hello from %s", rank)
    distenv.barrier()
    return {
        "small": _values(small),
        "small_calls": small_calls,
        "default": _values(default),
        "default_calls": default_calls,
        "grads": [None if p.grad is None else p.grad.double().tolist() for p in grads],
        "grad_dtypes": [None if p.grad is None else str(p.grad.dtype) for p in grads],
        "grad_params": _values(list(grads)),
        "grad_calls": grad_calls,
        "bucketed": [t[0].item() for t in many],
        "bucket_allocations": allocated,
        "master_only": times_ten(3),
        "wrapped": [times_ten.__name__, times_ten.__doc__],
        "is_main": distenv.is_main_process(),
        "dist_info": distenv.get_dist_info(),
        "seed": distenv.seed_everything(100, per_rank=True),
        "log": stream.getvalue(),
    }


def scenario_local_group() -> dict[str, Any]:
    """get_local_group on simulated nodes of unequal size."""
    info = distenv.init_dist()
    group = distenv.get_local_group()
    total = torch.tensor([float(info.rank)])
    dist.all_reduce(total, group=group)
    return {
        "node": info.node_rank,
        "ranks": dist.get_process_group_ranks(group),
        "size": dist.get_world_size(group),
        "sum": total.item(),
        "cached": distenv.get_local_group() is group,
    }


def scenario_gpu() -> dict[str, Any]:
    """init_dist on a GPU machine: the device chosen, the backend, a CUDA all_reduce."""
    info = distenv.init_dist()
    total = torch.tensor([float(info.rank + 1)], device="cuda")
    dist.all_reduce(total)
    return {
        "device": torch.cuda.current_device(),
        "backend": dist.get_backend(),
        "sum": total.item(),
    }


def main() -> int:
    scenario = globals()[f"scenario_{sys.argv[1]}"]
    torch.set_num_threads(1)
    result = scenario()
    dist.destroy_process_group()
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
