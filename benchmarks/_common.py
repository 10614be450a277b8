"""Shared helpers of the benchmarks: statistics, the machine's description, JSON output.

Pure standard library, so that every benchmark's ``--smoke`` path runs in the project venv too.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ENV_SH = Path(os.environ.get("DISTENV_TEST_STATE", "/var/tmp/distenv-test")) / "env.sh"
# Resamples of the bootstrap confidence intervals; fixed seed so a page regenerates identically
# from the same raw data.
RESAMPLES = 2000
SEED = 20260507


def percentile(values: Sequence[float], q: float) -> float:
    """Return the q-th percentile (0..100) with linear interpolation (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50.0)


def bootstrap_ci(
    samples: Sequence[Any],
    statistic: Callable[[list[Any]], float],
    *,
    level: float = 95.0,
    resamples: int = RESAMPLES,
) -> tuple[float, float]:
    """Return the percentile-bootstrap interval of `statistic` over `samples` (resampled whole).

    For paired A/B data pass the pairs as samples, so each resample keeps pairs together.
    """
    if len(samples) < 2:
        return (math.nan, math.nan)
    rng = random.Random(SEED)
    n = len(samples)
    stats = sorted(
        statistic([samples[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples)
    )
    tail = (100.0 - level) / 2
    return percentile(stats, tail), percentile(stats, 100.0 - tail)


def ratio_of_medians(pairs: list[tuple[float, float]]) -> float:
    """Return median(a) / median(b) over (a, b) pairs."""
    return median([a for a, _ in pairs]) / median([b for _, b in pairs])


def summary(values: Sequence[float]) -> dict[str, Any]:
    """Return n, median, p5, p95, min, max of `values`."""
    return {
        "n": len(values),
        "median": median(values),
        "p5": percentile(values, 5),
        "p95": percentile(values, 95),
        "min": min(values) if values else math.nan,
        "max": max(values) if values else math.nan,
    }


def installed(module: str) -> bool:
    """Whether `module` can be imported by this interpreter (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def python_c(code: str, env: dict[str, str]) -> tuple[float, str]:
    """Run ``python -c code`` in `env`; return its wall time (spawn to exit) and its stdout.

    The child runs in ``/``: ``-c`` puts its working directory on sys.path before PYTHONPATH, and
    a checkout's distenv/ there would win over the one the benchmark means.
    """
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd="/",
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"`python -c {code!r}` failed:\n{proc.stderr.strip()[-3000:]}")
    return wall, proc.stdout


def note(text: str) -> None:
    """Print a note for the reader of the log (stderr: stdout carries the JSON)."""
    print(f"note: {text}", file=sys.stderr, flush=True)


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _field(path: str, name: str) -> str | None:
    """The value of the first ``name: value`` line of `path` (/proc/cpuinfo, /proc/meminfo)."""
    for line in _read(path).splitlines():
        if line.startswith(name):
            return line.split(":", 1)[1].strip()
    return None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _command_line(argv: list[str], env: dict[str, str] | None = None) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (
        (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else None
    )


def _slurm_env() -> dict[str, str]:
    conf = os.environ.get("SLURM_CONF") or env_sh().get("DISTENV_TEST_SLURM_ONE") or ""
    return {**os.environ, "SLURM_CONF": conf}


def machine() -> dict[str, Any]:
    """Describe this machine and software, for the page's header."""
    model = _field("/proc/cpuinfo", "model name") or platform.processor() or "unknown"
    mem_kb = int((_field("/proc/meminfo", "MemTotal") or "0").split()[0])
    commit = _command_line(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    dirty = _command_line(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"])
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu_model": model,
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "ram_gib": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        "os": _read("/etc/debian_version").strip() or platform.platform(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "distenv": _version("distenv"),
        "mmengine": _version("mmengine"),
        "lightning_fabric": _version("lightning-fabric"),
        "submitit": _version("submitit"),
        "slurm": _command_line(["srun", "--version"], _slurm_env()),
        "gpu": _command_line(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
        or "none (CPU only; gloo backend)",
        "git_commit": (commit or "?") + (" + uncommitted changes" if dirty else ""),
    }


def env_sh(path: Path = ENV_SH) -> dict[str, str]:
    """Read the ``export K=V`` lines of tests/harness/setup.sh's env.sh (no shell)."""
    out: dict[str, str] = {}
    for line in _read(str(path)).splitlines():
        if line.startswith("export ") and "=" in line:
            key, value = line[len("export ") :].split("=", 1)
            out[key] = value
    return out


def load_average(before: float) -> dict[str, float]:
    """Return the 1-minute load averages before (`before`, ``os.getloadavg()[0]``) and now.

    How much else ran on the machine while a benchmark did (it may be shared), for its page.
    """
    return {"before": before, "after": os.getloadavg()[0]}


def parser(description: str) -> argparse.ArgumentParser:
    """Return an argument parser with the options every benchmark has."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--smoke", action="store_true", help="run once at tiny size (for the tests)")
    p.add_argument("--out", type=Path, help="also write the JSON result to this file")
    return p


def _json(result: dict[str, Any]) -> str:
    return json.dumps(result, indent=1, sort_keys=True, default=str)


def write_json(result: dict[str, Any], out: Path) -> None:
    """Write `result` to `out` as the committed results are: indented, keys sorted."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(_json(result) + "\n")


def emit(result: dict[str, Any], out: Path | None) -> None:
    """Print `result` as one JSON document on stdout, and write it to `out` if given."""
    if out is not None:
        write_json(result, out)
    print(_json(result), flush=True)


def time_verdict_parse(
    key: str, raw: bytes, checkin: Any, info: Any, samples: int, placed_raw: bytes = b""
) -> tuple[float, Any, bool]:
    """Time what a rank does with the verdict it read: parse it against its schema, and where it
    places ranks, its own place (`placed_raw`, written by rank 0 under place/<rank>), and take its
    node from them.

    Returns the seconds per parse (the mean of `samples`), the filled RankInfo and whether the
    verdict placed ranks. distenv is imported here, so the module stays pure standard library.
    """
    from distenv.bootstrap.verdict import fill_layout, parse_place, parse_verdict

    n = info.world_size
    start = time.perf_counter()
    for _ in range(samples):
        read, placed = parse_verdict(key, raw, scope=checkin.scope, world_size=n)
        if placed:
            place = parse_place(f"place/{info.rank}", placed_raw, scope=checkin.scope, world_size=n)
            read = read._replace(place=place)
        filled = fill_layout(info, read, checkin)
    return (time.perf_counter() - start) / samples, filled, placed
