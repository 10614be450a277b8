"""What rank 0 answers in the roll call: the verdict, the checks behind it, the node numbering and
each rank's layout from it (`fill_layout`).

Rank 0 validates a complete set of check-ins (`validate`) and publishes a `Verdict` of structured
problems only (a code, ranks, validated fields; the classes are in `distenv.bootstrap.problems`): every rank
renders the message from its own templates (`Problem.describe`), so no free text from the store is
ever printed. `distenv.bootstrap.problems` is imported only when there is a problem: a healthy roll call
never pays for creating its classes. Pure: no torch, no store, no process state.
"""

import json
import re
from collections import Counter
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from operator import attrgetter
from types import ModuleType
from typing import TYPE_CHECKING, NamedTuple

from distenv.bootstrap.records import (
    AGREED,
    MAX_SHOWN,
    MIXED_FIELDS,
    CheckIn,
    Fields,
    ForeignRecordError,
    Switch,
    load_json,
    matches,
)
from distenv.errors import RendezvousError
from distenv.rankinfo import RankInfo

if TYPE_CHECKING:
    from distenv.bootstrap.problems import Problem

__all__ = [
    "MAX_VERDICT_BYTES",
    "Place",
    "Verdict",
    "fill_layout",
    "host_sizes",
    "node_hosts",
    "parse_place",
    "parse_verdict",
    "refusal",
    "validate",
]

MAX_VERDICT_BYTES = 64 * 1024
MAX_PROBLEMS = 64
MAX_PLACE_BYTES = 1024


class Place(NamedTuple):
    """What one rank (or one node's leader, for its node) learns of its own node from the verdict.

    Published under ``place/<rank>`` only where the verdict has something to place: a node
    index and count (`node`, `nodes`) where the launcher left the layout to the roll call, the
    node's rank count (`size`) where it counted none, the backends the network probe moved to
    another interface on this node (`paths`, ``(backend, interface)``). Its size does not grow
    with the world: every rank reads its own, never the whole job's.
    """

    node: int | None = None
    nodes: int | None = None
    size: int | None = None
    paths: tuple[tuple[str, str], ...] = ()

    def to_json(self, scope: str) -> str:
        place = {"scope": scope, "node": self.node, "nodes": self.nodes, "size": self.size}
        return json.dumps({**place, "paths": [list(p) for p in self.paths]}, separators=(",", ":"))


_PLACE_FIELDS = frozenset(("scope", "node", "nodes", "size", "paths"))


def parse_place(key: str, raw: str | bytes, *, scope: str, world_size: int) -> Place:
    """Return the place stored under `key`, validated for this job's `scope` and world.

    Raises:
        ForeignRecordError: If it is too large, malformed, of another scope or inconsistent.
    """
    fields = Fields(key, load_json(key, raw, MAX_PLACE_BYTES), _PLACE_FIELDS)
    if fields.text("scope") != scope:
        raise ForeignRecordError(key, "written for another scope")
    nodes = fields.optional_integer("nodes", 1, world_size + 1)
    node = fields.optional_integer("node", 0, world_size if nodes is None else nodes)
    size = fields.optional_integer("size", 1, world_size + 1)
    paths = []
    for entry in fields.items("paths", 2):
        if (
            not isinstance(entry, list)
            or len(entry) != 2
            or not matches("probed_backend", entry[0])
            or not matches("interface", entry[1])
        ):
            raise ForeignRecordError(key, "field 'paths' is not a list of interface switches")
        paths.append((entry[0], entry[1]))
    if (node is None) != (nodes is None):
        raise ForeignRecordError(key, "a node index without a node count, or the reverse")
    return Place(node, nodes, size, tuple(paths))


class Verdict(NamedTuple):
    """Rank 0's conclusion, published to every rank: structured problems, rendered locally.

    `nodes` numbers the nodes where a launcher left the node layout incomplete (a check-in's
    ``node_rank`` or ``local_world_size`` is None, or rank 0's node count is unknown): the ranks'
    host names in order of their lowest rank (`node_hosts`), so a rank's node index is its host's
    position and the node count their number. `sizes` counts the ranks on each of those nodes
    (`host_sizes`) where a check-in's ``local_world_size`` is None, so a rank's local world size
    is the count at its node's position. Both are empty when every rank knew its layout, or when
    the verdict is negative. `paths` are the network probe's switches: the nodes whose ranks
    move a backend to another interface (`distenv.bootstrap.paths`). Rank 0 holds all of that;
    the others read the outcome (`ok`, `problems`) and, where `placed`, their own `place`.
    """

    ok: bool
    problems: "tuple[Problem, ...]"
    checkins: tuple[CheckIn, ...] = ()
    scope: str = "-/-/-"
    nodes: tuple[str, ...] = ()
    sizes: tuple[int, ...] = ()
    paths: tuple[Switch, ...] = ()
    place: Place | None = None
    #: A fresh value of rank 0's (`distenv.bootstrap.rollcall.roll_call`), in a positive verdict: where the backend
    #: proves the group, rank 0 releases it by writing this back (`distenv.bootstrap.protocol.RELEASE`),
    #: so that nothing written before the verdict can pass for the release.
    release: str = ""

    @property
    def placed(self) -> bool:
        """Whether ranks read a `Place` beside this verdict (rank 0's view)."""
        return self.ok and bool(self.nodes or self.paths)

    def to_json(self) -> str:
        """Return the published form, the same size at any scale: scope, outcome, problems."""
        published: dict[str, object] = {
            "scope": self.scope,
            "ok": self.ok,
            "problems": [_problems().problem_json(p) for p in self.problems[:MAX_PROBLEMS]],
            "placed": self.placed,
            "release": self.release,
        }
        return json.dumps(published, separators=(",", ":"))

    def place_of(self, hostname: str) -> Place | None:
        """Return the place of the ranks on `hostname`: the one read, or rank 0's reckoning."""
        if self.place is not None:
            return self.place
        if not self.placed:
            return None
        node = self.node_of(hostname)
        switches = tuple((s.backend, s.interface) for s in self.paths if s.host == hostname)
        if not self.nodes:
            return Place(paths=switches)
        if node is None:
            return None
        size = self.sizes[node] if self.sizes else None
        return Place(node, len(self.nodes), size, switches)

    def node_of(self, hostname: str) -> int | None:
        """Return the index of `hostname`'s node in `nodes`, or None if it names no such host."""
        try:
            return self.nodes.index(hostname)
        except ValueError:
            return None

    def describe(self, timeout: float) -> list[str]:
        """Return one message per problem, from this rank's own templates."""
        return [p.describe(timeout) for p in self.problems]

    def contradicts(self, checkin: CheckIn, *, holds_key: bool) -> str | None:
        """Return how this verdict contradicts what the rank of `checkin` knows, or None.

        Proof that rank 0 did not write it: rank 0 closes a missing rank's key before naming it
        (`distenv.bootstrap.rollcall`), so it never names a rank that holds its own key; and it
        lists every claimer of a rank up to `MAX_SHOWN`, so a shorter list without this process
        is not rank 0's.
        """
        if not self.problems:  # the usual verdict: no need to import the problems module
            return None
        problems = _problems()
        for problem in self.problems:
            if (
                isinstance(problem, problems.Missing)
                and holds_key
                and checkin.rank in problem.ranks
            ):
                return "it names this rank missing, but this rank checked in under its own key"
            if (
                isinstance(problem, problems.ClaimedTwice)
                and problem.rank == checkin.rank
                and len(problem.pids) < MAX_SHOWN
                and checkin.pid not in problem.pids
            ):
                return (
                    f"it lists the processes that claimed rank {checkin.rank} without this one "
                    f"(pid {checkin.pid})"
                )
        return None

    @property
    def collided(self) -> bool:
        """Whether a problem is that two processes of this job's identity met: two claimed one
        rank (`problems.SAME_IDENTITY`), or ranks were started for another world size."""
        return bool(self.problems) and any(
            isinstance(p, (_problems().ClaimedTwice, _problems().OtherSize)) for p in self.problems
        )

    @property
    def missing(self) -> bool:
        """Whether a problem is that ranks never arrived (a timeout, not a misconfiguration)."""
        if not self.problems:
            return False
        absent = (_problems().Missing, _problems().SilentNodes)
        return any(isinstance(p, absent) for p in self.problems)


_VERDICT_FIELDS = frozenset(("scope", "ok", "problems", "placed", "release"))
# A release value: 8 random bytes in hex, or empty (a negative verdict releases nothing).
_RELEASE = re.compile(r"(?:[0-9a-f]{16})?")


def parse_verdict(
    key: str, raw: str | bytes, *, scope: str, world_size: int
) -> tuple[Verdict, bool]:
    """Return the verdict stored under `key`, validated for this job's `scope` and world, and
    whether it places ranks: then each reads its own `Place` (`parse_place`).

    Raises:
        ForeignRecordError: If it is too large, malformed, of another scope, or inconsistent (an "ok"
            verdict with problems, a failing one without, a failing one that places ranks).
    """
    fields = Fields(key, load_json(key, raw, MAX_VERDICT_BYTES), _VERDICT_FIELDS)
    if fields.text("scope") != scope:
        raise ForeignRecordError(key, "written for another scope")
    ok = fields.flag("ok")
    items = fields.items("problems", MAX_PROBLEMS)
    problems = tuple(_problems().parse_problem(key, p, world_size) for p in items)
    if ok == bool(problems):
        raise ForeignRecordError(key, "its outcome contradicts its problems")
    placed = fields.flag("placed")
    if placed and not ok:
        raise ForeignRecordError(key, "a negative verdict places no rank")
    release = fields.data["release"]
    if type(release) is not str or not _RELEASE.fullmatch(release) or (release and not ok):
        raise ForeignRecordError(key, "field 'release' is not a positive verdict's release value")
    return Verdict(ok, problems, (), scope, release=release), placed


# ---- validation of a complete set of check-ins (rank 0) -----------------------------------------


def validate(checkins: Sequence[CheckIn], world_size: int) -> list["Problem"]:
    """Return what is wrong with a complete set of check-ins (an empty list when all is well).

    Checks: agreement on scope, world size, master, backend, torch version and launcher; unique
    ranks covering ``0..world_size-1``; unique local ranks per host; in a complete world, the
    local ranks and stated local sizes against the ranks counted on each host (and node); that
    every rank, or none, has a node index and a local size from its launcher; the node index,
    where a launcher names one, against the host names (one node, one host); no two ranks of one
    host on the same physical GPU unless sharing was allowed. Each check is a set comparison at C
    speed (rank 0 runs this on every check-in of the world); only a check that fails imports
    `distenv.bootstrap.problems` to say what.
    """
    found: list[Problem] = []
    for field in AGREED:
        if len(set(map(attrgetter(field), checkins))) > 1:
            found.append(_findings().disagreement(checkins, field))

    ranks = [c.rank for c in checkins]
    distinct = set(ranks)
    if len(distinct) != len(ranks):
        found += _findings().claimed_twice(checkins)
    elif len(distinct) != world_size:
        found.append(_findings().missing_ranks(world_size, None, checkins))

    # Keyed by node as well as host: tests (and `distenv run --nnodes 2` twice on one machine)
    # legitimately run several "nodes" on one host.
    places = list(map(attrgetter("hostname", "node_rank", "local_rank"), checkins))
    distinct_places = set(places)
    if len(distinct_places) != len(places):
        found += _findings().shared_local_ranks(places)
    elif len(distinct) == len(ranks) == world_size:
        found += _local_misfits(checkins, distinct_places)

    for field in MIXED_FIELDS:
        values = list(map(attrgetter(field), checkins))
        if 0 < values.count(None) < len(values):
            found.append(_findings().mixed_layout(checkins, field))

    # Only where the launcher named the nodes: the roll call's own numbering is by host.
    pairs = {(c.node_rank, c.hostname) for c in checkins if c.node_rank is not None}
    if len(pairs) != len({node for node, _ in pairs}):
        found += _findings().placements(pairs)

    on_gpus = [c for c in checkins if c.device is not None]
    if len(set(map(attrgetter("hostname", "device"), on_gpus))) != len(on_gpus):
        found += _findings().shared_gpus(on_gpus)
    return found[:MAX_PROBLEMS]


def _local_misfits(
    checkins: Sequence[CheckIn], places: AbstractSet[tuple[str, int | None, int]]
) -> list["Problem"]:
    """Return what contradicts the ranks counted on each host (and node) of a complete world.

    Local ranks, unique per place already, must be exactly 0..n-1 where n ranks run there, and a
    stated local world size must be n. Set comparisons; one entry per rank, none per pair.
    """
    counts = Counter(map(attrgetter("hostname", "node_rank"), checkins))
    expected = {(host, node, i) for (host, node), n in counts.items() for i in range(n)}
    sizes = set(map(attrgetter("hostname", "node_rank", "local_world_size"), checkins))
    misfits = {(h, nd) for h, nd, size in sizes if size is not None and size != counts[(h, nd)]}
    if places != expected:
        misfits |= {(h, nd) for h, nd, _ in places - expected}
    return _findings().local_layouts(checkins, misfits) if misfits else []


def node_hosts(checkins: Sequence[CheckIn], *, layout_known: bool = True) -> tuple[str, ...]:
    """Return the nodes' host names in order of their lowest rank, or () if every rank knew them.

    `checkins` are in rank order (rank 0's gather reads them so). A check-in carries the node
    index only, so rank 0 says with `layout_known` whether its launcher also counted the nodes
    (Cray PALS names each rank's node but not how many there are). Host names are what tells the
    nodes apart: two nodes that report one name are one node here, and the roll call's check of
    unique local ranks per host refuses that job (`distenv.bootstrap.findings.shared_local_ranks`).
    """
    if layout_known and all(
        c.node_rank is not None and c.local_world_size is not None for c in checkins
    ):
        return ()
    return tuple(dict.fromkeys(c.hostname for c in checkins))


def host_sizes(checkins: Sequence[CheckIn], hosts: Sequence[str]) -> tuple[int, ...]:
    """Return how many ranks run on each of `hosts`, or () if every rank knew its local size.

    `hosts` are the roll call's nodes (`node_hosts`): a rank whose launcher did not count the
    ranks on its node (Flux) takes its host's count, and its local rank stays the launcher's.
    """
    if not hosts or all(c.local_world_size is not None for c in checkins):
        return ()
    counts = Counter(c.hostname for c in checkins)
    return tuple(counts[host] for host in hosts)


def refusal(
    checkins: tuple[CheckIn, ...],
    info: RankInfo,
    scope: str,
    foreign: Sequence[str],
    *,
    complete: bool,
    ahead: tuple[int, int] | None = None,
    batched: bool = False,
) -> Verdict:
    """Return rank 0's negative verdict on foreign writes, or on missing ranks.

    `foreign` are the keys of records this job did not write (one problem names a few and counts
    them all); `ahead` is ``(count, records)`` where the check-in count ran ahead of the records.
    With `complete`, every rank checked in and the valid records are also validated; otherwise
    the ranks that did not are named, placed on nodes by rank 0's (`info`) local world size; in a
    `batched` roll call a node none of whose ranks arrived is named as a node, by its leader.
    """
    problems = _problems()
    named: list[Problem] = [problems.foreign_records(foreign)] if foreign else []
    if ahead is not None:
        named.append(problems.ForeignCount(*ahead))
    if not complete:
        silent, covered = (
            _findings().silent_nodes(info.world_size, info.local_world_size, checkins)
            if batched
            else (None, set())
        )
        if silent is not None:
            named.append(silent)
        if len(covered) + len(checkins) < info.world_size or silent is None:
            named.append(
                _findings().missing_ranks(
                    info.world_size, info.local_world_size, checkins, besides=covered
                )
            )
    else:
        named += validate(checkins, info.world_size)
    return Verdict(False, tuple(named), checkins, scope)


def fill_layout(info: RankInfo, verdict: Verdict, checkin: CheckIn) -> RankInfo:
    """Return `info` with the node layout its launcher left unknown, from the roll call's verdict.

    The verdict numbers the hosts in order of their lowest rank (`node_hosts`);
    this rank's node is the position of the host name it checked in with, and its local world
    size, where unknown, the verdict's count of ranks on that host (`host_sizes`):
    its `Place`.
    A known layout is kept as the launcher stated it (the roll call checked it against the hosts).

    Raises:
        RendezvousError: The verdict does not name this rank's host, or does not count its ranks
            (not this job's rank 0's).
    """
    if info.layout_known or not verdict.ok:
        return info
    place = verdict.place_of(checkin.hostname)
    node = None if place is None else place.node
    size = None if place is None else place.size
    if (
        place is None
        or place.nodes is None
        or node is None
        or (info.local_world_size is None and size is None)
    ):
        what = (
            f"does not place this rank's host {checkin.hostname!r} on a node, so its node is "
            "unknown"
            if node is None
            else f"does not count the ranks on this rank's host {checkin.hostname!r}, so its "
            "local world size is unknown"
        )
        raise RendezvousError(
            info.launcher,
            f"rank {info.rank}: the roll call's verdict {what}",
            hint="the verdict was not written by this job's rank 0, or a host's name changed "
            "during the start-up: see docs/security.md, and give the job its own MASTER_PORT",
        )
    return info.replace(
        node_rank=node if info.node_rank is None else info.node_rank,
        num_nodes=place.nodes if info.num_nodes is None else info.num_nodes,
        local_world_size=size if info.local_world_size is None else info.local_world_size,
    )


def _findings() -> ModuleType:
    """Return `distenv.bootstrap.findings` (and with it the problems), imported on the first problem."""
    from distenv.bootstrap import findings

    return findings


def _problems() -> ModuleType:
    """Return `distenv.bootstrap.problems`, imported on the first problem (the one lazy import)."""
    from distenv.bootstrap import problems

    return problems
