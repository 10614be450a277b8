"""The cost of the hang watchdog while training runs, 2 gloo ranks: distenv run's and init_dist's.

Each watched job runs with a hang timeout of 1 s (a sample every 0.25 s), in one of two ways:
``distenv run --hang-timeout 1`` (the rank wrapper's watchdog), or ``init_dist(hang_timeout=1)``
under a plain ``distenv run -n 2`` (the in-process autopsy of any launcher: its watchdog thread,
plus a hang thread that waits on a store key over a connection of its own). Measures:

  sample   the watchdog's work per sample (`sys._current_frames`, two CPU clocks, the default
           group's sequence number), timed in-process over many samples, as a share of its period
           (a quarter of the hang timeout)
  steps    steps per second of a loop (a 64x64 matmul and a 1 KiB all_reduce) under
           ``distenv run -n 2``: plain, ``--hang-timeout 1``, ``init_dist(hang_timeout=1)``, in
           alternating rounds; each job times ``--steps`` steps after a barrier (the slowest
           rank's time)

  cpu      distenv's threads' own CPU time in each watched rank (their thread clocks: the
           watchdog's, and the in-process hang thread's), per second of the loop: what they
           take from training, free of the jobs' noise

It also counts each rank's child processes while it runs (the threads start none: 0).

    python benchmarks/bench_watchdog.py [--rounds 5] [--steps 3000] [--smoke]

``--smoke`` runs one round of 200 steps and prints the results as one JSON object.
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


#: The ways a job runs: no watchdog, distenv run's, init_dist's (in-process).
MODES = ("plain", "run", "init")
#: distenv's threads in a watched rank: the watchdog (`distenv.postmortem.progress`), the in-process hang
#: thread (`distenv.bootstrap.hang`).
THREADS = ("distenv-watchdog", "distenv-hang")


def rank(steps: int, mode: str) -> None:
    """One rank: time `steps` steps; rank 0 prints the slowest rank's time as a JSON line."""
    import torch
    import torch.distributed as dist

    import distenv

    distenv.init_dist(backend="gloo", hang_timeout=1 if mode == "init" else None)
    a, x = torch.randn(64, 64), torch.ones(256)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        a = torch.tanh(a @ a)
        dist.all_reduce(x)
    took = time.perf_counter() - start
    children = len(Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split())
    # distenv's threads' own CPU time over the whole rank: what they took from training.
    ours = [t.ident for t in threading.enumerate() if t.name in THREADS and t.ident]
    spent = sum(time.clock_gettime(time.pthread_getcpuclockid(ident)) for ident in ours)
    found = torch.tensor([took, float(children), spent, len(ours)], dtype=torch.float64)
    dist.all_reduce(found, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        numbers = {"seconds": float(found[0]), "children": int(found[1])}
        threads = {"threads": int(found[3])}
        print("BENCH " + json.dumps({**numbers, "watchdog_cpu": float(found[2]), **threads}))
    dist.destroy_process_group()


def job(steps: int, mode: str) -> dict[str, float]:
    """Run one 2-rank job; return rank 0's line."""
    command = [sys.executable, "-m", "distenv", "run", "-n", "2"]
    command += ["--hang-timeout", "1"] if mode == "run" else []
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("DISTENV_HANG_TIMEOUT", None)
    out = subprocess.run(
        [*command, str(HERE), "--rank", str(steps), "--mode", mode],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
        env=env,
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("BENCH "))
    return dict(json.loads(line[6:]))


def sample_cost(samples: int = 20000) -> float:
    """Return the seconds one watchdog sample takes (the work of `progress._watch`'s loop body)."""
    from distenv.postmortem import progress

    main = threading.main_thread().ident
    start = time.perf_counter()
    for _ in range(samples):
        frame = sys._current_frames().get(main)
        assert frame is not None
        _ = (id(frame.f_code), frame.f_lineno, progress._collectives())
        _ = time.process_time() - time.thread_time()
        del frame
    return (time.perf_counter() - start) / samples


def machine() -> dict[str, int]:
    """Return what the numbers were measured on."""
    return {"logical_cpus": os.cpu_count() or 1}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--smoke", action="store_true", help="one round of 200 steps, as JSON")
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, default="plain", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        rank(args.rank, args.mode)
        return
    rounds, steps = (1, 200) if args.smoke else (args.rounds, args.steps)
    cost = sample_cost(2000 if args.smoke else 20000)
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    spent: dict[str, list[float]] = {mode: [] for mode in MODES}
    threads: dict[str, int] = {}
    for _ in range(rounds):
        for mode in MODES:
            found = job(steps, mode)
            rates[mode].append(round(steps / found["seconds"]))
            assert found["children"] == 0, found
            spent[mode].append(found["watchdog_cpu"] / found["seconds"])
            threads[mode] = int(found["threads"])
    median = {mode: statistics.median(rates[mode]) for mode in MODES}
    if args.smoke:
        print(
            json.dumps(
                {
                    "benchmark": "watchdog",
                    "smoke": True,
                    "machine": machine(),
                    "sample_s": cost,
                    "steps_per_s": median,
                    "threads_cpu_share_max": {mode: max(spent[mode]) for mode in MODES},
                    "threads": threads,
                    "children": 0,
                }
            )
        )
        return
    print(f"one sample: {cost * 1e6:.1f} us = {cost / 0.25 * 100:.4f} % of a 0.25 s period")
    labels = {"plain": "plain", "run": "--hang-timeout 1", "init": "init_dist(hang_timeout=1)"}
    for mode in MODES:
        print(f"steps/s {labels[mode]} {median[mode]:.0f} {rates[mode]}")
    for mode in MODES[1:]:
        overhead = (median["plain"] / median[mode] - 1) * 100
        print(
            f"{labels[mode]}: overhead {overhead:+.2f} % (median of {rounds}); "
            f"{threads[mode]} threads of distenv's, whose CPU per second of the loop was at most "
            f"{max(spent[mode]) * 100:.4f} %; 0 child processes"
        )


if __name__ == "__main__":
    main()
