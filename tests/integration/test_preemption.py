"""End to end on the real Slurm: warned jobs save, requeue themselves and resume (issue #14).

Four jobs on cluster "one": the warning sent to the steps only, to the batch shell only (relayed
by the template), to one array element (its sibling runs on), and a real ``--time``/``--signal``
warning. The last takes two minutes, mostly asleep: it is submitted early in the session and driven
in the background (`TimedJob`, conftest.py's `timed_requeue`). Each requeued job is released from
Slurm's hold by `released` (tests/support/integration/requeue_jobs.py).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.support.integration.helpers import Harness, cancel_jobs
from tests.support.integration.requeue_jobs import (
    SUMMARY,
    Job,
    TimedJob,
    element,
    finished,
    released,
    requeued,
    started,
    submit,
    wait_for,
)

pytestmark = pytest.mark.slurm

# 150 steps of 40 ms: long enough to be warned in, short enough to finish quickly once resumed.
TRAIN_ARGS = ["--steps", "150", "--step-time", "0.04"]


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


def test_warned_jobs_requeue_themselves_and_resume(
    harness: Harness, timed_requeue: TimedJob, tmp_path: Path
) -> None:
    """Steps-only, batch-shell-only (relayed), array element, real --time: all resume and finish.

    The real --time job was submitted early in the session (`timed_requeue`, conftest.py) and has
    been driven in the background since; here it is waited for and checked like the others.
    """
    try:
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

        for job in (steps, batch, warned):
            wait_for("the job was not requeued", lambda job=job: requeued(job), job)
            wait_for("the requeued job did not restart", released(job), job)
        for job in (steps, batch, warned, sibling):
            wait_for("the job did not finish", lambda job=job: finished(job), job)
        timed = timed_requeue.result()
    finally:
        cancel_jobs(harness.clusters["one"])
        timed_requeue.cancel()

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
