"""The hang autopsy of ``init_dist(hang_timeout=)`` under srun and mpirun: no distenv run in sight.

Real 4-rank jobs of tests/support/scripts/hang_rank.py (gloo all_reduce loops) with
``DISTENV_HANG_TIMEOUT=2``: ``srun -N2 --ntasks-per-node 2`` on the simulated cluster "multi" and
``mpirun.openmpi -np 4``, each with a rank that sleeps in its own code while the others wait in
the all_reduce, and a rank that skips one all_reduce (it waits in the final barrier while the
others wait in the loop's last all_reduce). Each asserts that rank 0's card names the diverging
rank and its user frame within the hang timeout + 10 s of the fault, the launcher's exit status
(124, every rank's), the line budget, that no rank survives, and with ``DISTENV_LOG_DIR`` each
rank's dump in ``DIR/rank-N.fault``; and a job that does not hang ends 0 under the watch, its
hang threads out of the way of the exit. The jobs run at once: about one job's time.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from distenv.local.dumps import main_stack
from distenv.master import free_port
from tests.process.test_run import gone
from tests.support.integration.helpers import (
    JOB_NAME,
    OMPI,
    PYTHON,
    REPO,
    TORCHRUN,
    Harness,
    Result,
)

RANK = str(REPO / "tests" / "support" / "scripts" / "hang_rank.py")
#: The hang timeout of every job: small, so the file costs the CI little.
HANG_S = 2.0
#: From the hang to the launcher's exit, beyond the hang timeout: the promise is 10 s.
NAMED_S = 10.0
#: How long after the launcher exited its ranks may still be ending (`_all_gone`).
EXIT_GRACE_S = 5.0
#: Everything a hung 4-rank job prints, the launcher's own lines included (mpirun's abort: 13).
BUDGET = 25
LAUNCHERS = {
    "srun": ["srun", "-J", JOB_NAME, "-N", "2", "--ntasks-per-node", "2", PYTHON],
    "mpirun": [*OMPI, "--oversubscribe", "-np", "4", PYTHON],
    "torchrun": [TORCHRUN, "--nproc-per-node", "4"],  # runs the script with its own interpreter
}
#: The hang_rank.py --hang value of each job; "done" never reaches its fault step: the job ends.
SCENARIOS = {"sleep": "2:5:sleep", "skip": "1:5:skip", "done": "0:99:sleep"}
JOBS = [
    ("srun", "sleep"),
    ("srun", "skip"),
    ("mpirun", "sleep"),
    ("mpirun", "skip"),
    ("mpirun", "done"),
    ("torchrun", "sleep"),
]


@dataclass
class Job:
    """One launch: its result, its folder, and when the launcher had exited."""

    result: Result
    out: Path
    ended: float

    def started(self) -> float:
        """Return when the hang began: when the last rank entered the collective it stays in
        (the fault's time where no rank entered one after it: a sleeping rank enters none)."""
        times = [float(p.read_text()) for p in self.out.glob("entered-*")]
        return max([float((self.out / "fault").read_text()), *times])

    def pids(self) -> list[int]:
        return [int(p.read_text()) for p in self.out.glob("pid*")]


def _launch(harness: Harness, launcher: str, scenario: str) -> Job:
    out = harness.outdir(f"hang-{launcher}-{scenario}")
    extra = {"DISTENV_HANG_TIMEOUT": str(HANG_S), "DISTENV_TIMEOUT": "60"}
    if scenario == "skip":
        extra["DISTENV_LOG_DIR"] = str(out / "logs")
    argv = [*LAUNCHERS[launcher], RANK, str(out), "--hang", SCENARIOS[scenario]]
    if launcher == "torchrun":  # init_dist's argument, in place of the variable
        del extra["DISTENV_HANG_TIMEOUT"]
        argv[1:1] = ["--master-port", str(free_port())]
        argv += ["--hang-timeout", str(HANG_S)]
    cluster = "multi" if launcher == "srun" else None
    env = harness.env(cluster, ompi=launcher == "mpirun", extra=extra)
    result = harness.start(argv, cluster=cluster, env=env, timeout=150).wait()
    return Job(result, out, time.time())


@pytest.fixture(scope="module")
def jobs(harness: Harness) -> Iterator[dict[str, Future[Job]]]:
    """Start every job at once; each test waits for its own."""
    with ThreadPoolExecutor(len(JOBS)) as pool:
        yield {f"{run}-{what}": pool.submit(_launch, harness, run, what) for run, what in JOBS}


def _all_gone(pids: list[int]) -> bool:
    """Return whether every one of `pids` has exited, allowing `EXIT_GRACE_S` after the launcher.

    mpirun, aborting the job on the first rank's status, may return once it sent the others
    SIGTERM, while the kernel still frees a rank's memory (torch's) on a loaded machine.
    """
    deadline = time.monotonic() + EXIT_GRACE_S
    while not all(gone(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _hung(job: Job, status: int = 124, budget: int | None = BUDGET) -> str:
    """Assert what every hang card and job end say; return the card."""
    result = job.result
    assert result.returncode == status, result.text
    text = result.stdout + result.stderr
    assert text.count("distenv: the job hung: ") == 1, result.text
    start = text.index("distenv: the job hung: ")
    end = text.find("as timeout(1)", start)
    assert end > 0, result.text
    card = text[start : end + len("as timeout(1)")]  # the card is one write: no line between
    first = (
        rf"\n  first:   rank \d on \S+ made no progress for {HANG_S:g} s, since [0-9:]+, at hang_"
    )
    assert re.search(first, card), result.text
    assert card.endswith(
        "  stopped: every rank that answered ends itself with status 124, as timeout(1)"
    )
    assert "no dump" not in card, result.text  # every rank answered
    if budget is not None:
        assert len(text.splitlines()) <= budget, result.text
    assert len(job.pids()) == 4, result.text
    assert _all_gone(job.pids()), result.text
    return card


def _sleeper_named(job: Job, status: int = 124, budget: int | None = BUDGET) -> None:
    card = _hung(job, status, budget)
    assert card.startswith("distenv: the job hung: rank 2's stack differs from the other ranks'")
    assert re.search(r"differs: rank 2 at hang_rank\.py:\d+ in train: time\.sleep\(600\)", card)
    majority = r"others:  ranks 0-1,3 waiting in all_reduce at hang_rank\.py:\d+ in train"
    assert re.search(majority, card), job.result.text
    assert job.ended - job.started() < HANG_S + NAMED_S, job.result.text


def _skipper_named(job: Job) -> None:
    card = _hung(job)
    assert card.startswith("distenv: the job hung: rank 1's stack differs from the other ranks'")
    assert re.search(r"differs: rank 1 waiting in barrier at hang_rank\.py:\d+ in finish", card)
    majority = r"others:  ranks 0,2-3 waiting in all_reduce at hang_rank\.py:\d+ in train"
    assert re.search(majority, card), job.result.text
    # From when the last rank blocked: rank 1 in the barrier, the others in their last all_reduce.
    assert job.ended - job.started() < HANG_S + NAMED_S, job.result.text
    assert f"stacks:  {job.out}/logs/rank-N.fault hold every thread's stack" in card
    for rank, function in ((0, "all_reduce"), (1, "barrier"), (2, "all_reduce"), (3, "all_reduce")):
        dump = (job.out / "logs" / f"rank-{rank}.fault").read_bytes()
        assert main_stack(dump)[0][2] == function, dump.decode(errors="replace")


@pytest.mark.slurm
def test_srun_a_rank_that_sleeps_while_the_others_all_reduce_is_named(
    jobs: dict[str, Future[Job]],
) -> None:
    """srun -N2: rank 2 (on n2) sleeps in its own code; rank 0's card names it, all end 124."""
    _sleeper_named(jobs["srun-sleep"].result())


@pytest.mark.slurm
def test_srun_a_rank_that_skipped_an_all_reduce_is_named(jobs: dict[str, Future[Job]]) -> None:
    """srun -N2: rank 1 skipped one all_reduce; each rank's dump lands in DISTENV_LOG_DIR."""
    _skipper_named(jobs["srun-skip"].result())


@pytest.mark.mpi
def test_mpirun_a_rank_that_sleeps_while_the_others_all_reduce_is_named(
    jobs: dict[str, Future[Job]],
) -> None:
    """mpirun -np 4: rank 2 sleeps in its own code; the card names it, mpirun exits 124."""
    _sleeper_named(jobs["mpirun-sleep"].result())


@pytest.mark.mpi
def test_mpirun_a_rank_that_skipped_an_all_reduce_is_named(jobs: dict[str, Future[Job]]) -> None:
    """mpirun -np 4: rank 1 skipped one all_reduce; each rank's dump lands in DISTENV_LOG_DIR."""
    _skipper_named(jobs["mpirun-skip"].result())


@pytest.mark.mpi
def test_mpirun_a_job_that_does_not_hang_ends_cleanly_under_the_watch(
    jobs: dict[str, Future[Job]],
) -> None:
    """mpirun -np 4 with DISTENV_HANG_TIMEOUT: 30 steps, then exit 0; no card, no abort."""
    job = jobs["mpirun-done"].result()
    assert job.result.returncode == 0, job.result.text
    text = job.result.stdout + job.result.stderr
    assert "hung" not in text, job.result.text
    assert "terminate called" not in text, job.result.text
    assert _all_gone(job.pids()), job.result.text


def test_torchrun_a_rank_that_sleeps_is_named_by_init_dist_s_argument(
    jobs: dict[str, Future[Job]],
) -> None:
    """torchrun --nproc-per-node 4 with init_dist(hang_timeout=2): rank 2 named; torchrun ends
    the job at once (its own status 1, its ChildFailedError naming exitcode 124)."""
    job = jobs["torchrun-sleep"].result()
    _sleeper_named(job, status=1, budget=None)  # torchrun prints ~60 lines of its own
    assert "failed (exitcode: 124)" in job.result.stderr, job.result.text
