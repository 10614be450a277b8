"""Rank 1 against a master port held by a service that is no torch store, 20 runs per mode under load.

    .venv/bin/python benchmarks/lab/hostile_master.py --out docs/benchmarks/hostile_master.json

For each mode of `tests.support.hostile` (silent, reset, close, wrong-ping, absurd-length), it
starts `--runs` ranks (rank 1 of 2, DISTENV_TIMEOUT=2), `--parallel` at a time, while
`--burners` processes spin on the CPU (by default two per core), and counts how each ended:
its exit status, whether it aborted (SIGABRT, exit 134, torch's ``terminate called``), the lines
on its stderr and the seconds from its start to its end. `--code DIR` runs another checkout's
distenv (``git worktree add /tmp/old <rev>``) for a before/after comparison. Lab-only: it takes
minutes; `tests/process/test_bounds.py` runs 2 per mode in CI.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.process.test_bounds import _env  # noqa: E402
from tests.support.hostile import MODES, hostile_listener  # noqa: E402

RANK = "import distenv; distenv.init_dist()"
ABORT = "terminate called"


def _burn() -> None:
    while True:
        pass


def _one(mode: str, code: Path, timeout: int) -> dict[str, Any]:
    with hostile_listener(mode) as port:
        # Rank 1 of 2, as tests/process/test_bounds.py starts it, on `code`'s distenv.
        env = {**_env(port, 1, timeout), "PYTHONPATH": str(code)}
        started = time.monotonic()
        run = subprocess.run(
            [sys.executable, "-c", RANK],
            env=env,
            cwd=code,  # `-c` puts the working directory first on the path, before PYTHONPATH
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        took = time.monotonic() - started
    status = run.returncode
    print(f"{mode}: status {status} in {took:.1f} s", file=sys.stderr, flush=True)
    return {
        "status": status,
        "aborted": status in (-signal.SIGABRT, 128 + signal.SIGABRT) or ABORT in run.stderr,
        "lines": len(run.stderr.splitlines()),
        "seconds": round(took, 2),
        "stderr": run.stderr[-3000:],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per mode")
    parser.add_argument("--parallel", type=int, default=4, help="ranks at once")
    parser.add_argument("--burners", type=int, default=2 * (os.cpu_count() or 1))
    parser.add_argument("--timeout", type=int, default=2, help="DISTENV_TIMEOUT of each rank")
    parser.add_argument("--code", type=Path, default=REPO, help="the checkout whose distenv runs")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    burners = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(args.burners)]
    for burner in burners:
        burner.start()
    cases = [mode for mode in args.modes for _ in range(args.runs)]
    try:
        with ThreadPoolExecutor(args.parallel) as pool:
            ends = list(pool.map(lambda mode: _one(mode, args.code, args.timeout), cases))
    finally:
        for burner in burners:
            burner.kill()
            burner.join()
    modes: dict[str, Any] = {}
    for mode in args.modes:
        mine = [end for mode_, end in zip(cases, ends, strict=True) if mode_ == mode]
        modes[mode] = {
            "runs": len(mine),
            "aborted": sum(end["aborted"] for end in mine),
            "statuses": sorted({end["status"] for end in mine}),
            "max_lines": max(end["lines"] for end in mine),
            "max_seconds": max(end["seconds"] for end in mine),
            # The longest stderr of the mode's runs (its last 3000 characters).
            "longest": max((end["stderr"] for end in mine), key=lambda err: len(err.splitlines())),
        }
    result = {
        "runs_per_mode": args.runs,
        "parallel": args.parallel,
        "burners": args.burners,
        "cpus": os.cpu_count(),
        "timeout": args.timeout,
        "code": str(args.code),
        "modes": modes,
    }
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0 if all(mode["aborted"] == 0 for mode in modes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
