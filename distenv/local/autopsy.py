"""The hang autopsy's card: every rank's stack, grouped, and the rank(s) whose stack differs.

When a rank's watchdog says it made no progress for the hang timeout (`distenv.local.watchdog`),
``distenv run`` has every local rank dump its threads' stacks into its fault file and prints::

    distenv run: the job hung: rank 0 made no progress for 3 s (since 17:30:26), at train.py:88
      differs: rank 2 at train.py:54 in train: time.sleep(60)
      others:  ranks 0-1,3 waiting in all_reduce at train.py:88 in train: dist.all_reduce(x)
      stacks:  /tmp/distenv-run-t9hw/rank-N.fault hold every thread's stack of each rank
      stopped: every rank, by distenv run (SIGTERM); exit status 124, as timeout(1)
      log:     ...

The stacks compared are the main threads' (faulthandler writes the main thread last), frame by
frame. The largest group is the majority; a rank in a smaller group is one that diverged. Where
the groups are equal, none is called the majority.
"""

from __future__ import annotations

import linecache
import os
import re
import time
from collections.abc import Mapping, Sequence

from distenv.local.card import rank_ranges
from distenv.local.reporting import users_file

__all__ = ["HANG_STATUS", "Frame", "group", "hang_card", "main_stack", "summary"]

#: The exit status of a job distenv run stopped because it hung: timeout(1)'s.
HANG_STATUS = 124
#: The most groups of stacks a card lists.
MAX_GROUPS = 4
#: The longest text of a line's value.
WIDTH = 200
_FRAME = re.compile(rb'^\s+File "(.+)", line (\d+) in (.+)$')
#: A frame: (file, line, function).
Frame = tuple[str, int, str]


def main_stack(dump: bytes) -> tuple[Frame, ...]:
    """Return the main thread's frames, innermost first, of a faulthandler dump (its last thread)."""
    blocks = [b for b in re.split(rb"\n\s*\n", dump) if b"(most recent call first)" in b]
    if not blocks:
        return ()
    frames = []
    for line in blocks[-1].splitlines():
        match = _FRAME.match(line)
        if match:
            name = match[1].decode("utf-8", "replace")
            frames.append((name, int(match[2]), match[3].decode("utf-8", "replace").strip()))
    return tuple(frames)


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank{'s' * (len(ranks) > 1)} {rank_ranges(ranks)}"


def _shown(frame: Frame) -> str:
    name, number, function = frame
    source = linecache.getline(name, number).strip()
    where = f"{os.path.basename(name)}:{number} in {function}"
    return f"{where}: {source}" if source else where


def describe(stack: Sequence[Frame]) -> str:
    """Return where a stack waits: ``waiting in all_reduce at train.py:88 in train: ...``."""
    if not stack:
        return "no Python stack was written"
    user = next((i for i, (name, _, _) in enumerate(stack) if users_file(name)), None)
    if user is None:
        return f"in {_shown(stack[0])}"
    if user == 0:
        return f"at {_shown(stack[0])}"
    return f"waiting in {stack[0][2]} at {_shown(stack[user])}"


def group(stacks: Mapping[int, tuple[Frame, ...]]) -> list[tuple[list[int], tuple[Frame, ...]]]:
    """Return the ranks of each distinct stack, the largest group first (then the lowest rank)."""
    groups: dict[tuple[Frame, ...], list[int]] = {}
    for rank in sorted(stacks):
        groups.setdefault(stacks[rank], []).append(rank)
    return sorted(((r, s) for s, r in groups.items()), key=lambda g: (-len(g[0]), g[0][0]))


def _clip(text: str) -> str:
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return shown if len(shown) <= WIDTH else shown[: WIDTH - 3] + "..."


def summary(stacks: Mapping[int, tuple[Frame, ...]], missing: Sequence[int]) -> list[str]:
    """Return the grouped lines: ``differs:`` for each minority group, ``others:`` the majority."""
    groups = group(stacks)
    majority = groups[0] if len(groups) == 1 or len(groups[0][0]) > len(groups[1][0]) else None
    lines = []
    for ranks, stack in groups[1 if majority else 0 : MAX_GROUPS]:
        label = "differs:" if majority is not None else "stack:"
        lines.append(f"  {label:<8} {_clip(f'{_ranks(ranks)} {describe(stack)}')}")
    if len(groups) > MAX_GROUPS:
        rest = [r for ranks, _ in groups[MAX_GROUPS:] for r in ranks]
        lines.append(f"  {'':<8} and {len(groups) - MAX_GROUPS} more stacks: {_ranks(rest)}")
    if majority is not None:
        label = "others:" if len(groups) > 1 else "all:"
        lines.append(f"  {label:<8} {_clip(f'{_ranks(majority[0])} {describe(majority[1])}')}")
    if missing:
        lines.append(f"  {'':<8} {_ranks(missing)}: no dump (ended, or not a Python rank)")
    return lines


def hang_card(
    rank: int,
    frame: str,
    since: float,
    timeout: float,
    stacks: Mapping[int, tuple[Frame, ...]],
    missing: Sequence[int],
    folder: str,
) -> list[str]:
    """Return the card of a hung job, up to its ``stacks:`` line (the supervisor adds the rest).

    Args:
        rank: The first rank whose watchdog found it stuck.
        frame: Where it was stuck, as its watchdog said.
        since: When it last progressed (``time.time()``).
        timeout: The hang timeout in seconds.
        stacks: Each dumped rank's main-thread stack, innermost first.
        missing: The ranks that wrote no dump.
        folder: The run's private folder, which holds the fault files.
    """
    clock = time.strftime("%H:%M:%S", time.localtime(since))
    return [
        f"distenv run: the job hung: rank {rank} made no progress for {timeout:g} s "
        f"(since {clock}, at {_clip(frame)})",
        *summary(stacks, missing),
        f"  stacks:  {folder}/rank-N.fault hold every thread's stack of each rank",
    ]
