"""Launcher backends, the registry that finds them by name, and the public plug-in contract.

A third-party backend imports only from here (plus `distenv.RankInfo` and `distenv.errors`):
`Launcher` (or `Scheduler` for a launcher that owns an allocation, `AllocationLauncher` for one
whose ranks lean on an enclosing scheduler's allocation), `Var` and `Reader` to declare
and read its variables, `MASTER_VARS` to honour the user's MASTER_ADDR/MASTER_PORT, `Default`,
`scheduler_port` and `scope_tag` for its master and export tag, `Nodes` and `World`; and registers
under the `PLUGIN_GROUP` entry-point group (docs/plugins.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from distenv.errors import ConfigurationError, LauncherNotFoundError
from distenv.launchers.awsbatch import AwsBatchLauncher
from distenv.launchers.azureml import AzuremlLauncher
from distenv.launchers.base import AllocationLauncher, Default, Launcher, Nodes, Scheduler, World
from distenv.launchers.flux import FluxLauncher
from distenv.launchers.gridengine import GridEngineLauncher
from distenv.launchers.htcondor import HtcondorLauncher
from distenv.launchers.indexed_job import IndexedJobLauncher
from distenv.launchers.kubeflow import KubeflowLauncher
from distenv.launchers.lsf import LsfLauncher
from distenv.launchers.mpi import MpiLauncher
from distenv.launchers.none import NoneLauncher
from distenv.launchers.pbs import PbsLauncher
from distenv.launchers.sagemaker import SagemakerLauncher
from distenv.launchers.skypilot import SkypilotLauncher
from distenv.launchers.slurm import SlurmLauncher
from distenv.launchers.torchrun import TorchrunLauncher
from distenv.launchers.vertex import VertexLauncher
from distenv.launchers.volcano import VolcanoLauncher
from distenv.master import MASTER_VARS, scheduler_port, scope_tag
from distenv.settings import PLUGINS_VAR, Settings
from distenv.variables import Reader, Var

__all__ = [
    "AWS_BATCH",
    "AZUREML",
    "BUILTIN",
    "DETECTION_ORDER",
    "FLUX",
    "HTCONDOR",
    "INDEXED_JOB",
    "KUBEFLOW",
    "LSF",
    "MASTER_VARS",
    "MPI",
    "NONE",
    "PBS",
    "PLUGINS_VAR",
    "PLUGIN_GROUP",
    "SAGEMAKER",
    "SGE",
    "SKYPILOT",
    "SLURM",
    "TORCHRUN",
    "VERTEX",
    "VOLCANO",
    "AllocationLauncher",
    "Default",
    "Launcher",
    "Nodes",
    "Reader",
    "Scheduler",
    "Var",
    "World",
    "auto_candidates",
    "canonical_name",
    "checked_name",
    "get_launcher",
    "scheduler_port",
    "scope_tag",
]

TORCHRUN, MPI, SLURM, LSF, NONE = (
    TorchrunLauncher(),
    MpiLauncher(),
    SlurmLauncher(),
    LsfLauncher(),
    NoneLauncher(),
)
PBS, FLUX = PbsLauncher(), FluxLauncher()
KUBEFLOW, INDEXED_JOB, VOLCANO = KubeflowLauncher(), IndexedJobLauncher(), VolcanoLauncher()
SAGEMAKER, AZUREML = SagemakerLauncher(), AzuremlLauncher()
SKYPILOT, AWS_BATCH = SkypilotLauncher(), AwsBatchLauncher()
VERTEX = VertexLauncher()
SGE, HTCONDOR = GridEngineLauncher(), HtcondorLauncher()
BUILTIN: dict[str, Launcher] = {
    launcher.name: launcher
    for launcher in (
        *(TORCHRUN, MPI, SLURM, LSF, NONE, PBS, FLUX),
        *(KUBEFLOW, INDEXED_JOB, VOLCANO, SAGEMAKER, AZUREML),
        *(SKYPILOT, AWS_BATCH, VERTEX, SGE, HTCONDOR),
    )
}
ALIASES = {alias: launcher.name for launcher in BUILTIN.values() for alias in launcher.aliases}

# The innermost launcher wins: the one that spawned this process beats the scheduler that granted
# its nodes (torchrun or mpirun inside an srun step or an LSF job is the common case, never the
# reverse). `none` is not in the order: it is what remains when nothing is detected. Opted-in
# plug-ins follow the same principle by type: a plain Launcher before every built-in, a Scheduler
# after the built-in launchers and before the built-in schedulers.
DETECTION_ORDER = (
    *("pytorch", "mpi"),
    # Schedulers of HPC clusters.
    *("slurm", "lsf", "pbs", "flux"),
    # Kubernetes pods never run inside an HPC scheduler's job; a TrainJob's pods are an Indexed
    # Job's too, and their PET_* variables say more than the index alone.
    *("kubeflow", "indexed-job", "volcano"),
    # Cloud training services enclose MPI or torchrun like a scheduler.
    *("sagemaker", "azureml", "vertex"),
    # Cloud clusters that run one process per node; SkyPilot on Slurm runs it as an srun step,
    # whose own numbering answers there.
    *("skypilot", "aws-batch"),
    # Universities' batch systems: Grid Engine and HTCondor's parallel universe enclose mpirun;
    # neither runs inside another scheduler's job.
    *("sge", "htcondor"),
)

# Third-party backends register under this entry-point group. Scanning entry points costs tens of
# milliseconds, so it happens only for a name that is not built in, or for the plug-ins named in
# DISTENV_PLUGINS (comma-separated); those are tried *before* the built-ins during auto detection,
# because a site-specific launcher is always the innermost layer.
PLUGIN_GROUP = "distenv.launchers"

CHOICES = ("auto", *BUILTIN, *ALIASES)


def canonical_name(name: str) -> str:
    """Return the canonical spelling of a launcher name (``torchrun`` -> ``pytorch``)."""
    name = name.strip().lower()
    return ALIASES.get(name, name)


def _load_plugin(name: str) -> Launcher | None:
    from importlib.metadata import entry_points

    for entry in entry_points(group=PLUGIN_GROUP, name=name):
        loaded = entry.load()
        launcher = loaded() if isinstance(loaded, type) else loaded
        if not isinstance(launcher, Launcher):
            raise ConfigurationError(
                "distenv",
                f"entry point {entry.value!r} of {PLUGIN_GROUP!r} is not a distenv Launcher",
                hint="subclass distenv.launchers.Launcher (or Scheduler)",
            )
        return launcher
    return None


def get_launcher(name: str) -> Launcher:
    """Return the launcher backend called `name` (built-in, alias, or plug-in).

    Raises:
        LauncherNotFoundError: If no backend has that name.
    """
    canonical = canonical_name(name)
    builtin = BUILTIN.get(canonical)
    if builtin is not None:
        return builtin
    plugin = _load_plugin(canonical)
    if plugin is None:
        import difflib  # only on this error: detection stays cheap

        near = difflib.get_close_matches(canonical, CHOICES, n=1)
        guess = f"did you mean {near[0]!r}? Otherwise " if near else ""
        raise LauncherNotFoundError(
            "distenv",
            f"unknown launcher {name!r}",
            hint=f"{guess}choose one of {', '.join(CHOICES)}, or install the plug-in that "
            "provides it",
            value=name,
        )
    return plugin


def checked_name(name: str) -> str:
    """Return `name` if it is ``auto`` or names a launcher (plug-ins included), else raise.

    For argparse's ``type=``: the error becomes a usage error (exit 2) naming the choices.
    """
    if canonical_name(name) == "auto":
        return "auto"
    try:
        get_launcher(name)
    except LauncherNotFoundError as exc:
        from argparse import ArgumentTypeError

        # argparse says "distenv <command>: error: argument --launcher:" first: not the source.
        raise ArgumentTypeError(f"{exc.problem}. Hint: {exc.hint}") from None
    return name


def auto_candidates(env: Mapping[str, str]) -> list[Launcher]:
    """Return the launchers auto detection tries, innermost first (plug-ins opted in first)."""
    opted = [get_launcher(n) for n in Settings.read(env).plugins]
    # A stable sort by type: launchers that spawn processes first, schedulers after them.
    return sorted(
        [*opted, *(BUILTIN[n] for n in DETECTION_ORDER)], key=lambda c: isinstance(c, Scheduler)
    )
