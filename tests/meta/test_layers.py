"""The layering is complete and honest: every module sits in a layer, and detection hides nothing.

`lint-imports` (tests/run.sh) checks the contracts of pyproject.toml; these tests check that the
contracts cover every module of distenv, so that a new module cannot escape them, and that the
modules detection runs import only with plain import statements, which the contracts can see.
"""

from __future__ import annotations

import ast
import pkgutil
import re
from pathlib import Path

import tomllib

import distenv

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "distenv"


def _contracts() -> list[dict[str, object]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    contracts: list[dict[str, object]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def _modules() -> set[str]:
    found = {"distenv.launchers"}  # a package: the layers name it whole
    for module in pkgutil.walk_packages(distenv.__path__, "distenv."):
        if not module.name.startswith("distenv.launchers."):
            found.add(module.name)
    return found


def test_every_module_is_in_exactly_one_layer() -> None:
    """A module missing from the layers would be free to import anything."""
    (layers,) = [c for c in _contracts() if c["type"] == "layers"]
    named = [m for layer in layers["layers"] for m in re.split(r"\s*[|:]\s*", str(layer))]  # type: ignore[attr-defined]
    assert len(named) == len(set(named)), sorted(m for m in named if named.count(m) > 1)
    assert set(named) == _modules()


def test_detection_modules_use_no_import_tricks() -> None:
    """No importlib.import_module or __import__ where detection runs: every edge is visible."""
    (detection,) = [c for c in _contracts() if "Detection" in str(c["name"])]
    sources = [str(m) for m in detection["source_modules"]]  # type: ignore[attr-defined]
    files: list[Path] = []
    for module in [*sources, "distenv.pipeline"]:
        path = PACKAGE.joinpath(*module.split(".")[1:])
        files += sorted(path.glob("*.py")) if path.is_dir() else [path.with_suffix(".py")]
    assert len(files) > 10
    for file in files:
        tree = ast.parse(file.read_text(), str(file))
        for node in ast.walk(tree):
            name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
            assert name not in ("import_module", "__import__", "spec_from_file_location"), (
                f"{file.relative_to(REPO)}:{getattr(node, 'lineno', '?')} uses {name}"
            )
