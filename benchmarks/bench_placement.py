"""The cost per rank of CPU binding (issue #41): reading the node from sysfs and deciding the CPUs.

Each rank's `init_dist(cpu_binding=...)` reads the node's topology once (sysfs, procfs: bounded
reads, no subprocess) and decides its CPUs (`distenv.placement.apply.place_ranks`); ``distenv
run --numa-binding`` does the same once for all of its ranks. Timed in-process, per node layout:

  live          this machine's own /sys and /proc
  dgx-h100      a DGX H100's tree (224 CPUs, 8 GPUs), written by tests/support/machines.py
  frontier      Frontier's node (128 CPUs, 8 MI250X GCDs, a Slurm cpuset)
  aurora-pvc    an Aurora-like node (208 CPUs, 6 PVC GPUs, 12 ranks)

A case's time is one read and one plan (mode ``auto``) of all of its local ranks; the budget is
5 ms. Process creation is counted with an audit hook (subprocess, fork, exec, spawn): 0.

    python benchmarks/bench_placement.py [--repeats 200] [--smoke] [--out FILE]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from _common import REPO, emit, machine, parser, summary

sys.path.insert(0, str(REPO))  # the recorded trees are the tests' (tests/support/machines.py)

WATCHED = {"subprocess.Popen", "os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork"}
EVENTS: list[str] = []
TIMING = [False]
CASES = {"dgx-h100": "dgx-h100", "frontier": "frontier-mi250x", "aurora-pvc": "aurora-pvc"}
BUDGET_MS = 5.0


def _audit(event: str, args: tuple[object, ...]) -> None:
    if TIMING[0] and event in WATCHED:
        EVENTS.append(event)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=200)
    args = p.parse_args(argv)
    repeats = 5 if args.smoke else args.repeats

    from distenv.placement.apply import place_ranks
    from tests.support.machines import MACHINES

    with tempfile.TemporaryDirectory() as folder:
        roots: dict[str, tuple[Path, int]] = {"live": (Path("/"), 2)}
        for name, machine_name in CASES.items():
            described = MACHINES[machine_name]
            roots[name] = (described.write(Path(folder) / name), described.ranks)
        sys.addaudithook(_audit)
        TIMING[0] = True  # only the timed code counts, not the trees' writing or machine()
        cases = {}
        for name, (root, ranks) in roots.items():
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                placement = place_ranks("auto", ranks, {}, root=root)
                times.append((time.perf_counter() - start) * 1000)
            cases[name] = {
                "ranks": ranks,
                "cpus": len(placement.topology.online),
                "accelerators": len(placement.topology.accelerators),
                "ms": summary(times),
                "within_budget": summary(times)["median"] <= BUDGET_MS,
            }
        TIMING[0] = False
    result = {
        "benchmark": "placement",
        "smoke": args.smoke,
        "machine": machine(),
        "repeats": repeats,
        "budget_ms": BUDGET_MS,
        "processes": len(EVENTS),
        "cases": cases,
    }
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
