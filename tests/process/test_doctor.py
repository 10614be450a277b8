"""`distenv doctor` on a login node, under `distenv run` and under torchrun (agent store)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import scrubbed_environ
from tests.process.test_cli import _page_sample
from tests.support.spawn import REPO, contract_env, free_port

VENV_BIN = Path(sys.executable).parent


def run(
    argv: list[str], env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_doctor_alone_explains_and_passes() -> None:
    """On a login node: one row, the reasons for `none`, verdict OK, exit 0."""
    result = run([sys.executable, "-m", "distenv", "doctor"], scrubbed_environ())
    assert result.returncode == 0, result.stderr
    assert re.search(r"^  none +chosen: no launcher detected", result.stdout, re.M)
    assert "verdict: OK: 1 of 1 ranks checked in" in result.stdout
    assert "rank 0's device: cpu: torch 2.13.0+cpu is a CPU-only build" in result.stdout


def test_doctor_refuses_a_batch_script_and_says_why() -> None:
    """In a 4-task job's batch script: the detection notes, the srun hint, exit 1."""
    env = {**scrubbed_environ(), "SLURM_JOB_ID": "9", "SLURM_NTASKS": "4"}
    result = run([sys.executable, "-m", "distenv", "doctor"], env)
    assert result.returncode == 1
    assert re.search(
        r"^  slurm +detected \(SLURM_JOB_ID='9', SLURM_NTASKS='4'\)$", result.stdout, re.M
    )
    assert "verdict: FAIL: slurm: this process is job 9's batch script" in result.stdout


def test_doctor_under_distenv_run_prints_one_table() -> None:
    """`distenv run -n 3 -m distenv doctor`: rank 0 alone prints a 3-row table and OK; docs/cli.md's
    sample of it is what it prints: how the launcher was chosen (but for the run's id) and the
    verdict (the rest is this machine's)."""
    result = run(
        [str(VENV_BIN / "distenv"), "run", "-n", "3", "-m", "distenv", "doctor"], scrubbed_environ()
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("distenv doctor:") == 1
    rows = [line.split() for line in result.stdout.splitlines() if line[:1].isdigit()]
    assert [(row[0], row[-1]) for row in rows] == [("0", "ok"), ("1", "ok"), ("2", "ok")]
    assert "verdict: OK: 3 of 3 ranks checked in" in result.stdout
    # Why cpu: this venv's torch is the CPU-only build.
    assert "rank 0's device: cpu: torch 2.13.0+cpu is a CPU-only build" in result.stdout

    def checked(lines: list[str]) -> list[str]:
        start = lines.index("how the launcher was chosen:")
        end = next(i for i, line in enumerate(lines) if line.startswith("rank 0's device:"))
        chosen = [re.sub(r"DISTENV_RUN_ID='[0-9a-f]+'", "<id>", line) for line in lines[start:end]]
        return [*chosen, lines[-1]]

    shown = _page_sample("distenv run -n 3 -m distenv doctor")
    assert checked(shown) == checked(result.stdout.splitlines())
    assert shown[-1] == "verdict: OK: 3 of 3 ranks checked in"


def test_doctor_under_torchrun_uses_the_agent_store() -> None:
    """Under torchrun the agent owns MASTER_PORT: doctor connects as a client and passes."""
    port = free_port()
    result = run(
        [
            str(VENV_BIN / "torchrun"),
            "--nproc-per-node",
            "2",
            "--master-port",
            str(port),
            "-m",
            "distenv",
            "doctor",
        ],
        scrubbed_environ(),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "launcher=pytorch world_size=2" in result.stdout
    assert "verdict: OK: 2 of 2 ranks checked in" in result.stdout


def test_doctor_names_a_missing_rank() -> None:
    """World size 2 with only rank 0 started: the table says MISSING and doctor exits 1."""
    env = contract_env(0, 2, free_port(), extra={"DISTENV_TIMEOUT": "2"})
    result = run([sys.executable, "-m", "distenv", "doctor"], env, timeout=60)
    assert result.returncode == 1
    rows = [line.split() for line in result.stdout.splitlines() if line[:1].isdigit()]
    assert [(row[0], " ".join(row[6:])) for row in rows] == [("0", "see verdict"), ("1", "MISSING")]
    assert "rank 1 (expected on" in result.stdout
