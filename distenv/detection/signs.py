"""Signs of a multi-process job that no launcher claimed: ``auto`` refuses, never "rank 0 of 1".

When no launcher detects this process, ``auto`` would run it alone: rank 0 of 1 on 127.0.0.1.
On one node of a multi-node job whose launcher distenv does not read, that is N separate
trainings, each writing checkpoints as rank 0, and an exit status of 0 on every node. So before
answering a single process, `multi_process_signs` looks for any sign that this process is one of
several:

a declared variable of any launcher (`Launcher.variables`) that fills a world size, a node count
or a local size with a number above 1, or a rank, node rank or local rank above 0. A launcher
distenv reads is thus also a sign wherever it is not detected (a malformed or partial set of its
variables); a new launcher's module declares its variables and joins the rule.

`--launcher none` is the way to run such a process alone on purpose.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from distenv.launchers import Launcher
from distenv.variables import decimal

__all__ = ["Sign", "multi_process_signs"]

#: RankInfo fields that say "several" above 1, and those that say "not the first" above 0.
SIZES = frozenset(("world_size", "num_nodes", "local_world_size"))
RANKS = frozenset(("rank", "node_rank", "local_rank"))


class Sign(NamedTuple):
    """One variable that says this process is one of several."""

    name: str
    value: str
    launcher: str
    field: str


def _says_several(field: str, value: str) -> bool:
    number = decimal(value.strip())  # not int(): '²' is a digit that int() refuses
    if number is None:
        return False
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
    return signs
