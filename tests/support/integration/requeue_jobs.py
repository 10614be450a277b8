"""Requeueing Slurm jobs of test_preemption.py: submit, watch, release from the hold, in background.

`Job` is one submitted job (or array element) of scripts/slurm's requeue templates on cluster
"one"; the conditions below poll ``scontrol show job``. `TimedJob` runs the one job that waits for
a real ``--time`` warning (about two minutes, mostly asleep) in a thread of its own, started early
in the session (tests/integration/conftest.py), so that its waiting overlaps the other tests.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.integration.helpers import JOB_NAME, REPO, SCRIPTS, Harness

# The fake GPUs of cluster "one" (4) are GPU placement's to test (test_templates.py): here two
# ranks per job without GPUs, so that the jobs run at once (and beside the other tests' jobs).
SMALL = ["--ntasks-per-node=2", "--cpus-per-task=1", "--gpus-per-task=0"]
WAIT_S = 180.0
SUMMARY = re.compile(r"^train: launcher=slurm world_size=2 steps=\d+ .*weights_identical=True$")
# The timed job's own name: a launch of another test killed at its timeout cancels every job named
# JOB_NAME on its cluster (helpers.cancel_jobs), which must not take this one with it.
TIMED_JOB_NAME = f"{JOB_NAME}-timed"


@dataclass
class Job:
    """One submitted job (or array element) and where its output goes."""

    label: str
    job: str  # what scontrol/scancel take: "1234" or "1233_0"
    output: Path
    env: Mapping[str, str]

    def text(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def show(self) -> dict[str, str]:
        """Return `scontrol show job` as a mapping ({} once the job is gone)."""
        done = subprocess.run(["scontrol", "-o", "show", "job", self.job], env=dict(self.env),
                              capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
        fields = (token.partition("=") for token in done.stdout.split())
        return {key: value for key, _, value in fields}


def wait_for(
    what: str, condition: Callable[[], bool], job: Job, timeout: float = WAIT_S, every: float = 0.25
) -> None:
    """Poll `condition` every `every` s until it holds; fail naming `what` and the job's output."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{job.label}: {what} within {timeout:g}s\n{job.show()}\n{job.text()}")
        time.sleep(every)


def submit(
    harness: Harness,
    script: str,
    label: str,
    options: list[str],
    *args: str,
    out: Path | None = None,
    name: str = JOB_NAME,
) -> Job:
    """Submit `script` from scripts/slurm unmodified; return the job (an array's element 0).

    Its output goes to `out`, by default a new folder of the harness.
    """
    out = out if out is not None else harness.outdir(label)
    array = any(o.startswith("--array") for o in options)
    argv = ["sbatch", "--parsable", "-J", name, "--chdir", str(REPO),
            "-o", f"{out}/job-%A_%a.out" if array else f"{out}/job-%j.out",
            f"--export=ALL,CHECKPOINT_ROOT={out},TRAIN=examples/train.py", *SMALL, *options,
            str(SCRIPTS / "slurm" / script), *args]  # fmt: skip
    env = harness.env("one")
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60,
                          check=True)  # fmt: skip
    job_id = done.stdout.strip().split(";")[0]
    if array:
        return Job(f"{label}_0", f"{job_id}_0", out / f"job-{job_id}_0.out", env)
    return Job(label, job_id, out / f"job-{job_id}.out", env)


def element(first: Job, index: int) -> Job:
    """Return element `index` of the array whose element 0 is `first`."""
    array = first.job.split("_")[0]
    output = first.output.with_name(f"job-{array}_{index}.out")
    return Job(f"array_{index}", f"{array}_{index}", output, first.env)


def requeued(job: Job) -> bool:
    info = job.show()
    return info.get("JobState") == "PENDING" and info.get("Restarts") == "1"


def finished(job: Job) -> bool:
    state = job.show().get("JobState")
    if state is None:
        # No record (an array element's, once done) or no answer under load: finished only if
        # its output says a run completed (a requeued run that has not restarted has no summary).
        return any(SUMMARY.match(line) for line in job.text().splitlines())
    return state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")


def released(job: Job) -> Callable[[], bool]:
    """Return a condition that releases `job` from its requeue hold, true once it runs again.

    The hold (Reason=BeginTime, about 120 s) is there for a reason: requeueing revokes the job's
    credential, and slurmd refuses a credential created in the same second as the revocation
    (slurmctld.log: "Killing non-startable batch JobId=N: Job credential revoked", and the job
    ends). So the job is released only 2 s after it was seen back in the queue, and again while
    it still waits for its begin time. The next allocation is longer, so that the timed job is
    not warned a second time.
    """
    seen: list[float] = []

    def condition() -> bool:
        info = job.show()
        if info.get("Restarts") == "1" and info.get("JobState") not in (None, "PENDING"):
            return True
        if info.get("JobState") == "PENDING" and info.get("Reason") == "BeginTime":
            seen.append(time.monotonic())
            if seen[-1] - seen[0] >= 2.0:
                scontrol(job, "update", f"JobId={job.job}", "StartTime=now", "TimeLimit=10",
                         check=False)  # fmt: skip
        time.sleep(0.5)
        return False

    return condition


def started(job: Job, step: int, restart: int) -> Callable[[], bool]:
    return lambda: f"train: started at step {step} (restart {restart})" in job.text()


def scontrol(job: Job, *args: str, check: bool = True) -> None:
    subprocess.run(["scontrol", *args], env=dict(job.env), capture_output=True, text=True,
                   timeout=30, check=check)  # fmt: skip


class TimedJob:
    """The job warned by Slurm itself (``--time=2 --signal=B:USR1@80``), driven in a thread.

    The warning is due 40 s after the start, but slurmctld checks time limits on its own ticks
    and may send it tens of seconds later, and the resumed run takes about a minute: two minutes
    or more, almost all of it asleep, which the session spends on other tests. Its 2 ranks import
    torch twice (start, restart) and use 2 of cluster one's 8 CPUs, shared (OverSubscribe=FORCE:4,
    no GPUs), so other tests' jobs start beside it.
    """

    def __init__(self, harness: Harness, checkpoint: Path) -> None:
        self.checkpoint = checkpoint
        self.error: BaseException | None = None
        # 150 steps of 0.7 s: long enough to be warned in (the warning may come late), and the
        # ranks have time to import torch on a busy machine and watch the signal first.
        self.job = submit(harness, "requeue.sbatch", "timed", ["--time=2", "--signal=B:USR1@80"],
                          "--checkpoint", str(checkpoint), "--steps", "150", "--step-time", "0.7",
                          name=TIMED_JOB_NAME)  # fmt: skip
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drive, name="timed-requeue", daemon=True)
        self._thread.start()

    def _drive(self) -> None:
        job = self.job
        conditions = [
            ("the job was not requeued", lambda: requeued(job)),
            ("the requeued job did not restart", released(job)),
            ("the job did not finish", lambda: finished(job)),
        ]
        try:
            for what, condition in conditions:
                # A poll a second is quick enough to release it 2 s into its 120 s hold.
                wait_for(what, self._unless_cancelled(condition), job, every=1.0)
        except BaseException as exc:  # pytest.fail raises a BaseException; the test re-raises it
            self.error = exc

    def _unless_cancelled(self, condition: Callable[[], bool]) -> Callable[[], bool]:
        return lambda: self._stop.is_set() or condition()

    def result(self) -> Job:
        """Wait for the thread (each of its waits is bounded); raise what failed in it."""
        self._thread.join(timeout=4 * WAIT_S)
        if self._thread.is_alive():
            pytest.fail(f"timed: still being driven after {4 * WAIT_S:g}s\n{self.job.text()}")
        if self.error is not None:
            raise self.error
        return self.job

    def cancel(self) -> None:
        """Stop driving the job and cancel it if it still runs (JOB_NAME clean-ups skip it)."""
        self._stop.set()
        subprocess.run(["scancel", self.job.job], env=dict(self.job.env), capture_output=True,
                       timeout=30, check=False)  # fmt: skip
        self._thread.join(timeout=WAIT_S)
