"""The docs' committed sections: the renderings of docs/hooks.py kept in the Markdown itself.

docs/ read on a code host shows no rendered marker: the sections a reader of the repository needs
(`COMMITTED`) are written into the page between the marker and ``<!-- end: KIND -->``, and the
site renders them afresh (`hooks.expand_markers`). ``python docs/sections.py`` rewrites every
page's sections after a change; tests/meta/test_docs.py fails while one differs from its
rendering. A page with a section only the site shows says so at its top (`SITE_NOTE`).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["COMMITTED", "SITE_NOTE", "for_code_hosts", "with_sections"]


def _load_hooks() -> ModuleType:
    """Return docs/hooks.py as a module (docs/ is no package; MkDocs loads it by path too)."""
    path = Path(__file__).resolve().parent / "hooks.py"
    spec = importlib.util.spec_from_file_location("distenv_docs_hooks", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = sys.modules.get(spec.name) or importlib.util.module_from_spec(spec)
    if spec.name not in sys.modules:
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module


hooks = _load_hooks()

#: The markers whose rendering is committed into the page (module docstring): small sections a
#: reader of the repository needs. The others (benchmark tables, the layers, the templates) exist
#: on the built site only.
COMMITTED = (
    "cli-help",
    "run-refused-flags",
    "env-table",
    "mpi-flavors",
    "settings-table",
    "detection-order",
    "env-exports",
    "restart-kinds",
)
#: What a page with a section only the built site shows (``:::`` API entries, a site-only
#: marker) says at its top, so that its reader on a code host knows where the rest is.
SITE_NOTE = "pip install -e '.[docs]' && mkdocs serve"


def for_code_hosts(markdown: str) -> str:
    """Return rendered Markdown as a code host shows it right: a table cell's pipe escaped.

    GitHub's tables split a row at every unescaped pipe, a code span's included (GFM's tables
    extension); Python-Markdown, the site's, keeps a code span's pipe and would show the
    backslash, so the site renders the section afresh from the marker instead.
    """
    lines = []
    for line in markdown.split("\n"):
        if line.startswith("|"):
            parts = line.split("`")
            line = "`".join(p.replace("|", "\\|") if i % 2 else p for i, p in enumerate(parts))
        lines.append(line)
    return "\n".join(lines)


def with_sections(markdown: str) -> str:
    """Return `markdown` with every `COMMITTED` marker followed by its fresh rendering.

    A marker alone gains its section; a section already there is rendered again. The page is
    unchanged exactly when its committed sections are up to date.
    """

    def section(kind: str, arg: str, marker: str) -> str:
        return f"{marker}\n{for_code_hosts(hooks.render(kind, arg, marker))}<!-- end: {kind} -->"

    def again(match: re.Match[str]) -> str:
        kind, arg = match.group("kind"), match.group("arg") or ""
        return section(kind, arg, match.group("marker"))

    def alone(match: re.Match[str]) -> str:
        kind, arg = match.group(1), match.group(2) or ""
        return section(kind, arg, match.group(0)) if kind in COMMITTED else match.group(0)

    parts = []
    last = 0
    for match in hooks.SECTION.finditer(markdown):
        parts.append(hooks.MARKER.sub(alone, markdown[last : match.start()]))
        parts.append(again(match))
        last = match.end()
    parts.append(hooks.MARKER.sub(alone, markdown[last:]))
    return "".join(parts)


if __name__ == "__main__":  # python docs/sections.py: rewrite the pages' committed sections
    for page in sorted((hooks.REPO / "docs").rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        fresh = with_sections(text)
        if fresh != text:
            page.write_text(fresh, encoding="utf-8")
            print(f"rewrote {page.relative_to(hooks.REPO)}")
