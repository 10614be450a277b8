"""Python stacks as the hang autopsies see them: written, read back, grouped into a card's lines.

Both autopsies use it: ``distenv run``'s (`distenv.local.autopsy`, from the ranks' fault files)
and the in-process one of ``init_dist(hang_timeout=)`` (`distenv.bootstrap.hang`, from the
stacks the ranks post to the job's store). A stack is written and read in faulthandler's format::

    Current thread 0x00007f5c8c8f1740 (most recent call first):
      File "/work/train.py", line 88 in train
      File "/work/train.py", line 120 in <module>

the innermost frame first, blocks separated by a blank line, the main thread's last (CPython
lists the threads newest first). The stacks compared are the main threads', frame by frame:
the largest group of identical stacks is the majority, and a rank in a smaller group is one
that diverged; where the groups are equal, none is called the majority. Nothing read is
trusted: names are decoded with replacement, and every line made is clipped to `WIDTH`.
"""

from __future__ import annotations

import functools
import linecache
import os
import re
import sysconfig
from collections.abc import Iterable, Mapping, Sequence
from types import FrameType

__all__ = [
    "DUMP_WAIT",
    "HANG_STATUS",
    "MAX_STACK_FRAMES",
    "Frame",
    "clip",
    "describe",
    "frames_of",
    "group",
    "main_stack",
    "rank_ranges",
    "shown",
    "summary",
    "suspects",
    "thread_text",
    "users_file",
]

#: The exit status of a job that an autopsy ended because it hung: timeout(1)'s.
HANG_STATUS = 124
#: The longest wait for the ranks' stacks once they were asked for them.
DUMP_WAIT = 3.0
#: A frame: (file, line, function).
Frame = tuple[str, int, str]
#: The most frames `thread_text` writes of one thread (faulthandler's own limit).
MAX_STACK_FRAMES = 100
#: The most groups of stacks a card lists.
MAX_GROUPS = 4
#: The longest text of a line's value.
WIDTH = 200
_FRAME = re.compile(rb'^\s+File "(.+)", line (\d+) in (.+)$')


@functools.cache
def _not_users() -> tuple[str, ...]:
    """Return the folders whose code is not the user's: distenv, the standard library, packages."""
    # distenv/, two levels above this module (distenv/postmortem/stacks.py).
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    paths = sysconfig.get_paths()
    folders = {
        paths[name] for name in ("stdlib", "platstdlib", "purelib", "platlib") if name in paths
    }
    return (package, *sorted(os.path.join(os.path.realpath(f), "") for f in folders))


def users_file(name: str) -> bool:
    """Return whether the code in file `name` is the user's (not distenv's, Python's, a package's)."""
    return not name.startswith("<") and not os.path.realpath(name).startswith(_not_users())


def rank_ranges(ranks: Iterable[int]) -> str:
    """Return ``0-1,3`` for ranks 0, 1 and 3."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    start = prev = None
    for rank in [*ordered, None]:
        if start is not None and (rank is None or prev is None or rank != prev + 1):
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if rank is not None and start is None:
            start = rank
        prev = rank
    return ",".join(parts)


def thread_text(ident: int, frame: FrameType | None) -> str:
    """Return one thread's block in faulthandler's format, innermost frame first, bounded.

    Args:
        ident: The thread's identifier (``threading.get_ident``), shown as faulthandler does.
        frame: The thread's innermost frame (``sys._current_frames()[ident]``).
    """
    lines = [f"Current thread 0x{ident:016x} (most recent call first):"]
    while frame is not None and len(lines) <= MAX_STACK_FRAMES:
        code = frame.f_code
        name = code.co_filename.replace('"', "'")[:WIDTH]
        lines.append(f'  File "{name}", line {frame.f_lineno or 0} in {code.co_name[:WIDTH]}')
        frame = frame.f_back
    if frame is not None:
        lines.append("  ...")
    return "\n".join(lines) + "\n"


def frames_of(block: bytes) -> tuple[Frame, ...]:
    found = []
    for line in block.splitlines():
        match = _FRAME.match(line)
        if match:
            name = match[1].decode("utf-8", "replace")
            found.append((name, int(match[2]), match[3].decode("utf-8", "replace").strip()))
    return tuple(found)


def main_stack(dump: bytes) -> tuple[Frame, ...]:
    """Return the main thread's frames, innermost first, of a dump (its last thread's block)."""
    blocks = [b for b in re.split(rb"\n\s*\n", dump) if b"(most recent call first)" in b]
    return frames_of(blocks[-1]) if blocks else ()


def shown(frame: Frame) -> str:
    """Return ``train.py:88 in train: dist.all_reduce(x)`` (the source line when readable)."""
    name, number, function = frame
    source = linecache.getline(name, number).strip()
    where = f"{os.path.basename(name)}:{number} in {function}"
    return f"{where}: {source}" if source else where


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank{'s' * (len(ranks) > 1)} {rank_ranges(ranks)}"


def clip(text: str) -> str:
    """Return `text` printable (escapes shown as such) and at most `WIDTH` characters long."""
    shown_text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return shown_text if len(shown_text) <= WIDTH else shown_text[: WIDTH - 3] + "..."


def describe(stack: Sequence[Frame]) -> str:
    """Return where a stack waits: ``waiting in all_reduce at train.py:88 in train: ...``."""
    if not stack:
        return "no Python stack was written"
    user = next((i for i, (name, _, _) in enumerate(stack) if users_file(name)), None)
    if user is None:
        return f"in {shown(stack[0])}"
    if user == 0:
        return f"at {shown(stack[0])}"
    return f"waiting in {stack[0][2]} at {shown(stack[user])}"


def group(stacks: Mapping[int, tuple[Frame, ...]]) -> list[tuple[list[int], tuple[Frame, ...]]]:
    """Return the ranks of each distinct stack, the largest group first (then the lowest rank)."""
    groups: dict[tuple[Frame, ...], list[int]] = {}
    for rank in sorted(stacks):
        groups.setdefault(stacks[rank], []).append(rank)
    return sorted(((r, s) for s, r in groups.items()), key=lambda g: (-len(g[0]), g[0][0]))


def suspects(stacks: Mapping[int, tuple[Frame, ...]]) -> str:
    """Return the card's first words: the rank(s) whose stack differs from the majority's."""
    groups = group(stacks)
    if len(groups) == 1:
        return f"every rank's stack is the same ({_ranks(groups[0][0])})"
    if not groups or len(groups[0][0]) == len(groups[1][0]):
        return "no stack is the majority's: each group is shown"
    odd = sorted(r for ranks, _ in groups[1:] for r in ranks)
    if len(odd) == 1:
        return f"rank {odd[0]}'s stack differs from the other ranks'"
    return f"the stacks of {_ranks(odd)} differ from the other ranks'"


def summary(stacks: Mapping[int, tuple[Frame, ...]], missing: Sequence[int]) -> list[str]:
    """Return the grouped lines: ``differs:`` for each minority group, ``others:`` the majority."""
    groups = group(stacks)
    majority = bool(groups) and (len(groups) == 1 or len(groups[0][0]) > len(groups[1][0]))
    lines = []
    for ranks, stack in groups[1 if majority else 0 : MAX_GROUPS]:
        label = "differs:" if majority else "stack:"
        lines.append(f"  {label:<8} {clip(f'{_ranks(ranks)} {describe(stack)}')}")
    if len(groups) > MAX_GROUPS:
        rest = [r for ranks, _ in groups[MAX_GROUPS:] for r in ranks]
        lines.append(f"  {'':<8} and {len(groups) - MAX_GROUPS} more stacks: {_ranks(rest)}")
    if majority:
        label = "others:" if len(groups) > 1 else "all:"
        lines.append(f"  {label:<8} {clip(f'{_ranks(groups[0][0])} {describe(groups[0][1])}')}")
    if missing:
        lines.append(f"  {'':<8} {_ranks(missing)}: no dump (ended, or not a Python rank)")
    return lines
