"""Import and detection stay light: no torch, no mpi4py, no subprocess, no entry-point scan."""

from __future__ import annotations

import ast
import importlib
import json
import pickle
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from tests.conftest import scrubbed_environ

PROBE = r"""
import json, sys
events = []
def hook(event, args):
    if event.startswith(("subprocess.", "os.system", "os.exec", "os.spawn", "os.posix_spawn",
                         "os.fork")):
        events.append(event)
sys.addaudithook(hook)
import distenv
loaded_by_import = sorted(m for m in sys.modules if m.startswith("distenv"))
for launcher in ("auto", "slurm", "none"):
    distenv.detect(launcher)
print(json.dumps({
    "events": events,
    "loaded_by_import": loaded_by_import,
    "modules": sorted(m for m in ("torch", "mpi4py", "numpy", "importlib.metadata")
                      if m in sys.modules),
}))
"""

SRUN_ENV = {
    "SLURM_JOB_ID": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "0",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_STEP_NUM_NODES": "1",
    "SLURM_STEP_TASKS_PER_NODE": "2",
    "SLURM_STEP_NODELIST": "n1",
}


def test_detection_imports_nothing_heavy_and_starts_no_process() -> None:
    """`import distenv; detect()` under srun loads neither torch nor mpi4py and spawns nothing;
    `import distenv` alone loads none of distenv's modules (each public name loads its own)."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**scrubbed_environ(), **SRUN_ENV},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    report = json.loads(result.stdout)
    assert report == {"events": [], "loaded_by_import": ["distenv"], "modules": []}


# The public names as they stood before distenv's modules moved into subpackages: any of them
# that disappears, from `distenv` or from the plug-in contract, breaks somebody's script.
PUBLIC = [
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
    "requeue",
    "resolve",
    "seed_everything",
    "setup",
    "stop_requested",
    "watch_preemption",
]
# The plug-in contract (docs/plugins.md): all that `distenv.launchers` exports.
PLUGIN_CONTRACT = [
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
# The registry's names, which `distenv.launchers` exported beside the contract before 0.2.0:
# they still resolve there.
REGISTRY = [
    "AWS_BATCH",
    "AZUREML",
    "BUILTIN",
    "DETECTION_ORDER",
    "FLUX",
    "INDEXED_JOB",
    "KUBEFLOW",
    "LSF",
    "MPI",
    "NONE",
    "PBS",
    "PLUGINS_VAR",
    "SAGEMAKER",
    "SKYPILOT",
    "SLURM",
    "TORCHRUN",
    "VOLCANO",
    "auto_candidates",
    "canonical_name",
    "checked_name",
    "get_launcher",
]


def test_every_public_name_imports() -> None:
    """Each name of `distenv.__all__` and `distenv.launchers.__all__` resolves, the old ones too."""
    import distenv
    import distenv.launchers

    assert set(PUBLIC) <= set(distenv.__all__)
    assert sorted(distenv.launchers.__all__) == sorted(PLUGIN_CONTRACT)
    for module in (distenv, distenv.launchers):
        for name in module.__all__:
            assert getattr(module, name) is not None, (module.__name__, name)


def test_registry_names_resolve_from_the_contract_namespace_and_their_module() -> None:
    """`from distenv.launchers import SLURM` still works, outside the contract, as the same object."""
    import distenv.launchers
    import distenv.launchers.registry
    import distenv.settings

    for name in REGISTRY:
        home = distenv.settings if name == "PLUGINS_VAR" else distenv.launchers.registry
        assert getattr(distenv.launchers, name) is getattr(home, name), name
    with pytest.raises(AttributeError, match="no attribute 'SLRUM'"):
        distenv.launchers.SLRUM  # noqa: B018


def _static_imports() -> dict[str, str]:
    """The `if TYPE_CHECKING:` imports of distenv/__init__.py, name -> module, each `name as name`."""
    tree = ast.parse(Path(str(importlib.import_module("distenv").__file__)).read_text())
    (block,) = [
        node
        for node in tree.body
        if isinstance(node, ast.If)
        and isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"
    ]
    found: dict[str, str] = {}
    for statement in block.body:
        assert isinstance(statement, ast.ImportFrom), ast.dump(statement)
        for alias in statement.names:
            assert alias.asname == alias.name, f"{alias.name}: write `{alias.name} as {alias.name}`"
            assert alias.name not in found, alias.name
            found[alias.name] = str(statement.module)
    return found


def test_one_table_drives_the_public_names() -> None:
    """`__all__`, `dir()`, the lazy loader and the static imports all follow distenv's two tables,
    core then training helpers, and each name is its home module's object."""
    import distenv

    homes = {**distenv._CORE, **distenv._HELPERS}
    assert not set(distenv._CORE) & set(distenv._HELPERS)
    assert distenv.__all__ == ["__version__", *distenv._CORE, *distenv._HELPERS]
    assert set(homes) <= set(dir(distenv))
    assert _static_imports() == homes
    for name, module in homes.items():
        assert getattr(distenv, name) is getattr(importlib.import_module(module), name), name
    with pytest.raises(AttributeError, match="no attribute 'init_dsit'"):
        distenv.init_dsit  # noqa: B018


def test_core_functions_say_distenv_and_everything_else_keeps_its_module() -> None:
    """`help()`, pickles and reprs name a core function `distenv.X`; a core class keeps its module,
    where `typing.get_type_hints` resolves its annotations (an error's is the name a refused rank
    prints), and a training helper keeps its home (`distenv.comm`, ...)."""
    import distenv

    for name, home in distenv._CORE.items():
        value = getattr(distenv, name)
        if isinstance(value, type):
            assert value.__module__ == home, name
            typing.get_type_hints(value)
        else:
            assert value.__module__ == "distenv", name
            assert pickle.loads(pickle.dumps(value)) is value, name  # noqa: S301 (our own bytes)
    for name, home in distenv._HELPERS.items():
        assert getattr(distenv, name).__module__ == home, name


# The modules that `import distenv` loaded, and so set as attributes, before it loaded only itself.
SUBMODULES = [
    "_hosts",
    "deadline",
    "detection",
    "errors",
    "exits",
    "launchers",
    "master",
    "rankinfo",
    "settings",
    "system",
    "timing",
    "variables",
]


def test_modules_stay_attributes_of_a_fresh_import() -> None:
    """`import distenv; distenv.errors.NotLaunchedError` works as before: a module of distenv's
    imports on first use; a name that is neither a public name nor a module is an AttributeError,
    and a probe for `__main__` does not start the CLI."""
    probe = (
        "import distenv, json, sys\n"
        f"found = [getattr(distenv, n) is sys.modules['distenv.' + n] for n in {SUBMODULES!r}]\n"
        "absent = [hasattr(distenv, n) for n in ('SLRUM', '__main__', '__wrapped__', 'a.b')]\n"
        "print(json.dumps([found, absent]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        env=scrubbed_environ(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    found, absent = json.loads(result.stdout)
    assert found == [True] * len(SUBMODULES)
    assert absent == [False] * 4
