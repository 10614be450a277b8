"""The problems of where ranks run: local ranks, nodes, layouts, GPUs, and the network between nodes.

Part of `distenv.bootstrap.problems` (which re-exports each class and gives it its code): declared
with their field kinds (`distenv.bootstrap.kinds`), rendered by each rank's own templates. Pure:
no torch, no store, no process state.
"""

from typing import NamedTuple

from distenv.bootstrap.kinds import (
    HOST,
    HOSTS,
    NODE,
    RANK,
    RANKS,
    Integer,
    Items,
    OneOf,
    Text,
    declare,
    hosts_text,
    length,
    number,
    ranks_text,
    world,
)
from distenv.bootstrap.records import MAX_CANDIDATES, MAX_RANK, MIXED_FIELDS, matches

__all__ = [
    "WHY_NOT",
    "LocalLayout",
    "MixedLayout",
    "Placement",
    "SharedGpu",
    "SharedLocalRank",
    "Unreachable",
]


@declare(
    {
        "host": HOST,
        "node": NODE,
        "local_rank": RANK,
        "sharing": Integer(2, MAX_RANK),
    }
)
class SharedLocalRank(NamedTuple):
    """Several ranks of one host and node with the same local rank."""

    host: str
    node: int | None  # None: the launcher named no node (the roll call numbers hosts)
    local_rank: int
    sharing: int

    def describe(self, timeout: float) -> str:
        node = "" if self.node is None else f" (node {self.node})"
        return f"{self.sharing} ranks on {self.host!r}{node} share local rank {self.local_rank}"


@declare({"node": RANK, "hosts": HOSTS})
class Placement(NamedTuple):
    """Ranks on several hosts that their launcher's node variables put on one node."""

    node: int
    hosts: tuple[str, ...]

    def describe(self, timeout: float) -> str:
        return (
            f"ranks that their launcher's variables put on node {self.node} run on "
            f"{list(self.hosts)}: the node variables do not describe these ranks; unset the "
            "node variables inherited from another job (for MPI ranks inside a scheduler's "
            "step, pass --launcher mpi)"
        )


@declare(
    {
        "field": OneOf(MIXED_FIELDS, "field 'field' names no layout field"),
        "known": RANKS,
        "unknown": RANKS,
        "known_total": Integer(length("known", 1), world(1)),
        "known_hosts": HOSTS,
        "unknown_total": Integer(length("unknown", 1), world(1)),
        "unknown_hosts": HOSTS,
    }
)
class MixedLayout(NamedTuple):
    """Ranks whose launcher named a layout field (``node_rank``, ``local_world_size``) beside
    ranks whose launcher did not: the ranks were not started alike."""

    field: str
    known: tuple[int, ...]
    known_total: int
    known_hosts: tuple[str, ...]
    unknown: tuple[int, ...]
    unknown_total: int
    unknown_hosts: tuple[str, ...]

    def describe(self, timeout: float) -> str:
        return (
            f"ranks {ranks_text(self.known, self.known_total)} (on {hosts_text(self.known_hosts)})"
            f" have a {self.field} from their launcher's variables but ranks "
            f"{ranks_text(self.unknown, self.unknown_total)} (on "
            f"{hosts_text(self.unknown_hosts)}) have none: the ranks were not started alike, so "
            "neither numbering can be trusted; start every rank with the same launcher and "
            "unset node variables inherited from another job on some nodes"
        )


@declare(
    {
        "ranks": RANKS,
        "local_ranks": RANKS,
        "sizes": Items(number(1, world(1)), "sizes are not local world sizes"),
        "host": HOST,
        "node": NODE,
        "total": Integer(length("ranks", 1), world(1)),
    },
    same=("ranks", "local_ranks"),
)
class LocalLayout(NamedTuple):
    """The ranks on one host (and node) whose local ranks or local size do not fit their count."""

    host: str
    node: int | None  # None: the launcher named no node (the roll call numbers hosts)
    total: int  # ranks of this job there
    ranks: tuple[int, ...]
    local_ranks: tuple[int, ...]  # of `ranks`, in the same order
    sizes: tuple[int, ...]  # the local_world_size values they gave (none: unknown)

    def describe(self, timeout: float) -> str:
        node = "" if self.node is None else f" (node {self.node})"
        sizes = ", ".join(map(str, self.sizes))
        given = f"local_world_size {sizes} and " if self.sizes else ""
        shown = ", ".join(map(str, self.local_ranks[:8])) + (
            ", ..." if len(self.local_ranks) > 8 else ""
        )
        return (
            f"{self.total} ranks of this job run on {self.host!r}{node} (ranks "
            f"{ranks_text(self.ranks, self.total)}), but their launcher gave them "
            f"{given}local ranks {shown}, not local ranks 0..{self.total - 1} of "
            f"{self.total}: its local variables do not describe these ranks; let the launcher "
            "set them (unset any inherited from another job or set by hand)"
        )


@declare(
    {
        "ranks": RANKS,
        "host": HOST,
        "device": Text(),
        "total": Integer(length("ranks"), MAX_RANK + 1),
    }
)
class SharedGpu(NamedTuple):
    """Ranks of one host driving the same physical GPU without having allowed it."""

    host: str
    device: str
    ranks: tuple[int, ...]
    total: int

    def describe(self, timeout: float) -> str:
        return (
            f"ranks {ranks_text(self.ranks, self.total)} on {self.host!r} drive the same GPU "
            f"({self.device}); give each rank its own GPU or pass allow_gpu_sharing=True"
        )


#: What a probe of one address found, as `Unreachable` says it (codes from the probe's results).
WHY_NOT = {
    "refused": "connection refused",
    "timeout": "no answer within the probe's time",
    "unreachable": "no route to it",
    "foreign": "another process answered there",
    "unbound": "the node cannot listen there",
    "error": "the connection failed",
    "unreached": "not reached",
    "family": "reached, but of another address family than the other nodes' (gloo connects "
    "addresses of one family only)",
}


def _probe(entry: object, world_size: int, got: object) -> bool:
    """Return whether `entry` is one probe's ``[address, interface or None, why]``."""
    return (
        isinstance(entry, list)
        and len(entry) == 3
        and matches("address", entry[0])
        and (entry[1] is None or matches("interface", entry[1]))
        and type(entry[2]) is str  # an unhashable value is no key of WHY_NOT either
        and entry[2] in WHY_NOT
    )


@declare(
    {
        "tried": Items(_probe, "field {name!r} is not a list of probes", cap=MAX_CANDIDATES),
        "host": HOST,
        "rank": RANK,
        "backend": Text("probed_backend"),
        "missed_by": HOSTS,
    }
)
class Unreachable(NamedTuple):
    """A node whose backend would advertise an address the other nodes cannot reach, and no
    alternative of which passed the probe either (`distenv.bootstrap.paths`)."""

    host: str
    rank: int
    backend: str
    tried: tuple[tuple[str, str | None, str], ...]
    missed_by: tuple[str, ...]

    def describe(self, timeout: float) -> str:
        tried = "; ".join(
            address + (f" on {interface}" if interface else "") + f": {WHY_NOT[why]}"
            for address, interface, why in self.tried
        )
        by = f" from {hosts_text(self.missed_by)}" if self.missed_by else ""
        variable = "GLOO_SOCKET_IFNAME" if self.backend == "gloo" else "NCCL_SOCKET_IFNAME"
        return (
            f"{self.backend} on {self.host!r} (rank {self.rank}'s node) would advertise an "
            f"address the other nodes cannot reach, and none of the node's addresses passed "
            f"the network probe{by} ({tried}); on that node, export {variable}=<the interface "
            "of the network the nodes share>, or give a MASTER_ADDR on that network "
            "(DISTENV_MASTER_ADDR_FORMAT='{host}-ib' for -ib names): docs/network.md"
        )
