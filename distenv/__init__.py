"""distenv: one PyTorch training script, started correctly by any launcher.

    import distenv
    info = distenv.init_dist(launcher="auto")   # srun, mpirun, torchrun, jsrun, distenv run, alone

Importing distenv imports neither torch nor mpi4py; detection reads the environment only.
"""

from __future__ import annotations

from distenv.detect import Detection, detect, explain
from distenv.errors import DistEnvError
from distenv.rankinfo import RankInfo
from distenv.resolve import resolve

__version__ = "0.1.0"

__all__ = [
    "Detection",
    "DistEnvError",
    "RankInfo",
    "__version__",
    "detect",
    "explain",
    "resolve",
]
