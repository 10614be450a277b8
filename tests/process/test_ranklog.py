"""A rank's log folder (distenv.postmortem.ranklog) and ``distenv why`` on it, one process per end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from distenv.postmortem.ranklog import HEAD, TAIL

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "support" / "scripts" / "log_rank.py"


def _run(tmp_path: Path, mode: str) -> tuple[subprocess.CompletedProcess[str], Path, list[str]]:
    logs = tmp_path / "logs"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(logs), mode],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    why = subprocess.run(
        [sys.executable, "-m", "distenv", "why", str(logs)],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert why.returncode == 0, why.stderr
    return done, logs, why.stdout.splitlines()


def test_exception_is_recorded_and_named(tmp_path: Path) -> None:
    """init_dist(log_dir=): the traceback is in the log, still on stderr, and why names the frame."""
    done, logs, card = _run(tmp_path, "raise")
    assert done.returncode == 1
    assert "ValueError: bad batch at step 3" in done.stderr  # still where it went before
    log = (logs / "rank-0.log").read_text()
    assert log.startswith("out line\nerr line\n")
    assert "ValueError: bad batch" in log
    assert card[0] == (
        "distenv why: rank 0 failed first: raised ValueError: bad batch at step 3 (exit status 1)"
    ), card
    assert card[2].startswith("  where:   log_rank.py:"), card
    assert "in fail: raise ValueError" in card[2], card
    assert "  output:  out line" in card, card


def test_exit_status_is_kept(tmp_path: Path) -> None:
    """sys.exit(3): the rank still ends with 3, and its record says so."""
    done, _, card = _run(tmp_path, "exit3")
    assert done.returncode == 3
    assert card[0] == "distenv why: rank 0 failed first: exited with status 3 (SystemExit: 3)", card


def test_segfault_leaves_its_stack(tmp_path: Path) -> None:
    """SIGSEGV: the output before it is in the log, the crash's frame in the card."""
    done, logs, card = _run(tmp_path, "segv")
    assert done.returncode == -11
    assert (logs / "rank-0.log").read_text() == "out line\nerr line\n"
    assert (
        card[0]
        == "distenv why: rank 0 failed first: was killed by SIGSEGV (a crash in native code)"
    )
    assert card[2].startswith("  where:   log_rank.py:"), card
    assert "in main: os.kill" in card[2], card


def test_sigkill_leaves_the_log_and_no_record(tmp_path: Path) -> None:
    """SIGKILL: nothing can be written then; the log holds the output, why says no record."""
    done, logs, card = _run(tmp_path, "kill")
    assert done.returncode == -9
    assert (logs / "rank-0.log").read_text() == "out line\nerr line\n"
    assert not (logs / "rank-0.report").exists()
    assert card[0] == "distenv why: no rank recorded a failure", card
    assert card[1].startswith("  silent:  rank 0 left no record"), card


def test_a_muted_console_gets_nothing_more_and_the_log_keeps_it(tmp_path: Path) -> None:
    """A hung job's end: the card reaches the console and the log at once; once muted, what the
    rank prints (a broken collective's traceback) goes to the log only, not over the card."""
    done, logs, _ = _run(tmp_path, "mute")
    assert done.returncode == 1
    assert done.stdout == "out line\n"
    assert done.stderr == "err line\ncard\n"
    log = (logs / "rank-0.log").read_text()
    assert "card\nmuted out\n" in log.replace("err line\n", "")
    assert "ValueError: bad batch at step 3" in log


def test_log_is_bounded_to_its_head_and_tail(tmp_path: Path) -> None:
    """20 MB of output: the log keeps the first and last lines, at most HEAD + 2 TAIL bytes."""
    done, logs, card = _run(tmp_path, "big")
    assert done.returncode == 0
    assert done.stdout.count("\n") == 200_000 + 1  # the console lost nothing
    log = (logs / "rank-0.log").read_bytes()
    assert len(log) <= HEAD + 2 * TAIL + 200
    assert log.startswith(b"out line\n")  # stderr's line: its own pipe, read in its own time
    assert b"err line\n" in log[:HEAD]
    assert b"\n000000000 " in log[:HEAD]
    assert log.endswith(b"000199999 " + b"x" * 90 + b"\n")
    assert b"bytes of this rank's output skipped here]" in log
    assert card[0] == "distenv why: every rank (1) ended with status 0", card


def test_a_log_dir_that_cannot_be_made_is_refused(tmp_path: Path) -> None:
    """$DISTENV_LOG_DIR under a file: init_dist refuses it in one line naming it and why."""
    (tmp_path / "train.py").write_text("")
    bad = tmp_path / "train.py" / "logs"
    env = {**os.environ, "PYTHONPATH": str(REPO), "DISTENV_LOG_DIR": str(bad)}
    done = subprocess.run(
        [sys.executable, "-c", "import distenv; distenv.init_dist('none')"],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert (
        f"init: $DISTENV_LOG_DIR is {str(bad)!r}: cannot create or write it (Not a directory). "
        "Hint: pass a folder this user can write on every node"
    ) in done.stderr
