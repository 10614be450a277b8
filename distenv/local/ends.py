"""How one rank ended, as its node saw it, and what its end causes on the others.

`End` is one rank's end: its status, its report, its crash's frames, whether the kernel's OOM
killer or ``distenv run``'s stop ended it. `CONSEQUENCES` are what a survivor writes when a peer's
failure breaks it (its collective's traceback, torch's C++ stack dumps, ``terminate called``):
the card counts them instead of printing them. The `distenv.local.witness.Witness` of a node
makes the ends; ``distenv why`` (`distenv.cli.why`) makes them from a log folder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from distenv.postmortem.failure import Report

__all__ = ["CONSEQUENCES", "ONCE_PER_RANK", "End"]

#: What a survivor writes when a peer's failure breaks it: the card counts each kind.
CONSEQUENCES: dict[str, re.Pattern[bytes]] = {
    "tracebacks": re.compile(rb"Traceback \(most recent call last\)"),
    "lost store": re.compile(rb"TCPStore|recvValue|DistStoreError|DistNetworkError"),
    "closed connections": re.compile(rb"Connection (closed|reset) by peer|Broken pipe"),
    "C++ stack dumps": re.compile(rb"Exception raised from"),
    "terminate called": re.compile(rb"terminate called"),
}
#: The consequences counted once per rank: words that a traceback repeats.
ONCE_PER_RANK = frozenset({"lost store", "closed connections"})


@dataclass
class End:
    """How one local rank ended, as far as this node saw.

    Attributes:
        rank: Its global rank.
        local_rank: Its index on this node.
        pid: Its process id.
        returncode: ``Popen.returncode`` style: status, or -N for signal N.
        at: When it failed: its report's time, the fault file's, else when it was seen ended.
        report: What it reported (None: it raised nothing, or is no Python rank).
        fault: The frames `faulthandler` wrote at a fatal signal, innermost last.
        oom: Whether the kernel's OOM killer killed it (cgroup count or kernel log).
        stopped: Whether it ended after distenv run began stopping the ranks.
        last: Its last lines of output before it failed.
    """

    rank: int
    local_rank: int
    pid: int
    returncode: int
    at: float
    report: Report | None = None
    fault: tuple[str, ...] = ()
    oom: bool = False
    stopped: bool = False
    last: tuple[bytes, ...] = ()

    @property
    def status(self) -> int:
        """Return the exit status the job takes from this failure (128+N for a crash by signal N).

        A rank that raised but was stopped while it exited (SIGTERM from the stop) failed with
        the status Python was ending it with: 1, or ``sys.exit``'s code (its report's).
        """
        if self.returncode > 0:
            return self.returncode
        if self.returncode < 0 and self.report is None and not self.stopped:
            return 128 - self.returncode
        return 1 if self.report is None else self.report.status

    @property
    def failed(self) -> bool:
        """Return whether it failed (a report, or an end other than success)."""
        return self.report is not None or self.returncode != 0

    @property
    def own(self) -> bool:
        """Return whether it failed on its own, not because a peer or distenv run ended it."""
        if self.report is not None:
            return not self.report.peer and self.report.kind != "stopped"
        return self.returncode != 0 and not self.stopped

    def order(self) -> tuple[int, float]:
        """Sort key of the failures, the cause first: a crash by signal, then the earliest."""
        crashed = self.report is None and self.returncode < 0
        return (0 if crashed else 1, self.at)
