"""Session fixtures of the integration tests: real Slurm clusters, Open MPI, MPICH, torchrun.

The harness (tests/harness/setup.sh) is brought up once per session; it is idempotent and takes
about a second when the clusters already run. A harness that cannot be brought up FAILS the tests
that need it: CI always has one, and a silently skipped integration suite proves nothing.

A job that mostly waits (test_preemption's real ``--time`` warning, about two minutes) starts with
the first integration test not marked ``idle_clusters`` (those wait for idle nodes) and runs in the
background; its test collects it.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import scrubbed_environ
from tests.support.integration.helpers import HARNESS, JOB_NAME, REPO, STATE, Harness, load_env_sh
from tests.support.integration.requeue_jobs import TimedJob

SETUP_TIMEOUT_S = 900  # a fresh machine installs packages and the venv first
#: The nodes of the multi-node cluster (tests/harness/setup.sh).
MULTI_NODES = ("n1", "n2", "n3", "n4")


def _set_up() -> None:
    """Run tests/harness/setup.sh (idempotent: it starts what is not running), or fail the test."""
    try:
        done = subprocess.run(
            ["bash", str(HARNESS / "setup.sh")],
            env=scrubbed_environ(),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=SETUP_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"tests/harness/setup.sh did not finish in {SETUP_TIMEOUT_S}s: {exc.stdout!r}")
    if done.returncode != 0:
        pytest.fail(
            f"tests/harness/setup.sh failed ({done.returncode}):\n{done.stdout}{done.stderr}"
        )


def _missing_slurmds(env: dict[str, str]) -> list[str]:
    """Return the nodes of the multi-node cluster whose slurmd no longer runs.

    Slurm 22.05's slurmd can die of a general protection fault in libc while it launches several
    steps at once on a loaded machine (seen once, in a CI run: the kernel's "traps: slurmd[...]
    general protection fault"); its node then fails every later test that uses it.
    """
    conf = env["DISTENV_TEST_SLURM_MULTI"].encode()
    running = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        slurmd = len(argv) > 5 and argv[0].endswith(b"slurmd") and argv[1:3] == [b"-D", b"-N"]
        if slurmd and argv[5] == conf:
            running.add(argv[3].decode())
    return [node for node in MULTI_NODES if node not in running]


@pytest.fixture(scope="session")
def harness() -> Iterator[Harness]:
    """Run tests/harness/setup.sh once and return the clusters' settings from its env.sh."""
    _set_up()
    work = STATE / "integration-work" / JOB_NAME
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    yield Harness(load_env_sh(STATE / "env.sh"), work)
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(autouse=True)
def _slurmds_running(request: pytest.FixtureRequest) -> None:
    """Before a test that uses the clusters, restart a slurmd that died (`_missing_slurmds`):
    one node's crash stays the failure of the test it happened in, not of every test after it."""
    if "harness" not in request.fixturenames or hasattr(request.module, "harness"):
        return
    harness: Harness = request.getfixturevalue("harness")
    missing = _missing_slurmds(harness.env_sh)
    if missing:
        print(f"conftest: slurmd of {', '.join(missing)} not running: setup.sh restarts it")
        _set_up()


@pytest.fixture(scope="session")
def timed_requeue(harness: Harness, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TimedJob]:
    """Submit test_preemption's job warned by its real --time limit; drive it in the background."""
    timed = TimedJob(harness, Path(tmp_path_factory.mktemp("timed-requeue")))
    yield timed
    timed.cancel()


@pytest.fixture(autouse=True)
def _start_background_jobs(request: pytest.FixtureRequest) -> None:
    """Start `timed_requeue` early when a selected test uses it, after the idle_clusters tests."""
    if request.node.get_closest_marker("idle_clusters") is not None:
        return
    if hasattr(request.module, "harness"):  # a module's own (local, function-scoped) harness
        return
    if any("timed_requeue" in getattr(item, "fixturenames", ()) for item in request.session.items):
        request.getfixturevalue("timed_requeue")
