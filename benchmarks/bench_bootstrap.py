"""Benchmarks 2 and 3: bootstrap time to a first all_reduce, and processes started per rank.

Each measurement is one launch (``srun -n 4`` on the test Slurm cluster "one", or ``torchrun
--nproc-per-node 4``) of _bootstrap_worker.py, whose ranks time themselves from a common start
line (after ``import torch`` and the library's import) to the first finished all_reduce; rank 0
reports the maximum over ranks. Methods are interleaved in a shuffled order every round, after a
warm-up round (first launcher only) that is dropped; 15 pairs + 5 mmengine rounds on 2 launchers
take about 6 minutes on a 2-core machine. The overhead of distenv over the bare shim is the ratio of medians
over paired rounds, with a paired bootstrap 95 % interval. Every rank also times its bootstrap's
phases (_trace_probes.py: the store, distenv's roll call, init_process_group, distenv's group-up
check, ...), reported per method with distenv's paired difference per phase.

With ``--profile`` every rank measures where its CPU goes instead (_cpu_probes.py: detection,
the check-in record, the store, the verdict, the network prediction, imports, torch's calls, ...),
and the result is the per-phase CPU table (ms per rank, medians over launches) of distenv and bare
``env://``: run_all.py's ``bootstrap_profile``, docs/benchmarks/bootstrap_profile.json.

    python benchmarks/bench_bootstrap.py [--rounds 15] [--mmengine-rounds 5] [--smoke] [--out F]
    python benchmarks/bench_bootstrap.py --profile [--rounds 10] [--launchers torchrun,srun]

On a GPU machine, ``--backend nccl`` makes both methods use NCCL with ``device_id=`` (eager
initialisation) and time a CUDA all_reduce: one rank per GPU, as NCCL allows no other
(``--launchers torchrun --nprocs <GPUs>``).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import _cpu_probes
import _trace_probes
from _common import (
    HERE,
    REPO,
    SEED,
    bootstrap_ci,
    emit,
    env_sh,
    installed,
    machine,
    median,
    note,
    parser,
    ratio_of_medians,
    summary,
)

WORKER = HERE / "_bootstrap_worker.py"
STEP_TIMEOUT_S = 180
SCRUB = ("SLURM_", "TORCHELASTIC_", "OMPI_", "PMI_", "PMIX_", "DISTENV_")
SCRUB_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(SCRUB) and k not in SCRUB_NAMES}


def launch(
    launcher: str,
    method: str,
    nprocs: int,
    slurm_conf: str | None,
    sync_root: Path,
    *,
    profile: bool = False,
) -> dict[str, Any]:
    """Run one launch; return rank 0's record plus the launch's own wall time, and every rank's
    phases: their spans (ms), or with `profile` their CPU (_cpu_probes.py)."""
    env = clean_env()
    env["BENCH_SYNC_DIR"] = str(sync_root / uuid.uuid4().hex)
    trace_dir = sync_root / f"trace-{uuid.uuid4().hex}"
    env[_cpu_probes.CPU_VAR if profile else _trace_probes.TRACE_VAR] = str(trace_dir)
    worker = [sys.executable, str(WORKER), "--method", method]
    # Another process may take torchrun's free port before its agent listens: a new port then.
    for attempt in range(3):
        for folder in (env["BENCH_SYNC_DIR"], trace_dir):  # nothing left of a failed try
            shutil.rmtree(folder, ignore_errors=True)
        argv = launch_argv(launcher, nprocs, worker, env, slurm_conf)
        start = time.perf_counter()
        returncode, stdout, stderr = run(argv, env)
        if not (launcher == "torchrun" and returncode and "EADDRINUSE" in stderr):
            break
        note(f"torchrun's port was taken (try {attempt + 1}); again with another")
    wall = time.perf_counter() - start
    shutil.rmtree(env["BENCH_SYNC_DIR"], ignore_errors=True)
    lines = [line for line in stdout.splitlines() if line.startswith("BENCH ")]
    if returncode != 0 or len(lines) != 1:
        raise SystemExit(
            f"bench_bootstrap: {' '.join(argv)} exited {returncode}\n"
            f"{stdout[-2000:]}\n{stderr[-4000:]}"
        )
    record: dict[str, Any] = json.loads(lines[0][len("BENCH ") :])
    record["launch_wall_s"] = wall
    ranks = [json.loads(f.read_text()) for f in sorted(trace_dir.glob("*.json"))]
    shutil.rmtree(trace_dir, ignore_errors=True)
    if len(ranks) != nprocs:
        raise SystemExit(f"bench_bootstrap: {len(ranks)} phase traces of {nprocs} ranks")
    if profile:
        record["cpu_phases"] = {r["rank"]: r["phases"] for r in ranks}
    else:
        record["phases"] = {r["rank"]: _trace_probes.phases(r["events"]) for r in ranks}
    return record


def launch_argv(
    launcher: str, nprocs: int, worker: list[str], env: dict[str, str], slurm_conf: str | None
) -> list[str]:
    """Return the command line of one launch of `worker` (setting what `env` needs for it)."""
    if launcher == "srun":
        env["SLURM_CONF"] = str(slurm_conf)
        argv = ["srun", "-n", str(nprocs), "--job-name", "distenv-bench", "--kill-on-bad-exit=1"]
        return argv + worker
    if launcher == "torchrun":
        torchrun = str(Path(sys.executable).with_name("torchrun"))
        from distenv.master import free_port

        # An explicit free port: `--master-port 0` makes the workers wait forever (torch 2.13).
        port = str(free_port("127.0.0.1"))
        return [torchrun, "--nproc-per-node", str(nprocs), "--master-port", port, *worker[1:]]
    if launcher == "distenv-run":
        return [sys.executable, "-m", "distenv", "run", "-n", str(nprocs), *worker[1:]]
    raise ValueError(launcher)


def run(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """Run one launch in its own session (killed whole if it hangs, torchrun's workers
    included); return its exit status, stdout and stderr."""
    proc = subprocess.Popen(
        argv,
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=STEP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        stderr += f"\n(killed after {STEP_TIMEOUT_S} s)"
    return proc.returncode, stdout, stderr


def find_slurm_conf(given: str | None) -> str | None:
    for candidate in (given, os.environ.get("SLURM_CONF"), env_sh().get("DISTENV_TEST_SLURM_ONE")):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15, help="paired distenv/bare rounds")
    p.add_argument("--mmengine-rounds", type=int, default=5, help="rounds that also run mmengine")
    p.add_argument("--nprocs", type=int, default=4)
    p.add_argument("--slurm-conf", help="slurm.conf of the test cluster (default: from env.sh)")
    p.add_argument("--launchers", default="srun,torchrun")
    p.add_argument("--profile", action="store_true", help="per-phase CPU of distenv and bare")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    args = p.parse_args(argv)
    os.environ["BENCH_BACKEND"] = args.backend
    rounds, mm_rounds, warmup = (1, 1, 0) if args.smoke else (args.rounds, args.mmengine_rounds, 1)
    nprocs = 2 if args.smoke else args.nprocs

    methods = ["distenv", "bare"]
    skipped: dict[str, str] = {}
    if args.profile:
        mm_rounds = 0
    if not mm_rounds:
        skipped["mmengine"] = "--mmengine-rounds 0"
    elif installed("mmengine"):
        methods.append("mmengine")
    else:
        skipped["mmengine"] = f"mmengine is not installed in {sys.prefix}"
        note(f"skipping mmengine: {skipped['mmengine']}")

    launchers = args.launchers.split(",")
    slurm_conf = find_slurm_conf(args.slurm_conf)
    if "srun" in launchers and (slurm_conf is None or shutil.which("srun") is None):
        skipped["srun"] = "no srun or no slurm.conf (run tests/harness/setup.sh)"
        note(f"skipping srun: {skipped['srun']}")
        launchers.remove("srun")

    rng = random.Random(SEED)
    results: dict[str, Any] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="distenv-bench-") as tmp:
        sync_root = Path(tmp)
        for index, launcher in enumerate(launchers):
            records: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
            # The warm-up (page cache, .pyc files) serves every launcher: only the first has one.
            skip = 0 if index else warmup
            for round_ in range(skip + rounds):
                order = [m for m in methods if m != "mmengine" or round_ < skip + mm_rounds]
                rng.shuffle(order)
                for method in order:
                    record = launch(
                        launcher, method, nprocs, slurm_conf, sync_root, profile=args.profile
                    )
                    if round_ >= skip:
                        records[method].append(record)
                    note(f"{launcher} round {round_} {method}: {record['max_s'] * 1000:.1f} ms")
            results[launcher] = cpu_table(records) if args.profile else analyse(records)
    result = {
        "benchmark": "bootstrap_profile" if args.profile else "bootstrap",
        "smoke": args.smoke,
        "nprocs": nprocs,
        "backend": args.backend,
        "rounds": rounds,
        "mmengine_rounds": mm_rounds if "mmengine" in methods else 0,
        "warmup_rounds": warmup,
        "warmup_before": "the first launcher only",
        "total_s": time.perf_counter() - started,
        "machine": machine(),
        "launchers": results,
        "skipped": skipped,
    }
    emit(result, args.out)
    return 0


def analyse(records: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {"methods": {}}
    for method, recs in records.items():
        times = [r["max_s"] for r in recs]
        out["methods"][method] = {
            "max_over_ranks_s": summary(times),
            "launch_wall_s": summary([r["launch_wall_s"] for r in recs]),
            "processes_per_rank": summary([max(r["events_per_rank"]) for r in recs]),
            "cpu_per_rank_ms": median([_cpu_ms(r) for r in recs]) if recs else None,
            "import_cpu_per_rank_ms": median([_cpu_ms(r, "import_cpu_per_rank_s") for r in recs])
            if recs
            else None,
            "events_per_rank_max": max((max(r["events_per_rank"]) for r in recs), default=0),
            "rank0_events_example": recs[0]["rank0_events"] if recs else [],
            "raw_max_s": times,
        }
    # Rounds are paired: distenv's i-th and bare's i-th come from the same round.
    pairs = list(zip(records["distenv"], records["bare"], strict=False))
    out["phases"] = phase_table(records, pairs)
    ab = [(a["max_s"], b["max_s"]) for a, b in pairs]
    if ab:
        ratio = ratio_of_medians(ab)
        low, high = bootstrap_ci(ab, ratio_of_medians)
        out["distenv_vs_bare"] = {
            "pairs": len(ab),
            "ratio": ratio,
            "overhead_pct": (ratio - 1) * 100,
            "overhead_ci_pct": [(low - 1) * 100, (high - 1) * 100],
            "median_paired_diff_ms": median([(a - b) * 1000 for a, b in ab]),
            "median_paired_cpu_diff_ms": median([_cpu_ms(a) - _cpu_ms(b) for a, b in pairs]),
        }
    if records.get("mmengine"):
        mm = list(zip(records["distenv"], records["mmengine"], strict=False))
        ab = [(a["max_s"], b["max_s"]) for a, b in mm]
        low, high = bootstrap_ci(ab, ratio_of_medians)
        out["distenv_vs_mmengine"] = {
            "pairs": len(ab),
            "ratio": ratio_of_medians(ab),
            "ratio_ci": [low, high],
        }
    return out


def cpu_table(records: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each method's CPU per phase (_cpu_probes.PROBES, then "other" and the total): rank 0's and
    the other ranks' (their mean in a launch), each the median over launches (ms); and distenv's
    median paired difference with bare in the CPU of a rank (the mean over a launch's ranks)."""
    order = [*_cpu_probes.PROBES, _cpu_probes.OTHER]
    out: dict[str, Any] = {"order": order, "methods": {}}
    for method, recs in records.items():
        if not recs:
            continue
        rows: dict[str, Any] = {}
        for phase in order:
            rank0 = [r["cpu_phases"][0].get(phase, 0.0) for r in recs]
            others = [
                median([v.get(phase, 0.0) for k, v in r["cpu_phases"].items() if k != 0])
                for r in recs
            ]
            if any(rank0) or any(others):
                rows[phase] = {"rank0": median(rank0), "others": median(others)}
        # The probes' own total (their phases and "other" add up to it), not the worker's CPU
        # figure: the two are read at instants a few microseconds apart.
        rows["total"] = {
            "rank0": median([sum(r["cpu_phases"][0].values()) for r in recs]),
            "others": median([
                median([sum(v.values()) for k, v in r["cpu_phases"].items() if k != 0])
                for r in recs
            ]),
        }  # fmt: skip
        out["methods"][method] = {"phases": rows, "cpu_per_rank_ms": median(
            [_cpu_ms(r) for r in recs]
        )}  # fmt: skip
    pairs = list(zip(records["distenv"], records["bare"], strict=False))
    if pairs:
        out["median_paired_cpu_diff_ms"] = median([_cpu_ms(a) - _cpu_ms(b) for a, b in pairs])
        out["pairs"] = len(pairs)
    return out


def _cpu_ms(record: dict[str, Any], field: str = "cpu_per_rank_s") -> float:
    """The CPU time a launch's ranks spent (`field`: bootstrapping, or importing the library),
    on average per rank (ms)."""
    return 1000 * sum(record[field]) / len(record[field])


def phase_table(
    records: dict[str, list[dict[str, Any]]], pairs: list[tuple[dict[str, Any], dict[str, Any]]]
) -> dict[str, Any]:
    """Each phase (_trace_probes.phases): its median per method, over launches of the median over
    the launch's ranks, and distenv's median paired difference with bare (ms)."""

    def span(record: dict[str, Any], phase: str) -> float:
        return median([spans[phase] for spans in record["phases"].values()])

    names = list(next(iter(records["distenv"][0]["phases"].values())))
    table: dict[str, Any] = {}
    for phase in names:
        row: dict[str, Any] = {
            method: median([span(r, phase) for r in recs])
            for method, recs in records.items()
            if recs
        }
        row["distenv_minus_bare_ms"] = median([span(a, phase) - span(b, phase) for a, b in pairs])
        table[phase] = row
    return table


if __name__ == "__main__":
    sys.exit(main())
