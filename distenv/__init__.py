"""distenv: one PyTorch training script, started correctly by any launcher.

    import distenv
    info = distenv.init_dist(launcher="auto")   # srun, mpirun, torchrun, jsrun, distenv run, alone

Importing distenv imports neither torch nor mpi4py, nor any module of its own but this one: every
public name loads its module on first use (PEP 562). The public API is two groups (docs/api.md):
the core, which starts, describes and stops a job, and the training helpers that scripts written
for mmcv or detectron2 look for (`get_dist_info`, `master_only`, ...). A helper's documented home
is its module (`distenv.comm`, `distenv.seeding`, `distenv.log`); `distenv.<name>` is the same
object, where those scripts expect it.
"""

from __future__ import annotations

import importlib
from types import FunctionType
from typing import TYPE_CHECKING, Any

# The static view of the tables below, for mypy, pyright and import-linter (which sees every edge).
# `name as name` is the re-export that static analysers honour (a derived `__all__` is invisible to
# them); tests/meta/test_import.py checks that these imports are exactly the tables' entries.
if TYPE_CHECKING:
    from distenv.args import add_launcher_argument as add_launcher_argument
    from distenv.bootstrap.init import init_dist as init_dist
    from distenv.bootstrap.init import setup as setup
    from distenv.comm import allreduce_grads as allreduce_grads
    from distenv.comm import allreduce_params as allreduce_params
    from distenv.comm import barrier as barrier
    from distenv.comm import get_dist_info as get_dist_info
    from distenv.comm import get_local_group as get_local_group
    from distenv.comm import is_main_process as is_main_process
    from distenv.comm import master_only as master_only
    from distenv.detection.pipeline import Detection as Detection
    from distenv.detection.pipeline import detect as detect
    from distenv.detection.pipeline import explain as explain
    from distenv.detection.pipeline import resolve as resolve
    from distenv.device import current_device as current_device
    from distenv.errors import DistEnvError as DistEnvError
    from distenv.errors import NotLaunchedError as NotLaunchedError
    from distenv.errors import RendezvousTimeoutError as RendezvousTimeoutError
    from distenv.errors import RequeueError as RequeueError
    from distenv.errors import WorkerFailedError as WorkerFailedError
    from distenv.local.spawn import launch as launch
    from distenv.log import get_logger as get_logger
    from distenv.preempt import requeue as requeue
    from distenv.preempt import stop_requested as stop_requested
    from distenv.preempt import watch_preemption as watch_preemption
    from distenv.rankinfo import RankInfo as RankInfo
    from distenv.seeding import seed_everything as seed_everything

__version__ = "0.2.0.dev0"

# The public names, each written once: name -> the module that defines it. `__all__`, `__dir__`
# and `__getattr__` follow these two tables, in docs/api.md's order.
#
# The core: start a job, describe it, stop it, and the errors a script catches (the others are
# `distenv.errors`'). Its functions say "distenv" as their `__module__` once loaded (help(), pickles,
# reprs: `distenv.init_dist`). Its classes keep their module's: `typing.get_type_hints` resolves a
# class's annotations in the module its `__module__` names (Detection's name the pipeline's
# imports), and an error's qualified name is part of the one line a refused rank prints
# (docs/errors.md). A function's annotations resolve through its own globals.
_CORE = {
    "init_dist": "distenv.bootstrap.init",
    "setup": "distenv.bootstrap.init",
    "add_launcher_argument": "distenv.args",
    "current_device": "distenv.device",
    "RankInfo": "distenv.rankinfo",
    "detect": "distenv.detection.pipeline",
    "explain": "distenv.detection.pipeline",
    "resolve": "distenv.detection.pipeline",
    "Detection": "distenv.detection.pipeline",
    "launch": "distenv.local.spawn",
    "watch_preemption": "distenv.preempt",
    "stop_requested": "distenv.preempt",
    "requeue": "distenv.preempt",
    "DistEnvError": "distenv.errors",
    "NotLaunchedError": "distenv.errors",
    "RendezvousTimeoutError": "distenv.errors",
    "WorkerFailedError": "distenv.errors",
    "RequeueError": "distenv.errors",
}
# The training helpers of mmcv's and detectron2's scripts; their `__module__` stays their home's.
_HELPERS = {
    "get_dist_info": "distenv.comm",
    "is_main_process": "distenv.comm",
    "master_only": "distenv.comm",
    "barrier": "distenv.comm",
    "get_local_group": "distenv.comm",
    "allreduce_grads": "distenv.comm",
    "allreduce_params": "distenv.comm",
    "seed_everything": "distenv.seeding",
    "get_logger": "distenv.log",
}
_HOMES = {**_CORE, **_HELPERS}


def __getattr__(name: str) -> Any:
    """Load a public name from its module on first use, then keep it as a plain attribute.

    Any other name that is one of distenv's modules (`distenv.errors`, `distenv.launchers`, ...)
    imports it, as `import distenv` did for most of them before it loaded nothing but itself.
    """
    if name not in _HOMES:
        return _submodule(name)
    value = getattr(importlib.import_module(_HOMES[name]), name)
    if name in _CORE and isinstance(value, FunctionType):
        value.__module__ = __name__
    globals()[name] = value  # later lookups skip __getattr__
    return value


def _submodule(name: str) -> Any:
    missing = AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if not name.isidentifier() or name.startswith("__"):  # never run __main__ on a probe
        raise missing
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise  # the module exists and lacks one of its own imports: say so
        raise missing from None


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


__all__ = ["__version__", *_CORE, *_HELPERS]
