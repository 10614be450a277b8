"""The roll call's problems: structured, validated when read, rendered by each rank's own templates.

Each class declares its fields' kinds (`distenv.bootstrap.kinds`), which the one parser,
`parse_problem`, checks a problem read from the store against; the problems of where ranks run are
in `distenv.bootstrap.layouts` (re-exported here), and what builds them from the check-ins in
`distenv.bootstrap.findings`.

Imported only when there is a problem to build, publish or read (`distenv.bootstrap.verdict`): a healthy roll
call never pays for creating its classes inside every rank's bootstrap. Pure, like
`distenv.bootstrap.records`: no torch, no store, no process state.
"""

from collections.abc import Sequence
from typing import Any, NamedTuple

from distenv.bootstrap.kinds import (
    HOSTS,
    OWN_WORLD_SIZE,
    RANK,
    RANKS,
    AgreedValues,
    Integer,
    Items,
    OneOf,
    Totals,
    after,
    build,
    declare,
    hosts_text,
    length,
    listed,
    number,
    optional,
    pattern,
    ranks_text,
    world,
)
from distenv.bootstrap.layouts import (
    LocalLayout,
    MixedLayout,
    Placement,
    SharedGpu,
    SharedLocalRank,
    Unreachable,
)
from distenv.bootstrap.records import (
    AGREED,
    MAX_PID,
    MAX_RANK,
    Fields,
    ForeignRecordError,
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
    "SilentNodes",
    "Unreachable",
    "foreign_records",
    "parse_problem",
    "problem_json",
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
            where = hosts_text(hosts) if hosts else (f"node {node}" if node is not None else "")
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
            f"{value!r} on ranks {ranks_text(ranks, total)}"
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
    """Return `problem` as the verdict publishes it: its code, then its fields by name."""
    return {"code": CODES[type(problem)], **problem._asdict()}


def parse_problem(key: str, data: object, world: int) -> Problem:
    """Return the problem a verdict under `key` holds, read by its class's declared field kinds
    for a reader of a world of `world` ranks (`ForeignRecordError` if it is not one)."""
    # A code of another type (a list is unhashable) is as unknown as an unknown string.
    if (
        not isinstance(data, dict)
        or type(data.get("code")) is not str
        or data["code"] not in _PROBLEMS
    ):
        raise ForeignRecordError(key, "a problem with an unknown code")
    kind = _PROBLEMS[data["code"]]
    body = {k: v for k, v in data.items() if k != "code"}
    problem: Problem = build(kind, Fields(key, body, frozenset(kind._fields)), world)
    return problem
