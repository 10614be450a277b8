"""What ranks write to the store, and what rank 0 answers: schemas, checks and messages.

Nothing read from the store is trusted. TCPStore is unauthenticated, so any process that reaches
rank 0's port can write any key; a record therefore counts only if it parses against its schema
here: JSON of a bounded size, exactly the known fields, each of its type, in its range, and every
string matching its own pattern (host names, versions, backends, devices, launchers, scopes).
Anything else raises `ForeignRecordError`, naming the key, never echoing the text.

Rank 0's verdict carries structured problems only (a code, ranks, validated fields): every rank
renders the message from its own templates (`Problem.describe`), so no free text from the store is
ever printed. This module is pure: no torch, no store, no process state.
"""

import json
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from operator import attrgetter
from typing import Any, NamedTuple

__all__ = [
    "AGREED",
    "MAX_CHECKIN_BYTES",
    "MAX_VERDICT_BYTES",
    "CheckIn",
    "ClaimedTwice",
    "Disagreement",
    "ForeignCheckIn",
    "ForeignRecordError",
    "Missing",
    "Placement",
    "Problem",
    "SharedGpu",
    "SharedLocalRank",
    "Verdict",
    "expected_hosts",
    "matches",
    "missing_ranks",
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
    """What one rank reports about itself."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
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
    local_world = fields.integer("local_world_size", 1, MAX_RANK + 1)
    return CheckIn(
        rank=fields.integer("rank", 0, world),
        world_size=world,
        local_rank=fields.integer("local_rank", 0, local_world),
        local_world_size=local_world,
        node_rank=fields.integer("node_rank", 0, world),
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


# ---- problems: structured, validated, rendered locally ------------------------------------------


def _shown(ranks: Sequence[int]) -> tuple[tuple[int, ...], int]:
    ordered = sorted(ranks)
    return tuple(ordered[:MAX_SHOWN]), len(ordered)


def _ranks_text(shown: Sequence[int], total: int) -> str:
    text = ", ".join(str(r) for r in shown[:8])
    return text + (f", ... ({total} in all)" if total > 8 else "")


def _rank_list(fields: _Fields, name: str, world: int) -> tuple[int, ...]:
    ranks = fields.items(name)
    if not all(type(r) is int and 0 <= r < world for r in ranks):
        raise ForeignRecordError(fields.key, f"field {name!r} is not a list of ranks")
    return tuple(ranks)


def _host_list(fields: _Fields, name: str) -> tuple[str, ...]:
    hosts = fields.items(name)
    if not all(matches("hostname", h) for h in hosts):
        raise ForeignRecordError(fields.key, f"field {name!r} is not a list of host names")
    return tuple(hosts)


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
            where = ", ".join(hosts) if hosts else (f"node {node}" if node is not None else "")
            lines.append(f"rank {rank} (expected on {where or 'an unknown host'})")
        more = f" and {self.total - len(self.ranks)} more" if self.total > len(self.ranks) else ""
        return (
            f"{self.total} of {self.world_size} ranks did not check in within {timeout:.0f} s: "
            + ", ".join(lines)
            + more
        )

    @classmethod
    def parse(cls, fields: "_Fields", world: int) -> "Missing":
        ranks = _rank_list(fields, "ranks", world)
        hosts_raw = fields.items("hosts")
        nodes_raw = fields.items("nodes")
        if len(hosts_raw) != len(ranks) or len(nodes_raw) != len(ranks):
            raise ForeignRecordError(fields.key, "ranks, hosts and nodes differ in length")
        hosts = []
        for entry in hosts_raw:
            if not isinstance(entry, list) or len(entry) > MAX_SHOWN:
                raise ForeignRecordError(fields.key, "hosts is not a list of host lists")
            if not all(matches("hostname", h) for h in entry):
                raise ForeignRecordError(fields.key, "hosts is not a list of host lists")
            hosts.append(tuple(entry))
        if not all(n is None or (type(n) is int and 0 <= n < world) for n in nodes_raw):
            raise ForeignRecordError(fields.key, "nodes is not a list of node indexes")
        total = fields.integer("total", len(ranks), world + 1)
        return cls(
            total,
            fields.integer("world_size", world, world + 1),
            ranks,
            tuple(hosts),
            tuple(nodes_raw),
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

    @classmethod
    def parse(cls, fields: "_Fields", world: int) -> "Disagreement":
        field = fields.data["field"]
        if field not in AGREED:
            raise ForeignRecordError(fields.key, "field 'field' names no agreed field")
        values = fields.items("values")
        if field == "world_size":
            if not all(type(v) is int and 0 < v <= MAX_RANK for v in values):
                raise ForeignRecordError(fields.key, "values are not world sizes")
        elif not all(matches(field, v) for v in values):
            raise ForeignRecordError(fields.key, f"values do not match the pattern of {field}")
        groups = fields.items("ranks")
        totals = fields.items("totals")
        if len(groups) != len(values) or len(totals) != len(values):
            raise ForeignRecordError(fields.key, "values, ranks and totals differ in length")
        ranks = []
        for group, total in zip(groups, totals, strict=True):
            if not isinstance(group, list) or len(group) > MAX_SHOWN:
                raise ForeignRecordError(fields.key, "ranks is not a list of rank lists")
            if not all(type(r) is int and 0 <= r < world for r in group):
                raise ForeignRecordError(fields.key, "ranks is not a list of rank lists")
            if type(total) is not int or not len(group) <= total <= MAX_RANK:
                raise ForeignRecordError(fields.key, "totals are not counts")
            ranks.append(tuple(group))
        return cls(field, tuple(values), tuple(ranks), tuple(totals))


class ClaimedTwice(NamedTuple):
    """One rank claimed by several processes: each claim's pid and host."""

    rank: int
    pids: tuple[int, ...]
    hosts: tuple[str, ...]

    def describe(self, timeout: float) -> str:
        who = ", ".join(f"pid {p} on {h}" for p, h in zip(self.pids, self.hosts, strict=True))
        return f"rank {self.rank} was claimed by {len(self.pids)} processes ({who})"

    @classmethod
    def parse(cls, fields: "_Fields", world: int) -> "ClaimedTwice":
        pids = fields.items("pids")
        if not all(type(p) is int and 0 < p <= MAX_PID for p in pids):
            raise ForeignRecordError(fields.key, "pids are not process ids")
        hosts = _host_list(fields, "hosts")
        if len(hosts) != len(pids):
            raise ForeignRecordError(fields.key, "pids and hosts differ in length")
        return cls(fields.integer("rank", 0, world), tuple(pids), hosts)


class SharedLocalRank(NamedTuple):
    """Several ranks of one host and node with the same local rank."""

    host: str
    node: int
    local_rank: int
    sharing: int

    def describe(self, timeout: float) -> str:
        return (
            f"{self.sharing} ranks on {self.host} (node {self.node}) share local rank "
            f"{self.local_rank}"
        )

    @classmethod
    def parse(cls, fields: "_Fields", world: int) -> "SharedLocalRank":
        return cls(
            fields.text("host", "hostname"),
            fields.integer("node", 0, world),
            fields.integer("local_rank", 0, world),
            fields.integer("sharing", 2, MAX_RANK),
        )


class Placement(NamedTuple):
    """MPI ranks assumed on one node (by-node placement) that run on several hosts."""

    node: int
    hosts: tuple[str, ...]

    def describe(self, timeout: float) -> str:
        return (
            f"MPI ranks assumed on node {self.node} (by-node placement) run on "
            f"{list(self.hosts)}: the job does not place ranks node by node; export "
            "MASTER_ADDR and use --map-by node-compatible placement"
        )

    @classmethod
    def parse(cls, fields: "_Fields", world: int) -> "Placement":
        return cls(fields.integer("node", 0, world), _host_list(fields, "hosts"))


class SharedGpu(NamedTuple):
    """Ranks of one host driving the same physical GPU without having allowed it."""

    host: str
    device: str
    ranks: tuple[int, ...]
    total: int

    def describe(self, timeout: float) -> str:
        return (
            f"ranks {_ranks_text(self.ranks, self.total)} on {self.host} drive the same GPU "
            f"({self.device}); give each rank its own GPU or pass allow_gpu_sharing=True"
        )

    @classmethod
    def parse(cls, fields: "_Fields", world: int) -> "SharedGpu":
        ranks = _rank_list(fields, "ranks", world)
        return cls(
            fields.text("host", "hostname"),
            fields.text("device"),
            ranks,
            fields.integer("total", len(ranks), MAX_RANK + 1),
        )


class ForeignCheckIn(NamedTuple):
    """A check-in under this job's keys that this job's distenv did not write."""

    key: str

    def describe(self, timeout: float) -> str:
        return (
            f"the check-in record under {self.key} was not written by this job's distenv "
            "(malformed, oversized, of another job's scope or under another rank's key): a "
            "process that is not part of this job wrote to rank 0's store"
        )

    @classmethod
    def parse(cls, fields: "_Fields", world: int) -> "ForeignCheckIn":
        return cls(fields.text("key", "record_key"))


Problem = (
    Missing | Disagreement | ClaimedTwice | SharedLocalRank | Placement | SharedGpu | ForeignCheckIn
)
#: Each problem's code in the published verdict.
CODES: dict[type, str] = {
    Missing: "missing",
    Disagreement: "disagree",
    ClaimedTwice: "claimed",
    SharedLocalRank: "local_rank",
    Placement: "placement",
    SharedGpu: "gpu",
    ForeignCheckIn: "foreign",
}
_PROBLEMS: dict[str, Any] = {code: kind for kind, code in CODES.items()}


def _problem_json(problem: Problem) -> dict[str, Any]:
    return {"code": CODES[type(problem)], **problem._asdict()}


def _parse_problem(key: str, data: object, world: int) -> Problem:
    if not isinstance(data, dict) or data.get("code") not in _PROBLEMS:
        raise ForeignRecordError(key, "a problem with an unknown code")
    kind = _PROBLEMS[data["code"]]
    body = {k: v for k, v in data.items() if k != "code"}
    problem: Problem = kind.parse(_Fields(key, body, frozenset(kind._fields)), world)
    return problem


class Verdict(NamedTuple):
    """Rank 0's conclusion, published to every rank: structured problems, rendered locally."""

    ok: bool
    problems: tuple[Problem, ...]
    checkins: tuple[CheckIn, ...] = ()
    scope: str = "-/-/-"

    def to_json(self) -> str:
        """Return the published form: scope, ok and problems (never the check-ins)."""
        return json.dumps(
            {
                "scope": self.scope,
                "ok": self.ok,
                "problems": [_problem_json(p) for p in self.problems[:MAX_PROBLEMS]],
            },
            separators=(",", ":"),
        )

    def describe(self, timeout: float) -> list[str]:
        """Return one message per problem, from this rank's own templates."""
        return [p.describe(timeout) for p in self.problems]

    @property
    def missing(self) -> bool:
        """Whether a problem is that ranks never arrived (a timeout, not a misconfiguration)."""
        return any(isinstance(p, Missing) for p in self.problems)


_VERDICT_FIELDS = frozenset(("scope", "ok", "problems"))


def parse_verdict(key: str, raw: str | bytes, *, scope: str, world_size: int) -> Verdict:
    """Return the verdict stored under `key`, validated for this job's `scope` and world.

    Raises:
        ForeignRecordError: If it is too large, malformed, of another scope, or inconsistent (an "ok"
            verdict with problems, a failing one without).
    """
    fields = _Fields(key, _load(key, raw, MAX_VERDICT_BYTES), _VERDICT_FIELDS)
    if fields.text("scope") != scope:
        raise ForeignRecordError(key, "written for another scope")
    ok = fields.flag("ok")
    problems = tuple(
        _parse_problem(key, p, world_size) for p in fields.items("problems", MAX_PROBLEMS)
    )
    if ok == bool(problems):
        raise ForeignRecordError(key, "its outcome contradicts its problems")
    return Verdict(ok, problems, (), scope)


# ---- validation of a complete set of check-ins (rank 0) -----------------------------------------


def _agreement(checkins: Sequence[CheckIn], field: str) -> list[Problem]:
    of = attrgetter(field)
    if len(set(map(of, checkins))) <= 1:  # the common case, at C speed
        return []
    values: dict[Any, list[int]] = defaultdict(list)
    for c in checkins:
        values[of(c)].append(c.rank)
    ordered = sorted(values.items(), key=lambda item: str(item[0]))[:MAX_SHOWN]
    return [
        Disagreement(
            field,
            tuple(value for value, _ in ordered),
            tuple(_shown(ranks)[0] for _, ranks in ordered),
            tuple(len(ranks) for _, ranks in ordered),
        )
    ]


def _claimed_twice(checkins: Sequence[CheckIn]) -> list[Problem]:
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


def validate(checkins: Sequence[CheckIn], world_size: int) -> list[Problem]:
    """Return what is wrong with a complete set of check-ins (an empty list when all is well).

    Checks: agreement on scope, world size, master, backend, torch version and launcher; unique
    ranks covering ``0..world_size-1``; unique local ranks per host; for MPI, the assumed by-node
    placement against the host names; no two ranks of one host on the same physical GPU unless
    sharing was allowed. Each check has a fast path for a healthy job (rank 0 runs this on every
    check-in of the world).
    """
    problems: list[Problem] = []
    for field in AGREED:
        problems += _agreement(checkins, field)

    ranks = [c.rank for c in checkins]
    distinct = set(ranks)
    twice = _claimed_twice(checkins) if len(distinct) != len(ranks) else []
    problems += twice
    if not twice and len(distinct) != world_size:
        missing = sorted(set(range(world_size)) - distinct)
        if missing:
            problems.append(_missing(missing, world_size, checkins, None))

    # Keyed by node as well as host: tests (and `distenv run --nnodes 2` twice on one machine)
    # legitimately run several "nodes" on one host.
    places = list(map(attrgetter("hostname", "node_rank", "local_rank"), checkins))
    if len(set(places)) != len(places):
        for (host, node, local_rank), count in sorted(Counter(places).items()):
            if count > 1:
                problems.append(SharedLocalRank(host, node, local_rank, count))

    if checkins and checkins[0].launcher == "mpi":
        hosts_of_node: dict[int, set[str]] = defaultdict(set)
        for c in checkins:
            hosts_of_node[c.node_rank].add(c.hostname)
        for node, hosts in sorted(hosts_of_node.items()):
            if len(hosts) > 1:
                problems.append(Placement(node, tuple(sorted(hosts))[:MAX_SHOWN]))

    on_gpus = [c for c in checkins if c.device is not None]
    gpus = set(map(attrgetter("hostname", "device"), on_gpus))
    if len(gpus) == len(on_gpus):  # one rank per GPU: nothing shares
        return problems[:MAX_PROBLEMS]
    devices: dict[tuple[str, str], list[int]] = defaultdict(list)
    allowed: dict[tuple[str, str], bool] = defaultdict(lambda: True)
    for c in on_gpus:
        if c.device is not None:
            devices[(c.hostname, c.device)].append(c.rank)
            allowed[(c.hostname, c.device)] &= c.allow_gpu_sharing
    for (host, device), on_device in sorted(devices.items()):
        if len(on_device) > 1 and not allowed[(host, device)]:
            shown, total = _shown(on_device)
            problems.append(SharedGpu(host, device, shown, total))
    return problems[:MAX_PROBLEMS]


def expected_hosts(
    rank: int, world_size: int, local_world_size: int, arrived: Sequence[CheckIn]
) -> tuple[tuple[str, ...], int | None]:
    """Return where a missing rank should run: the hosts of its node's arrivals, and the node."""
    node = rank // local_world_size if world_size % local_world_size == 0 else None
    hosts = sorted({c.hostname for c in arrived if node is not None and c.node_rank == node})
    return tuple(hosts[:MAX_SHOWN]), node


def _missing(
    missing: Sequence[int],
    world_size: int,
    arrived: Sequence[CheckIn],
    local_world_size: int | None,
) -> Missing:
    named = list(missing)[:MAX_SHOWN]
    local = local_world_size or (arrived[0].local_world_size if arrived else 1)
    places = [expected_hosts(r, world_size, local, arrived) for r in named]
    return Missing(
        len(missing),
        world_size,
        tuple(named),
        tuple(hosts for hosts, _ in places),
        tuple(node for _, node in places),
    )


def missing_ranks(world_size: int, local_world_size: int, arrived: Sequence[CheckIn]) -> Missing:
    """Return the `Missing` problem for the ranks of ``0..world_size-1`` that did not arrive."""
    seen = {c.rank for c in arrived}
    absent = [r for r in range(world_size) if r not in seen]
    return _missing(absent, world_size, arrived, local_world_size)
