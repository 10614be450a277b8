"""How local launchers stop their ranks: one stop policy, and the words for how a rank ended.

`StopPolicy` is the one way both local launchers stop ranks (in the spirit of torch elastic's
``PContext``): the first failure is named with how it ended and how many others were stopped; the
others get SIGTERM (or the stopping signal received), then SIGKILL after the grace period.
`distenv.launch` applies it with `StopPolicy.stop` to its multiprocessing workers; ``distenv run``'s
`distenv.local.supervise.Supervisor` applies it to its ranks' process groups without blocking.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "DEFAULT_GRACE_PERIOD",
    "KILL_WAIT",
    "StopPolicy",
    "Stoppable",
    "describe_exit",
    "exit_status",
]

#: Seconds between SIGTERM and SIGKILL, when the user does not choose (torchrun's default too).
DEFAULT_GRACE_PERIOD = 5.0
#: How long to wait for a process that was sent SIGKILL (it may be stuck in the kernel).
KILL_WAIT = 5.0


def exit_status(returncode: int) -> int:
    """Return the shell-style exit status of a `Popen.returncode` (128+N for signal N)."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(returncode: int) -> str:
    """Return ``exited with status 3`` or ``was killed by SIGSEGV``."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"was killed by {name}"


class Stoppable(Protocol):
    """A rank as `StopPolicy.stop` sees it (a multiprocessing ``Process`` is one)."""

    def is_alive(self) -> bool: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...


@dataclass(frozen=True)
class StopPolicy:
    """How a local launcher stops its ranks, and how it says so.

    Attributes:
        grace_period: Seconds between SIGTERM (or the stopping signal) and SIGKILL.
    """

    grace_period: float = DEFAULT_GRACE_PERIOD

    @staticmethod
    def stopped(others: int) -> str:
        """Return ``stopped the other 3 ranks`` (or that none was running)."""
        if not others:
            return "no other rank was running"
        return f"stopped the other {others} rank{'s' * (others != 1)}"

    def failure(self, rank: int, pid: int | None, how: str, others: int) -> str:
        """Return the message that names the first failure and whom it stopped."""
        return f"rank {rank} (pid {pid}) {how}; {self.stopped(others)}"

    def killed(self, stragglers: Sequence[str]) -> str:
        """Return the message for ranks still running at the end of the grace period."""
        ranks = "ranks" if len(stragglers) > 1 else "rank"
        return (
            f"{ranks} {', '.join(stragglers)} still running {self.grace_period:g}s after the "
            "stop signal; sent SIGKILL"
        )

    def stop(self, ranks: Sequence[Stoppable]) -> int:
        """Send SIGTERM to the live `ranks`, SIGKILL those alive after the grace period.

        Blocks until every one has exited (or KILL_WAIT more seconds passed after SIGKILL).

        Returns:
            How many were alive.
        """
        alive = [rank for rank in ranks if rank.is_alive()]
        for rank in alive:
            rank.terminate()
        deadline = time.monotonic() + self.grace_period
        for rank in alive:
            rank.join(timeout=max(0.0, deadline - time.monotonic()))
        for rank in alive:
            if rank.is_alive():
                rank.kill()
                rank.join(timeout=KILL_WAIT)
        return len(alive)
