"""End to end on the real Slurm: warned jobs save, requeue themselves and resume (issue #14).

Four jobs at once on cluster "one": the warning sent to the steps only, to the batch shell only
(relayed by the template), to one array element (its sibling runs on), and a real
``--time``/``--signal`` warning. Each requeued job is released from Slurm's hold by `released`.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.helpers import JOB_NAME, REPO, SCRIPTS, Harness, cancel_jobs

pytestmark = pytest.mark.slurm

# The fake GPUs of cluster "one" (4) are GPU placement's to test (test_templates.py): here two
# ranks per job without GPUs, so that the four jobs run at once.
SMALL = ["--ntasks-per-node=2", "--cpus-per-task=1", "--gpus-per-task=0"]
# 150 steps of 40 ms: long enough to be warned in, short enough to finish quickly once resumed.
TRAIN_ARGS = ["--steps", "150", "--step-time", "0.04"]
WAIT_S = 180.0
SUMMARY = re.compile(r"^train: launcher=slurm world_size=2 steps=\d+ .*weights_identical=True$")


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


def wait_for(what: str, condition: Callable[[], bool], job: Job, timeout: float = WAIT_S) -> None:
    """Poll `condition` until it holds; fail naming `what` and the job's output after `timeout`."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{job.label}: {what} within {timeout:g}s\n{job.show()}\n{job.text()}")
        time.sleep(0.25)


def submit(harness: Harness, script: str, label: str, options: list[str], *args: str) -> Job:
    """Submit `script` from scripts/slurm unmodified; return the job (an array's element 0)."""
    out = harness.outdir(label)
    array = any(o.startswith("--array") for o in options)
    argv = ["sbatch", "--parsable", "-J", JOB_NAME, "--chdir", str(REPO),
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


def check_resumed(job: Job, template: str) -> int:
    """Assert one save, a requeue, a restart at that step and a finished run; return the step."""
    text = job.text()
    saved = re.findall(r"^train: stop requested; saved step (\d+) of 150$", text, re.M)
    assert len(saved) == 1, text
    step = int(saved[0])
    assert 0 < step < 150, text
    assert f"requeue: running `scontrol requeue {job.job}`" in text, text
    assert "DUE TO JOB REQUEUE" in text, text
    runs = re.findall(rf"^{template}: .*run (\d+)$", text, re.M)
    assert runs == ["0", "1"], text
    assert f"train: started at step {step} (restart 1)" in text, text
    assert any(SUMMARY.match(line) for line in text.splitlines()), text
    return step


def scancel(job: Job, *options: str) -> None:
    """Send USR1 with scancel: to the job's steps, or with --batch to its batch shell only."""
    subprocess.run(["scancel", *options, "--signal=USR1", job.job], env=dict(job.env),
                   capture_output=True, text=True, timeout=30, check=True)  # fmt: skip


def test_warned_jobs_requeue_themselves_and_resume(harness: Harness, tmp_path: Path) -> None:
    """Steps-only, batch-shell-only (relayed), array element, real --time: all resume and finish."""
    try:
        # 150 steps of 0.7 s: the warning is due 40 s after the start (time for the ranks to
        # import torch on a busy machine and watch the signal), but slurmctld checks time limits
        # on its own ticks and may send it tens of seconds later; the run must still be going.
        timed = submit(harness, "requeue.sbatch", "timed", ["--time=2", "--signal=B:USR1@80"],
                       "--checkpoint", str(tmp_path / "timed"), "--steps", "150",
                       "--step-time", "0.7")  # fmt: skip
        steps, batch = (
            submit(harness, "requeue.sbatch", label, [], "--checkpoint", str(tmp_path / label),
                   *TRAIN_ARGS)
            for label in ("steps", "batch")
        )  # fmt: skip
        first = submit(harness, "requeue_array.sbatch", "array", ["--array=0-1"], *TRAIN_ARGS)
        elements = [first, element(first, 1)]

        # Warn the plain jobs once every rank watches the signal (train.py prints "started").
        for job in (steps, batch):
            wait_for("train.py did not start", started(job, 0, 0), job)
        scancel(steps)
        scancel(batch, "--batch")

        # The array: warn (batch shell only) the element whose job id is the array's own id,
        # the one 0.1.0's template requeued the whole array with.
        for job in elements:
            wait_for("the element did not start", started(job, 0, 0), job)
        array_id = first.job.split("_")[0]
        warned = next(e for e in elements if e.show().get("JobId") == array_id)
        sibling = next(e for e in elements if e is not warned)
        scancel(warned, "--batch")

        for job in (steps, batch, warned, timed):
            wait_for("the job was not requeued", lambda job=job: requeued(job), job)
            wait_for("the requeued job did not restart", released(job), job)
        for job in (steps, batch, warned, timed, sibling):
            wait_for("the job did not finish", lambda job=job: finished(job), job)
    finally:
        cancel_jobs(harness.clusters["one"])

    check_resumed(steps, "requeue")
    assert "relaying" not in steps.text()
    check_resumed(batch, "requeue")
    assert "requeue: USR1 reached the batch shell; relaying it" in batch.text()
    check_resumed(warned, "requeue_array")
    assert f"relaying it to the steps of {warned.job}" in warned.text()
    check_resumed(timed, "requeue")
    assert "requeue: USR1 reached the batch shell; relaying it" in timed.text()

    # The sibling never heard of it: one run, no save, no requeue, finished.
    text = sibling.text()
    assert re.findall(r"^requeue_array: .*run (\d+)$", text, re.M) == ["0"], text
    assert "stop requested" not in text, text
    assert "REQUEUE" not in text, text
    assert any(SUMMARY.match(line) for line in text.splitlines()), text
