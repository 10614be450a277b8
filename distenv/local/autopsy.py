"""The hang autopsy's card: every rank's stack, grouped, and the rank(s) whose stack differs.

When a rank's watchdog says it made no progress for the hang timeout (`distenv.local.watchdog`),
``distenv run`` has every local rank dump its threads' stacks into its fault file and prints::

    distenv run: the job hung: rank 2's stack differs from the other ranks'
      first:   rank 3 made no progress for 3 s, since 18:01:22, at train.py:88 in train
      differs: rank 2 at train.py:54 in train: time.sleep(600)
      others:  ranks 0-1,3 waiting in all_reduce at train.py:88 in train: dist.all_reduce(x)
      stacks:  /tmp/distenv-run-puc7km8d/rank-N.fault hold every thread's stack
      stopped: every rank stopped by distenv run (SIGTERM, grace 5 s) 0.1 s after the dump; ...
      log:     ...

`Autopsy` is the supervisor's part: it asks the ranks for their dumps (when a watchdog says its
rank is stuck, or on SIGUSR1), waits for them (`DUMP_WAIT` at most) and makes the lines. The
stacks compared are the main threads' (`distenv.local.dumps.main_stack`), frame by frame. The
largest group is the majority; a rank in a smaller group is one that diverged. Where
the groups are equal, none is called the majority.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping, Sequence

from distenv.deadline import Deadline
from distenv.failure import users_file
from distenv.local.card import rank_ranges
from distenv.local.dumps import Frame, main_stack, shown
from distenv.local.watchdog import DUMP_SIGNAL
from distenv.local.witness import Witness

__all__ = ["DUMP_WAIT", "HANG_STATUS", "Autopsy", "describe", "group", "summary", "suspects"]

#: The exit status of a job distenv run stopped because it hung: timeout(1)'s.
HANG_STATUS = 124
#: The longest wait for the ranks' stack dumps once they were asked for one.
DUMP_WAIT = 3.0
#: The most groups of stacks a card lists.
MAX_GROUPS = 4
#: The longest text of a line's value.
WIDTH = 200


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank{'s' * (len(ranks) > 1)} {rank_ranges(ranks)}"


def _clip(text: str) -> str:
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
        lines.append(f"  {label:<8} {_clip(f'{_ranks(ranks)} {describe(stack)}')}")
    if len(groups) > MAX_GROUPS:
        rest = [r for ranks, _ in groups[MAX_GROUPS:] for r in ranks]
        lines.append(f"  {'':<8} and {len(groups) - MAX_GROUPS} more stacks: {_ranks(rest)}")
    if majority:
        label = "others:" if len(groups) > 1 else "all:"
        lines.append(f"  {label:<8} {_clip(f'{_ranks(groups[0][0])} {describe(groups[0][1])}')}")
    if missing:
        lines.append(f"  {'':<8} {_ranks(missing)}: no dump (ended, or not a Python rank)")
    return lines


class Autopsy:
    """The supervisor's side of the hang autopsy and of the dumps on demand (module docstring).

    Args:
        witness: The node's witness (the ranks' watchdog lines and fault files).
        ranks: The node's global ranks.
        hang_timeout: The hang timeout in seconds (None: no rank has a watchdog).
    """

    def __init__(self, witness: Witness, ranks: Sequence[int], hang_timeout: float | None) -> None:
        self.witness = witness
        self.ranks = list(ranks)
        self.hang_timeout = hang_timeout
        #: The hang card's first lines, once the job was found hung.
        self.card: list[str] | None = None
        #: When the hang was found (``time.time()``).
        self.found_at = 0.0
        self._pending: tuple[tuple[int, str, float] | None, Deadline] | None = None

    def on_demand(self) -> None:
        """Note a dump on demand: SIGUSR1 was forwarded to the ranks, which dump their stacks."""
        if self._pending is None:
            self._pending = (None, Deadline.after(DUMP_WAIT))

    def poll(self, running: Mapping[int, int], *, watch: bool) -> bool:
        """Ask for dumps or read them, as due; return True once the job is found hung.

        Args:
            running: The pid of each local rank still running.
            watch: Whether a stuck rank still makes a hang (not once the job is stopping).
        """
        if self._pending is None:
            stuck = self.witness.stuck() if watch and self.card is None else None
            if stuck is not None:
                for pid in running.values():  # the rank alone: its children do not dump
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, DUMP_SIGNAL)
                self._pending = (stuck, Deadline.after(DUMP_WAIT))
            return False
        stuck, deadline = self._pending
        if not self.witness.dumped(list(running)) and not deadline.passed():
            return False
        time.sleep(0.05)  # a dump is written at once, but in many writes: let it end
        self._pending = None
        stacks = {rank: main_stack(dump) for rank, dump in self.witness.take_dumps().items()}
        missing = [rank for rank in self.ranks if rank not in stacks]
        folder = f"  stacks:  {self.witness.run_dir.path}/rank-N.fault hold every thread's stack"
        if stuck is None:
            head = (
                f"distenv run: SIGUSR1: the stacks of {len(stacks)} of {len(self.ranks)} local "
                f"ranks ({_ranks(sorted(stacks)) if stacks else 'none'})"
            )
            from distenv.local.output import tell

            tell("\n".join([head, *summary(stacks, missing), folder]))
            return False
        if not watch:
            return False
        rank, frame, since = stuck
        clock = time.strftime("%H:%M:%S", time.localtime(since))
        self.card = [
            f"distenv run: the job hung: {suspects(stacks)}",
            f"  first:   rank {rank} made no progress for {self.hang_timeout or 0:g} s, since "
            f"{clock}, at {_clip(frame)}",
            *summary(stacks, missing),
            folder,
        ]
        self.found_at = time.time()
        return True

    def ending(self, grace: float, killed: bool, log: str) -> str:
        """Return the whole hang card, once the ranks were stopped."""
        assert self.card is not None
        stopped = "every rank killed" if killed else "every rank stopped"
        return "\n".join(
            [
                *self.card,
                f"  stopped: {stopped} by distenv run (SIGTERM, grace {grace:g} s) "
                f"{time.time() - self.found_at:.1f} s after the dump; exit status {HANG_STATUS}, "
                "as timeout(1)",
                log,
            ]
        )
