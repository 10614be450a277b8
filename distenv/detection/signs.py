"""Signs of a multi-process job that no launcher claimed: ``auto`` refuses, never "rank 0 of 1".

When no launcher detects this process, ``auto`` would run it alone: rank 0 of 1 on 127.0.0.1.
On one node of a multi-node job whose launcher distenv does not read, that is N separate
trainings, each writing checkpoints as rank 0, and an exit status of 0 on every node. So before
answering a single process, `multi_process_signs` looks for any sign that this process is one of
several:

- a declared variable of any launcher (`Launcher.variables`) that fills a world size, a node
  count or a local size with a number above 1, or a rank, node rank or local rank above 0; and
- the variables below of launchers distenv has no module for yet (`UNREAD`), each cited from its
  vendor's documentation (these services cannot run here).

`--launcher none` is the way to run such a process alone on purpose.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from distenv.launchers import Launcher

__all__ = ["UNREAD", "Sign", "Unread", "multi_process_signs"]

#: RankInfo fields that say "several" above 1, and those that say "not the first" above 0.
SIZES = frozenset(("world_size", "num_nodes", "local_world_size"))
RANKS = frozenset(("rank", "node_rank", "local_rank"))


class Unread(NamedTuple):
    """A variable of a launcher distenv does not read yet, and what it says (a size or a rank)."""

    name: str
    launcher: str
    field: str
    source: str


#: Vendors' variables that make a process one of several (issue #29), with their documentation.
UNREAD: tuple[Unread, ...] = (
    Unread(
        "_CONDOR_NPROCS",
        "HTCondor parallel universe",
        "world_size",
        "HTCondor manual: parallel universe, $(Node) and _CONDOR_PROCNO/_CONDOR_NPROCS",
    ),
    Unread(
        "_CONDOR_PROCNO",
        "HTCondor parallel universe",
        "rank",
        "HTCondor manual: parallel universe, $(Node) and _CONDOR_PROCNO/_CONDOR_NPROCS",
    ),
    Unread(
        "NSLOTS",
        "Grid Engine parallel environment",
        "world_size",
        "Grid Engine sge_pe(5) and qsub(1): NSLOTS, with PE and PE_HOSTFILE in a parallel job",
    ),
)
# Grid Engine sets NSLOTS in every job; only a parallel environment's makes it a sign.
_NEEDS = {"NSLOTS": "PE_HOSTFILE"}


class Sign(NamedTuple):
    """One variable that says this process is one of several."""

    name: str
    value: str
    launcher: str
    field: str


def _says_several(field: str, value: str) -> bool:
    text = value.strip()
    if not text.isdigit() or len(text) > 9:
        return False
    number = int(text)
    return (field in SIZES and number > 1) or (field in RANKS and number > 0)


def multi_process_signs(launchers: Iterable[Launcher], env: Mapping[str, str]) -> list[Sign]:
    """Return every variable in `env` that says this process is one of several, in order.

    `launchers` are those ``auto`` considered (none detected this process); a value that is no
    number is no sign here (the launcher that reads it refuses it).
    """
    signs: list[Sign] = []
    seen: set[str] = set()
    for launcher in launchers:
        for var in launcher.variables:
            value = env.get(var.name)
            if var.name not in seen and value and _says_several(var.field, value):
                seen.add(var.name)
                signs.append(Sign(var.name, value, launcher.name, var.field))
    for unread in UNREAD:
        value = env.get(unread.name)
        needed = _NEEDS.get(unread.name)
        if needed is not None and not env.get(needed):
            continue
        if unread.name not in seen and value and _says_several(unread.field, value):
            seen.add(unread.name)
            signs.append(Sign(unread.name, value, unread.launcher, unread.field))
    return signs
