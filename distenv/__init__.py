"""distenv: one PyTorch training script, started correctly by any launcher.

    import distenv
    info = distenv.init_dist(launcher="auto")   # srun, mpirun, torchrun, jsrun, distenv run, alone

Importing distenv imports neither torch nor mpi4py; detection reads the environment only. The
other public names load their module on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from distenv.detect import Detection, detect, explain
from distenv.errors import DistEnvError
from distenv.rankinfo import RankInfo

if TYPE_CHECKING:
    from distenv.args import add_launcher_argument
    from distenv.comm import (
        allreduce_grads,
        allreduce_params,
        barrier,
        get_dist_info,
        get_local_group,
        is_main_process,
        master_only,
    )
    from distenv.init import init_dist, setup
    from distenv.log import get_logger
    from distenv.resolve import resolve
    from distenv.seeding import seed_everything
    from distenv.spawn import launch

__version__ = "0.1.0"

# Public name -> the module that defines it. Loaded on first use (PEP 562): `import distenv;
# distenv.detect()` must not pay for subprocess, multiprocessing or logging set-up it never uses.
_LAZY = {
    "add_launcher_argument": "distenv.args",
    "allreduce_grads": "distenv.comm",
    "allreduce_params": "distenv.comm",
    "barrier": "distenv.comm",
    "get_dist_info": "distenv.comm",
    "get_local_group": "distenv.comm",
    "is_main_process": "distenv.comm",
    "master_only": "distenv.comm",
    "init_dist": "distenv.init",
    "setup": "distenv.init",
    "get_logger": "distenv.log",
    "resolve": "distenv.resolve",
    "seed_everything": "distenv.seeding",
    "launch": "distenv.spawn",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'distenv' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(module), name)
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
    "detect",
    "explain",
    "get_dist_info",
    "get_local_group",
    "get_logger",
    "init_dist",
    "is_main_process",
    "launch",
    "master_only",
    "resolve",
    "seed_everything",
    "setup",
]
