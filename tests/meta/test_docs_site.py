"""The documentation site's reference pages: the API page shows public objects only, the templates
page shows every shipped template, and error examples wrap instead of being cut off."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

from distenv.cli import templates
from tests.meta.test_docs import hooks

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"


def _api_entries() -> list[str]:
    text = (REPO / "docs" / "api.md").read_text()
    return re.findall(r"^::: ([\w.]+)$", text, re.M)


def _resolve(path: str) -> object:
    """Import `path` the way mkdocstrings finds it: the longest importable module, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for part in parts[cut:]:
            obj = getattr(obj, part)
        return obj
    raise AssertionError(f"api.md names {path!r}, which does not import")


def test_api_page_names_only_public_objects() -> None:
    """No private module or name (`distenv._x`, `_Y`) in the API reference."""
    entries = _api_entries()
    assert len(entries) > 20, entries
    for path in entries:
        assert not [p for p in path.split(".") if p.startswith("_")], path
        _resolve(path)


def test_api_page_does_not_document_a_module_in_place_of_a_function() -> None:
    """`::: distenv.X` renders the module distenv/X.py where one exists, not a function
    `distenv.X` of the same name (as the module detect.py once shadowed `distenv.detect`): an
    entry naming a module must not also be a package attribute that is something else."""
    for path in _api_entries():
        parent_module = importlib.import_module(path.rpartition(".")[0])
        if not hasattr(parent_module, "__path__") or importlib.util.find_spec(path) is None:
            continue
        parent, _, name = path.rpartition(".")
        attribute = getattr(importlib.import_module(parent), name, None)
        module = importlib.import_module(path)
        assert attribute is None or attribute is module, f"{path}: module shadows {attribute!r}"


def _section(text: str, heading: str) -> str:
    """The part of a page under `## heading`, up to the next `## ` heading."""
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_api_page_shows_the_core_and_the_training_helpers_apart() -> None:
    """The page's two groups are distenv's two tables: each core name documented as `distenv.X`
    (the error classes named there, documented with `distenv.errors`), each training helper at its
    home module, and both lists in the page's introduction."""
    import distenv

    text = (REPO / "docs" / "api.md").read_text()
    core, helpers = _section(text, "The core"), _section(text, "Training helpers")
    intro = text.split("\n## ", 1)[0]
    entries = set(_api_entries())
    assert "distenv.errors" in entries
    for name in distenv._CORE:
        value = getattr(distenv, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert f"`distenv.{name}`" in core, name
        else:
            assert f"\n::: distenv.{name}\n" in core, name
        assert f"`{name}`" in intro, name
    for name, home in distenv._HELPERS.items():
        assert f"\n::: {home}.{name}\n" in helpers, name
        assert f"`{name}`" in intro, name


def test_templates_page_shows_every_template_in_full() -> None:
    """docs/scripts.md renders, from the package data, a row and the whole text of each file."""
    page = hooks.render_scripts()
    files = sorted(str(p.relative_to(SCRIPTS)) for p in SCRIPTS.rglob("*") if p.is_file())
    assert list(templates.names()) == files
    for name in files:
        assert f"| [`{name}`](#" in page
        body = "\n".join(
            f"    {line}" if line else "" for line in templates.read(name).splitlines()
        )
        assert body in page, name


def test_text_and_console_blocks_wrap_on_the_site() -> None:
    """Error examples are ```text blocks or ```console sessions; the site's CSS wraps both (the
    Hint stays visible). test_docs_browser.py checks the pages themselves in Chromium."""
    config = (REPO / "mkdocs.yml").read_text()
    assert "pygments_lang_class: true" in config
    (css,) = re.findall(r"^extra_css:\n  - (\S+)$", config, re.M)
    text = re.sub(r"/\*.*?\*/", "", (REPO / "docs" / css).read_text(), flags=re.S)
    rules = re.findall(r"([^{}]+)\{([^}]*)\}", text)
    wrapped = {
        selector.strip()
        for selectors, body in rules
        if "white-space: pre-wrap" in body
        for selector in selectors.split(",")
    }
    for lang in ("text", "console"):
        assert f".md-typeset .language-{lang} pre > code" in wrapped, wrapped


def test_readme_says_how_to_build_the_docs() -> None:
    """The README gives the command that builds the site."""
    assert "mkdocs build --strict" in (REPO / "README.md").read_text()
