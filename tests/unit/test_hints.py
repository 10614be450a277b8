"""A hint's example command quotes the job's own script and size (#43 item 5)."""

from __future__ import annotations

import pytest

from distenv.errors import LauncherNotFoundError, MissingVariableError
from distenv.hints import personal, reword, script_of, size_of
from distenv.launchers.registry import get_launcher

MPI_HINT = get_launcher("mpi").how_to_start
SLURM_HINT = get_launcher("slurm").how_to_start


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param(["main_tv.py", "--lr", "0.1"], "main_tv.py", id="script"),
        pytest.param(
            ["references/classification/train.py"], "references/classification/train.py", id="path"
        ),
        pytest.param(["-c"], None, id="python-c"),
        pytest.param([""], None, id="interactive"),
        pytest.param(["/usr/bin/distenv", "info"], None, id="not-python"),
        pytest.param(["my `evil`.py"], None, id="backtick"),
        pytest.param([], None, id="no-argv"),
    ],
)
def test_script_of(argv: list[str], expected: str | None) -> None:
    """Only a .py script is quoted, as it was given; nothing that could break the hint's code span."""
    assert script_of(argv) == expected


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param({"WORLD_SIZE": "2", "OMPI_COMM_WORLD_SIZE": "8"}, 2, id="torchrun-first"),
        pytest.param({"OMPI_COMM_WORLD_SIZE": "3"}, 3, id="openmpi"),
        pytest.param({"PMI_SIZE": "5"}, 5, id="hydra"),
        pytest.param({"WORLD_SIZE": "x"}, None, id="malformed"),
        pytest.param({"WORLD_SIZE": "9" * 5000}, None, id="huge"),
        pytest.param({"WORLD_SIZE": "0"}, None, id="zero"),
        pytest.param({}, None, id="none"),
    ],
)
def test_size_of(env: dict[str, str], expected: int | None) -> None:
    """The world's size a launcher states; a malformed or absurd one is not quoted."""
    assert size_of(env) == expected


def test_the_mpi_hint_quotes_the_job_s_size_and_script() -> None:
    """`mpirun -np 4 python train.py` becomes the 2-rank main_tv.py job's own command."""
    assert personal(MPI_HINT, "main_tv.py", 2) == (
        "start it with `mpirun -np 2 python main_tv.py ...` (Open MPI) or `mpiexec -n 2 python "
        "main_tv.py ...` (MPICH, Intel MPI), or with `srun --mpi=pmix` inside a Slurm job"
    )
    assert personal(MPI_HINT, None, None) == MPI_HINT
    # Not a word of its own: left alone.
    assert personal("see examples/train.py and train.pyc", "x.py", None) == (
        "see examples/train.py and train.pyc"
    )


def test_reword_changes_the_hint_and_the_message() -> None:
    """The error's hint attribute and its message change together; the problem stays."""
    error = LauncherNotFoundError("slurm", "none of its variables are set", hint=SLURM_HINT)
    reword(error, ["main_tv.py"], {"WORLD_SIZE": "2"})
    assert error.hint is not None
    assert "`srun python main_tv.py ...`" in error.hint
    assert str(error) == f"slurm: none of its variables are set. Hint: {error.hint}"
    untouched = MissingVariableError("slurm", "SLURM_PROCID")
    reword(untouched, ["main_tv.py"], {})
    assert str(untouched) == "slurm: $SLURM_PROCID is not set"
