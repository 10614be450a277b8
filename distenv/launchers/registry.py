"""The built-in launchers in detection order, and finding a launcher by name (plug-ins included).

`BUILTINS` is the one list of built-in launchers: `BUILTIN` (by name), `DETECTION_ORDER`, the
``--launcher`` choices and auto detection's candidates are all derived from it. Plug-ins are
found through the `PLUGIN_GROUP` entry points only when asked for (a name that is not built in,
or ``DISTENV_PLUGINS``), never by default: scanning entry points costs tens of milliseconds.
"""

from __future__ import annotations

from collections.abc import Mapping

from distenv.errors import ConfigurationError, LauncherNotFoundError
from distenv.launchers.awsbatch import AwsBatchLauncher
from distenv.launchers.azureml import AzuremlLauncher
from distenv.launchers.base import PLUGIN_GROUP, Launcher, Scheduler
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
from distenv.settings import Settings

__all__ = [
    "ALIASES",
    "AWS_BATCH",
    "AZUREML",
    "BUILTIN",
    "BUILTINS",
    "CHOICES",
    "DETECTION_ORDER",
    "FLUX",
    "HTCONDOR",
    "INDEXED_JOB",
    "KUBEFLOW",
    "LSF",
    "MPI",
    "NONE",
    "PBS",
    "SAGEMAKER",
    "SGE",
    "SKYPILOT",
    "SLURM",
    "TORCHRUN",
    "VERTEX",
    "VOLCANO",
    "auto_candidates",
    "canonical_name",
    "checked_name",
    "get_launcher",
]

TORCHRUN, MPI = TorchrunLauncher(), MpiLauncher()
SLURM, LSF, PBS, FLUX = SlurmLauncher(), LsfLauncher(), PbsLauncher(), FluxLauncher()
KUBEFLOW, INDEXED_JOB, VOLCANO = KubeflowLauncher(), IndexedJobLauncher(), VolcanoLauncher()
SAGEMAKER, AZUREML, VERTEX = SagemakerLauncher(), AzuremlLauncher(), VertexLauncher()
SKYPILOT, AWS_BATCH = SkypilotLauncher(), AwsBatchLauncher()
SGE, HTCONDOR = GridEngineLauncher(), HtcondorLauncher()
NONE = NoneLauncher()

# Every built-in launcher, in auto detection's order. The innermost launcher wins: the one that
# spawned this process beats the scheduler that granted its nodes (torchrun or mpirun inside an
# srun step or an LSF job is the common case, never the reverse). `none` comes last and is not
# detected: it is what remains when nothing else is. Opted-in plug-ins follow the same principle
# by type (`auto_candidates`): a plain Launcher before every built-in, a Scheduler after the
# built-in launchers and before the built-in schedulers.
BUILTINS: tuple[Launcher, ...] = (
    # Launchers that spawn the processes.
    *(TORCHRUN, MPI),
    # Schedulers of HPC clusters.
    *(SLURM, LSF, PBS, FLUX),
    # Kubernetes pods never run inside an HPC scheduler's job; a TrainJob's pods are an Indexed
    # Job's too, and their PET_* variables say more than the index alone.
    *(KUBEFLOW, INDEXED_JOB, VOLCANO),
    # Cloud training services enclose MPI or torchrun like a scheduler.
    *(SAGEMAKER, AZUREML, VERTEX),
    # Cloud clusters that run one process per node; SkyPilot on Slurm runs it as an srun step,
    # whose own numbering answers there.
    *(SKYPILOT, AWS_BATCH),
    # Universities' batch systems: Grid Engine and HTCondor's parallel universe enclose mpirun;
    # neither runs inside another scheduler's job.
    *(SGE, HTCONDOR),
    NONE,
)

BUILTIN: dict[str, Launcher] = {launcher.name: launcher for launcher in BUILTINS}
ALIASES = {alias: launcher.name for launcher in BUILTINS for alias in launcher.aliases}
# The names auto detection tries, innermost first (`none` is what remains).
DETECTION_ORDER = tuple(launcher.name for launcher in BUILTINS if launcher is not NONE)
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
