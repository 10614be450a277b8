"""The job-script templates of scripts/, shipped in the package: `distenv template` prints them.

The package's ``distenv/scripts`` is the repository's ``scripts/`` (a symbolic link in the source
tree; the wheel and the sdist hold copies of the files), so ``pip install`` users get exactly the
scripts the tests submit. A template is named by its path under scripts/
(``slurm/single_node.sbatch``); a file added there is listed without code changes.
"""

from __future__ import annotations

import re
from importlib.resources import files
from typing import TYPE_CHECKING

from distenv.errors import ConfigurationError

if TYPE_CHECKING:
    from importlib.abc import Traversable  # importlib.resources.abc from Python 3.11

__all__ = ["description", "find", "names", "read", "summary"]

_ROOT = "scripts"
# Scheduler directive lines (sbatch, bsub, qsub, flux batch): they end a leading comment.
_DIRECTIVES = ("#SBATCH", "#BSUB", "#PBS", "#flux:")


def _root() -> Traversable:
    return files("distenv").joinpath(_ROOT)


def _walk(folder: Traversable, prefix: str) -> list[str]:
    found: list[str] = []
    for entry in folder.iterdir():
        if entry.name.startswith((".", "_")):
            continue
        if entry.is_dir():
            found += _walk(entry, f"{prefix}{entry.name}/")
        elif entry.is_file():
            found.append(prefix + entry.name)
    return found


def names() -> tuple[str, ...]:
    """Return every template's name (its path under scripts/), sorted."""
    return tuple(sorted(_walk(_root(), "")))


def find(name: str) -> str:
    """Return the template `name` stands for: its full name, a unique file name or stem, else
    the one template whose name contains it (``single``, ``array``).

    Raises:
        ConfigurationError: If no template, or more than one, matches `name` (the error names
            the ones it could mean).
    """
    known = names()
    if name in known:
        return name
    matches = [
        n for n in known if name in (n.rsplit("/", 1)[-1], n.rsplit("/", 1)[-1].split(".")[0])
    ] or [n for n in known if name in n]
    if len(matches) == 1:
        return matches[0]
    problem = (
        f"no template {name!r}" if not matches else f"{name!r} is ambiguous ({', '.join(matches)})"
    )
    raise ConfigurationError(
        "template",
        problem,
        hint=f"name one of: {', '.join(known)} (`distenv template` lists them)",
    )


def read(name: str) -> str:
    """Return the text of template `name` (see `find`), exactly as scripts/ holds it."""
    text: str = _root().joinpath(*find(name).split("/")).read_text(encoding="utf-8")
    return text


def description(name: str) -> str:
    """Return the first paragraph of template `name`'s leading comment (after the shebang)."""
    words: list[str] = []
    for line in read(name).splitlines()[1:]:
        text = line.lstrip("#").strip()
        if not line.startswith("#") or not text or line.startswith(_DIRECTIVES):
            break
        words.append(text)
    return " ".join(words)


def summary(name: str) -> str:
    """Return what template `name` is for: the first clause of its `description`, whole."""
    return re.split(r"[.:](?:\s|$)", description(name), maxsplit=1)[0]
