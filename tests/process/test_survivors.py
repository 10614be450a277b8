"""`distenv run` leaves no survivor: daemonized grandchildren end with the run and are reaped.

Real processes: ``python -m distenv run`` runs under tests/support/scripts/leftovers.py, a child subreaper
that reports every process the run left behind (alive, or a zombie it did not reap), and its ranks
are tests/support/scripts/rank_child.py, whose ``--escape`` daemonizes a sleeper (fork, setsid, fork) out of
the rank's process group and session.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.process.test_run import CHILD, REPO, TIMEOUT, gone, launcher_env, pids, wait_for
from tests.support.scripts.rank_child import ESCAPEE

LEFTOVERS = str(Path(__file__).resolve().parents[1] / "support" / "scripts" / "leftovers.py")


def run_watched(
    out: Path,
    args: Sequence[str],
    *,
    ready: Callable[[], bool] | None = None,
    check: Callable[[int], None] | None = None,
    signum: int | None = None,
) -> tuple[dict[str, Any], str, float]:
    """Run ``distenv run ARGS`` under leftovers.py; once `ready()` holds, call `check` with its
    pid, then send it `signum`.

    Returns:
        The report (status, what was left), distenv run's stderr, and the seconds from its start (or
        from the signal) to its exit.
    """
    report = out / "leftovers.json"
    started = time.monotonic()
    watcher = subprocess.Popen(
        [sys.executable, LEFTOVERS, str(report), sys.executable, "-m", "distenv", "run", *args],
        env=launcher_env(),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        if ready is not None:
            wait_for(lambda: report.with_suffix(".pid").exists() and ready())
            launcher = int(report.with_suffix(".pid").read_text())
            if check is not None:
                check(launcher)
            if signum is not None:
                os.kill(launcher, signum)
                started = time.monotonic()
        _, stderr = watcher.communicate(timeout=TIMEOUT)
    finally:
        if watcher.poll() is None and report.with_suffix(".pid").exists():
            # SIGKILL distenv run: the watcher then reports, and ends whatever it left behind.
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(report.with_suffix(".pid").read_text()), signal.SIGKILL)
        watcher.communicate(timeout=TIMEOUT)
    found: dict[str, Any] = json.loads(report.read_text())
    return found, stderr, found["ended"] - started


def escapees(out: Path, count: int) -> list[int]:
    """Return the escaped sleepers' pids, checking that all `count` of them were started."""
    found = pids(out, "epid")
    assert len(found) == count, f"expected {count} escaped sleepers, found {found}"
    return found


@pytest.mark.parametrize(
    ("options", "grace", "low", "high"),
    [([], "10", 0, 8), (["--escape-ignore-term"], "1", 1, 10)],
    ids=["sigterm", "ignores-sigterm"],
)
def test_escaped_grandchild_ends_with_a_normal_run(
    tmp_path: Path, options: list[str], grace: str, low: float, high: float
) -> None:
    """After the ranks exit 0, their daemonized sleepers get SIGTERM (SIGKILL after the grace
    period) and are reaped before distenv run exits 0: nothing alive, no zombie."""
    args = ["-n", "2", "--grace-period", grace, CHILD, str(tmp_path), "--escape", *options]
    report, stderr, elapsed = run_watched(tmp_path, args)
    assert report["status"] == 0, stderr
    assert report["left"] == [], stderr
    assert all(gone(pid) for pid in escapees(tmp_path, 2))
    assert low <= elapsed < high, stderr
    assert ("sent SIGKILL" in stderr) == bool(options), stderr


def test_escaped_grandchild_ends_when_the_run_gets_sigterm(tmp_path: Path) -> None:
    """SIGTERM to distenv run ends the ranks and their daemonized sleepers, well within the grace
    period, and it exits 143 with nothing left."""
    args = ["-n", "2", "--grace-period", "10", CHILD, str(tmp_path), "--escape", "--sleep", "60"]
    report, stderr, elapsed = run_watched(
        tmp_path,
        [*args, "--on-signal"],
        ready=lambda: len(pids(tmp_path)) == 2 and len(pids(tmp_path, "epid")) == 2,
        signum=signal.SIGTERM,
    )
    assert report["status"] == 128 + signal.SIGTERM, stderr
    assert report["left"] == [], stderr
    assert all(gone(pid) for pid in escapees(tmp_path, 2))
    assert elapsed < 8, stderr


def test_rank_status_survives_adopted_orphans(tmp_path: Path) -> None:
    """A rank that exits 3 while orphans exist keeps its status: distenv run names status 3 for
    that rank in its card and exits 3. Rank 1 leaves a zombie orphan just before it exits, and with a 1 s
    monitor interval every poll reads /proc first, so a reaper that waited for any child
    (``waitpid(-1)``) would take rank 1's status there and Popen would report 0."""
    args = ["-n", "2", "--grace-period", "10", "--monitor-interval", "1", CHILD, str(tmp_path)]
    # Rank 0 sleeps less than TIMEOUT: with a stolen status, nobody would stop it.
    escape = ["--escape", "--end-escapee", "--fail-rank", "1", "--sleep", "20"]
    report, stderr, elapsed = run_watched(tmp_path, [*args, *escape])
    assert report["status"] == 3, stderr
    rank1 = pids(tmp_path)[1]
    assert "distenv run: rank 1 failed first: exited with status 3 (SystemExit: 3)" in stderr
    assert f"pid {rank1}," in stderr
    assert report["left"] == [], stderr
    assert all(gone(pid) for pid in escapees(tmp_path, 2))
    assert elapsed < 8, stderr


def zombies_of(parent: int) -> list[int]:
    """Return the zombie children of `parent`."""
    found = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            stat = stat_file.read_bytes()
        except OSError:
            continue
        state, ppid = stat[stat.rfind(b")") + 2 :].split()[:2]
        if state == b"Z" and int(ppid) == parent:
            found.append(int(stat_file.parent.name))
    return found


def test_orphans_that_exit_are_reaped_while_ranks_run(tmp_path: Path) -> None:
    """Adopted orphans that exit while the ranks still run are reaped within seconds, not at the
    end of the job: no zombie piles up under distenv run."""
    reaped: list[float] = []

    def check(launcher: int) -> None:
        sleepers = escapees(tmp_path, 2)
        started = time.monotonic()
        wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in sleepers), timeout=5)
        reaped.append(time.monotonic() - started)
        assert zombies_of(launcher) == []
        assert all(Path(f"/proc/{pid}").exists() for pid in pids(tmp_path))  # ranks still run

    args = [CHILD, str(tmp_path), "--escape", "--escape-for", "0.5", "--on-signal", "--sleep", "60"]
    report, stderr, _ = run_watched(
        tmp_path,
        ["-n", "2", *args],
        ready=lambda: len(pids(tmp_path)) == 2 and len(pids(tmp_path, "epid")) == 2,
        check=check,
        signum=signal.SIGTERM,
    )
    assert report["status"] == 128 + signal.SIGTERM, stderr
    assert report["left"] == [], stderr
    # 0.5 s of sleep, then one reaping interval at most.
    (seconds,) = reaped
    assert seconds < 3


def test_sigkilled_run_leaves_its_daemons_to_the_scheduler(tmp_path: Path) -> None:
    """The documented limit: a SIGKILLed distenv run runs no more code, so its daemonized
    grandchildren survive it (re-parented to the nearest subreaper, here the watcher); the ranks'
    own end is pinned by test_run.test_sigkilled_launcher_leaves_no_process."""
    args = ["-n", "2", CHILD, str(tmp_path), "--escape", "--sleep", "60"]
    report, _, elapsed = run_watched(
        tmp_path,
        args,
        ready=lambda: len(pids(tmp_path)) == 2 and len(pids(tmp_path, "epid")) == 2,
        signum=signal.SIGKILL,
    )
    assert report["status"] == -signal.SIGKILL
    survivors = {p["pid"] for p in report["left"] if ESCAPEE in p["argv"] and p["state"] != "Z"}
    assert survivors == set(escapees(tmp_path, 2))
    assert elapsed < 5
