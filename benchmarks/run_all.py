"""Run every benchmark, keep their JSON results in docs/benchmarks/, then write docs/benchmarks.md.

    python benchmarks/run_all.py [--quick] [--only import,bootstrap,bootstrap_per_core,...]

Meant for the bench venv (.venv-bench: torch plus mmengine, lightning-fabric, submitit,
matplotlib); `bash benchmarks/run.sh` creates it and calls this. The page's words are its
template, docs/benchmarks.md.in; report.py fills in the numbers.

Lab-only tools are not run here: benchmarks/lab/ holds the release comparison (bench_versions.py)
and the fault, network and restart matrices, each run by hand as the page it feeds says
(docs/security.md, faults.md, network.md, restarts.md).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from _common import HERE, REPO

RESULTS = REPO / "docs" / "benchmarks"
# name -> (script, full arguments, --quick arguments)
BENCHMARKS: dict[str, tuple[str, list[str], list[str]]] = {
    "import": (
        "bench_import.py",
        ["--runs", "15", "--warmup", "2"],
        ["--runs", "5", "--warmup", "1"],
    ),
    "bootstrap": (
        "bench_bootstrap.py",
        ["--rounds", "15", "--mmengine-rounds", "5"],
        ["--rounds", "3", "--mmengine-rounds", "2"],
    ),
    # The same under torchrun with one rank per core: what the bootstrap's rounds cost when the
    # ranks do not share cores (report.py sets it beside the 4-rank run).
    "bootstrap_per_core": (
        "bench_bootstrap.py",
        ["--nprocs", "2", "--launchers", "torchrun", "--rounds", "15", "--mmengine-rounds", "0"],
        ["--nprocs", "2", "--launchers", "torchrun", "--rounds", "3", "--mmengine-rounds", "0"],
    ),
    # Where each rank's CPU goes, per phase, distenv beside bare env:// (_cpu_probes.py).
    "bootstrap_profile": (
        "bench_bootstrap.py",
        ["--profile", "--rounds", "11", "--mmengine-rounds", "0"],
        ["--profile", "--rounds", "3", "--mmengine-rounds", "0"],
    ),
    "allreduce": ("bench_allreduce.py", ["--iters", "12", "--warmup", "2"], ["--iters", "3"]),
    "scaling": (
        "bench_scaling.py",
        ["--sizes", "2,4,8,16,32", "--repeats", "2"],
        ["--sizes", "2,4,8", "--repeats", "1", "--rollcall-sizes", "64,256,1024"],
    ),
    "placement": ("bench_placement.py", ["--repeats", "200"], ["--repeats", "20"]),
    "ranklog": (
        "bench_ranklog.py",
        ["--rounds", "16", "--steps", "1500"],
        ["--rounds", "3", "--steps", "500"],
    ),
    "watchdog": (
        "bench_watchdog.py",
        ["--rounds", "5", "--steps", "3000"],
        ["--rounds", "1", "--steps", "1000"],
    ),
    "rendezvous_scale": (
        "bench_rendezvous_scale.py",
        ["--sizes", "4096,16384,131072", "--repeats", "3"],
        ["--sizes", "4096,16384", "--repeats", "1"],
    ),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions (not for the page)")
    p.add_argument("--only", default=",".join(BENCHMARKS), help="comma-separated subset")
    args = p.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    for name in args.only.split(","):
        script, full, quick = BENCHMARKS[name]
        out = RESULTS / f"{name}.json"
        argv_ = [sys.executable, str(HERE / script), *(quick if args.quick else full)]
        print(f"== {name}: {' '.join(argv_[1:])}", flush=True)
        start = time.perf_counter()
        subprocess.run([*argv_, "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
        print(
            f"== {name}: {time.perf_counter() - start:.0f} s -> {out.relative_to(REPO)}", flush=True
        )
    subprocess.run([sys.executable, str(HERE / "report.py")], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
