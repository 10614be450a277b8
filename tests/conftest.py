"""Shared fixtures: a hermetic environment for every test, and the fast default lane.

A bare ``pytest`` (the paths from ``testpaths``, no ``-m``) runs the fast lane: `FAST_DIRS`, less
the tests marked ``slow`` (they build the site, a wheel or a venv, or start the benchmarks), in
about a minute. ``pytest --all`` (tests/run.sh, CI) runs everything; a path or node id named on
the command line, or a marker expression (``-m gpu``), runs what it selects.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from distenv.launchers.registry import BUILTIN
from distenv.rankinfo import ENV_CONTRACT

# The developer's shell (or a CI runner inside a Slurm job) must not leak into a test: every
# variable a built-in launcher declares is removed, read from the launchers' own tables.
DECLARED = frozenset(var.name for launcher in BUILTIN.values() for var in launcher.variables)

# Removed as well, beyond the declared tables, each for its reason.
EXTRA_NAMES = (
    *ENV_CONTRACT,  # torchrun's whole contract: ROLE_RANK and ROLE_WORLD_SIZE are declared nowhere
    "CUDA_VISIBLE_DEVICES",  # init_dist's device rule and `distenv info` read it
    "CROSS_RANK",  # DeepSpeed's launcher marks its ranks with these two; the agreement check
    "CROSS_SIZE",  # reads them beside the torchrun contract
)
# Families a launcher sets beyond the members distenv declares (numbered or per-task names), or
# that steer the launchers the tests start (srun, mpirun, mpiexec, torchrun inherit them).
EXTRA_PREFIXES = (
    "SLURM_",  # het components (..._HET_GROUP_<n>), and srun in a test would join that job
    "SRUN_",  # srun's, salloc's and sbatch's input variables
    "SALLOC_",
    "SBATCH_",
    "OMPI_",  # Open MPI's other rank variables and its MCA parameters (OMPI_MCA_*)
    "PMI_",  # PMI/PMIx client variables (PMI_FD, PMIX_SERVER_URI, ...)
    "PMIX_",
    "MV2_",  # MVAPICH2
    "PALS_",  # Cray PALS
    "HYDRA_",  # MPICH's Hydra and Intel MPI steer mpiexec
    "I_MPI_",
    "LSB_",  # LSF and jsrun
    "JSM_",
    "TORCHELASTIC_",  # torchrun's agent (TORCHELASTIC_USE_AGENT_STORE, ...)
    "DISTENV_",  # distenv's own settings (DISTENV_TIMEOUT, DISTENV_PLUGINS, ...)
    "PET_",  # Kubeflow pods
    "SM_",  # SageMaker
    "AZ_BATCH",  # Azure ML
    "VC_",  # Volcano: VC_<task>_HOSTS and VC_<task>_NUM for every task name
    "VK_",  # Volcano's older spelling (VK_TASK_INDEX)
)
SCRUB_NAMES = DECLARED | frozenset(EXTRA_NAMES)


def scrubbed(name: str) -> bool:
    """Return whether the hermetic environment removes the variable `name`."""
    return name in SCRUB_NAMES or name.startswith(EXTRA_PREFIXES)


def scrubbed_environ(environ: dict[str, str] | os._Environ[str] = os.environ) -> dict[str, str]:
    """Return a copy of `environ` without launcher variables (for child processes of tests)."""
    return {key: value for key, value in environ.items() if not scrubbed(key)}


@pytest.fixture(autouse=True)
def _hermetic_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remove every launcher variable from os.environ for the duration of a test."""
    for key in list(os.environ):
        if scrubbed(key):
            monkeypatch.delenv(key)


#: The directories of the fast default lane (in-process and light subprocess tests).
FAST_DIRS = ("unit", "meta")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--all",
        action="store_true",
        help="run every test (process, integration, slow): a bare pytest runs the fast lane",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the fast lane only, for a bare ``pytest`` without ``--all`` (module doc)."""
    named = config.args_source is not pytest.Config.ArgsSource.TESTPATHS
    if config.getoption("--all") or named or config.option.markexpr:
        return
    tests = Path(__file__).resolve().parent
    fast = tuple(tests / name for name in FAST_DIRS)

    def in_lane(item: pytest.Item) -> bool:
        in_fast_dir = any(item.path.is_relative_to(directory) for directory in fast)
        return in_fast_dir and item.get_closest_marker("slow") is None

    kept = [item for item in items if in_lane(item)]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if not in_lane(item)])
        items[:] = kept


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove network-lab leftovers; under DISTENV_STRICT_TESTS, fail on a skip or an xfail.

    A lab tears itself down in ``finally``; the sweep is the net under that (a test interrupted
    inside a teardown). It removes only this process's namespaces (netlab.RUN_PREFIX), and only
    when a test imported the lab.
    """
    netlab = sys.modules.get("tests.support.netlab")
    if netlab is not None:
        netlab.sweep()
    if not os.environ.get("DISTENV_STRICT_TESTS"):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    stats = getattr(reporter, "stats", {})
    hidden = len(stats.get("skipped", [])) + len(stats.get("xfailed", []))
    if hidden and exitstatus == 0:
        print(f"\n{hidden} test(s) skipped or xfailed: not allowed (DISTENV_STRICT_TESTS)")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
