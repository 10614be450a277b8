"""Bare torch aborts at exit under the forcing of tests/process/test_teardown.py: how often.

    .venv/bin/python benchmarks/lab/exit_race.py [--exits 120] --out docs/benchmarks/exit_race.json

That test's control, run apart: jobs of 4 bare-torch ranks (tests/support/scripts/exit_race.py
``torch destroy``: each rank on one CPU, gloo's worker threads at nice 19) until --exits rank exits
have been seen; an exit that aborted (SIGABRT, or the C++ runtime's "terminate called" line) is
counted. The test's distenv ranks exit 0 in 20 of 20 under the same forcing; this is what makes
that mean something: bare torch does not. docs/faults.md quotes the result.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# benchmarks/, whose modules this lab tool builds on, is not its own directory.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import REPO, emit, machine, note, parser

sys.path.insert(0, str(REPO))

from tests.process.test_teardown import ABORT_MESSAGE, _exits

WORLD = 4


def aborted(code: int, err: str) -> bool:
    """Whether a rank ended by SIGABRT (the shell's 128 + 6 included) or printed the C++
    runtime's line for a thread destroyed while it ran."""
    return code in (-signal.SIGABRT, 128 + signal.SIGABRT) or ABORT_MESSAGE in err


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--exits", type=int, default=120, help="rank exits to run (jobs of 4 ranks)")
    args = p.parse_args()
    most = WORLD if args.smoke else args.exits
    jobs, lost, began, load = [], 0, time.monotonic(), os.getloadavg()[0]
    while len(jobs) * WORLD < most and lost < 3:
        start = time.monotonic()
        try:
            ended = _exits("torch", "destroy", WORLD)
        except subprocess.TimeoutExpired:  # a rank past _exits' 2 minutes: a job lost to the load
            note(f"job {len(jobs) + 1}: timed out")
            lost += 1
            continue
        jobs.append(
            {
                "codes": [code for code, _ in ended],
                "aborted": [aborted(code, err) for code, err in ended],
                "seconds": round(time.monotonic() - start, 1),
            }
        )
        note(f"job {len(jobs)}: {jobs[-1]}")
    exits = [a for job in jobs for a in job["aborted"]]
    emit(
        {
            "benchmark": "exit_race",
            "smoke": args.smoke,
            "machine": machine(),
            "load_average": {"before": load, "after": os.getloadavg()[0]},
            "jobs": jobs,
            "jobs_timed_out": lost,
            "exits": len(exits),
            "aborted_exits": sum(exits),
            "jobs_with_an_abort": sum(any(job["aborted"]) for job in jobs),
            "first_abort_exit": exits.index(True) + 1 if any(exits) else None,
            "total_s": round(time.monotonic() - began, 1),
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
