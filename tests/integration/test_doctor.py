"""`distenv doctor` under srun and mpirun on the real engines."""

from __future__ import annotations

import pytest

from tests.support.integration.helpers import JOB_NAME, OMPI, PYTHON, Harness, wait_all

DOCTOR = [PYTHON, "-m", "distenv", "doctor"]


@pytest.mark.slurm
@pytest.mark.mpi
def test_doctor_under_srun_and_mpirun(harness: Harness) -> None:
    """srun -N 2 --ntasks-per-node 2 and mpirun -np 4: one table from rank 0, verdict OK."""
    srun = harness.start(
        ["srun", "-J", JOB_NAME, "-N", "2", "--ntasks-per-node", "2", *DOCTOR], cluster="multi"
    )
    mpirun = harness.start(
        [*OMPI, "--oversubscribe", "-np", "4", *DOCTOR], env=harness.env(ompi=True)
    )
    for result, launcher in zip(wait_all([srun, mpirun]), ("slurm", "mpi"), strict=True):
        assert result.returncode == 0, result.text
        assert result.stdout.count("distenv doctor:") == 1
        assert f"launcher={launcher} world_size=4" in result.stdout
        rows = [line.split() for line in result.stdout.splitlines() if line[:1].isdigit()]
        assert [row[0] for row in rows] == ["0", "1", "2", "3"]
        assert all(row[-1] == "ok" for row in rows)
        assert "verdict: OK: 4 of 4 ranks checked in" in result.stdout
        assert "rank 0's device: cpu: torch 2.13.0+cpu is a CPU-only build" in result.stdout
    hosts = {line.split()[1] for line in srun.wait().stdout.splitlines() if line[:1].isdigit()}
    assert len(hosts) == 2
