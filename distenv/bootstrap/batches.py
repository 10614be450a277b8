"""What a node's leader writes to rank 0's store: one record for all of its node's ranks.

Where several ranks share a node, the node's leader gathers their check-ins
(`distenv.bootstrap.leaders`) and appends them to rank 0's store as one `Batch`: the fields its
ranks share once, then a short row per rank. Rank 0 reads a shard of batches per ``SHARD_RANKS``
ranks (a few keys at any scale, each far below TCPStore's 8 MiB value limit) instead of one key
per rank, and expands them to the same `CheckIn` records a flat roll call reads, so one validation
serves both. After the process group exists, the leader reports its node's group-up tokens the
same way (`UpBatch`).

Nothing read here is trusted: a shard is lines of JSON, and a line that does not parse against its
schema (or a fragment a forger appended without a newline, which spoils the line it joins) is
counted as foreign, never skipped as if absent. Pure: no torch, no store, no process state.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from distenv.bootstrap.protocol import BATCHES
from distenv.bootstrap.records import (
    MAX_PID,
    MAX_RANK,
    CheckIn,
    Fields,
    ForeignRecordError,
    checkin_of,
    load_json,
    pattern_of,
)

__all__ = [
    "SHARD_RANKS",
    "Batch",
    "UpBatch",
    "parse_batches",
    "parse_up_batches",
    "shard_key",
    "shard_keys",
]

#: Leaders whose rank falls in one block of this many ranks append to one key: 131 072 ranks
#: make 32 keys of about 1 MiB each.
SHARD_RANKS = 4096
#: One batch's bytes: its shared fields, then under 200 bytes per rank (rows of odd ranks, whose
#: shared fields differ, or that offer addresses to the network probe, are whole check-ins).
MAX_BATCH_BYTES = 1 << 20

_SHARED = ("scope", "world_size", "master", "backend", "torch_version", "launcher", "hostname")
_LAYOUT = ("node_rank", "local_world_size")
_COMMON = frozenset((*_SHARED, *_LAYOUT))
_BATCH = frozenset(("leader", "common", "ranks", "odd"))
_UP = frozenset(("leader", "tokens", "gone", "late"))
_TOKEN_HEX = 16


def shard_key(leader: int) -> str:
    """Return the key the leader of rank `leader` appends its node's records to."""
    return BATCHES.of(leader // SHARD_RANKS)


def shard_keys(world_size: int) -> list[str]:
    """Return every shard key of a world of `world_size` ranks, in order."""
    return [BATCHES.of(n) for n in range((world_size + SHARD_RANKS - 1) // SHARD_RANKS)]


class Batch(NamedTuple):
    """One node's check-ins as its leader forwards them (the leader's own among them)."""

    leader: int
    checkins: tuple[CheckIn, ...]

    def to_line(self) -> str:
        """Return the appended form: one line of JSON, the shared fields written once."""
        own = self.checkins[0]
        common = {name: getattr(own, name) for name in (*_SHARED, *_LAYOUT)}
        rows: list[list[Any]] = []
        odd: list[dict[str, Any]] = []
        for c in self.checkins:
            if c.net is None and all(getattr(c, n) == common[n] for n in common):
                rows.append([c.rank, c.local_rank, c.pid, c.device, c.allow_gpu_sharing])
            else:
                odd.append(c.to_dict())
        line = {
            "leader": self.leader,
            "common": common,
            "ranks": rows,
            "odd": odd,
        }
        return json.dumps(line, separators=(",", ":")) + "\n"


def _rows(key: str, fields: Fields, common: dict[str, Any], world: int) -> list[CheckIn]:
    """Return the check-ins of a batch's rows, each field checked as a check-in's would be.

    Rank 0 runs this on every rank of a large world: one pattern match per device (each differs)
    and no keyword arguments.
    """
    local_world = common["local_world_size"]
    locals_below = world if local_world is None else local_world
    device_ok = pattern_of("device").fullmatch
    shared = (
        common["world_size"],
        local_world,
        common["node_rank"],
        common["hostname"],
    )
    tail = (
        common["launcher"],
        common["master"],
        common["backend"],
        common["torch_version"],
    )
    scope = common["scope"]
    make = CheckIn._make
    out = []
    for row in fields.items("ranks", MAX_RANK):
        if type(row) is not list or len(row) != 5:
            raise ForeignRecordError(key, "field 'ranks' is not a list of rows of five")
        rank, local_rank, pid, device, sharing = row
        if not (
            type(rank) is int
            and 0 <= rank < world
            and type(local_rank) is int
            and 0 <= local_rank < locals_below
            and type(pid) is int
            and 1 <= pid <= MAX_PID
            and (device is None or (type(device) is str and device_ok(device) is not None))
            and type(sharing) is bool
        ):
            raise ForeignRecordError(key, "a row of field 'ranks' is out of its range")
        # CheckIn's field order: rank, world_size, local_rank, local_world_size, node_rank,
        # hostname, pid, launcher, master, backend, torch_version, device, allow_gpu_sharing,
        # scope, net.
        out.append(
            make(
                (rank, shared[0], local_rank, *shared[1:], pid, *tail, device, sharing, scope, None)
            )
        )
    return out


def _batch(key: str, data: object, scope: str, world: int) -> Batch:
    fields = Fields(key, data, _BATCH)
    leader = fields.integer("leader", 0, world)
    shared = Fields(key, fields.data["common"], _COMMON)
    common: dict[str, Any] = {name: shared.text(name) for name in _SHARED if name != "world_size"}
    common["world_size"] = shared.integer("world_size", 1, MAX_RANK + 1)
    common["node_rank"] = shared.optional_integer("node_rank", 0, world)
    common["local_world_size"] = shared.optional_integer("local_world_size", 1, MAX_RANK + 1)
    if common["scope"] != scope or common["world_size"] != world:
        raise ForeignRecordError(key, "written for another scope or world")
    checkins = _rows(key, fields, common, world)
    for entry in fields.items("odd", MAX_RANK):
        checkins.append(checkin_of(key, entry))
    if all(c.rank != leader for c in checkins):
        raise ForeignRecordError(key, "the batch does not hold its leader's check-in")
    return Batch(leader, tuple(checkins))


T = TypeVar("T")


def _parse_lines(key: str, raw: bytes | None, parse: Callable[[object], T]) -> tuple[list[T], int]:
    """Return what `parse` makes of each line of a shard, and how many lines it refused.

    A fragment after the last newline is nobody's whole record: it counts as refused.
    """
    if raw is None:
        return [], 0
    *lines, fragment = raw.decode("utf-8", "replace").split("\n")
    found, foreign = [], int(bool(fragment))
    for line in lines:
        try:
            found.append(parse(load_json(key, line, MAX_BATCH_BYTES)))
        except ForeignRecordError:
            foreign += 1
    return found, foreign


def parse_batches(
    key: str, raw: bytes | None, *, scope: str, world_size: int
) -> tuple[list[Batch], int]:
    """Return the valid batches in one shard, and how many of its lines this job did not write."""
    return _parse_lines(key, raw, lambda data: _batch(key, data, scope, world_size))


class UpBatch(NamedTuple):
    """One node's group-up report from its leader.

    `tokens` pairs each rank that came up with the token it drew; `gone` are the node's ranks
    whose connection to the leader closed before they came up (they died or were killed), `late`
    those still silent when the leader reported.
    """

    leader: int
    tokens: tuple[tuple[int, str], ...]
    gone: tuple[int, ...] = ()
    late: tuple[int, ...] = ()

    def to_line(self) -> str:
        line = {
            "leader": self.leader,
            "tokens": [list(t) for t in self.tokens],
            "gone": list(self.gone),
            "late": list(self.late),
        }
        return json.dumps(line, separators=(",", ":")) + "\n"

    @property
    def ranks(self) -> int:
        """How many ranks this report accounts for."""
        return len(self.tokens) + len(self.gone) + len(self.late)

    def echo(self) -> str:
        """Return rank 0's acknowledgement of this report: its tokens, echoed in rank order."""
        return ",".join(f"{rank}:{token}" for rank, token in sorted(self.tokens))


def _ranks(key: str, fields: Fields, name: str, world: int) -> tuple[int, ...]:
    values = fields.items(name, MAX_RANK)
    if not all(type(r) is int and 0 <= r < world for r in values):
        raise ForeignRecordError(key, f"field {name!r} is not a list of ranks")
    return tuple(values)


def _up(key: str, data: object, world: int) -> UpBatch:
    fields = Fields(key, data, _UP)
    tokens = []
    for entry in fields.items("tokens", MAX_RANK):
        if (
            not isinstance(entry, list)
            or len(entry) != 2
            or type(entry[0]) is not int
            or not 0 <= entry[0] < world
            or type(entry[1]) is not str
            or len(entry[1]) != _TOKEN_HEX
            or not all(ch in "0123456789abcdef" for ch in entry[1])
        ):
            raise ForeignRecordError(key, "field 'tokens' is not a list of ranks and tokens")
        tokens.append((entry[0], entry[1]))
    return UpBatch(
        fields.integer("leader", 0, world),
        tuple(tokens),
        _ranks(key, fields, "gone", world),
        _ranks(key, fields, "late", world),
    )


def parse_up_batches(key: str, raw: bytes | None, *, world_size: int) -> tuple[list[UpBatch], int]:
    """Return the valid group-up reports in one shard, and how many lines this job did not write."""
    return _parse_lines(key, raw, lambda data: _up(key, data, world_size))
