"""The fault matrix: each fault of issue #13 once under its launcher, timed to a clear error.

Runs every fault of tests/support/integration/faults.py (the definitions tests/integration/test_faults.py
asserts on) one after another, so that no launch competes with another for the 2 cores, and
records for each: the seconds from the fault to the last rank's error (for a signal, to the
signalled rank's), the bound, the launcher's exit status and each rank's where it reports one, the
rank named and by whom, and the processes left behind (none expected). docs/faults.md renders the
JSON (docs/hooks.py, marker ``fault-matrix``).

    bash tests/harness/setup.sh     # the Slurm clusters and MPI (idempotent)
    .venv/bin/python benchmarks/lab/fault_matrix.py --out docs/benchmarks/faults.json

``--smoke`` runs only the silent-listener fault (no Slurm needed), for tests/meta/test_benchmarks.py.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

# benchmarks/, whose modules this lab tool builds on, is not its own directory.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import REPO, emit, machine, note, parser

sys.path.insert(0, str(REPO))

from tests.support.integration.faults import FAULTS, PHASES, Outcome, signal_in_phase
from tests.support.integration.helpers import JOB_NAME, STATE, Harness, load_env_sh

# The rank each fault's messages must name (the page's "named" column).
NAMED = {
    "killed-after-checkin": "rank 1 (checked in",
    "sigterm-two-in-roll-call": "rank 1 on",
    "stopped-after-init": "rank 2 on",
    "forged-up-stopped": "a process outside this job wrote to it",
    "rank0-killed-in-init": "lost rank 0's store",
    "killed-in-init-torchrun": "interrupted by SIGTERM",
    "silent-master-port": "accepts connections but is not answering as a torch store",
}
SMOKE = ("silent-master-port",)


def record_phase(name: str, outcome: Outcome, exited: float) -> dict[str, Any]:
    phase = PHASES[name]
    rec = outcome.record(f"interrupted by {phase.signal.name} during {phase.what}")
    target = outcome.errors().get(phase.target)
    rec["measured_s"] = round(target["t"] - outcome.fault_t, 3) if target else None
    rec["bound_s"] = 2.0
    rec["exited_s"] = round(exited, 3)
    return rec


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    args = p.parse_args()
    work = STATE / "fault-matrix" / JOB_NAME
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    harness = Harness(load_env_sh(STATE / "env.sh"), work)
    records: dict[str, dict[str, Any]] = {}
    began = time.monotonic()
    for name, run in FAULTS.items():
        if args.smoke and name not in SMOKE:
            continue
        note(f"fault {name}")
        records[name] = run(harness).record(NAMED[name])
    if not args.smoke:
        for name in PHASES:
            note(f"signal during {name}")
            records[f"signal-{name}"] = record_phase(name, *signal_in_phase(harness, name))
    shutil.rmtree(work, ignore_errors=True)
    emit(
        {
            "benchmark": "faults",
            "smoke": args.smoke,
            "machine": machine(),
            "total_s": round(time.monotonic() - began, 1),
            "faults": records,
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
