"""Per-rank logs and ``distenv why`` under mpirun -np 4: the card names the crashed rank.

The job runs tests/support/scripts/card_rank.py (an all_reduce loop) with ``DISTENV_LOG_DIR``;
rank 1 dies of SIGSEGV at step 3, right after its last print. ``distenv why DIR`` must name that
rank, the signal, the user's frame it crashed in and that last line, and count the others as its consequences; no rank may outlive
mpirun. The srun -N2 case (rank 1 raises) runs as a failing step of scripts/slurm/multi_node.sbatch
in tests/integration/test_templates.py, whose card the template prints.
"""

from __future__ import annotations

import subprocess

from tests.support.integration.faults import DISTENV, survivors
from tests.support.integration.helpers import OMPI, PYTHON, REPO, Harness

CARD_RANK = str(REPO / "tests" / "support" / "scripts" / "card_rank.py")


def test_mpirun_names_the_crashed_rank(harness: Harness) -> None:
    """mpirun -np 4: rank 1 dies of SIGSEGV at step 3; the card names it and the frame it was in."""
    out = harness.outdir("why-mpirun")
    logs = out / "logs"
    extra = {"DISTENV_LOG_DIR": str(logs), "DISTENV_TIMEOUT": "60", "PYTHONUNBUFFERED": "1"}
    argv = [*OMPI, "-np", "4", PYTHON, CARD_RANK, str(out), "--fail", "1:3:segv"]
    result = harness.run(argv, env=harness.env(ompi=True, extra=extra), timeout=150)
    assert result.returncode != 0, result.text
    left = survivors(str(out))
    assert not left, f"ranks outlived mpirun: {left}\n{result.text}"
    why = subprocess.run(
        [DISTENV, "why", str(logs)], capture_output=True, text=True, timeout=60, check=False
    )
    assert why.returncode == 0, why.stderr
    lines = why.stdout.splitlines()
    assert lines[0] == (
        "distenv why: rank 1 failed first: was killed by SIGSEGV (a crash in native code)"
    ), why.stdout
    assert " of 4, local rank 1 on " in lines[1], why.stdout
    assert lines[2].startswith("  where:   card_rank.py:"), why.stdout
    assert "in inject: os.kill" in lines[2], why.stdout
    assert "  output:  rank 1 at step 3" in lines, why.stdout  # printed just before the crash
    assert b"Fatal Python error: Segmentation fault" in (logs / "rank-1.fault").read_bytes()
    assert len(lines) <= 12, why.stdout
