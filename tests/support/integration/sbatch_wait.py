"""`sbatch --wait`, answered within half a second of the job's end instead of up to 32 s later.

    python sbatch_wait.py [sbatch options] script [args]

sbatch --wait sleeps 2 s, then 8, then 32 s between its looks at the job (Slurm 22.05,
src/sbatch/sbatch.c `_job_wait`: the sleep grows fourfold while under MinJobAge/2 and 32 s, and
the test clusters have MinJobAge=30), so a job that ends after 11 s is reported after 42 s. This
runs ``sbatch --parsable`` with the given arguments, passes its output on, then asks
``scontrol -o show job`` every `POLL_S` until every record of the job (each array element) has
ended, and exits as `sbatch --wait` does: with the highest exit status of the records, 1 for a
record ended by a signal. It waits out COMPLETING too, so the job's output files are complete.
Harness.sbatch (helpers.py) starts it; its timeout ends this process and cancels the job.
"""

from __future__ import annotations

import subprocess
import sys
import time

POLL_S = 0.5
# JobState of `scontrol show job` for a record that ended (job_state_string, slurm.h base states).
ENDED = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE", "OUT_OF_MEMORY"}  # fmt: skip


def exit_status(records: list[dict[str, str]]) -> int | None:
    """Return sbatch --wait's exit status once every record ended, else None."""
    if not records or any(r.get("JobState") not in ENDED for r in records):
        return None
    statuses = []
    for record in records:
        code, _, signal = record.get("ExitCode", "0:0").partition(":")
        statuses.append(1 if signal not in ("", "0") else int(code))
    return max(statuses)


def show(job: str) -> list[dict[str, str]] | None:
    """Return the job's records (one per array element), or None when scontrol did not answer."""
    done = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True,
                          timeout=30, check=False)  # fmt: skip
    if done.returncode != 0:
        if "Invalid job id" in done.stderr:
            sys.exit(f"sbatch_wait: job {job} no longer known to slurmctld; its exit code is lost")
        return None
    records = []
    for line in done.stdout.splitlines():
        fields = (token.partition("=") for token in line.split())
        records.append({key: value for key, _, value in fields})
    return records


def main(argv: list[str]) -> int:
    submitted = subprocess.run(["sbatch", "--parsable", *argv], capture_output=True, text=True,
                               timeout=60, check=False)  # fmt: skip
    sys.stdout.write(submitted.stdout)
    sys.stderr.write(submitted.stderr)
    sys.stdout.flush()
    if submitted.returncode != 0:
        return submitted.returncode
    job = submitted.stdout.strip().split(";")[0]
    while True:
        records = show(job)
        status = exit_status(records) if records is not None else None
        if status is not None:
            return status
        time.sleep(POLL_S)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
