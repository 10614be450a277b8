"""distenv: one PyTorch training script, started correctly by any launcher.

    import distenv
    info = distenv.init_dist(launcher="auto")   # srun, mpirun, torchrun, jsrun, distenv run, alone

Importing distenv imports neither torch nor mpi4py; detection reads the environment only. The
other public names load their module on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from distenv.detection.pipeline import Detection, detect, explain, resolve
from distenv.errors import DistEnvError
from distenv.rankinfo import RankInfo

if TYPE_CHECKING:
    from distenv.args import add_launcher_argument
    from distenv.bootstrap.init import init_dist, setup
    from distenv.comm import (
        allreduce_grads,
        allreduce_params,
        barrier,
        get_dist_info,
        get_local_group,
        is_main_process,
        master_only,
    )
    from distenv.device import current_device
    from distenv.local.spawn import launch
    from distenv.log import get_logger
    from distenv.preempt import requeue, stop_requested, watch_preemption
    from distenv.seeding import seed_everything

__version__ = "0.2.0.dev0"

# Public names loaded on first use (PEP 562): `import distenv; distenv.detect()` must not pay for
# subprocess, multiprocessing or logging set-up it never uses. Plain import statements, so that the
# layering check (import-linter) sees every edge.
_LAZY = frozenset(
    {
        "add_launcher_argument",
        "allreduce_grads",
        "allreduce_params",
        "barrier",
        "current_device",
        "get_dist_info",
        "get_local_group",
        "is_main_process",
        "master_only",
        "init_dist",
        "setup",
        "get_logger",
        "seed_everything",
        "launch",
        "requeue",
        "stop_requested",
        "watch_preemption",
    }
)


def _load(name: str) -> Any:
    if name == "add_launcher_argument":
        from distenv import args

        return args.add_launcher_argument
    if name in ("init_dist", "setup"):
        from distenv.bootstrap import init

        return getattr(init, name)
    if name == "current_device":
        from distenv import device

        return device.current_device
    if name == "get_logger":
        from distenv import log

        return log.get_logger
    if name == "seed_everything":
        from distenv import seeding

        return seeding.seed_everything
    if name in ("requeue", "stop_requested", "watch_preemption"):
        from distenv import preempt

        return getattr(preempt, name)
    if name == "launch":
        from distenv.local import spawn

        return spawn.launch
    from distenv import comm

    return getattr(comm, name)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'distenv' has no attribute {name!r}")
    value = _load(name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "Detection",
    "DistEnvError",
    "RankInfo",
    "__version__",
    "add_launcher_argument",
    "allreduce_grads",
    "allreduce_params",
    "barrier",
    "current_device",
    "detect",
    "explain",
    "get_dist_info",
    "get_local_group",
    "get_logger",
    "init_dist",
    "is_main_process",
    "launch",
    "master_only",
    "requeue",
    "resolve",
    "seed_everything",
    "setup",
    "stop_requested",
    "watch_preemption",
]
