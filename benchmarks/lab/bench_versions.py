"""Benchmark: two versions of distenv against each other, paired and interleaved, in one run.

Is the working tree's distenv no slower than a baseline, a git revision (default ``a124b84``,
release 0.1.0)? The baseline is materialised with ``git archive REV distenv | tar -x`` into a
temporary directory (the repository is never checked out), the working tree's distenv/ copied
beside it (`snapshot`); each copy is byte-compiled and made read-only, so both sides are treated
alike. Every child picks its copy with ``PYTHONPATH=<dir holding distenv/>`` and proves it: it
reports the file of every ``distenv`` module it loaded, and the run stops if one comes from
elsewhere (the ``''`` that ``python -c`` puts *before* PYTHONPATH would win in a directory holding
distenv/, so those children run with cwd=/).

1. import + detect: a fresh ``python -c "import distenv; distenv.detect()"`` child, timed by the
   parent from spawn to exit, under bench_import.py's simulated ``srun -n 4`` step environment.
   Target: upper bound of (candidate - baseline) <= 3 ms.
2. bootstrap: one ``srun -n 4`` (test Slurm cluster "one") or ``torchrun --nproc-per-node 4``
   launch of _bootstrap_worker.py's ``distenv`` method, started by bench_bootstrap.launch, which
   reports the slowest rank's time from a common start line to the first finished all_reduce
   (gloo, CPU) and each rank's phases (_trace_probes.py). This script is the ranks' entry point:
   it checks the copy, pins ``distenv.init_dist(launcher="slurm" | "torchrun")`` and runs the
   worker unchanged. Target: upper bound <= 2 ms per launcher.

Each pair runs both versions back to back, each side first in half the pairs (srun steps run back
to back show an order effect of several ms); warm-up pairs are dropped (2 for the import, 1 per
launcher for the bootstrap). Per measurement: the median paired difference (candidate - baseline,
ms), its 95 % percentile-bootstrap interval over pairs, and the interval's upper end as the "upper
bound"; PASS when it is at most the target; exit 1 if a measurement FAILs (never with --smoke).
On a quiet 2-core machine the defaults (200 import pairs, 40 bootstrap pairs on 2 launchers) take
about 17 minutes, ``--smoke`` about 1. Noise floor there (A/A runs, one version against itself):
the import's paired differences spread by ~12 ms (sd), so 40 pairs gave an upper bound of +6 to
+8 ms even for identical code, 200 pairs one of 0 to +2 ms; the bootstrap's spread by 5-17 ms, so
15 pairs gave an upper bound of +7 to +15 ms. The JSON records how busy the CPUs were before and
after. docs/security.md ("What it costs") quotes the result.

    python benchmarks/lab/bench_versions.py [--baseline a124b84] [--import-pairs 200]
        [--bootstrap-pairs 40] [--launchers srun,torchrun] [--trace] [--smoke] [--out FILE]
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import random
import runpy
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

# benchmarks/, whose modules this lab tool builds on, is not its own directory.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_bootstrap
from _common import (
    HERE,
    REPO,
    SEED,
    bootstrap_ci,
    machine,
    median,
    note,
    parser,
    python_c,
    summary,
    write_json,
)
from bench_import import child_env

DEFAULT_BASELINE = "a124b84"  # release 0.1.0
DEFAULT_OUT = REPO / "docs" / "benchmarks" / "versions.json"
IMPORT_TARGET_MS = 3.0
BOOTSTRAP_TARGET_MS = 2.0
IMPORT_WARMUP = 2
BOOTSTRAP_WARMUP = 1
WORKER = HERE / "_bootstrap_worker.py"
# distenv.init_dist's launcher argument for each launcher (names of release 0.1.0 and later).
INIT_LAUNCHER = {"srun": "slurm", "torchrun": "torchrun"}
# Set in a rank's environment (bench_bootstrap.clean_env keeps BENCH_*, scrubs DISTENV_*): the
# distenv/ directory it must load, and the launcher to pass to init_dist.
EXPECT_VAR = "BENCH_VERSIONS_EXPECT"
LAUNCHER_VAR = "BENCH_VERSIONS_LAUNCHER"
# The timed child: detection as bench_import.py times it (with the child's own clock around it,
# for information), then (microseconds) the file of distenv and of every distenv module loaded,
# one a line, for the parent to check.
IMPORT_CODE = (
    "import time; t0 = time.perf_counter()\n"
    "import distenv; distenv.detect()\n"
    "t1 = time.perf_counter()\n"
    "import sys\n"
    "print(t1 - t0)\n"
    "print(distenv.__file__)\n"
    "print(*sorted(str(getattr(m, '__file__', None)) for n, m in list(sys.modules.items())"
    " if n == 'distenv' or n.startswith('distenv.')), sep='\\n')\n"
)


@dataclass
class Side:
    """One version of distenv: where it comes from and the directory PYTHONPATH names."""

    name: str  # "baseline" or "candidate"
    rev: str | None  # None: the working tree
    commit: str | None
    root: Path  # holds distenv/

    @property
    def package(self) -> Path:
        return self.root / "distenv"

    def describe(self) -> str:
        origin = f"{self.rev} ({self.commit})" if self.rev else f"working tree {REPO / 'distenv'}"
        return f"{self.name}: {origin} -> PYTHONPATH={self.root}"


# --- the rank's entry point (under srun / torchrun) ------------------------------------------


def foreign_modules(expect: Path) -> list[str]:
    """Return 'module: file' for every loaded distenv module that is not under `expect`."""
    root = expect.resolve()
    bad = []
    for name, module in list(sys.modules.items()):
        if name != "distenv" and not name.startswith("distenv."):
            continue
        file = getattr(module, "__file__", None)
        if file is None or not Path(file).resolve().is_relative_to(root):
            bad.append(f"{name}: {file}")
    return bad


def check_copy(expect: Path) -> None:
    if bad := foreign_modules(expect):
        raise SystemExit(f"bench_versions rank: distenv not from {expect}: {bad}")


def rank_main() -> int:
    """Check this rank's distenv copy, pin init_dist's launcher, run the worker unchanged."""
    expect = Path(os.environ[EXPECT_VAR])
    import distenv

    real = distenv.init_dist  # loads distenv.bootstrap.init; the worker does so before its clock
    check_copy(expect)
    distenv.init_dist = functools.partial(real, launcher=os.environ[LAUNCHER_VAR])
    sys.argv[0] = str(WORKER)
    try:
        runpy.run_path(str(WORKER), run_name="__main__")
    finally:
        check_copy(expect)
    return 0


# --- the two copies ---------------------------------------------------------------------------


def git(*args: str) -> bytes:
    out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"bench_versions: git {' '.join(args)}: {out.stderr.decode().strip()}")
    return out.stdout


def set_writable(root: Path, writable: bool) -> None:
    """Make the tree under `root` read-only (files 444, folders 555) or writable again.

    Symbolic links are left alone: a revision's ``distenv/scripts`` link to ../scripts dangles in
    the extracted copy, and chmod would follow it.
    """
    file_mode, dir_mode = (0o644, 0o755) if writable else (0o444, 0o555)
    paths = [root, *(path for path in root.rglob("*") if not path.is_symlink())]
    # Folders last when locking (their entries stay reachable), first when unlocking.
    for path in sorted(paths, key=lambda p: p.is_dir() != writable):
        path.chmod(dir_mode if path.is_dir() else file_mode)


def materialise(rev: str, dest: Path) -> Side:
    """Extract `rev`'s distenv/ into `dest` with git archive | tar, byte-compile, lock it."""
    commit = git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").decode().strip()
    dest.mkdir()
    untar = subprocess.run(
        ["tar", "-x", "-C", str(dest)], input=git("archive", commit, "distenv"), check=False
    )
    if untar.returncode != 0 or not (dest / "distenv" / "__init__.py").is_file():
        raise SystemExit(f"bench_versions: git archive {rev} distenv | tar -x gave no distenv/")
    compile_and_lock(dest)
    return Side("baseline", rev, commit, dest)


def snapshot(dest: Path) -> Side:
    """Copy the working tree's distenv/ (as on disk, no bytecode) into `dest`; compile, lock.

    A copy rather than PYTHONPATH=REPO: both sides then get the same treatment (fresh .pyc files,
    read-only, same file system), the ranks' inherited PYTHONDONTWRITEBYTECODE cannot make one
    side compile its sources at every launch, and edits made during the run do not leak into it.
    """
    dest.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    # symlinks=False: distenv/scripts links to ../scripts, which a copy elsewhere would lose.
    shutil.copytree(REPO / "distenv", dest / "distenv", ignore=ignore, symlinks=False)
    compile_and_lock(dest)
    return Side("candidate", None, None, dest)


def compile_and_lock(root: Path) -> None:
    """Write the .pyc files now (no child pays for compiling), then make the copy read-only."""
    package = str(root / "distenv")
    out = subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "--invalidation-mode", "timestamp", package],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"bench_versions: {package} does not compile:\n{out.stdout}{out.stderr}")
    set_writable(root, False)


def fingerprint(package: Path) -> str:
    """Hash of the sources under `package` (to notice edits of the working tree during a run)."""
    digest = hashlib.sha256()
    # os.walk follows the distenv/scripts link as the copy's real folder does (rglob would not).
    files = [
        Path(root, name) for root, _, names in os.walk(package, followlinks=True) for name in names
    ]
    for path in sorted(files):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


# --- the measurements -------------------------------------------------------------------------


def pair_orders(warmup: int, pairs: int, rng: random.Random) -> list[str]:
    """Which side runs first in each pair: random, but each side first in half the kept pairs.

    The second run of a pair can be systematically faster (e.g. srun steps back to back by
    several ms): balancing keeps that order effect out of the median difference.
    """
    kept = ["baseline", "candidate"] * (pairs // 2)
    if pairs % 2:
        kept.append(rng.choice(["baseline", "candidate"]))
    rng.shuffle(kept)
    return [rng.choice(["baseline", "candidate"]) for _ in range(warmup)] + kept


def run_pairs(
    sides: list[Side], warmup: int, pairs: int, rng: random.Random, run: Callable[[Side], Any]
) -> tuple[dict[str, list[Any]], list[str]]:
    """Run `run` on both sides `warmup` + `pairs` times, in pair_orders' order; return each
    side's kept results and which side ran first in each kept pair."""
    kept: dict[str, list[Any]] = {s.name: [] for s in sides}
    orders = []
    for index, first in enumerate(pair_orders(warmup, pairs, rng)):
        order = sides if first == sides[0].name else sides[::-1]
        results = [(side, run(side)) for side in order]
        if index >= warmup:
            orders.append(first)
            for side, result in results:
                kept[side.name].append(result)
    return kept, orders


def run_import(side: Side) -> tuple[float, float, str]:
    """Run the import child once; return (wall s, in-child s, distenv.__file__ it reported)."""
    wall, out = python_c(IMPORT_CODE, {**child_env(), "PYTHONPATH": str(side.root)})
    in_child, *files = out.splitlines()
    root = side.package.resolve()
    bad = [f for f in files if f == "None" or not Path(f).resolve().is_relative_to(root)]
    if not files or bad:
        raise SystemExit(
            f"bench_versions: the {side.name}'s child loaded distenv from {bad or files}, "
            f"not from {side.package}: PYTHONPATH did not win"
        )
    return wall, float(in_child), files[0]


def measure_import(sides: list[Side], pairs: int, rng: random.Random) -> dict[str, Any]:
    runs, orders = run_pairs(sides, IMPORT_WARMUP, pairs, rng, run_import)
    base, cand = runs["baseline"], runs["candidate"]
    result = paired([r[0] for r in base], [r[0] for r in cand], IMPORT_TARGET_MS, orders)
    # For information (no verdict): the same pairs timed by the children themselves, from before
    # `import distenv` to after detect(): interpreter start-up and exit excluded, far less noise.
    result["in_child"] = paired([r[1] for r in base], [r[1] for r in cand], None, orders)
    return result


def launch_once(side: Side, launcher: str, nprocs: int, conf: str | None, sync: Path) -> Any:
    """One bench_bootstrap.launch whose ranks start this script on `side`'s copy."""
    values = {
        "PYTHONPATH": str(side.root),
        EXPECT_VAR: str(side.package),
        LAUNCHER_VAR: INIT_LAUNCHER[launcher],
    }
    # launch() builds the ranks' environment from os.environ and their command from WORKER.
    with (
        mock.patch.dict(os.environ, values),
        mock.patch.object(bench_bootstrap, "WORKER", Path(__file__).resolve()),
    ):
        record = bench_bootstrap.launch(launcher, "distenv", nprocs, conf, sync)
    if record.get("method") != "distenv" or record.get("world_size") != nprocs:
        raise SystemExit(f"bench_versions: unexpected record from {launcher}: {record}")
    note(f"{launcher} {side.name}: {record['max_s'] * 1000:.1f} ms")
    return record


def measure_bootstrap(
    sides: list[Side],
    launcher: str,
    pairs: int,
    nprocs: int,
    conf: str | None,
    rng: random.Random,
    trace: bool = False,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="distenv-versions-sync-") as tmp:
        run = functools.partial(launch_once, launcher=launcher, nprocs=nprocs, conf=conf,
                                sync=Path(tmp))  # fmt: skip
        records, orders = run_pairs(sides, BOOTSTRAP_WARMUP, pairs, rng, run)
    base, cand = records["baseline"], records["candidate"]
    result = paired(
        [r["max_s"] for r in base], [r["max_s"] for r in cand], BOOTSTRAP_TARGET_MS, orders
    )
    result["launch_wall_diff_ms"] = median(
        [(c["launch_wall_s"] - b["launch_wall_s"]) * 1000 for b, c in zip(base, cand, strict=True)]
    )
    result["init_dist_launcher"] = INIT_LAUNCHER[launcher]
    result["processes_started_per_rank_max"] = {
        name: max((max(r["events_per_rank"]) for r in recs), default=0)
        for name, recs in records.items()
    }
    if trace:
        result["phases"] = phase_rows(base, cand, orders)
    return result


def phase_rows(
    base: list[dict[str, Any]], cand: list[dict[str, Any]], orders: list[str]
) -> dict[str, dict[str, Any]]:
    """Paired differences per phase (bench_bootstrap.launch's "phases", ms): rank 0's, and the
    median over the other ranks'."""

    def role(record: dict[str, Any], phase: str, zero: bool) -> float:
        spans = [v[phase] for k, v in record["phases"].items() if (int(k) == 0) == zero]
        return median(spans) / 1000

    rows = {}
    names = list(next(iter(base[0]["phases"].values())))
    for zero, label in ((True, "rank 0"), (False, "others")):
        for phase in names:
            rows[f"{label} {phase}"] = paired(
                [role(r, phase, zero) for r in base], [role(r, phase, zero) for r in cand],
                None, orders,
            )  # fmt: skip
    return rows


def paired(
    base_s: list[float], cand_s: list[float], target_ms: float | None, orders: list[str]
) -> dict[str, Any]:
    """Median paired difference (candidate - baseline, ms), its 95 % interval, the verdict.

    With no target the verdict is "info".
    """
    diffs = [(c - b) * 1000 for b, c in zip(base_s, cand_s, strict=True)]
    low, high = bootstrap_ci(diffs, median)
    base_ms, cand_ms = [b * 1000 for b in base_s], [c * 1000 for c in cand_s]
    return {
        "pairs": len(diffs),
        "baseline_ms": summary(base_ms),
        "candidate_ms": summary(cand_ms),
        "median_diff_ms": median(diffs),
        "ci95_diff_ms": [low, high],
        "upper_bound_ms": high,
        "target_ms": target_ms,
        "verdict": (
            "info"
            if target_ms is None
            else "PASS"
            if not math.isnan(high) and high <= target_ms
            else "FAIL"
        ),
        "relative_diff_pct": (
            (median(cand_ms) / median(base_ms) - 1) * 100 if median(base_ms) else math.nan
        ),
        # Diagnostic: median of (second run - first run) over the pairs, whichever side that was.
        "order_effect_ms": median(
            [d if first == "baseline" else -d for d, first in zip(diffs, orders, strict=True)]
        ),
        "first_in_pair": orders,
        "raw_baseline_ms": base_ms,
        "raw_candidate_ms": cand_ms,
        "raw_diff_ms": diffs,
    }


def busy_fraction(seconds: float = 1.0) -> float:
    """Share of CPU time (all CPUs) spent busy during `seconds` while this process sleeps."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields) - idle, sum(fields)

    try:
        busy0, total0 = sample()
        time.sleep(seconds)
        busy1, total1 = sample()
    except (OSError, ValueError, IndexError):
        return math.nan
    return (busy1 - busy0) / max(total1 - total0, 1)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.set_defaults(out=DEFAULT_OUT)
    p.add_argument("--baseline", default=DEFAULT_BASELINE, help="git revision (default: 0.1.0)")
    p.add_argument("--import-pairs", type=int, help="default 200 (3 with --smoke)")
    p.add_argument("--bootstrap-pairs", type=int, help="per launcher; default 40 (2 with --smoke)")
    p.add_argument("--launchers", default="srun,torchrun", help="subset of srun,torchrun or ''")
    p.add_argument("--nprocs", type=int, default=4, help="ranks per bootstrap launch")
    p.add_argument("--slurm-conf", help="slurm.conf of the test cluster (default: from env.sh)")
    p.add_argument(
        "--trace", action="store_true", help="also report each phase's paired differences"
    )
    args = p.parse_args(argv)
    import_pairs = args.import_pairs if args.import_pairs is not None else 3 if args.smoke else 200
    bootstrap_pairs = (
        args.bootstrap_pairs if args.bootstrap_pairs is not None else 2 if args.smoke else 40
    )
    launchers = [name for name in args.launchers.split(",") if name]
    if unknown := set(launchers) - set(INIT_LAUNCHER):
        p.error(f"unknown launchers {sorted(unknown)}: choose among {sorted(INIT_LAUNCHER)}")
    if min(import_pairs, bootstrap_pairs) < 2:
        p.error("at least 2 pairs: the interval needs them")
    slurm_conf = bench_bootstrap.find_slurm_conf(args.slurm_conf)
    if "srun" in launchers and (slurm_conf is None or shutil.which("srun") is None):
        raise SystemExit(
            "bench_versions: no srun or no slurm.conf of the test cluster (run "
            "tests/harness/setup.sh, or pass --launchers torchrun)"
        )

    started = time.perf_counter()
    rng = random.Random(SEED)
    tmp = Path(tempfile.mkdtemp(prefix="distenv-versions-"))
    try:
        sides = [materialise(args.baseline, tmp / "baseline"), snapshot(tmp / "candidate")]
        copied = fingerprint(sides[1].package)
        if fingerprint(REPO / "distenv") != copied:
            raise SystemExit("bench_versions: distenv/ changed while it was copied; run again")
        found = {}
        for side in sides:  # one unmeasured child each: the copy that PYTHONPATH selects
            *_, found[side.name] = run_import(side)
            note(f"{side.describe()}; the child imported {found[side.name]}")
        busy_start = busy_fraction()
        if busy_start > 0.25:
            note(f"WARNING: the CPUs are {busy_start:.0%} busy before the start: expect noise")

        rows: dict[str, dict[str, Any]] = {}
        elapsed: dict[str, float] = {}
        clock = time.perf_counter()
        rows["import+detect"] = measure_import(sides, import_pairs, rng)
        elapsed["import+detect"] = time.perf_counter() - clock
        for launcher in launchers:
            clock = time.perf_counter()
            rows[f"bootstrap {launcher}"] = measure_bootstrap(
                sides, launcher, bootstrap_pairs, args.nprocs, slurm_conf, rng, args.trace
            )
            elapsed[f"bootstrap {launcher}"] = time.perf_counter() - clock
    finally:
        set_writable(tmp, True)
        shutil.rmtree(tmp, ignore_errors=True)

    changed = fingerprint(REPO / "distenv") != copied
    if changed:
        note("the working tree's distenv/ changed during the run; measured: the copy at start")
    verdict = "PASS" if all(r["verdict"] == "PASS" for r in rows.values()) else "FAIL"
    result = {
        "benchmark": "versions",
        "smoke": args.smoke,
        "sides": {
            side.name: {
                "rev": side.rev or "working tree",
                "commit": side.commit,
                "pythonpath": str(side.root),
                "distenv_file": found[side.name],
            }
            for side in sides
        },
        "method": (
            "pairs of back-to-back runs, random order within a pair (each side first in half "
            "the pairs), warm-up pairs dropped; "
            "median of (candidate - baseline) with a 95 % percentile bootstrap over pairs "
            "(2000 resamples); upper_bound_ms = the interval's upper end; PASS if <= target_ms"
        ),
        "import_warmup_pairs": IMPORT_WARMUP,
        "bootstrap_warmup_pairs": BOOTSTRAP_WARMUP,
        "nprocs": args.nprocs,
        "measurements": rows,
        "elapsed_s": elapsed,
        "verdict": verdict,
        # Share of CPU time used by others over 1 s while this script waits, before and after.
        "cpu_busy_start": busy_start,
        "cpu_busy_end": busy_fraction(),
        "total_s": time.perf_counter() - started,
        "machine": machine(),
    }
    result["sides"]["candidate"].update(
        copied_from=str(REPO / "distenv"),
        fingerprint=copied,
        working_tree_changed_during_run=changed,
    )
    write_json(result, args.out)
    for name, row in rows.items():
        for label, r in [(name, row), *row.get("phases", {}).items()]:
            low, high = r["ci95_diff_ms"]
            print(
                f"{label}: {r['median_diff_ms']:+.2f} ms [{low:+.2f}, {high:+.2f}] {r['verdict']}"
            )
    print(f"overall: {verdict} in {result['total_s']:.0f} s; JSON: {args.out}")
    return 0 if verdict == "PASS" or args.smoke else 1


if __name__ == "__main__":
    sys.exit(rank_main() if EXPECT_VAR in os.environ else main())
