"""Descriptor limits: a rank raises its soft RLIMIT_NOFILE to what the job needs, or refuses.

Rank 0's store holds one accepted connection per rank (torch's TCPStore server), and gloo connects
every pair of ranks (a full mesh: ``world_size - 1`` sockets on every rank). Both outgrow the soft
limit most systems start processes with (1024) long before the sizes large jobs run at: at 2 048
ranks rank 0's store alone needs twice that, its ``accept`` fails with EMFILE, and ranks wait for
a store that takes no one in. NCCL raises its own soft limit to the hard one, but only inside
``init_process_group``, after the store.

So before it reaches the store each rank counts what it will hold: the descriptors it has open,
``world_size`` for rank 0's store (where rank 0 hosts it), ``world_size - 1`` for a gloo mesh,
`probe.WINDOW` for rank 0's network probes where it probes, and `RESERVE` for the rest. It
raises its soft limit to that much, never lower and never past the hard limit (only as far as
needed: code that uses ``select()`` breaks on descriptors above 1023), and refuses, naming the
limit, the need and the fix, when the hard limit is lower: before any rank waits on it.
"""

from __future__ import annotations

import os
import resource  # Unix only, like every launcher distenv serves
from typing import NamedTuple

from distenv.bootstrap.probe import WINDOW
from distenv.errors import ConfigurationError
from distenv.rankinfo import RankInfo

__all__ = ["RESERVE", "Need", "ensure_descriptors", "needed", "open_descriptors"]

#: Descriptors kept for everything else a rank opens (files, pipes, torch's own sockets).
RESERVE = 64


class Need(NamedTuple):
    """The descriptors one rank will hold at once, by what holds them."""

    open_now: int
    store: int
    mesh: int
    probes: int
    members: int = 0

    @property
    def total(self) -> int:
        return self.open_now + self.store + self.mesh + self.probes + self.members + RESERVE

    def describe(self) -> str:
        parts = [f"{self.open_now} open now"]
        if self.store:
            parts.append(f"{self.store} for the store's connections")
        if self.mesh:
            parts.append(f"{self.mesh} for gloo's connections to every other rank")
        if self.probes:
            parts.append(f"{self.probes} for the network probes")
        if self.members:
            parts.append(f"{self.members} for the node's other ranks (it leads the node)")
        return ", ".join([*parts, f"{RESERVE} in reserve"])


def open_descriptors() -> int:
    """Return how many descriptors this process has open (0 where /proc does not say)."""
    try:
        return max(len(os.listdir("/proc/self/fd")) - 1, 0)  # less listdir's own
    except OSError:
        return 0


def needed(
    info: RankInfo,
    backend: str,
    *,
    hosts_store: bool,
    probes: bool,
    open_now: int,
    members: int = 0,
) -> Need:
    """Return what `info`'s rank will hold with `backend` (`hosts_store`: rank 0's own store;
    `members`: the connections of a node leader's other ranks)."""
    mesh = info.world_size - 1 if "gloo" in backend else 0
    store = info.world_size if hosts_store else 0
    return Need(open_now, store, mesh, WINDOW if probes else 0, members)


def ensure_descriptors(
    info: RankInfo, backend: str, *, hosts_store: bool, probes: bool, members: int = 0
) -> None:
    """Raise this process's soft RLIMIT_NOFILE to what the rank needs (`needed`), or refuse.

    Raises:
        ConfigurationError: If the hard limit is below the need.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = needed(
        info, backend, hosts_store=hosts_store, probes=probes, open_now=0, members=members
    )
    if soft == resource.RLIM_INFINITY or need.total <= soft:
        return
    need = need._replace(open_now=open_descriptors())
    total = need.total
    if total <= soft:
        return
    if hard != resource.RLIM_INFINITY and total > hard:
        raise ConfigurationError(
            info.launcher,
            f"{info.who} needs about {total} file descriptors "
            f"({need.describe()}) but its hard limit (RLIMIT_NOFILE, `ulimit -Hn`) is {hard}",
            hint=f"raise the hard limit of open files to at least {total} where the job starts: "
            "nofile in /etc/security/limits.conf or the service's LimitNOFILE=, a container's "
            "--ulimit nofile=...; under Slurm the limit srun propagates is the submitting "
            "shell's (PropagateResourceLimits, srun --propagate)",
            variable="RLIMIT_NOFILE",
            value=str(hard),
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (total, hard))
