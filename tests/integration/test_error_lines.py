"""A refused job prints one line per rank, within a budget of lines for the whole job (#27).

The README's training script, refused under its real launchers: Open MPI's mpirun (whose own
report of the failed job counts too), `distenv run` and a Slurm batch step. Each budget is
asserted on every line the job printed, and each rank's line must carry the error and its fix.
"""

from __future__ import annotations

import re

import pytest

from tests.support.integration.helpers import OMPI, OMPI5, PYTHON, REPO, Harness, Result, engine

TRAIN = str(REPO / "examples" / "train.py")
ERROR = "distenv.errors.LauncherNotFoundError: slurm: none of its variables are set"


def _lines(result: Result) -> list[str]:
    """Every line the job printed: stdout, stderr and (sbatch) its output files."""
    text = "\n".join([result.stdout, result.stderr, *result.files.values()])
    return [line for line in text.splitlines() if line.strip()]


def _assert_one_line_per_rank(lines: list[str], ranks: int) -> None:
    errors = [line for line in lines if ERROR in line]
    assert len(errors) == ranks, lines
    assert all("train.py:" in line and ". Hint: " in line for line in errors), errors
    assert not any(line.startswith("Traceback") for line in lines), lines


@pytest.mark.mpi
def test_a_refused_mpirun_of_four_ranks_prints_at_most_12_lines(harness: Harness) -> None:
    mpirun = [*engine(OMPI5), "--oversubscribe", "-np", "4"]
    result = harness.run([*mpirun, PYTHON, TRAIN, "--launcher", "slurm"], env=harness.env())
    assert result.returncode != 0, result.text
    lines = _lines(result)
    assert len(lines) <= 12, result.text
    _assert_one_line_per_rank(lines, 4)
    assert sorted(line.split(":")[0] for line in lines if ERROR in line) == [
        f"rank {rank}" for rank in range(4)
    ]


@pytest.mark.mpi
def test_a_refused_debian_mpirun_of_four_ranks_prints_at_most_15_lines(harness: Harness) -> None:
    """Debian's Open MPI 4.1 (mpirun.openmpi) adds a longer report of its own: 15 lines in all."""
    mpirun = [*OMPI, "--oversubscribe", "-np", "4"]
    result = harness.run([*mpirun, PYTHON, TRAIN, "--launcher", "slurm"], env=harness.env())
    assert result.returncode != 0, result.text
    lines = _lines(result)
    assert len(lines) <= 15, result.text
    # Two ranks' lines may share one line of the merged output: count the errors, not lines.
    assert sorted(re.findall(r"rank (\d): \S*train\.py:", result.stdout + result.stderr)) == [
        str(rank) for rank in range(4)
    ], result.text
    assert not any(line.startswith("Traceback") for line in lines), lines


def test_a_refused_distenv_run_of_four_ranks_prints_at_most_8_lines(harness: Harness) -> None:
    argv = [PYTHON, "-m", "distenv", "run", "-n", "4", TRAIN, "--launcher", "slurm"]
    result = harness.run(argv, env=harness.env())
    assert result.returncode == 1, result.text
    lines = _lines(result)
    assert len(lines) <= 8, result.text
    # The ranks distenv run stops after the first failure may not get to print theirs.
    errors = [line for line in lines if ERROR in line]
    assert 1 <= len(errors) <= 4, result.text
    _assert_one_line_per_rank(lines, len(errors))


@pytest.mark.slurm
def test_a_refused_sbatch_batch_step_prints_at_most_6_lines(harness: Harness) -> None:
    """The batch script of a 4-task job runs the script itself, without srun: refused."""
    wrap = f"exec {PYTHON} {TRAIN} --launcher slurm"
    result = harness.sbatch(
        None, cluster="one", options=["-n", "4", "--wrap", wrap], label="batch-lines"
    ).wait()
    assert result.returncode != 0, result.text
    lines = _lines(result)
    assert len(lines) <= 6, result.text
    # No "rank 0: " before it: the batch script is no rank.
    assert any(
        line.startswith("examples/train.py:") and "rank 0 of 4" in line and ". Hint: " in line
        for line in lines
    ), result.text
    assert not any(line.startswith("Traceback") for line in lines), lines
