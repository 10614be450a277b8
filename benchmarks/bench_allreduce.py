"""Benchmark 4: averaging ResNet-50-shaped gradients over 4 gloo ranks on one node.

per_tensor, distenv's buckets and mmengine's ``all_reduce_params``, each checked to average right,
timed (the slowest rank's) and its extra memory profiled: docs/benchmarks.md.in (section 4) says
how.

    python benchmarks/bench_allreduce.py [--iters 10] [--warmup 2] [--nprocs 4] [--smoke] [--out F]
"""

from __future__ import annotations

import random
import sys
import time
from typing import Any

from _common import SEED, emit, installed, machine, median, note, parser, percentile, summary
from _resnet50 import numel, resnet50_shapes

BUCKETS_MB = (1, 5, 25, 100)
MIB = 1024 * 1024


def _peak_allocated(fn: Any) -> int:
    """Return the peak bytes torch's CPU allocator held beyond its starting point during fn()."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    running = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        running += event.nbytes()
        peak = max(peak, running)
    return peak


def rank_main(config: dict[str, Any]) -> dict[str, Any] | None:
    """Run on every rank (module-level: distenv.launch's spawned workers import it by name)."""
    import torch
    import torch.distributed as dist

    import distenv

    rank, world = dist.get_rank(), dist.get_world_size()
    shapes = resnet50_shapes()[: config["tensors"]]
    torch.manual_seed(rank)
    params = []
    for shape in shapes:
        p = torch.nn.Parameter(torch.empty(shape))
        p.grad = torch.randn(shape)
        params.append(p)
    grads = [p.grad for p in params]

    def per_tensor() -> None:
        for g in grads:
            dist.all_reduce(g)
            g.div_(world)

    methods: dict[str, Any] = {"per_tensor": per_tensor}
    for mb in config["buckets"]:
        methods[f"distenv_{mb}mb"] = lambda mb=mb: distenv.allreduce_grads(
            params, bucket_size_mb=mb
        )
    methods["distenv_default"] = lambda: distenv.allreduce_grads(params)
    if config["mmengine"]:
        import mmengine.dist as mmdist

        methods["mmengine_all"] = lambda: mmdist.all_reduce_params(
            grads, coalesce=True, bucket_size_mb=-1, op="mean"
        )
        methods["mmengine_25mb"] = lambda: mmdist.all_reduce_params(
            grads, coalesce=True, bucket_size_mb=25, op="mean"
        )

    # Check each method once: every gradient must become mean(rank) = (world - 1) / 2; count the
    # collectives it issues (mmengine calls torch.distributed.all_reduce through the module too).
    calls = {}
    real_all_reduce = dist.all_reduce
    for name, fn in methods.items():
        for g in grads:
            g.fill_(float(rank))
        count = [0]

        def counting(*args: Any, _count: list[int] = count, **kwargs: Any) -> Any:
            _count[0] += 1
            return real_all_reduce(*args, **kwargs)

        dist.all_reduce = counting
        try:
            fn()
        finally:
            dist.all_reduce = real_all_reduce
        expected = (world - 1) / 2
        worst = max(float((g - expected).abs().max()) for g in grads)
        if worst > 1e-5:
            raise AssertionError(f"{name} did not average: off by {worst}")
        calls[name] = count[0]
    for g in grads:
        g.normal_()

    rng = random.Random(SEED)  # same seed on every rank: the same order everywhere
    local: dict[str, list[float]] = {name: [] for name in methods}
    for it in range(config["warmup"] + config["iters"]):
        order = list(methods)
        rng.shuffle(order)
        for name in order:
            dist.barrier()
            start = time.perf_counter()
            methods[name]()
            elapsed = time.perf_counter() - start
            if it >= config["warmup"]:
                local[name].append(elapsed)

    peaks = {}
    for name in methods:  # one by one on every rank: they are collectives
        dist.barrier()
        peaks[name] = _peak_allocated(methods[name])

    # Per iteration, the slowest rank's time is the method's time.
    names = list(methods)
    table = torch.tensor([local[n] for n in names], dtype=torch.float64)
    dist.all_reduce(table, op=dist.ReduceOp.MAX)
    if rank != 0:
        return None
    return {
        "times": {n: table[i].tolist() for i, n in enumerate(names)},
        "collectives": calls,
        "peak_extra_bytes": peaks,
        "grad_bytes": sum(g.numel() * g.element_size() for g in grads),
        "largest_grad_bytes": max(g.numel() * g.element_size() for g in grads),
    }


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--nprocs", type=int, default=4)
    args = p.parse_args(argv)

    import distenv

    mmengine = installed("mmengine")
    skipped = {}
    if not mmengine:
        skipped["mmengine"] = f"mmengine is not installed in {sys.prefix}"
        note(f"skipping mmengine: {skipped['mmengine']}")
    shapes = resnet50_shapes()
    config = {
        "tensors": 12 if args.smoke else len(shapes),
        "buckets": (1, 25) if args.smoke else BUCKETS_MB,
        "iters": 1 if args.smoke else args.iters,
        "warmup": 0 if args.smoke else args.warmup,
        "mmengine": mmengine,
    }
    nprocs = 2 if args.smoke else args.nprocs
    started = time.perf_counter()
    out = distenv.launch(rank_main, nprocs=nprocs, args=(config,))[0]
    assert out is not None
    times = out["times"]
    base = median(times["per_tensor"])
    mm = median(times["mmengine_all"]) if "mmengine_all" in times else None
    methods = {}
    for name, values in times.items():
        bucket_mb = None
        if name.startswith("distenv_"):
            bucket_mb = 25.0 if name == "distenv_default" else float(name[8:-2])
        elif name == "mmengine_25mb":
            bucket_mb = 25.0
        methods[name] = {
            **summary(values),
            "p50": median(values),
            "p95": percentile(values, 95),
            "speedup_vs_per_tensor": base / median(values),
            "speedup_vs_mmengine_all": None if mm is None else mm / median(values),
            "collectives": out["collectives"][name],
            "peak_extra_bytes": out["peak_extra_bytes"][name],
            "bucket_mb": bucket_mb,
            "raw_s": values,
        }
    shapes_used = shapes[: config["tensors"]]
    result = {
        "benchmark": "allreduce",
        "smoke": args.smoke,
        "nprocs": nprocs,
        "backend": "gloo",
        "tensors": len(shapes_used),
        "parameters": numel(shapes_used),
        "grad_bytes": out["grad_bytes"],
        "largest_grad_bytes": out["largest_grad_bytes"],
        "iters": config["iters"],
        "warmup": config["warmup"],
        "total_s": time.perf_counter() - started,
        "machine": machine(),
        "methods": methods,
        "skipped": skipped,
    }
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
