"""The public plug-in contract: what a third-party launcher imports (docs/plugins.md).

A plug-in subclasses `Launcher` (or `Scheduler` for a launcher that owns an allocation,
`AllocationLauncher` for one whose ranks lean on an enclosing scheduler's allocation), declares
and reads its variables with `Var` and `Reader`, honours the user's MASTER_ADDR/MASTER_PORT with
`MASTER_VARS`, states its master and export tag with `Default`, `scheduler_port` and `scope_tag`,
answers in `Nodes` and `World`, and registers under the `PLUGIN_GROUP` entry-point group. The
built-in launchers live one per module beside `base`; `distenv.launchers.registry` lists them in
detection order and finds a launcher by name.
"""

from __future__ import annotations

from distenv.launchers.base import (
    PLUGIN_GROUP,
    AllocationLauncher,
    Default,
    Launcher,
    Nodes,
    Scheduler,
    World,
)
from distenv.master import MASTER_VARS, scheduler_port, scope_tag
from distenv.variables import Reader, Var

__all__ = [
    "MASTER_VARS",
    "PLUGIN_GROUP",
    "AllocationLauncher",
    "Default",
    "Launcher",
    "Nodes",
    "Reader",
    "Scheduler",
    "Var",
    "World",
    "scheduler_port",
    "scope_tag",
]


def __getattr__(name: str) -> object:
    """Resolve the registry's names (``SLURM``, ``get_launcher``, ...) as 0.1.0 offered them here.

    They are no part of the contract (not in `__all__`); their module is
    `distenv.launchers.registry`, and ``PLUGINS_VAR`` is `distenv.settings`'.
    """
    from distenv import settings
    from distenv.launchers import registry

    if name in registry.__all__:
        return getattr(registry, name)
    if name == "PLUGINS_VAR":
        return settings.PLUGINS_VAR
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
