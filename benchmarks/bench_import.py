"""Benchmark 1: the cost of importing distenv and detecting the launcher, against the alternatives.

Each case is a fresh ``python -c <code>`` child, timed spawn to exit, its peak RSS its own
``VmHWM``; docs/benchmarks.md.in (section 1) says how and why.

    python benchmarks/bench_import.py [--runs 15] [--warmup 2] [--smoke] [--out FILE]
"""

from __future__ import annotations

import os
import random
import sys
from typing import Any

from _common import (
    REPO,
    SEED,
    bootstrap_ci,
    emit,
    installed,
    machine,
    median,
    note,
    parser,
    python_c,
)
from _common import summary as summarize

# The check that distenv stayed light runs inside the timed child (microseconds): a failure makes
# the child exit non-zero, which stops the benchmark.
LIGHT_CHECK = (
    "heavy = [m for m in ('torch', 'mpi4py', 'numpy') if m in sys.modules]; "
    "sys.exit(f'distenv imported {heavy}') if heavy else None"
)
DISTENV_CODE = "import distenv, sys; distenv.detect(); " + LIGHT_CHECK
# What a training script loads before its first call: every module of the bootstrap (torch is
# imported inside init_dist).
DISTENV_INIT_CODE = "import sys; from distenv import init_dist; " + LIGHT_CHECK

# (name, code, module that must be importable, what it stands for)
CASES: tuple[tuple[str, str, str | None, str], ...] = (
    ("python", "pass", None, "bare interpreter: `python -c pass`"),
    ("distenv", DISTENV_CODE, "distenv", "`import distenv; distenv.detect()`"),
    ("distenv_init", DISTENV_INIT_CODE, "distenv", "`from distenv import init_dist`"),
    ("torch", "import torch", "torch", "`import torch`"),
    (
        "mmengine",
        "from mmengine.dist import init_dist",
        "mmengine",
        "`from mmengine.dist import init_dist`",
    ),
    (
        "lightning_fabric",
        "from lightning_fabric.plugins.environments import SLURMEnvironment",
        "lightning_fabric",
        "`from lightning_fabric.plugins.environments import SLURMEnvironment`",
    ),
    ("submitit", "import submitit", "submitit", "`import submitit`"),
)
SMOKE_CASES = ("python", "distenv", "distenv_init")
# Appended to every case: report this process's own peak RSS (kB) on stdout, without an import.
HWM_CODE = (
    "\nprint(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')))"
)

# A step of `srun -n 4` on one node, as captured on the test cluster.
SRUN_ENV = {
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "0",
    "SLURM_NTASKS": "4",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NNODES": "1",
    "SLURM_STEP_NUM_NODES": "1",
    "SLURM_STEP_TASKS_PER_NODE": "4",
    "SLURM_TASKS_PER_NODE": "4",
    "SLURM_STEP_NODELIST": "node1",
    "SLURM_NODELIST": "node1",
    "SLURM_JOB_NODELIST": "node1",
}


def child_env() -> dict[str, str]:
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")
    return {**{k: os.environ[k] for k in keep if k in os.environ}, **SRUN_ENV}


def run_once(code: str, env: dict[str, str]) -> tuple[float, float]:
    """Run ``python -c code``; return (wall seconds, peak RSS in MiB) of that child alone."""
    wall, out = python_c(code + HWM_CODE, env)
    return wall, int(out.split()[-1]) / 1024


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--warmup", type=int, default=2)
    args = p.parse_args(argv)
    runs, warmup = (1, 0) if args.smoke else (args.runs, args.warmup)

    cases, skipped = [], {}
    for name, code, module, label in CASES:
        if args.smoke and name not in SMOKE_CASES:
            note(f"--smoke: skipping {name}")
            continue
        if module is not None and not installed(module):
            skipped[name] = f"{module} is not installed in {sys.prefix}"
            note(f"skipping {name}: {skipped[name]}")
            continue
        cases.append((name, code, label))

    env = child_env()
    rng = random.Random(SEED)
    walls: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    rss: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    for round_ in range(warmup + runs):
        order = list(cases)
        rng.shuffle(order)
        for name, code, _ in order:
            wall, peak = run_once(code, env)
            if round_ >= warmup:
                walls[name].append(wall)
                rss[name].append(peak)

    base_wall, base_rss = walls["python"], rss["python"]
    results: dict[str, Any] = {}
    for name, _, label in cases:
        # Paired per round: the same round's bare-interpreter run is the baseline.
        pairs = list(zip(walls[name], base_wall, strict=True))
        deltas = [a - b for a, b in pairs]
        results[name] = {
            "label": label,
            "wall_s": summarize(walls[name]),
            "rss_mib": summarize(rss[name]),
            "delta_wall_s": median(deltas),
            "delta_wall_ci_s": bootstrap_ci(deltas, median),
            "delta_rss_mib": median(rss[name]) - median(base_rss),
            "ratio_to_torch": (
                median(walls[name]) / median(walls["torch"]) if "torch" in walls else None
            ),
            "raw_wall_s": walls[name],
            "raw_rss_mib": rss[name],
        }
    result = {
        "benchmark": "import",
        "smoke": args.smoke,
        "runs": runs,
        "warmup": warmup,
        "python": sys.executable,
        "repo": str(REPO),
        "machine": machine(),
        "cases": results,
        "skipped": skipped,
    }
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
