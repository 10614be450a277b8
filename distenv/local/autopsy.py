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
stacks are grouped by `distenv.postmortem.stacks`, which the in-process autopsy of ``init_dist`` shares.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping, Sequence

from distenv.deadline import Deadline
from distenv.local.watchdog import DUMP_SIGNAL
from distenv.local.witness import Witness
from distenv.postmortem.stacks import (
    DUMP_WAIT,
    HANG_STATUS,
    clip,
    describe,
    group,
    main_stack,
    rank_ranges,
    summary,
    suspects,
)

__all__ = ["DUMP_WAIT", "HANG_STATUS", "Autopsy", "describe", "group", "summary", "suspects"]


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank{'s' * (len(ranks) > 1)} {rank_ranges(ranks)}"


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
            f"{clock}, at {clip(frame)}",
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
