"""Per-rank logs and ``distenv why`` under srun -N2 and mpirun -np 4: the card names the cause.

Each job runs tests/support/scripts/card_rank.py (an all_reduce loop) with ``DISTENV_LOG_DIR``;
one rank fails at step 3. ``distenv why DIR`` must name that rank, how it failed and the user's
frame, and count the others as its consequences; no rank may outlive the launcher. The two jobs
start together (one module fixture): the file takes about as long as the slower one.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.integration.faults import DISTENV, survivors
from tests.support.integration.helpers import OMPI, PYTHON, REPO, Harness, Result

CARD_RANK = str(REPO / "tests" / "support" / "scripts" / "card_rank.py")
SRUN_2N = ["srun", "-N", "2", "-n", "4", "--ntasks-per-node", "2"]

Jobs = dict[str, "Future[tuple[Result, Path, str]]"]


def _job(harness: Harness, name: str, fail: str) -> tuple[Result, Path, str]:
    out = harness.outdir(f"why-{name}")
    logs = out / "logs"
    extra = {"DISTENV_LOG_DIR": str(logs), "DISTENV_TIMEOUT": "60", "PYTHONUNBUFFERED": "1"}
    if name == "srun":
        argv = [*SRUN_2N, PYTHON, CARD_RANK, str(out), "--fail", fail]
        result = harness.run(
            argv, env=harness.env("multi", extra=extra), cluster="multi", timeout=150
        )
    else:
        argv = [*OMPI, "-np", "4", PYTHON, CARD_RANK, str(out), "--fail", fail]
        result = harness.run(argv, env=harness.env(ompi=True, extra=extra), timeout=150)
    left = survivors(str(out))
    assert not left, f"{name}: ranks outlived the launcher: {left}\n{result.text}"
    why = subprocess.run(
        [DISTENV, "why", str(logs)], capture_output=True, text=True, timeout=60, check=False
    )
    assert why.returncode == 0, why.stderr
    return result, logs, why.stdout


@pytest.fixture(scope="module")
def jobs(harness: Harness) -> Iterator[Jobs]:
    with ThreadPoolExecutor(2) as pool:
        yield {
            "srun": pool.submit(_job, harness, "srun", "2:3:raise"),
            "mpirun": pool.submit(_job, harness, "mpirun", "1:3:segv"),
        }


def test_srun_two_nodes_names_the_raising_rank(jobs: Jobs) -> None:
    """srun -N2: rank 2 raises at step 3; the card names it, its error, its frame, its line."""
    result, logs, card = jobs["srun"].result()
    assert result.returncode != 0, result.text
    lines = card.splitlines()
    assert lines[0] == (
        "distenv why: rank 2 failed first: raised ValueError: bad batch at step 3 (exit status 1)"
    ), card
    assert " of 4, local rank 0 on " in lines[1], card
    assert any(
        line.startswith("  where:   card_rank.py:") and "in inject: raise ValueError" in line
        for line in lines
    ), card
    assert "  output:  rank 2 at step 3" in lines, card
    assert "ValueError: bad batch at step 3" in (logs / "rank-2.log").read_text(), card
    assert len(lines) <= 12, card


def test_mpirun_names_the_crashed_rank(jobs: Jobs) -> None:
    """mpirun -np 4: rank 1 dies of SIGSEGV at step 3; the card names it and the frame it was in."""
    result, logs, card = jobs["mpirun"].result()
    assert result.returncode != 0, result.text
    lines = card.splitlines()
    assert lines[0] == (
        "distenv why: rank 1 failed first: was killed by SIGSEGV (a crash in native code)"
    ), card
    assert any(
        line.startswith("  where:   card_rank.py:") and "in inject" in line for line in lines
    ), card
    assert b"Fatal Python error: Segmentation fault" in (logs / "rank-1.fault").read_bytes()
