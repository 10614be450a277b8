"""What ranks write to the store, and what rank 0 answers: schemas, checks and messages.

Nothing read from the store is trusted. TCPStore is unauthenticated, so any process that reaches
rank 0's port can write any key; a record therefore counts only if it parses against its schema
here: JSON of a bounded size, exactly the known fields, each of its type, in its range, and every
string matching its own pattern (host names, versions, backends, devices, launchers, scopes).
Anything else raises `ForeignRecordError`, naming the key, never echoing the text.

Rank 0's verdict carries structured problems only (a code, ranks, validated fields; the classes are
in `distenv.problems`, imported only when there is a problem): every rank renders the message from
its own templates (`Problem.describe`), so no free text from the store is ever printed. This module
is pure: no torch, no store, no process state.
"""

import json
import re
from collections import Counter
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from operator import attrgetter
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from distenv.problems import Problem

__all__ = [
    "AGREED",
    "MAX_CHECKIN_BYTES",
    "MAX_VERDICT_BYTES",
    "CheckIn",
    "ForeignRecordError",
    "Verdict",
    "host_sizes",
    "matches",
    "node_hosts",
    "parse_checkin",
    "parse_scope",
    "parse_verdict",
    "validate",
]

# Caps, checked after reading (TCPStore cannot tell a value's size before).
MAX_CHECKIN_BYTES = 2048
MAX_VERDICT_BYTES = 64 * 1024
MAX_SCOPE_BYTES = 300
MAX_RANK = 1 << 24  # a world of 16 M ranks: far beyond any job, small enough to be sane
MAX_PID = 1 << 22  # Linux's pid_max limit
MAX_PROBLEMS = 64
MAX_SHOWN = 16  # ranks, hosts or claims a problem names; the rest are counted
# A verdict that numbers the nodes carries their host names: this much more per possible node.
NODE_BYTES = 256

_HOST = r"[A-Za-z0-9_](?:[A-Za-z0-9._-]{0,252})"
_IPV6 = r"\[[0-9A-Fa-f:.]{2,45}(?:%[A-Za-z0-9_.-]{1,32})?\]"
PATTERNS = {
    "hostname": _HOST,
    "master": rf"(?:{_HOST}|{_IPV6}):[0-9]{{1,5}}",
    "launcher": r"[a-z][a-z0-9_-]{0,31}",
    "backend": r"[A-Za-z0-9:,_-]{1,64}",
    "torch_version": r"[0-9]{1,4}\.[0-9]{1,4}(?:\.[0-9]{1,4})?[A-Za-z0-9.+_-]{0,48}",
    "device": r"(?:GPU|MIG)-[0-9A-Fa-f-]{1,64}|[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}",
    # scope_tag(launcher, job, step): see distenv.master.RUN_ID_PATTERN for the run ids inside.
    "scope": r"[A-Za-z0-9][A-Za-z0-9._:/@+\[\]-]{0,299}",
    "record_key": r"(?:checkin|extra)/[0-9]{1,8}",
}
_COMPILED: dict[str, re.Pattern[str]] = {}  # compiled on first use: imports stay cheap
# Values that matched, per pattern: rank 0 checks N records whose host names, versions and scope
# repeat, so each distinct string meets its regex once. Bounded; a miss only costs the regex.
_MATCHED: dict[str, set[str]] = {}
_MATCHED_MAX = 1 << 16

#: The check-in fields every rank must agree on.
AGREED = ("scope", "world_size", "master", "backend", "torch_version", "launcher")
#: The layout fields a launcher may leave to the roll call: every rank has them, or none does.
MIXED_FIELDS = ("node_rank", "local_world_size")


class ForeignRecordError(Exception):
    """A value under one of this job's keys that this job's distenv did not write."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"{key}: {why}")
        self.key = key
        self.why = why


def matches(field: str, value: object) -> bool:
    """Return whether `value` is a string matching `field`'s pattern."""
    if type(value) is not str:
        return False
    matched = _MATCHED.get(field)
    if matched is not None and value in matched:
        return True
    pattern = _COMPILED.get(field)
    if pattern is None:
        pattern = _COMPILED[field] = re.compile(PATTERNS[field])
        matched = _MATCHED[field] = set()
    if pattern.fullmatch(value) is None:
        return False
    if matched is not None and len(matched) < _MATCHED_MAX:
        matched.add(value)
    return True


class _Fields:
    """Typed access to one JSON object's fields, raising `ForeignRecordError` for anything unexpected."""

    def __init__(self, key: str, data: object, names: AbstractSet[str]) -> None:
        if not isinstance(data, dict):
            raise ForeignRecordError(key, "not a JSON object")
        if data.keys() != names:
            raise ForeignRecordError(key, "unexpected or missing fields")
        self.key, self.data = key, data

    def integer(self, name: str, low: int = 0, high: int = MAX_RANK) -> int:
        value = self.data[name]
        if type(value) is not int or not low <= value < high:
            raise ForeignRecordError(
                self.key, f"field {name!r} is not an integer in [{low}, {high})"
            )
        return value

    def flag(self, name: str) -> bool:
        value = self.data[name]
        if type(value) is not bool:
            raise ForeignRecordError(self.key, f"field {name!r} is not a boolean")
        return value

    def text(self, name: str, pattern: str | None = None) -> str:
        value = self.data[name]
        if not matches(pattern or name, value):
            raise ForeignRecordError(self.key, f"field {name!r} does not match its pattern")
        assert isinstance(value, str)
        return value

    def optional_integer(self, name: str, low: int = 0, high: int = MAX_RANK) -> int | None:
        return None if self.data[name] is None else self.integer(name, low, high)

    def optional_text(self, name: str, pattern: str) -> str | None:
        return None if self.data[name] is None else self.text(name, pattern)

    def items(self, name: str, cap: int = MAX_SHOWN) -> list[Any]:
        value = self.data[name]
        if not isinstance(value, list) or len(value) > cap:
            raise ForeignRecordError(self.key, f"field {name!r} is not a list of at most {cap}")
        return value


_decode = json.JSONDecoder().decode


def _load(key: str, raw: str | bytes, cap: int) -> object:
    if len(raw) > cap:
        raise ForeignRecordError(key, f"{len(raw)} bytes, more than the {cap} allowed")
    try:
        # Decoding first skips json.loads's encoding sniffing: rank 0 parses N of these.
        return _decode(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
    except (ValueError, UnicodeDecodeError):
        raise ForeignRecordError(key, "not JSON") from None


def parse_scope(key: str, raw: str | bytes) -> str:
    """Return the scope written under `key`, validated (`ForeignRecordError` if not distenv's)."""
    if len(raw) > MAX_SCOPE_BYTES:
        raise ForeignRecordError(key, "longer than any scope")
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    if not matches("scope", text):
        raise ForeignRecordError(key, "not a scope written by distenv")
    return text


class CheckIn(NamedTuple):
    """What one rank reports about itself.

    `node_rank` (or `local_world_size`) None: its launcher names no node index (no count of the
    ranks on its node); the roll call fills them in from the ranks' host names.
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int | None
    node_rank: int | None
    hostname: str
    pid: int
    launcher: str
    master: str
    backend: str
    torch_version: str
    device: str | None = None
    allow_gpu_sharing: bool = False
    scope: str = "-/-/-"

    def to_json(self) -> str:
        return json.dumps(self._asdict(), sort_keys=True)


_CHECKIN_FIELDS = frozenset(CheckIn._fields)


def _checkin(key: str, data: object) -> CheckIn:
    fields = _Fields(key, data, _CHECKIN_FIELDS)
    world = fields.integer("world_size", 1, MAX_RANK + 1)
    local_world = fields.optional_integer("local_world_size", 1, MAX_RANK + 1)
    return CheckIn(
        rank=fields.integer("rank", 0, world),
        world_size=world,
        local_rank=fields.integer("local_rank", 0, world if local_world is None else local_world),
        local_world_size=local_world,
        node_rank=fields.optional_integer("node_rank", 0, world),
        hostname=fields.text("hostname"),
        pid=fields.integer("pid", 1, MAX_PID + 1),
        launcher=fields.text("launcher"),
        master=fields.text("master"),
        backend=fields.text("backend"),
        torch_version=fields.text("torch_version"),
        device=fields.optional_text("device", "device"),
        allow_gpu_sharing=fields.flag("allow_gpu_sharing"),
        scope=fields.text("scope"),
    )


def parse_checkin(key: str, raw: str | bytes) -> CheckIn:
    """Return the check-in stored under `key`, validated against its schema.

    Raises:
        ForeignRecordError: If it is too large, not JSON, or any field is missing, extra, of the wrong
            type, out of range or does not match its pattern.
    """
    return _checkin(key, _load(key, raw, MAX_CHECKIN_BYTES))


class Verdict(NamedTuple):
    """Rank 0's conclusion, published to every rank: structured problems, rendered locally.

    `nodes` numbers the nodes where a launcher left the node layout incomplete (a check-in's
    ``node_rank`` or ``local_world_size`` is None, or rank 0's node count is unknown): the ranks'
    host names in order of their lowest rank (`node_hosts`), so a rank's node index is its host's
    position and the node count their number. `sizes` counts the ranks on each of those nodes
    (`host_sizes`) where a check-in's ``local_world_size`` is None, so a rank's local world size
    is the count at its node's position. Both are empty when every rank knew its layout, or when
    the verdict is negative.
    """

    ok: bool
    problems: "tuple[Problem, ...]"
    checkins: tuple[CheckIn, ...] = ()
    scope: str = "-/-/-"
    nodes: tuple[str, ...] = ()
    sizes: tuple[int, ...] = ()

    def to_json(self) -> str:
        """Return the published form: scope, ok, problems, nodes and, if any, sizes."""
        published: dict[str, object] = {
            "scope": self.scope,
            "ok": self.ok,
            "problems": [_problems().problem_json(p) for p in self.problems[:MAX_PROBLEMS]],
            "nodes": list(self.nodes),
        }
        if self.sizes:  # only where a rank's local world size is unknown: no bytes otherwise
            published["sizes"] = list(self.sizes)
        return json.dumps(published, separators=(",", ":"))

    def size_of(self, node: int) -> int | None:
        """Return how many ranks run on node `node` (`sizes`), or None if it counts none."""
        return self.sizes[node] if 0 <= node < len(self.sizes) else None

    def node_of(self, hostname: str) -> int | None:
        """Return the index of `hostname`'s node in `nodes`, or None if it names no such host."""
        try:
            return self.nodes.index(hostname)
        except ValueError:
            return None

    def describe(self, timeout: float) -> list[str]:
        """Return one message per problem, from this rank's own templates."""
        return [p.describe(timeout) for p in self.problems]

    @property
    def missing(self) -> bool:
        """Whether a problem is that ranks never arrived (a timeout, not a misconfiguration)."""
        return bool(self.problems) and any(
            isinstance(p, _problems().Missing) for p in self.problems
        )


_VERDICT_FIELDS = frozenset(("scope", "ok", "problems", "nodes"))
_SIZED_VERDICT_FIELDS = _VERDICT_FIELDS | {"sizes"}


def parse_verdict(key: str, raw: str | bytes, *, scope: str, world_size: int) -> Verdict:
    """Return the verdict stored under `key`, validated for this job's `scope` and world.

    Raises:
        ForeignRecordError: If it is too large, malformed, of another scope, or inconsistent (an "ok"
            verdict with problems, a failing one without).
    """
    cap = MAX_VERDICT_BYTES + NODE_BYTES * world_size
    data = _load(key, raw, cap)
    sized = isinstance(data, dict) and "sizes" in data
    fields = _Fields(key, data, _SIZED_VERDICT_FIELDS if sized else _VERDICT_FIELDS)
    if fields.text("scope") != scope:
        raise ForeignRecordError(key, "written for another scope")
    ok = fields.flag("ok")
    items = fields.items("problems", MAX_PROBLEMS)
    problems = tuple(_problems().parse_problem(key, p, world_size) for p in items)
    if ok == bool(problems):
        raise ForeignRecordError(key, "its outcome contradicts its problems")
    hosts = fields.items("nodes", world_size)
    if not all(matches("hostname", host) for host in hosts) or len(set(hosts)) != len(hosts):
        raise ForeignRecordError(key, "field 'nodes' is not a list of distinct host names")
    if hosts and not ok:
        raise ForeignRecordError(key, "a negative verdict numbers no nodes")
    sizes = fields.items("sizes", world_size) if sized else []
    if sized and (
        not all(type(n) is int and 1 <= n <= world_size for n in sizes)
        or len(sizes) != len(hosts)
        or sum(sizes) != world_size
    ):
        raise ForeignRecordError(
            key, "field 'sizes' does not count the ranks of each node in 'nodes'"
        )
    return Verdict(ok, problems, (), scope, tuple(hosts), tuple(sizes))


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
    `distenv.problems` to say what.
    """
    found: list[Problem] = []
    for field in AGREED:
        if len(set(map(attrgetter(field), checkins))) > 1:
            found.append(_problems().disagreement(checkins, field))

    ranks = [c.rank for c in checkins]
    distinct = set(ranks)
    if len(distinct) != len(ranks):
        found += _problems().claimed_twice(checkins)
    elif len(distinct) != world_size:
        found.append(_problems().missing_ranks(world_size, None, checkins))

    # Keyed by node as well as host: tests (and `distenv run --nnodes 2` twice on one machine)
    # legitimately run several "nodes" on one host.
    places = list(map(attrgetter("hostname", "node_rank", "local_rank"), checkins))
    distinct_places = set(places)
    if len(distinct_places) != len(places):
        found += _problems().shared_local_ranks(places)
    elif len(distinct) == len(ranks) == world_size:
        found += _local_misfits(checkins, distinct_places)

    for field in MIXED_FIELDS:
        values = list(map(attrgetter(field), checkins))
        if 0 < values.count(None) < len(values):
            found.append(_problems().mixed_layout(checkins, field))

    # Only where the launcher named the nodes: the roll call's own numbering is by host.
    pairs = {(c.node_rank, c.hostname) for c in checkins if c.node_rank is not None}
    if len(pairs) != len({node for node, _ in pairs}):
        found += _problems().placements(pairs)

    on_gpus = [c for c in checkins if c.device is not None]
    if len(set(map(attrgetter("hostname", "device"), on_gpus))) != len(on_gpus):
        found += _problems().shared_gpus(on_gpus)
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
    return _problems().local_layouts(checkins, misfits) if misfits else []


def node_hosts(checkins: Sequence[CheckIn], *, layout_known: bool = True) -> tuple[str, ...]:
    """Return the nodes' host names in order of their lowest rank, or () if every rank knew them.

    `checkins` are in rank order (rank 0's gather reads them so). A check-in carries the node
    index only, so rank 0 says with `layout_known` whether its launcher also counted the nodes
    (Cray PALS names each rank's node but not how many there are). Host names are what tells the
    nodes apart: two nodes that report one name are one node here, and the roll call's check of
    unique local ranks per host refuses that job (`distenv.problems.shared_local_ranks`).
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


def _problems() -> ModuleType:
    from distenv import problems

    return problems
