"""What rank 0 found, as problems: the slow paths of `distenv.bootstrap.verdict`.

Called only once a fast check has found something wrong (`distenv.bootstrap.verdict.validate`,
`distenv.bootstrap.verdict.refusal`): each builds the problems of `distenv.bootstrap.problems`
from the check-ins, naming the first `MAX_SHOWN` ranks, hosts or claims and counting the rest.
Pure: no torch, no store, no process state.
"""

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from operator import attrgetter
from typing import Any

from distenv.bootstrap.problems import (
    ClaimedTwice,
    Disagreement,
    LocalLayout,
    Missing,
    MixedLayout,
    Placement,
    Problem,
    SharedGpu,
    SharedLocalRank,
    SilentNodes,
)
from distenv.bootstrap.records import MAX_SHOWN, CheckIn

__all__ = [
    "claimed_twice",
    "disagreement",
    "expected_hosts",
    "local_layouts",
    "missing_ranks",
    "mixed_layout",
    "placements",
    "shared_gpus",
    "shared_local_ranks",
    "silent_nodes",
]


def _shown(ranks: Sequence[int]) -> tuple[tuple[int, ...], int]:
    ordered = sorted(ranks)
    return tuple(ordered[:MAX_SHOWN]), len(ordered)


def disagreement(checkins: Sequence[CheckIn], field: str) -> Disagreement:
    """Return how the ranks disagree on `field`: each value (the first `MAX_SHOWN`) with its ranks."""
    of = attrgetter(field)
    values: dict[Any, list[int]] = defaultdict(list)
    for c in checkins:
        values[of(c)].append(c.rank)
    ordered = sorted(values.items(), key=lambda item: str(item[0]))[:MAX_SHOWN]
    return Disagreement(
        field,
        tuple(value for value, _ in ordered),
        tuple(_shown(ranks)[0] for _, ranks in ordered),
        tuple(len(ranks) for _, ranks in ordered),
    )


def claimed_twice(checkins: Sequence[CheckIn]) -> list[Problem]:
    """Return a `ClaimedTwice` for each rank that several check-ins claim."""
    by_rank: dict[int, list[CheckIn]] = defaultdict(list)
    for c in checkins:
        by_rank[c.rank].append(c)
    return [
        ClaimedTwice(
            rank,
            tuple(c.pid for c in same[:MAX_SHOWN]),
            tuple(c.hostname for c in same[:MAX_SHOWN]),
        )
        for rank, same in sorted(by_rank.items())
        if len(same) > 1
    ]


def shared_local_ranks(places: Sequence[tuple[str, int | None, int]]) -> list[Problem]:
    """Return a `SharedLocalRank` for each (host, node, local rank) that several ranks hold."""
    counts = Counter(places).items()
    return [
        SharedLocalRank(host, node, local_rank, count)
        for (host, node, local_rank), count in sorted(
            counts, key=lambda p: (p[0][0], p[0][1] or 0, p[0][2])
        )
        if count > 1
    ]


def placements(node_hosts: Iterable[tuple[int, str]]) -> list[Problem]:
    """Return a `Placement` for each node that MPI's node variables put on several hosts."""
    hosts_of_node: dict[int, set[str]] = defaultdict(set)
    for node, host in node_hosts:
        hosts_of_node[node].add(host)
    return [
        Placement(node, tuple(sorted(hosts))[:MAX_SHOWN])
        for node, hosts in sorted(hosts_of_node.items())
        if len(hosts) > 1
    ]


def mixed_layout(checkins: Sequence[CheckIn], field: str) -> MixedLayout:
    """Return the `MixedLayout` of ranks that have `field` beside ranks that have none."""
    of = attrgetter(field)
    known = [c for c in checkins if of(c) is not None]
    unknown = [c for c in checkins if of(c) is None]

    def hosts(group: Sequence[CheckIn]) -> tuple[str, ...]:
        return tuple(sorted({c.hostname for c in group}))[:MAX_SHOWN]

    (known_ranks, known_total), (unknown_ranks, unknown_total) = (
        _shown([c.rank for c in known]),
        _shown([c.rank for c in unknown]),
    )
    return MixedLayout(
        field, known_ranks, known_total, hosts(known), unknown_ranks, unknown_total, hosts(unknown)
    )


def local_layouts(
    checkins: Sequence[CheckIn], misfits: Iterable[tuple[str, int | None]]
) -> list[Problem]:
    """Return a `LocalLayout` for each (host, node) place whose ranks do not fit their count."""
    wanted = set(misfits)
    at: dict[tuple[str, int | None], list[CheckIn]] = defaultdict(list)
    for c in checkins:
        if (c.hostname, c.node_rank) in wanted:
            at[(c.hostname, c.node_rank)].append(c)
    problems: list[Problem] = []
    for (host, node), group in sorted(at.items(), key=lambda p: (p[0][0], p[0][1] or 0)):
        group.sort(key=attrgetter("rank"))
        shown = group[:MAX_SHOWN]
        sizes = sorted({c.local_world_size for c in group if c.local_world_size is not None})
        problems.append(
            LocalLayout(
                host,
                node,
                len(group),
                tuple(c.rank for c in shown),
                tuple(c.local_rank for c in shown),
                tuple(sizes[:MAX_SHOWN]),
            )
        )
    return problems


def shared_gpus(on_gpus: Sequence[CheckIn]) -> list[Problem]:
    """Return a `SharedGpu` for each GPU that several ranks of a host drive without allowing it."""
    devices: dict[tuple[str, str], list[int]] = defaultdict(list)
    allowed: dict[tuple[str, str], bool] = defaultdict(lambda: True)
    for c in on_gpus:
        if c.device is not None:
            devices[(c.hostname, c.device)].append(c.rank)
            allowed[(c.hostname, c.device)] &= c.allow_gpu_sharing
    problems: list[Problem] = []
    for (host, device), ranks in sorted(devices.items()):
        if len(ranks) > 1 and not allowed[(host, device)]:
            shown, total = _shown(ranks)
            problems.append(SharedGpu(host, device, shown, total))
    return problems


def expected_hosts(
    rank: int, world_size: int, local_world_size: int | None, arrived: Sequence[CheckIn]
) -> tuple[tuple[str, ...], int | None]:
    """Return where a missing rank should run: the hosts of its node's arrivals, and the node.

    Nowhere known when the ranks per node are unknown (`local_world_size` None: Flux).
    """
    if local_world_size is None or world_size % local_world_size:
        return (), None
    node = rank // local_world_size
    hosts = sorted({c.hostname for c in arrived if node is not None and c.node_rank == node})
    return tuple(hosts[:MAX_SHOWN]), node


def _missing(
    missing: Sequence[int],
    world_size: int,
    arrived: Sequence[CheckIn],
    local_world_size: int | None,
) -> Missing:
    named = list(missing)[:MAX_SHOWN]
    local = (
        local_world_size
        if local_world_size is not None
        else (arrived[0].local_world_size if arrived else 1)
    )
    places = [expected_hosts(r, world_size, local, arrived) for r in named]
    return Missing(
        len(missing),
        world_size,
        tuple(named),
        tuple(hosts for hosts, _ in places),
        tuple(node for _, node in places),
    )


def silent_nodes(
    world_size: int, local_world_size: int | None, arrived: Sequence[CheckIn]
) -> tuple[SilentNodes | None, set[int]]:
    """Return the nodes of a batched roll call none of whose ranks arrived, and those ranks.

    Nodes are rank 0's reckoning (`local_world_size` consecutive ranks each, as
    `expected_hosts` places a missing rank); none where it cannot say.
    """
    local = local_world_size
    if local is None or local < 2 or world_size % local:
        return None, set()
    seen = {c.rank for c in arrived}
    silent = [
        n for n in range(world_size // local) if not seen & set(range(n * local, (n + 1) * local))
    ]
    if not silent:
        return None, set()
    shown = silent[:MAX_SHOWN]
    problem = SilentNodes(
        len(silent), tuple(n * local for n in shown), tuple(shown), (local,) * len(shown)
    )
    return problem, {r for n in silent for r in range(n * local, (n + 1) * local)}


def missing_ranks(
    world_size: int,
    local_world_size: int | None,
    arrived: Sequence[CheckIn],
    *,
    besides: set[int] | None = None,
) -> Missing:
    """Return the `Missing` problem for the ranks of ``0..world_size-1`` that did not arrive.

    `local_world_size` places them on nodes; None takes the arrivals' own. `besides` are ranks
    already named otherwise (`silent_nodes`).
    """
    seen = {c.rank for c in arrived} | (besides or set())
    absent = [r for r in range(world_size) if r not in seen]
    return _missing(absent, world_size, arrived, local_world_size)
