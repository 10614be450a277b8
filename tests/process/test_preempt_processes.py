"""Preemption across ranks: examples/train.py under the real `distenv run` (4 gloo ranks).

A warning signal to one rank, or to the launcher, stops every rank at the same step. The rules
behind it (restart counts, the requeue command, the watch) are tested in tests/unit/test_preempt.py;
the Slurm end-to-end runs in tests/integration/test_preemption.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import scrubbed_environ

REPO = Path(__file__).resolve().parents[2]
TRAIN = str(REPO / "examples" / "train.py")
TIMEOUT = 120


def train_args(checkpoint: Path, *extra: str) -> list[str]:
    """Return train.py's arguments: 400 steps of 20 ms, saving to `checkpoint` and exiting."""
    return [
        TRAIN,
        "--checkpoint",
        str(checkpoint),
        "--on-stop",
        "exit",
        "--steps",
        "400",
        "--step-time",
        "0.02",
        *extra,
    ]


@contextlib.contextmanager
def start_train(*args: str) -> Iterator[subprocess.Popen[str]]:
    """Run ``distenv run --nproc-per-node 4 ARGS`` (killed and reaped on the way out)."""
    env = scrubbed_environ()
    env.pop("OMP_NUM_THREADS", None)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "distenv", "run", "--nproc-per-node", "4", *args],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield launcher
    finally:
        launcher.kill()
        launcher.communicate(timeout=TIMEOUT)


def wait_started(launcher: subprocess.Popen[str]) -> list[str]:
    """Read the launcher's output until rank 0 says it started; return the lines read."""
    lines: list[str] = []
    assert launcher.stdout is not None
    for line in launcher.stdout:
        lines.append(line)
        if line.startswith("train: started"):
            return lines
    pytest.fail(f"train.py never started: {lines}")


def rank_pids(launcher: subprocess.Popen[str]) -> list[int]:
    """Return the pids of the launcher's rank processes (its children that run train.py)."""
    children = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split()
    return [
        int(pid)
        for pid in children
        if TRAIN in Path(f"/proc/{pid}/cmdline").read_bytes().decode().replace("\0", " ")
    ]


def saved_steps(checkpoint: Path) -> list[int]:
    """Return the step each of the 4 ranks saved."""
    import torch

    return [
        int(torch.load(checkpoint / f"rank{r}.pt", weights_only=True)["step"]) for r in range(4)
    ]


def finish(launcher: subprocess.Popen[str], lines: list[str]) -> str:
    """Wait for the launcher; return its whole output."""
    out, _ = launcher.communicate(timeout=TIMEOUT)
    return "".join(lines) + out


@pytest.mark.parametrize("sig", ["USR1", "USR2"])
def test_a_signal_to_one_rank_stops_every_rank_at_the_same_step(sig: str, tmp_path: Path) -> None:
    """Agreement: only rank 2 gets the warning; all 4 ranks save the same step and exit 0."""
    with start_train(*train_args(tmp_path, "--warning-signal", sig)) as launcher:
        lines = wait_started(launcher)
        ranks = rank_pids(launcher)
        assert len(ranks) == 4, ranks
        os.kill(sorted(ranks)[2], getattr(signal, f"SIG{sig}"))
        text = finish(launcher, lines)
        assert launcher.returncode == 0, text
    assert "train: stop requested; saved step" in text
    steps = saved_steps(tmp_path)
    assert len(set(steps)) == 1, steps
    assert 0 < steps[0] < 400, steps


def test_distenv_run_forwards_the_warning_to_every_rank(tmp_path: Path) -> None:
    """SIGUSR1 to `distenv run` (as `scancel --signal` sends it) reaches its ranks: all save."""
    with start_train(*train_args(tmp_path)) as launcher:
        lines = wait_started(launcher)
        launcher.send_signal(signal.SIGUSR1)
        text = finish(launcher, lines)
        assert launcher.returncode == 0, text
    assert len(set(saved_steps(tmp_path))) == 1


def test_sigterm_as_the_warning_is_forwarded_and_given_the_grace_period(tmp_path: Path) -> None:
    """TERM as warning signal: `distenv run --grace-period` lets the ranks save before SIGKILL."""
    args = train_args(tmp_path, "--warning-signal", "TERM")
    with start_train("--grace-period", "60", *args) as launcher:
        lines = wait_started(launcher)
        launcher.send_signal(signal.SIGTERM)
        text = finish(launcher, lines)
    assert "train: stop requested; saved step" in text, text
    assert "SIGKILL" not in text, text
    assert len(set(saved_steps(tmp_path))) == 1
