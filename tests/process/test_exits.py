"""A DistEnvError from a public call ends a script in one line per rank (distenv.exits).

Each test runs a real Python process: what the user sees is what Python prints at exit.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import distenv
from distenv.errors import DistEnvError, LauncherNotFoundError
from distenv.exits import DEBUG_VAR, OneLine, one_line
from distenv.local.reporting import classify
from tests.conftest import scrubbed_environ
from tests.support.spawn import REPO

SCRIPT = """\
import distenv

distenv.init_dist("slurm")
"""


def _run(tmp_path: Path, code: str = SCRIPT, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(code)
    return subprocess.run(
        [sys.executable, str(script)],
        env={**scrubbed_environ(), "PYTHONPATH": str(REPO), **env},
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_a_refusal_is_one_line_from_the_users_call(tmp_path: Path) -> None:
    """No traceback: the file and line of the user's call, the error's class, its message with
    the fix, and how to see the traceback; exit status 1."""
    done = _run(tmp_path)
    assert done.returncode == 1
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith(
        "train.py:3: distenv.errors.LauncherNotFoundError: slurm: none of its variables are set"
    ), line
    assert ". Hint: submit it:" in line
    assert line.endswith(f"({DEBUG_VAR}=1 shows the traceback)")


def test_a_rank_other_than_0_prefixes_its_rank_and_leaves_the_debug_note_to_rank_0(
    tmp_path: Path,
) -> None:
    done = _run(tmp_path, OMPI_COMM_WORLD_RANK="3")
    (line,) = done.stderr.splitlines()
    assert line.startswith("rank 3: train.py:3: distenv.errors.LauncherNotFoundError: slurm:")
    assert DEBUG_VAR not in line
    assert done.returncode == 1


def test_the_debug_switch_gives_the_whole_traceback(tmp_path: Path) -> None:
    done = _run(tmp_path, **{DEBUG_VAR: "1"})
    assert done.returncode == 1
    assert done.stderr.startswith("Traceback (most recent call last):")
    assert 'distenv/detection/choice.py", line' in done.stderr
    assert done.stderr.splitlines()[-1].startswith(
        "distenv.errors.LauncherNotFoundError: slurm: none of its variables are set"
    )


CAUGHT = """\
import distenv
from distenv.errors import LauncherNotFoundError

try:
    distenv.init_dist("slurm")
except LauncherNotFoundError as error:
    print("caught", type(error).__name__, error.variable, error.source)
try:
    distenv.init_dist("slurm")
except Exception as error:
    print("caught as Exception")
"""


def test_the_error_is_still_caught_by_its_class_and_as_an_exception(tmp_path: Path) -> None:
    done = _run(tmp_path, CAUGHT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "caught LauncherNotFoundError None slurm",
        "caught as Exception",
    ]


def test_outside_the_main_thread_the_plain_error_is_raised() -> None:
    """A thread drops a SystemExit silently: there the error stays a plain exception."""
    caught: list[BaseException] = []

    def target() -> None:
        try:
            distenv.init_dist("slurm")
        except BaseException as error:
            caught.append(error)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(60)
    (error,) = caught
    assert isinstance(error, LauncherNotFoundError)
    assert not isinstance(error, SystemExit)


def test_in_the_main_thread_it_is_both_its_class_and_a_one_line_exit() -> None:
    with pytest.raises(LauncherNotFoundError) as caught:
        distenv.init_dist("slurm")
    error = caught.value
    assert isinstance(error, OneLine)
    assert type(error).__name__ == "LauncherNotFoundError"
    assert isinstance(error.code, str)
    assert "distenv.errors.LauncherNotFoundError: slurm:" in error.code
    # Chained to the original, which keeps distenv's frames for whoever prints it.
    assert type(error.__cause__) is LauncherNotFoundError
    # Pickled as the plain error (multiprocessing, torch.multiprocessing).
    copy = pickle.loads(pickle.dumps(error))  # noqa: S301 - its own bytes
    assert type(copy) is LauncherNotFoundError
    assert (copy.source, str(copy)) == ("slurm", str(error))


def test_nested_public_calls_convert_once() -> None:
    @one_line
    def outer() -> None:
        distenv.init_dist("slurm")

    with pytest.raises(LauncherNotFoundError) as caught:
        outer()
    assert type(caught.value.__cause__) is LauncherNotFoundError


def test_a_restarted_rank_reports_the_refusal_as_not_retried() -> None:
    """Under distenv run --max-restarts the rank's report says `refused`, not a SystemExit."""
    with pytest.raises(DistEnvError) as caught:
        distenv.init_dist("slurm")
    report = classify(caught.value)
    assert report is not None
    assert report.kind == "refused"
    assert report.what.startswith("LauncherNotFoundError: slurm:")


IPYTHON = """\
import sys, types

shell = types.ModuleType("IPython")
shell.get_ipython = lambda: {running}
sys.modules["IPython"] = shell
import distenv

distenv.init_dist("slurm")
"""


def test_ipython_imported_by_a_library_keeps_the_one_line(tmp_path: Path) -> None:
    """IPython imported in a plain script (tqdm and others may) is no interactive session."""
    done = _run(tmp_path, IPYTHON.format(running="None"))
    (line,) = done.stderr.splitlines()
    assert line.startswith("train.py:8: distenv.errors.LauncherNotFoundError: slurm:"), line


def test_a_running_ipython_shell_gets_the_plain_exception(tmp_path: Path) -> None:
    done = _run(tmp_path, IPYTHON.format(running="object()"))
    assert done.returncode == 1
    assert done.stderr.startswith("Traceback (most recent call last):"), done.stderr
