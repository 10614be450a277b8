"""What ranks write to the store: the check-in's schema, and the checks every record passes.

Nothing read from the store is trusted. TCPStore is unauthenticated, so any process that reaches
rank 0's port can write any key; a record therefore counts only if it parses against its schema
here: JSON of a bounded size, exactly the known fields, each of its type, in its range, and every
string matching its own pattern (host names, versions, backends, devices, launchers, scopes).
Anything else raises `ForeignRecordError`, naming the key, never echoing the text. Rank 0's answer
is in `distenv.bootstrap.verdict`, its problems in `distenv.bootstrap.problems`. Pure: no torch, no store, no process
state.
"""

import json
import re
from collections.abc import Set as AbstractSet
from typing import Any, NamedTuple

__all__ = [
    "AGREED",
    "MAX_CHECKIN_BYTES",
    "MIXED_FIELDS",
    "CheckIn",
    "Fields",
    "ForeignRecordError",
    "NetRecord",
    "Switch",
    "checkin_of",
    "claim",
    "load_json",
    "matches",
    "parse_checkin",
    "parse_claim",
    "parse_scope",
    "pattern_of",
]

# Caps, checked after reading (TCPStore cannot tell a value's size before).
MAX_CHECKIN_BYTES = 4096
MAX_SCOPE_BYTES = 300
MAX_CLAIM_BYTES = 2048  # the scope, and rank 0's network record for the probe
MAX_CANDIDATES = 8  # addresses one rank offers to the network probe (distenv.system.netpath)
MAX_RANK = 1 << 24  # a world of 16 M ranks: far beyond any job, small enough to be sane
MAX_PID = 1 << 22  # Linux's pid_max limit
MAX_SHOWN = 16  # ranks, hosts or claims a problem names; the rest are counted

_HOST = r"[A-Za-z0-9_](?:[A-Za-z0-9._-]{0,252})"
_IPV6 = r"\[[0-9A-Fa-f:.]{2,45}(?:%[A-Za-z0-9_.-]{1,32})?\]"
PATTERNS = {
    # A host name as distenv._hosts.record_host writes it: plain, or percent-encoded.
    "hostname": r"[A-Za-z0-9_%](?:[A-Za-z0-9._%-]{0,252})",
    "master": rf"(?:{_HOST}|{_IPV6}):[0-9]{{1,5}}",
    "launcher": r"[a-z][a-z0-9_-]{0,31}",
    "backend": r"[A-Za-z0-9:,_-]{1,64}",
    "torch_version": r"[0-9]{1,4}\.[0-9]{1,4}(?:\.[0-9]{1,4})?[A-Za-z0-9.+_-]{0,48}",
    # distenv.device.identity_of: a UUID, a PCI address, or the visible value that picked it.
    "device": r"(?:GPU|MIG|XPU)-[0-9A-Fa-f-]{1,64}|[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}"
    r"|(?:cuda|rocm|xpu):[0-9A-Za-z.+-]{1,128}",
    # scope_tag(launcher, job, step): see distenv.master.RUN_ID_PATTERN for the run ids inside.
    "scope": r"[A-Za-z0-9][A-Za-z0-9._:/@+\[\]-]{0,299}",
    "record_key": r"(?:checkin|extra|batches)/[0-9]{1,8}",
    "address": r"[0-9]{1,3}(?:\.[0-9]{1,3}){3}|[0-9A-Fa-f:.]{2,45}(?:%[A-Za-z0-9_.-]{1,32})?",
    "interface": r"[A-Za-z0-9_.@-]{1,15}",
    "token": r"[0-9a-f]{16}",
    "probed_backend": r"gloo|nccl",
}
# Compiled when this module is imported (init_dist's first call imports it, `import distenv` does
# not): about 1 ms of work each rank does before it meets the others, in parallel with their own
# start, instead of on rank 0 while every other rank waits for its verdict.
_COMPILED: dict[str, re.Pattern[str]] = {field: re.compile(p) for field, p in PATTERNS.items()}
# Values that matched, per pattern: rank 0 checks N records whose host names, versions and scope
# repeat, so each distinct string meets its regex once. Bounded; a miss only costs the regex.
_MATCHED: dict[str, set[str]] = {field: set() for field in PATTERNS}
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


def pattern_of(field: str) -> re.Pattern[str]:
    """Return `field`'s compiled pattern (for a caller that checks many values of one field)."""
    return _COMPILED[field]


def matches(field: str, value: object) -> bool:
    """Return whether `value` is a string matching `field`'s pattern."""
    if type(value) is not str:
        return False
    matched = _MATCHED[field]
    if value in matched:
        return True
    if _COMPILED[field].fullmatch(value) is None:
        return False
    if len(matched) < _MATCHED_MAX:
        matched.add(value)
    return True


class Fields:
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


def load_json(key: str, raw: str | bytes, cap: int) -> object:
    """Return the JSON value of a record of at most `cap` bytes (`ForeignRecordError` if not)."""
    if len(raw) > cap:
        raise ForeignRecordError(key, f"{len(raw)} bytes, more than the {cap} allowed")
    try:
        # Decoding first skips json.loads's encoding sniffing: rank 0 parses N of these.
        return _decode(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
    except (ValueError, UnicodeDecodeError):
        raise ForeignRecordError(key, "not JSON") from None


def parse_scope(key: str, raw: str | bytes) -> str:
    """Return the scope written under `key`, validated (`ForeignRecordError` if not distenv's).

    A claim (`parse_claim`) holds the scope on its first line.
    """
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    text = text.partition("\n")[0]
    if len(text) > MAX_SCOPE_BYTES:
        raise ForeignRecordError(key, "longer than any scope")
    if not matches("scope", text):
        raise ForeignRecordError(key, "not a scope written by distenv")
    return text


class NetRecord(NamedTuple):
    """What one rank offers to the roll call's network probe (docs/network.md).

    `addresses` are ``(address, port, interface)``: each address this node's backends would
    advertise by default or could advertise instead (`distenv.system.netpath.predict`), with the port
    this rank listens on there for the probe (0: it could not listen) and the interface that
    holds it (None: none does). `defaults` pairs each probed backend with its default's index,
    `route` is the index of the address toward the master. `token` is what the listener answers,
    so that a probe that reaches another process (a docker0 address every node has) fails.
    `reached` is, on a rank that probed rank 0's node, the bit mask of rank 0's addresses it
    reached; None where it did not probe.
    """

    token: str
    addresses: tuple[tuple[str, int, str | None], ...]
    defaults: tuple[tuple[str, int], ...]
    route: int | None
    reached: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "token": self.token,
            "addresses": [list(a) for a in self.addresses],
            "defaults": [list(d) for d in self.defaults],
            "route": self.route,
            "reached": self.reached,
        }


_NET_FIELDS = frozenset(NetRecord._fields)


def _net(key: str, data: object) -> NetRecord:
    fields = Fields(key, data, _NET_FIELDS)
    addresses = []
    for entry in fields.items("addresses", MAX_CANDIDATES):
        if (
            not isinstance(entry, list)
            or len(entry) != 3
            or not matches("address", entry[0])
            or type(entry[1]) is not int
            or not 0 <= entry[1] < 1 << 16
            or not (entry[2] is None or matches("interface", entry[2]))
        ):
            raise ForeignRecordError(key, "field 'addresses' is not a list of network addresses")
        addresses.append((entry[0], entry[1], entry[2]))
    defaults = []
    for entry in fields.items("defaults", 2):
        if (
            not isinstance(entry, list)
            or len(entry) != 2
            or not matches("probed_backend", entry[0])
            or type(entry[1]) is not int
            or not 0 <= entry[1] < len(addresses)
        ):
            raise ForeignRecordError(key, "field 'defaults' does not index its addresses")
        defaults.append((entry[0], entry[1]))
    return NetRecord(
        token=fields.text("token"),
        addresses=tuple(addresses),
        defaults=tuple(defaults),
        route=fields.optional_integer("route", 0, max(len(addresses), 1)),
        reached=fields.optional_integer("reached", 0, 1 << MAX_CANDIDATES),
    )


class Switch(NamedTuple):
    """The ranks on `host` move `backend` to `interface`: one entry of a verdict's ``paths``
    (`distenv.bootstrap.paths`)."""

    host: str
    backend: str
    interface: str


class CheckIn(NamedTuple):
    """What one rank reports about itself.

    `node_rank` (or `local_world_size`) None: its launcher names no node index (no count of the
    ranks on its node); the roll call fills them in from the ranks' host names. `net`: what it
    offers to the network probe, None where it takes no part in it.
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
    net: NetRecord | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the record as JSON-ready values (`checkin_of` reads it back)."""
        record = self._asdict()
        record["net"] = None if self.net is None else self.net.to_dict()
        return record

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


_CHECKIN_FIELDS = frozenset(CheckIn._fields)


def checkin_of(key: str, data: object) -> CheckIn:
    """Return the check-in in `data`, a decoded JSON value read under `key` (`parse_checkin`)."""
    fields = Fields(key, data, _CHECKIN_FIELDS)
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
        net=None if fields.data["net"] is None else _net(key, fields.data["net"]),
    )


def parse_checkin(key: str, raw: str | bytes) -> CheckIn:
    """Return the check-in stored under `key`, validated against its schema.

    Raises:
        ForeignRecordError: If it is too large, not JSON, or any field is missing, extra, of the wrong
            type, out of range or does not match its pattern.
    """
    return checkin_of(key, load_json(key, raw, MAX_CHECKIN_BYTES))


def parse_claim(key: str, raw: str | bytes) -> tuple[str, str | None, NetRecord | None]:
    """Return the scope, rank 0's host name and its network record in a scope claim.

    The claim is the scope, then, where rank 0 offers its node's addresses to the probe, a line
    of JSON with its host name and `NetRecord`.

    Raises:
        ForeignRecordError: If it is too large or anything in it is not distenv's.
    """
    if len(raw) > MAX_CLAIM_BYTES:
        raise ForeignRecordError(key, "longer than any claim")
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    scope = parse_scope(key, text)
    rest = text.partition("\n")[2]
    if not rest:
        return scope, None, None
    fields = Fields(key, load_json(key, rest, MAX_CLAIM_BYTES), frozenset(("hostname", "net")))
    return scope, fields.text("hostname"), _net(key, fields.data["net"])


def claim(scope: str, hostname: str | None = None, net: NetRecord | None = None) -> str:
    """Return the value of a scope claim (`parse_claim`)."""
    if net is None or hostname is None:
        return scope
    return scope + "\n" + json.dumps({"hostname": hostname, "net": net.to_dict()})
