"""The hang autopsy of ``distenv run --hang-timeout``: the rank whose stack differs, named in time.

Real 4-rank jobs of tests/support/scripts/hang_rank.py (gloo all_reduce loops) under
``distenv run -n 4 --hang-timeout 3``: a rank that sleeps in its own code while the others wait
in the all_reduce, a rank that skips one all_reduce (and waits in the final barrier while the
others wait in the loop's last all_reduce), a loop whose slow steps sit on one line (not a hang),
and SIGUSR1 to distenv run (a dump on demand, nothing stopped). The scenarios run concurrently in
one module fixture, so that they cost the CI about one job's time.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import scrubbed_environ
from tests.process.test_run import gone

REPO = Path(__file__).resolve().parents[2]
RANK = str(REPO / "tests" / "support" / "scripts" / "hang_rank.py")
#: A job to its end on a loaded 2-core machine: four `import torch`, the loop, the stop.
TIMEOUT = 150.0
#: The hang timeout of every scenario.
HANG_S = 3.0
#: From the hang to distenv run's exit, beyond the hang timeout: the promise is 10 s.
NAMED_S = 10.0
#: The line budget of a hung 4-rank job: everything distenv run and its ranks print.
BUDGET = 25
SCENARIOS = {
    # name: the hang_rank.py --hang value (rank:step:mode)
    "sleep": "2:5:sleep",
    "skip": "1:5:skip",
    "slow": "0:0:slow",
    "usr1": "0:0:none",
}


@dataclass
class Job:
    """One scenario: its distenv run, its output and its folder."""

    out: Path
    agent: subprocess.Popen[str]
    text: str = ""
    ended: float = 0.0
    ranks_alive_after_usr1: bool = False

    def pids(self) -> list[int]:
        return [int(p.read_text()) for p in self.out.glob("pid*")]

    def started(self) -> float:
        """Return when the hang began: when the last rank entered the collective it stays in
        (the fault's time where no rank entered one after it: a sleeping rank enters none)."""
        times = [float(p.read_text()) for p in self.out.glob("entered-*")]
        return max([float((self.out / "fault").read_text()), *times])


def _start(tmp: Path, name: str) -> Job:
    out = tmp / name
    out.mkdir()
    env = scrubbed_environ()
    env.pop("OMP_NUM_THREADS", None)
    env["DISTENV_TIMEOUT"] = "60"
    command = [sys.executable, "-m", "distenv", "run", "-n", "4", "--hang-timeout", str(HANG_S)]
    agent = subprocess.Popen(
        [*command, RANK, str(out), "--hang", SCENARIOS[name]],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return Job(out, agent)


def _dump_on_demand(job: Job, deadline: float) -> None:
    """Once every rank runs its loop past the hang timeout, SIGUSR1 distenv run; then stop it."""
    while len(job.pids()) < 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(HANG_S + 1)  # training that goes on is not a hang
    job.agent.send_signal(signal.SIGUSR1)
    time.sleep(2)
    job.ranks_alive_after_usr1 = len(job.pids()) == 4 and not any(map(gone, job.pids()))
    job.agent.send_signal(signal.SIGTERM)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Job]]:
    """Run every scenario at once; return each one's output once its distenv run exited."""
    tmp = tmp_path_factory.mktemp("hang")
    started = {name: _start(tmp, name) for name in SCENARIOS}
    deadline = time.monotonic() + TIMEOUT
    try:
        _dump_on_demand(started["usr1"], deadline)
        for job in started.values():
            job.text, _ = job.agent.communicate(timeout=max(1.0, deadline - time.monotonic()))
            job.ended = time.time()
        yield started
    finally:
        for job in started.values():
            if job.agent.poll() is None:
                job.agent.kill()
                job.agent.communicate()


def _hung(job: Job) -> str:
    """Assert what every hang card says; return the card."""
    assert job.agent.returncode == 124, job.text
    card = job.text[job.text.index("distenv run: the job hung: ") :]
    first = rf"\n  first:   rank \d made no progress for {HANG_S:g} s, since [0-9:]+, at hang_rank"
    assert re.search(first, card), job.text
    assert "exit status 124, as timeout(1)" in card, job.text
    # DISTENV_HANG_TIMEOUT reaches init_dist too: its in-process autopsy stays out of the way.
    assert "distenv: the job hung" not in job.text, job.text
    assert len(job.text.splitlines()) <= BUDGET, job.text
    assert len(job.pids()) == 4, job.text
    assert all(gone(pid) for pid in job.pids()), job.text
    return card


def test_a_rank_that_sleeps_while_the_others_all_reduce_is_named(jobs: dict[str, Job]) -> None:
    """Rank 2 sleeps in its own code: named with its frame; the others wait in all_reduce."""
    job = jobs["sleep"]
    card = _hung(job)
    assert card.startswith("distenv run: the job hung: rank 2's stack differs from the other")
    assert re.search(r"differs: rank 2 at hang_rank\.py:\d+ in train: time\.sleep\(600\)", card)
    majority = r"others:  ranks 0-1,3 waiting in all_reduce at hang_rank\.py:\d+ in train"
    assert re.search(majority, card), job.text
    assert job.ended - job.started() < HANG_S + NAMED_S, job.text


def test_a_rank_that_skipped_an_all_reduce_is_named(jobs: dict[str, Job]) -> None:
    """Rank 1 skipped one all_reduce: it waits in the final barrier, the others in the loop."""
    job = jobs["skip"]
    card = _hung(job)
    assert card.startswith("distenv run: the job hung: rank 1's stack differs from the other")
    assert re.search(r"differs: rank 1 waiting in barrier at hang_rank\.py:\d+ in finish", card)
    majority = r"others:  ranks 0,2-3 waiting in all_reduce at hang_rank\.py:\d+ in train"
    assert re.search(majority, card), job.text
    # From when the last rank blocked: rank 1 in the barrier, the others in their last all_reduce.
    assert job.ended - job.started() < HANG_S + NAMED_S, job.text


def test_steps_slower_than_a_sample_on_one_line_are_no_hang(jobs: dict[str, Job]) -> None:
    """1.6 s steps spent on one line, under a 3 s hang timeout: the job runs to its end."""
    job = jobs["slow"]
    assert job.agent.returncode == 0, job.text
    assert "hung" not in job.text, job.text


def test_sigusr1_dumps_every_rank_s_stack_without_stopping_them(jobs: dict[str, Job]) -> None:
    """SIGUSR1 to distenv run: the ranks' grouped stacks are printed; they go on until SIGTERM."""
    job = jobs["usr1"]
    assert job.ranks_alive_after_usr1, job.text
    assert job.agent.returncode == 128 + signal.SIGTERM, job.text
    assert "distenv run: SIGUSR1: the stacks of 4 of 4 local ranks (ranks 0-3)" in job.text
    # Caught mid-loop, the ranks may sit on two lines in equal numbers: then each group is a
    # "stack:" (no majority).
    assert re.search(
        r"(all|others|differs|stack): +ranks? [0-9,-]+ .*hang_rank\.py:\d+ in train", job.text
    ), job.text
    assert "hung" not in job.text, job.text
    folder = re.findall(r"stacks: +(\S+)/rank-N\.fault", job.text)[0]
    assert "Thread 0x" in (Path(folder) / "rank-0.fault").read_text()
    assert all(gone(pid) for pid in job.pids()), job.text


def test_a_bad_hang_timeout_is_refused_naming_it(tmp_path: Path) -> None:
    """$DISTENV_HANG_TIMEOUT that is not seconds: one line naming it, before any rank starts."""
    env = {**scrubbed_environ(), "DISTENV_HANG_TIMEOUT": "soon"}
    result = subprocess.run(
        [sys.executable, "-m", "distenv", "run", "-n", "2", RANK, str(tmp_path), "--hang", "x"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert "$DISTENV_HANG_TIMEOUT is 'soon', expected a positive number of seconds" in result.stderr
    assert "Hint:" in result.stderr
    assert not list(tmp_path.iterdir())
    assert os.environ.get("DISTENV_HANG_TIMEOUT") is None


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--hang-timeout", "3", "--no-python"], "--hang-timeout needs Python ranks"),
        (["--max-restarts", "1"], "$DISTENV_HANG_TIMEOUT does not work with --max-restarts yet"),
    ],
)
def test_a_hang_timeout_without_a_watchdog_is_refused(
    tmp_path: Path, options: list[str], named: str
) -> None:
    """--no-python ranks have no watchdog; --max-restarts does not take a hang yet: refused."""
    env = {**scrubbed_environ(), "DISTENV_HANG_TIMEOUT": "3"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "distenv",
            "run",
            "-n",
            "2",
            *options,
            RANK if "--no-python" not in options else "true",
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert named in result.stderr, result.stderr
    assert "Hint: drop one" in result.stderr, result.stderr
