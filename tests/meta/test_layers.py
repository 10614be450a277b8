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

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "distenv"


def _contracts() -> list[dict[str, object]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    contracts: list[dict[str, object]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def _modules(package: str = "distenv") -> set[str]:
    """Return the modules and subpackages directly inside `package` (not the modules of those)."""
    path = PACKAGE.joinpath(*package.split(".")[1:])
    return {f"{package}.{module.name}" for module in pkgutil.iter_modules([str(path)])}


def _named(layers: list[str]) -> list[str]:
    return [m for layer in layers for m in re.split(r"\s*[|:]\s*", layer.split("#")[0].strip())]


def test_every_module_is_in_exactly_one_layer() -> None:
    """A module missing from the layers would be free to import anything.

    The top contract names distenv's modules and subpackages; each subpackage but
    `distenv.launchers` (the plug-in contract: one module per launcher, beside `base`) and
    `distenv.cli` (one face and the two modules only it imports) layers its own modules in a
    contract whose container it is.
    """
    layered = [c for c in _contracts() if c["type"] == "layers"]
    (top,) = [c for c in layered if "containers" not in c]
    named = _named(top["layers"])  # type: ignore[arg-type]
    assert len(named) == len(set(named)), sorted(m for m in named if named.count(m) > 1)
    assert set(named) == _modules()
    inner = {c["containers"][0]: c["layers"] for c in layered if "containers" in c}  # type: ignore[index]
    assert set(inner) == {
        "distenv.bootstrap",
        "distenv.detection",
        "distenv.local",
        "distenv.placement",
        "distenv.postmortem",
        "distenv.system",
    }
    for package, layers in inner.items():
        modules = [f"{package}.{m}" for m in _named(layers)]  # type: ignore[arg-type]
        assert len(modules) == len(set(modules)), package
        assert set(modules) == _modules(package), package


def test_detection_modules_use_no_import_tricks() -> None:
    """No importlib.import_module or __import__ where detection runs: every edge is visible."""
    (detection,) = [c for c in _contracts() if str(c["name"]).startswith("Detection reads")]
    sources = [str(m) for m in detection["source_modules"]]  # type: ignore[attr-defined]
    files: list[Path] = []
    for module in [*sources, "distenv.detection.pipeline"]:
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


def test_the_package_stays_small_and_flat() -> None:
    """No module of distenv is over 450 lines, and at most 18 modules sit at the top level
    (the rest live in subpackages named for what they hold: docs/architecture.md)."""
    sizes = {
        str(path.relative_to(REPO)): len(path.read_text("utf-8").splitlines())
        for path in PACKAGE.rglob("*.py")
    }
    assert {name: n for name, n in sizes.items() if n > 450} == {}
    flat = [m for m in _modules() if not m.endswith(("__init__", "__main__"))]
    top = [m for m in flat if (PACKAGE / f"{m.split('.')[-1]}.py").is_file()]
    assert len(top) <= 18, sorted(top)
