"""Shared fixtures: a hermetic environment for every test."""

from __future__ import annotations

import os

import pytest

from distenv.rankinfo import ENV_CONTRACT

# Variables of every launcher and scheduler distenv reads, and of the torchrun contract. The
# developer's shell (or a CI runner inside a Slurm job) must not leak into a test.
SCRUB_PREFIXES = (
    "SLURM_",
    "SRUN_",
    "SALLOC_",
    "SBATCH_",
    "OMPI_",
    "PMI_",
    "PMIX_",
    "MPI_LOCAL",
    "MV2_",
    "PALS_",
    "HYDRA_",
    "I_MPI_",
    "LSB_",
    "JSM_",
    "TORCHELASTIC_",
    "DISTENV_",
    "PET_",  # Kubeflow pods
    "SM_",  # SageMaker
    "AZ_BATCH",  # Azure ML
    "VC_",  # Volcano
    "VK_",
)
# DeepSpeed's launcher marks its ranks with these (distenv.detection.agreement.LAUNCH_MARKS).
SCRUB_NAMES = (*ENV_CONTRACT, "CUDA_VISIBLE_DEVICES", "CROSS_RANK", "CROSS_SIZE", "LOCAL_SIZE")
SCRUB_NAMES += ("JOB_COMPLETION_INDEX", "TRAINING_JOB_NAME", "AZUREML_RUN_ID")  # cloud launchers


def scrubbed_environ(environ: dict[str, str] | os._Environ[str] = os.environ) -> dict[str, str]:
    """Return a copy of `environ` without launcher variables (for child processes of tests)."""
    return {
        key: value
        for key, value in environ.items()
        if not key.startswith(SCRUB_PREFIXES) and key not in SCRUB_NAMES
    }


@pytest.fixture(autouse=True)
def _hermetic_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remove every launcher variable from os.environ for the duration of a test."""
    for key in list(os.environ):
        if key.startswith(SCRUB_PREFIXES) or key in SCRUB_NAMES:
            monkeypatch.delenv(key)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under DISTENV_STRICT_TESTS, a skipped or xfailed test fails the run (CI must see all)."""
    if not os.environ.get("DISTENV_STRICT_TESTS"):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    stats = getattr(reporter, "stats", {})
    hidden = len(stats.get("skipped", [])) + len(stats.get("xfailed", []))
    if hidden and exitstatus == 0:
        print(f"\n{hidden} test(s) skipped or xfailed: not allowed (DISTENV_STRICT_TESTS)")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
