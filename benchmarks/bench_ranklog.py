"""The cost of the per-rank log while training runs: a step loop bare and with its output teed.

One process per job runs a training-like loop printing a log line every step (or every 10), bare
and with `distenv.postmortem.ranklog.start`, in paired rounds: its step time, a line's cost, its
threads, children and log bytes. docs/benchmarks.md.in (section 6) says how.

    python benchmarks/bench_ranklog.py [--rounds 16] [--steps 1500] [--smoke] [--out FILE]

``--smoke`` runs one round of 100 steps, printing every step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import REPO, bootstrap_ci, emit, load_average, machine, median, parser, summary

HERE = Path(__file__).resolve()
MODES = ("bare", "logged")
#: Print a log line every N steps.
EVERY = (1, 10)
SIZE = 256
WARMUP = 50
#: Lines printed alone after the loop, to time one line.
LINES = 1000
LINE = "step      0 loss 0.1234 lr 1.00e-04 grad_norm 0.731 1.02 ms/step"


def _threads() -> int:
    """This process's threads, native ones included (/proc/self/status)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise RuntimeError("no Threads: line in /proc/self/status")


def child(mode: str, steps: int, every: int, folder: Path, result: Path) -> None:
    """One job: time `steps` steps printing every `every`; write what it found to `result`."""
    import torch

    torch.set_num_threads(1)  # one rank of several on a shared node: its share of the cores
    a = torch.randn(SIZE, SIZE) / SIZE**0.5
    threads_before = _threads()
    if mode == "logged":
        from distenv.postmortem import ranklog

        folder.mkdir(parents=True, exist_ok=True)
        log = ranklog.start(folder, 0, 0)
    for i in range(WARMUP):
        a = torch.tanh(a @ a)
        print(f"step {i:6d} loss {float(a[0, 0]):.4f} lr 1.00e-04 grad_norm 0.731 1.02 ms/step")
    start = time.perf_counter()
    for i in range(steps):
        a = torch.tanh(a @ a)
        if i % every == 0:
            loss = float(a[0, 0])
            print(
                f"step {i:6d} loss {loss:.4f} lr 1.00e-04 grad_norm 0.731 1.02 ms/step", flush=True
            )
    took = time.perf_counter() - start
    pid = os.getpid()
    log_bytes = log.log.stat().st_size if mode == "logged" else 0
    # The line alone, many times: its cost without the steps' noise.
    start = time.perf_counter()
    for _ in range(LINES):
        print(LINE, flush=True)
    found = {
        "step_s": took / steps,
        "line_s": (time.perf_counter() - start) / LINES,
        "threads_added": _threads() - threads_before,
        "children": len(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()),
        "log_bytes": log_bytes,
    }
    result.write_text(json.dumps(found))


def job(mode: str, steps: int, every: int, folder: Path) -> dict[str, Any]:
    """Run one job in a fresh process, its console a file; return what it found."""
    result = folder / "result.json"
    command = [sys.executable, str(HERE), "--child", mode, "--steps", str(steps)]
    with (folder / "console").open("wb") as console:
        subprocess.run(
            [
                *command,
                "--every",
                str(every),
                "--folder",
                str(folder / "logs"),
                "--result",
                str(result),
            ],
            stdout=console,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            timeout=600,
            check=True,
        )
    found: dict[str, Any] = json.loads(result.read_text())
    # What the console had at the loop's end: all of it but the lines timed alone.
    found["console_bytes"] = (folder / "console").stat().st_size - LINES * (len(LINE) + 1)
    return found


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=16)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--every", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child, args.steps, args.every, args.folder, args.result)
        return 0
    rounds, steps = (1, 100) if args.smoke else (args.rounds, args.steps)
    everies = EVERY[:1] if args.smoke else EVERY  # the smoke test's 10 s: two processes
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    variants: dict[str, Any] = {}
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {e: {m: [] for m in MODES} for e in everies}
    for r in range(rounds):
        for every in everies:
            # Alternate which mode goes first: a drift in the machine's load cancels out.
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                with tempfile.TemporaryDirectory() as folder:
                    runs[every][mode].append(job(mode, steps, every, Path(folder)))
    for every, by_mode in runs.items():
        paired = list(zip(by_mode["bare"], by_mode["logged"], strict=True))
        pairs = [(lg["step_s"], b["step_s"]) for b, lg in paired]

        def overhead(sample: list[tuple[float, float]]) -> float:
            return median([lg / b - 1 for lg, b in sample]) * 100

        diffs = [lg - b for lg, b in pairs]
        logged = by_mode["logged"]
        variants[f"every_{every}"] = {
            "print_every": every,
            "step_s": {mode: summary([x["step_s"] for x in by_mode[mode]]) for mode in MODES},
            "overhead_pct": overhead(pairs),
            "overhead_pct_ci95": bootstrap_ci(pairs, overhead),
            "per_print_us": median(diffs) * every * 1e6,
            "line_s": {mode: summary([x["line_s"] for x in by_mode[mode]]) for mode in MODES},
            "line_us": median([lg["line_s"] - b["line_s"] for b, lg in paired]) * 1e6,
            "threads_added": {
                mode: max(x["threads_added"] for x in by_mode[mode]) for mode in MODES
            },
            "children": max(x["children"] for mode in MODES for x in by_mode[mode]),
            "log_bytes": max(x["log_bytes"] for x in logged),
            "console_bytes": max(x["console_bytes"] for x in logged),
        }
    result = {
        "benchmark": "ranklog",
        "smoke": args.smoke,
        "machine": machine(),
        "rounds": rounds,
        "steps": steps,
        "warmup": WARMUP,
        "lines": LINES,
        "matmul": SIZE,
        "variants": variants,
        "total_s": time.perf_counter() - start,
        "load_average": load_average(load_before),
    }
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
