"""``distenv run --log-dir`` with torchrun's --redirects, --tee and --local-ranks-filter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import scrubbed_environ

REPO = Path(__file__).resolve().parents[2]
SAID = str(REPO / "tests" / "support" / "scripts" / "said_rank.py")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = scrubbed_environ()
    env.pop("OMP_NUM_THREADS", None)
    return subprocess.run(
        [sys.executable, "-m", "distenv", *args],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_log_dir_keeps_each_rank_and_why_names_the_failure(tmp_path: Path) -> None:
    """--log-dir: each rank's two streams in rank-N.log, its record in rank-N.report; with
    --redirects 0:3 local rank 0 is off the console; `distenv why DIR` names rank 1's raise."""
    logs = tmp_path / "logs"
    done = _run(
        "run", "-n", "2", "--log-dir", str(logs), "--redirects", "0:3", SAID, "--raise", "1"
    )
    assert done.returncode == 1, done.stderr
    # One line on each stream: two pipes, read in their own time.
    assert sorted((logs / "rank-0.log").read_text().splitlines()) == [
        "err of rank 0",
        "out of rank 0",
    ]
    assert "ValueError: rank 1 gave up" in (logs / "rank-1.log").read_text()
    assert (logs / "rank-0.report").read_bytes() == b""  # ended with status 0
    assert "out of rank 0" not in done.stdout
    assert "err of rank 0" not in done.stderr
    assert "out of rank 1" in done.stdout
    assert "distenv run: rank 1 failed first: raised ValueError: rank 1 gave up" in done.stderr
    why = _run("why", str(logs))
    assert why.returncode == 0, why.stderr
    card = why.stdout.splitlines()
    assert (
        card[0]
        == "distenv why: rank 1 failed first: raised ValueError: rank 1 gave up (exit status 1)"
    )
    assert " of 2, local rank 1 on " in card[1], card
    assert card[2].startswith("  where:   said_rank.py:"), card
    assert "in give_up: raise ValueError" in card[2], card
    assert "  others:  rank 0 had finished" in card, card


def test_local_ranks_filter_and_tee(tmp_path: Path) -> None:
    """--local-ranks-filter 1 shows rank 1 only; --tee 3 over --redirects 3 shows both streams."""
    done = _run("run", "-n", "2", "--local-ranks-filter", "1", SAID)
    assert done.returncode == 0, done.stderr
    assert "out of rank 0" not in done.stdout
    assert "out of rank 1" in done.stdout
    logs = tmp_path / "logs"
    done = _run("run", "-n", "2", "--log-dir", str(logs), "-r", "3", "-t", "0:3", SAID)
    assert done.returncode == 0, done.stderr
    assert "out of rank 0" in done.stdout  # teed
    assert "out of rank 1" not in done.stdout  # redirected
    assert "out of rank 1" in (logs / "rank-1.log").read_text()


def test_redirects_need_a_log_dir() -> None:
    """--redirects without --log-dir is refused in one line naming the option and the fix."""
    done = _run("run", "-n", "2", "--redirects", "3", SAID)
    assert done.returncode == 1
    assert "--redirects needs --log-dir" in done.stderr
    assert "Hint: add --log-dir DIR" in done.stderr
    done = _run("run", "-n", "2", "--log-dir", "x", "--tee", "0:7", SAID)
    assert done.returncode == 2
    assert "'7' in '0:7' is not 0 (none), 1 (stdout), 2 (stderr) or 3 (both)" in done.stderr


def test_a_killed_rank_is_named_first_with_a_log_dir(tmp_path: Path) -> None:
    """--log-dir: rank 1 SIGKILLed while rank 0 sleeps is the card's first failure (the fault
    files' first line, who the rank is, is no crash); rank 0 is stopped, both logs kept."""
    logs = tmp_path / "logs"
    done = _run("run", "-n", "2", "--log-dir", str(logs), SAID, "--kill", "1")
    assert done.returncode == 137, done.stderr
    assert "distenv run: rank 1 failed first: was killed by SIGKILL" in done.stderr
    assert "rank 0 stopped by distenv run" in done.stderr
    assert (logs / "rank-0.fault").read_text().startswith("distenv: rank 0, local rank 0, pid ")
    assert "out of rank 1" in (logs / "rank-1.log").read_text()
