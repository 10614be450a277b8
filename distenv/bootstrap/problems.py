"""The roll call's problems: structured, validated when read, rendered by each rank's own templates.

Imported only when there is a problem to build, publish or read (`distenv.bootstrap.verdict`): a healthy roll
call never pays for creating its classes inside every rank's bootstrap. Pure, like
`distenv.bootstrap.records`: no torch, no store, no process state.
"""

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from operator import attrgetter
from typing import Any, NamedTuple

from distenv.bootstrap.kinds import (
    AgreedValues,
    Integer,
    Items,
    OneOf,
    Text,
    Totals,
    after,
    build,
    declare,
    length,
    listed,
    number,
    optional,
    pattern,
    world,
)
from distenv.bootstrap.records import (
    AGREED,
    MAX_CANDIDATES,
    MAX_PID,
    MAX_RANK,
    MAX_SHOWN,
    MIXED_FIELDS,
    CheckIn,
    Fields,
    ForeignRecordError,
    matches,
)

__all__ = [
    "CODES",
    "COLLISION_HINT",
    "SAME_IDENTITY",
    "SIZE_HINT",
    "ClaimedTwice",
    "Disagreement",
    "ForeignCheckIn",
    "ForeignCount",
    "LocalLayout",
    "Missing",
    "MixedLayout",
    "OtherSize",
    "Placement",
    "Problem",
    "SharedGpu",
    "SharedLocalRank",
    "Unreachable",
    "claimed_twice",
    "disagreement",
    "expected_hosts",
    "foreign_records",
    "local_layouts",
    "missing_ranks",
    "mixed_layout",
    "parse_problem",
    "placements",
    "problem_json",
    "shared_gpus",
    "shared_local_ranks",
]


#: What two processes claiming one rank's key are, when each was given it honestly: two jobs
#: that no part of their identity tells apart (docs/security.md), or one launch that gave two
#: processes the same rank.
SAME_IDENTITY = "two jobs with the same identity on one store (or two processes given one rank)"
#: The fix for `SAME_IDENTITY`.
COLLISION_HINT = (
    "give each job its own run id (TORCHELASTIC_RUN_ID, i.e. torchrun --rdzv-id; distenv run "
    "--run-id; DISTENV_RUN_ID) or its own MASTER_PORT"
)
#: The fix for ranks of one job identity started for worlds of different sizes (`OtherSize`).
SIZE_HINT = (
    "start every node of the job for the same world: the same -n/--nproc-per-node and --nnodes "
    "on each (or the same WORLD_SIZE), or give the other job its own run id"
)

# Foreign record keys a problem names; the rest are counted.
MAX_FOREIGN_SHOWN = 4


def _hosts_text(hosts: Iterable[str]) -> str:
    """Return host names as quoted data: they come from the store, whoever wrote them there."""
    return ", ".join(map(repr, hosts))


def _shown(ranks: Sequence[int]) -> tuple[tuple[int, ...], int]:
    ordered = sorted(ranks)
    return tuple(ordered[:MAX_SHOWN]), len(ordered)


def _ranks_text(shown: Sequence[int], total: int) -> str:
    text = ", ".join(str(r) for r in shown[:8])
    return text + (f", ... ({total} in all)" if total > 8 else "")


# The field kinds most problems share (`distenv.bootstrap.kinds`).
RANK = Integer(0, world())
RANKS = Items(number(0, world()), "field {name!r} is not a list of ranks")
NODE = Integer(
    0, world(), optional=True
)  # None: the launcher named no node (the roll call numbers hosts)
HOST = Text("hostname")
HOSTS = Items(pattern("hostname"), "field {name!r} is not a list of host names")
OWN_WORLD_SIZE = Integer(world(), world(1))  # the reader's own: a problem of its world only
_NOT_LEADERS = "nodes and sizes do not match the leaders"


@declare(
    {
        "sizes": Items(number(1, MAX_RANK + 1), "sizes are not world sizes"),
        "hosts": HOSTS,
        "world_size": OWN_WORLD_SIZE,
    },
    same=("sizes", "hosts"),
)
class OtherSize(NamedTuple):
    """Ranks of this job's identity started for a world of another size (where each said so)."""

    world_size: int
    sizes: tuple[int, ...]
    hosts: tuple[str, ...]

    def describe(self, timeout: float) -> str:
        said = ", ".join(f"{s} on {h!r}" for s, h in zip(self.sizes, self.hosts, strict=True))
        return (
            f"a size mismatch: rank 0 was started for a world of {self.world_size} ranks, ranks "
            f"of the same job identity for {said}"
        )


@declare(
    {
        "ranks": RANKS,
        "hosts": Items(listed(pattern("hostname")), "hosts is not a list of host lists"),
        "nodes": Items(optional(number(0, world())), "nodes is not a list of node indexes"),
        "total": Integer(length("ranks"), world(1)),
        "world_size": OWN_WORLD_SIZE,
    },
    same=("ranks", "hosts", "nodes"),
)
class Missing(NamedTuple):
    """Ranks that did not check in: each named with the hosts it was expected on."""

    total: int
    world_size: int
    ranks: tuple[int, ...]
    hosts: tuple[tuple[str, ...], ...]
    nodes: tuple[int | None, ...]

    def describe(self, timeout: float) -> str:
        lines = []
        for rank, hosts, node in zip(self.ranks, self.hosts, self.nodes, strict=True):
            where = _hosts_text(hosts) if hosts else (f"node {node}" if node is not None else "")
            lines.append(f"rank {rank} (expected on {where or 'an unknown host'})")
        more = f" and {self.total - len(self.ranks)} more" if self.total > len(self.ranks) else ""
        return (
            f"{self.total} of {self.world_size} ranks did not check in within {timeout:.0f} s: "
            + ", ".join(lines)
            + more
        )


@declare(
    {
        "field": OneOf(AGREED, "field 'field' names no agreed field"),
        "values": AgreedValues("field"),
        "ranks": Items(listed(number(0, world())), "ranks is not a list of rank lists"),
        "totals": Totals("ranks"),
    },
    same=("values", "ranks", "totals"),
)
class Disagreement(NamedTuple):
    """Ranks that disagree on one of the `AGREED` fields: each value with its ranks."""

    field: str
    values: tuple[str | int, ...]
    ranks: tuple[tuple[int, ...], ...]
    totals: tuple[int, ...]

    def describe(self, timeout: float) -> str:
        parts = "; ".join(
            f"{value!r} on ranks {_ranks_text(ranks, total)}"
            for value, ranks, total in zip(self.values, self.ranks, self.totals, strict=True)
        )
        return f"ranks disagree on {self.field}: {parts}"


@declare(
    {
        "pids": Items(number(1, MAX_PID + 1), "pids are not process ids"),
        "hosts": HOSTS,
        "rank": RANK,
    },
    same=("pids", "hosts"),
)
class ClaimedTwice(NamedTuple):
    """One rank claimed by several processes: each claim's pid and host."""

    rank: int
    pids: tuple[int, ...]
    hosts: tuple[str, ...]

    def describe(self, timeout: float) -> str:
        who = ", ".join(f"pid {p} on {h!r}" for p, h in zip(self.pids, self.hosts, strict=True))
        return (
            f"rank {self.rank} was claimed by {len(self.pids)} processes ({who}): {SAME_IDENTITY}"
        )


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
            f"ranks {_ranks_text(self.known, self.known_total)} (on {_hosts_text(self.known_hosts)})"
            f" have a {self.field} from their launcher's variables but ranks "
            f"{_ranks_text(self.unknown, self.unknown_total)} (on "
            f"{_hosts_text(self.unknown_hosts)}) have none: the ranks were not started alike, so "
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
            f"{_ranks_text(self.ranks, self.total)}), but their launcher gave them "
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
            f"ranks {_ranks_text(self.ranks, self.total)} on {self.host!r} drive the same GPU "
            f"({self.device}); give each rank its own GPU or pass allow_gpu_sharing=True"
        )


@declare(
    {
        "keys": Items(
            pattern("record_key"),
            "field {name!r} is not a list of record keys",
            cap=MAX_FOREIGN_SHOWN,
            least=1,
        ),
        "total": Integer(length("keys"), MAX_RANK + 1),
    }
)
class ForeignCheckIn(NamedTuple):
    """Check-in records under this job's keys that this job's distenv did not write: a few keys
    named, all of them counted, in one short line however many there are."""

    keys: tuple[str, ...]
    total: int

    def describe(self, timeout: float) -> str:
        shown = ", ".join(self.keys)
        more = f" and {self.total - len(self.keys)} more" if self.total > len(self.keys) else ""
        what = (
            f"the check-in record under {shown} was"
            if self.total == 1
            else f"{self.total} check-in records (under {shown}{more}) were"
        )
        return (
            f"{what} not written by this job's distenv (malformed, oversized, of another job's "
            "scope or under another rank's key): a process that is not part of this job wrote "
            "to rank 0's store"
        )


@declare(
    {
        "records": Integer(0, MAX_RANK + 1),
        "counted": Integer(after("records"), 1 << 62),
    }
)
class ForeignCount(NamedTuple):
    """A counter in this job's keys that ran ahead of the records this job's ranks (or their
    nodes' leaders) count: only a process outside the job can have added to it."""

    counted: int
    records: int

    def describe(self, timeout: float) -> str:
        return (
            f"the check-in count in rank 0's store read {self.counted} while {self.records} "
            "check-in records were there (a rank, or its node's leader, counts only the records "
            "it writes): a process that is not part of this job added to it"
        )


@declare(
    {
        "leaders": RANKS,
        "nodes": Items(number(0, world()), _NOT_LEADERS),
        "sizes": Items(number(1, world(1)), _NOT_LEADERS),
        "total": Integer(length("leaders", 1), world(1)),
    },
    same=("leaders", "nodes", "sizes"),
    why=_NOT_LEADERS,
)
class SilentNodes(NamedTuple):
    """Nodes none of whose ranks reached rank 0 where node leaders batch the roll call: their
    leader (its node's first rank) never reported, so its members could not either.

    `leaders` are the nodes' first ranks (the first `MAX_SHOWN`), `sizes` their rank counts.
    """

    total: int
    leaders: tuple[int, ...]
    nodes: tuple[int, ...]
    sizes: tuple[int, ...]

    def describe(self, timeout: float) -> str:
        named = [
            f"node {node} (its leader, rank {leader}, and {size - 1} more "
            f"rank{'s' if size != 2 else ''})"
            for leader, node, size in zip(self.leaders, self.nodes, self.sizes, strict=True)
        ]
        more = f" and {self.total - len(named)} more nodes" if self.total > len(named) else ""
        return (
            f"{self.total} node(s) sent no report within {timeout:.0f} s: "
            + ", ".join(named)
            + more
            + ": a leader that died, was stopped or started too late takes its node with it"
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
        by = f" from {_hosts_text(self.missed_by)}" if self.missed_by else ""
        variable = "GLOO_SOCKET_IFNAME" if self.backend == "gloo" else "NCCL_SOCKET_IFNAME"
        return (
            f"{self.backend} on {self.host!r} (rank {self.rank}'s node) would advertise an "
            f"address the other nodes cannot reach, and none of the node's addresses passed "
            f"the network probe{by} ({tried}); on that node, export {variable}=<the interface "
            "of the network the nodes share>, or give a MASTER_ADDR on that network "
            "(DISTENV_MASTER_ADDR_FORMAT='{host}-ib' for -ib names): docs/network.md"
        )


def foreign_records(keys: Sequence[str]) -> ForeignCheckIn:
    """Return the one problem that names (a few of) the foreign records under `keys`."""
    return ForeignCheckIn(tuple(keys[:MAX_FOREIGN_SHOWN]), len(keys))


Problem = (
    Missing
    | Disagreement
    | ClaimedTwice
    | SharedLocalRank
    | Placement
    | MixedLayout
    | LocalLayout
    | SharedGpu
    | ForeignCheckIn
    | ForeignCount
    | Unreachable
    | SilentNodes
    | OtherSize
)
#: Each problem's code in the published verdict.
CODES: dict[type, str] = {
    Missing: "missing",
    Disagreement: "disagree",
    ClaimedTwice: "claimed",
    SharedLocalRank: "local_rank",
    Placement: "placement",
    MixedLayout: "mixed_layout",
    LocalLayout: "local_layout",
    SharedGpu: "gpu",
    ForeignCheckIn: "foreign",
    ForeignCount: "foreign_count",
    Unreachable: "unreachable",
    SilentNodes: "silent_nodes",
    OtherSize: "other_size",
}
_PROBLEMS: dict[str, Any] = {code: kind for kind, code in CODES.items()}


def problem_json(problem: Problem) -> dict[str, Any]:
    return {"code": CODES[type(problem)], **problem._asdict()}


def parse_problem(key: str, data: object, world: int) -> Problem:
    if not isinstance(data, dict) or data.get("code") not in _PROBLEMS:
        raise ForeignRecordError(key, "a problem with an unknown code")
    kind = _PROBLEMS[data["code"]]
    body = {k: v for k, v in data.items() if k != "code"}
    problem: Problem = build(kind, Fields(key, body, frozenset(kind._fields)), world)
    return problem


# ---- the slow paths of `distenv.bootstrap.verdict.validate`: called once a fast check has found a problem --


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
