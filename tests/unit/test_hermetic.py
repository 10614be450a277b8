"""The tests' hermetic environment (tests/conftest.py) removes every variable a launcher declares."""

from __future__ import annotations

import os

import pytest

from distenv.launchers.registry import BUILTIN
from distenv.rankinfo import ENV_CONTRACT
from tests.conftest import scrubbed_environ

KEPT = {"PATH": "/usr/bin:/bin", "HOME": "/root", "PYTHONPATH": "/src", "OMP_NUM_THREADS": "2"}


@pytest.mark.parametrize("launcher", sorted(BUILTIN))
def test_every_declared_variable_is_scrubbed(launcher: str) -> None:
    """A variable added to a launcher's `variables` table can never leak into a test."""
    declared = {var.name: "1" for var in BUILTIN[launcher].variables}
    assert scrubbed_environ({**declared, **KEPT}) == KEPT


def test_the_torchrun_contract_and_the_extra_names_are_scrubbed() -> None:
    """The whole torchrun contract, the device list and DeepSpeed's marks, declared or not."""
    extra = dict.fromkeys((*ENV_CONTRACT, "CUDA_VISIBLE_DEVICES", "CROSS_RANK", "CROSS_SIZE"), "1")
    assert scrubbed_environ({**extra, **KEPT}) == KEPT


@pytest.mark.parametrize(
    "name",
    [
        "SLURM_JOB_NODELIST_HET_GROUP_3",
        "SRUN_CPUS_PER_TASK",
        "SBATCH_PARTITION",
        "OMPI_MCA_btl",
        "PMIX_SERVER_URI",
        "HYDRA_HOST_FILE",
        "I_MPI_HYDRA_BOOTSTRAP",
        "TORCHELASTIC_USE_AGENT_STORE",
        "DISTENV_TIMEOUT",
        "VC_PS_HOSTS",
    ],
)
def test_undeclared_members_of_launcher_families_are_scrubbed(name: str) -> None:
    """Families a launcher sets beyond what distenv declares go too (they steer srun, mpirun...)."""
    assert scrubbed_environ({name: "1", **KEPT}) == KEPT


def test_the_running_test_sees_no_declared_variable() -> None:
    """The autouse fixture has removed every declared variable from os.environ."""
    declared = {var.name for launcher in BUILTIN.values() for var in launcher.variables}
    assert declared.isdisjoint(os.environ)
