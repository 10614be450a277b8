"""The cost of the hang watchdog while training runs, 2 gloo ranks: distenv run's and init_dist's.

A step loop under ``distenv run -n 2`` plain, with ``--hang-timeout 1`` and with
``init_dist(hang_timeout=1)``, in paired rounds; one sample's work timed alone; the watchdog
threads' own CPU time and each rank's child processes counted. docs/benchmarks.md.in (section 7)
says how.

    python benchmarks/bench_watchdog.py [--rounds 5] [--steps 3000] [--smoke] [--out FILE]

``--smoke`` runs one round of 200 steps.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from _common import REPO, bootstrap_ci, emit, load_average, machine, median, parser, summary

HERE = Path(__file__).resolve()
#: The ways a job runs: no watchdog, distenv run's, init_dist's (in-process).
MODES = ("plain", "run", "init")
#: distenv's threads in a watched rank: the watchdog (`distenv.postmortem.progress`), the in-process hang
#: thread (`distenv.bootstrap.hang`).
THREADS = ("distenv-watchdog", "distenv-hang")
#: The hang timeout of a watched job, and the watchdog's sampling period (a quarter of it).
HANG_TIMEOUT_S = 1
PERIOD_S = HANG_TIMEOUT_S / 4


def rank(steps: int, mode: str) -> None:
    """One rank: time `steps` steps; rank 0 prints the slowest rank's time as a JSON line."""
    import torch
    import torch.distributed as dist

    import distenv

    distenv.init_dist(backend="gloo", hang_timeout=HANG_TIMEOUT_S if mode == "init" else None)
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
    command += ["--hang-timeout", str(HANG_TIMEOUT_S)] if mode == "run" else []
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


def overhead(pairs: list[tuple[float, float]]) -> float:
    """The median over rounds of (watched step / plain step) - 1, in percent."""
    return median([watched / plain - 1 for watched, plain in pairs]) * 100


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=MODES, default="plain", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rank is not None:
        rank(args.rank, args.mode)
        return 0
    rounds, steps = (1, 200) if args.smoke else (args.rounds, args.steps)
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    cost = sample_cost(2000 if args.smoke else 20000)
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    for r in range(rounds):
        # Alternate the order: a drift in the machine's load falls on each way alike.
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            runs[mode].append(job(steps, mode))
    step_s = {mode: [x["seconds"] / steps for x in runs[mode]] for mode in MODES}
    watched: dict[str, Any] = {}
    for mode in MODES[1:]:
        pairs = list(zip(step_s[mode], step_s["plain"], strict=True))
        watched[mode] = {
            "overhead_pct": overhead(pairs),
            "overhead_pct_ci95": bootstrap_ci(pairs, overhead),
            # distenv's threads' CPU time per second of the loop, the most of any round.
            "threads_cpu_share_max": max(x["watchdog_cpu"] / x["seconds"] for x in runs[mode]),
        }
    result = {
        "benchmark": "watchdog",
        "smoke": args.smoke,
        "machine": machine(),
        "rounds": rounds,
        "steps": steps,
        "hang_timeout_s": HANG_TIMEOUT_S,
        "period_s": PERIOD_S,
        "sample_s": cost,
        "sample_period_pct": cost / PERIOD_S * 100,
        "step_s": {mode: summary(step_s[mode]) for mode in MODES},
        "steps_per_s": {mode: [round(1 / s) for s in step_s[mode]] for mode in MODES},
        "watched": watched,
        "threads": {mode: max(int(x["threads"]) for x in runs[mode]) for mode in MODES},
        "children": max(int(x["children"]) for mode in MODES for x in runs[mode]),
        "total_s": time.perf_counter() - start,
        "load_average": load_average(load_before),
    }
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
