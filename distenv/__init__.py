"""distenv: one PyTorch training script, started correctly by any launcher.

    import distenv
    info = distenv.init_dist(launcher="auto")   # srun, mpirun, torchrun, jsrun, distenv run, alone

Importing distenv imports neither torch nor mpi4py; detection reads the environment only.
"""

from __future__ import annotations

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
from distenv.detect import Detection, detect, explain
from distenv.errors import DistEnvError
from distenv.init import init_dist, setup
from distenv.launch import launch
from distenv.log import get_logger
from distenv.rankinfo import RankInfo
from distenv.resolve import resolve
from distenv.seeding import seed_everything

__version__ = "0.1.0"

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
