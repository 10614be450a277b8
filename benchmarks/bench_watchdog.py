"""The cost of ``distenv run --hang-timeout``'s watchdog while training runs, 2 gloo ranks.

Two measures:

  sample   the watchdog's work per sample (`sys._current_frames`, two CPU clocks, the default
           group's sequence number), timed in-process over many samples, as a share of its period
           (a quarter of the hang timeout)
  steps    steps per second of a loop (a 64x64 matmul and a 1 KiB all_reduce) under
           ``distenv run -n 2``, with and without ``--hang-timeout 1`` (a sample every 0.25 s),
           in alternating rounds; each job times ``--steps`` steps after a barrier (the slowest
           rank's time)

  cpu      the watchdog thread's own CPU time in each watched rank (its thread's clock), per
           second of the loop: what it takes from training, free of the jobs' noise

It also counts each rank's child processes while it runs (the watchdog is a thread: 0).

    python benchmarks/bench_watchdog.py [--rounds 5] [--steps 3000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]


def rank(steps: int) -> None:
    """One rank: time `steps` steps; rank 0 prints the slowest rank's time as a JSON line."""
    import torch
    import torch.distributed as dist

    import distenv

    distenv.init_dist(backend="gloo")
    a, x = torch.randn(64, 64), torch.ones(256)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        a = torch.tanh(a @ a)
        dist.all_reduce(x)
    took = time.perf_counter() - start
    children = len(Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split())
    # The watchdog thread's own CPU time over the whole rank: what it took from training.
    watchdog = [t for t in threading.enumerate() if t.name == "distenv-watchdog"]
    ident = watchdog[0].ident if watchdog else None
    spent = time.clock_gettime(time.pthread_getcpuclockid(ident)) if ident else 0.0
    found = torch.tensor([took, float(children), spent], dtype=torch.float64)
    dist.all_reduce(found, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        numbers = {"seconds": float(found[0]), "children": int(found[1])}
        print("BENCH " + json.dumps({**numbers, "watchdog_cpu": float(found[2])}))
    dist.destroy_process_group()


def job(steps: int, hang: bool) -> dict[str, float]:
    """Run one 2-rank job; return rank 0's line."""
    command = [sys.executable, "-m", "distenv", "run", "-n", "2"]
    command += ["--hang-timeout", "1"] if hang else []
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [*command, str(HERE), "--rank", str(steps)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
        env=env,
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("BENCH "))
    return dict(json.loads(line[6:]))


def sample_cost(samples: int = 20000) -> float:
    """Return the seconds one watchdog sample takes (the work of `watchdog._watch`'s loop body)."""
    import threading

    from distenv.local import watchdog

    main = threading.main_thread().ident
    start = time.perf_counter()
    for _ in range(samples):
        frame = sys._current_frames().get(main)
        assert frame is not None
        _ = (id(frame.f_code), frame.f_lineno, watchdog._collectives())
        _ = time.process_time() - time.thread_time()
        del frame
    return (time.perf_counter() - start) / samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        rank(args.rank)
        return
    cost = sample_cost()
    print(f"one sample: {cost * 1e6:.1f} us = {cost / 0.25 * 100:.4f} % of a 0.25 s period")
    rates: dict[bool, list[float]] = {False: [], True: []}
    spent: list[float] = []
    for _ in range(args.rounds):
        for hang in (False, True):
            found = job(args.steps, hang)
            rates[hang].append(round(args.steps / found["seconds"]))
            assert found["children"] == 0, found
            if hang:
                spent.append(found["watchdog_cpu"] / found["seconds"])
    plain, watched = statistics.median(rates[False]), statistics.median(rates[True])
    print(f"steps/s plain {plain:.0f} {rates[False]}")
    print(f"steps/s --hang-timeout 1 {watched:.0f} {rates[True]}")
    print(
        f"overhead {(plain / watched - 1) * 100:+.2f} % (median of {args.rounds}); 0 child processes"
    )
    print(f"watchdog thread CPU per second of the loop, at most: {max(spent) * 100:.4f} %")


if __name__ == "__main__":
    main()
