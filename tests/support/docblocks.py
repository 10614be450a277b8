"""The code blocks and "checked with" claims of the recipe pages, and the markers that back them.

Every fenced Python block of the recipe pages (docs/start/*.md, docs/migration.md) carries a marker
on the line before it, either

    <!-- run: tests/integration/test_recipes.py::test_accelerate -->

naming the test(s) that execute it (several, separated by spaces), or

    <!-- not-run: why no test executes it -->

The named test reads the block from the page with `recipe` (so the docs' text is what runs).
Likewise a sentence of those pages that says something was checked, tested or measured sits in a
paragraph that carries ``<!-- backed-by: tests/...::test_name -->``. tests/meta/test_docs.py enforces
both; docs/hooks.py renders the markers to nothing.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w-]*)\s*$")
BLOCK_MARKER = re.compile(r"^\s*<!--\s*(?P<kind>run|not-run):\s*(?P<arg>.*?)\s*-->\s*$")
BACKED_BY = re.compile(r"<!--\s*backed-by:\s*(?P<arg>.*?)\s*-->")
CLAIM = re.compile(
    r"(?<!not )\b(?:checked|tested|verified) (?:with|under|on)\b|\bmeasured\b", re.IGNORECASE
)


def recipe_pages() -> list[Path]:
    """Return the pages whose code blocks are recipes: docs/start/*.md and docs/migration.md."""
    return [*sorted((DOCS / "start").glob("*.md")), DOCS / "migration.md"]


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page, dedented, with the marker on the line before it."""

    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    kind: str | None  # "run", "not-run" or None (no marker)
    arg: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def tests(self) -> list[str]:
        """The test ids a ``run`` marker names."""
        return self.arg.split() if self.kind == "run" else []


def blocks(page: Path) -> list[Block]:
    """Return every fenced block of `page`, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None or not m.group("lang"):
            i += 1
            continue
        indent, start = m.group("indent"), i
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        body = [
            line[len(indent) :] if line.startswith(indent) else line.strip()
            for line in lines[i + 1 : end]
        ]
        prev = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = BLOCK_MARKER.match(prev)
        found.append(
            Block(
                page=page,
                line=start + 1,
                lang=m.group("lang"),
                code="\n".join(body) + "\n",
                kind=marker.group("kind") if marker else None,
                arg=marker.group("arg") if marker else "",
            )
        )
        i = end + 1
    return found


def python_blocks() -> list[Block]:
    """Return the Python blocks of every recipe page."""
    return [b for page in recipe_pages() for b in blocks(page) if b.lang == "python"]


def recipe(test_id: str, lang: str = "python") -> list[Block]:
    """Return the blocks (of `lang`) whose ``run`` marker names `test_id`, in page order.

    Raises:
        LookupError: When none does, so that a test never runs an empty recipe.
    """
    found = [
        b for page in recipe_pages() for b in blocks(page) if b.lang == lang and test_id in b.tests
    ]
    if not found:
        raise LookupError(f"no {lang} block of the recipe pages is marked 'run: {test_id}'")
    return found


def names_a_test(test_id: str) -> bool:
    """Return whether ``path::name`` names a test function defined in that file."""
    path, _, name = test_id.partition("::")
    file = REPO / path
    if not name or not file.is_file():
        return False
    tree = ast.parse(file.read_text(encoding="utf-8"))
    return any(
        isinstance(node, ast.FunctionDef) and node.name == name and name.startswith("test_")
        for node in tree.body
    )


@dataclass(frozen=True)
class Claim:
    """A paragraph of a recipe page that says something was checked, tested or measured."""

    page: Path
    line: int
    text: str
    backed_by: list[str]

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def claims(page: Path) -> list[Claim]:
    """Return the paragraphs of `page` (outside code blocks) that make a claim of checking."""
    found = []
    paragraph: list[tuple[int, str]] = []
    in_code = False

    def flush() -> None:
        text = " ".join(line.strip() for _, line in paragraph)
        if paragraph and CLAIM.search(BACKED_BY.sub("", text)):
            backed = [t for m in BACKED_BY.finditer(text) for t in m.group("arg").split()]
            found.append(Claim(page, paragraph[0][0], text, backed))
        paragraph.clear()

    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
        if FENCE.match(line):
            flush()
            in_code = not in_code
        elif in_code:
            continue
        elif line.strip():
            paragraph.append((number, line))
        else:
            flush()
    flush()
    return found
