"""Rank 0's gathering: the check-ins of a flat roll call, or the nodes' batches, into a verdict.

Rank 0 reads what the ranks (`gather_checkins`) or the node leaders (`gather_batches`) wrote to
its store (`distenv.bootstrap.protocol`'s keys), once the count says when to look, and validates it
(`distenv.bootstrap.verdict`): the records decide, never a count alone. Called by the flat and the
leaders' `distenv.bootstrap.channel.Channel`.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import Any

from distenv.bootstrap.batches import parse_batches, shard_keys
from distenv.bootstrap.protocol import ALL, CHECKIN, CLOSED, CUT, EXTRA, EXTRAS, SIZES, WRITTEN
from distenv.bootstrap.records import (
    MAX_RANK,
    MAX_SHOWN,
    CheckIn,
    ForeignRecordError,
    matches,
    parse_checkin,
)
from distenv.bootstrap.verdict import Verdict, host_sizes, node_hosts, refusal, validate
from distenv.bootstrap.waits import pauses, peek, read_many, wait_counted, wait_keys
from distenv.deadline import Deadline, pause
from distenv.rankinfo import RankInfo
from distenv.timing import VERDICT_GRACE_S

__all__ = ["MAX_EXTRA", "gather_batches", "gather_checkins"]

# Extra claims rank 0 reads: beyond this many, the verdict already says enough.
MAX_EXTRA = 64
# The reports of other world sizes rank 0 reads (`other_sizes`): a line each, a few suffice.
MAX_SIZES_BYTES = 4096


def gather_checkins(store: Any, info: RankInfo, scope: str, deadline: Deadline) -> Verdict:
    """Return rank 0's verdict on the check-ins written by `deadline` (naming missing ranks).

    The "written" count says when to look; the records decide. Every rank writes its record
    before it counts itself, so a count ahead of the records was raised by a process outside the
    job (`ForeignCount`). Only honest claims may end the wait before every rank's key holds a
    record (two processes claiming one rank: the verdict says so at once); after a foreign write
    the absent ranks are awaited until `deadline`. Ranks still absent then have their keys
    closed (`CLOSED`) before they are named missing, so that a rank that checks in afterwards
    learns it came too late, and a rank that holds its own key knows that a verdict naming it
    missing is forged.
    """
    world = info.world_size
    counted = wait_counted(store, WRITTEN.name, world, ALL.name, deadline)
    resized = other_sizes(store, world) if counted >= CUT else None
    if resized is not None:
        raws = read_many(store, [f"{CHECKIN.stem}{rank}" for rank in range(world)])
        known, _ = _records([f"{CHECKIN.stem}{rank}" for rank in range(world)], raws, scope, world)
        return Verdict(False, (resized,), tuple(known), scope)
    extras = min(int(store.add(EXTRAS.name, 0)), MAX_EXTRA)
    stem = CHECKIN.stem
    keys = [f"{stem}{rank}" for rank in range(world)]
    keys += [EXTRA.of(n) for n in range(1, extras + 1)]
    raws = read_many(store, keys)
    present = len(raws) - raws.count(None)
    ahead = (counted, present) if counted > present else None
    checkins, foreign = _records(keys, raws, scope, world)
    absent = [key for key, raw in zip(keys, raws[:world], strict=False) if raw is None]
    if absent and (ahead or foreign):
        wait_keys(store, absent, deadline)
        raws = read_many(store, keys)
        checkins, foreign = _records(keys, raws, scope, world)
    honest = counted >= world and ahead is None and not foreign
    closed: set[str] = set()
    if None in raws[:world] and not honest:
        raws[:world] = _close(store, keys[:world], raws[:world], closed)
        checkins, foreign = _records(keys, raws, scope, world, closed)
    complete = honest or all(
        raw is not None and key not in closed for key, raw in zip(keys, raws[:world], strict=False)
    )
    found = tuple(checkins)
    if complete and not foreign and ahead is None:
        problems = validate(found, world)
        nodes = () if problems else node_hosts(found, layout_known=info.layout_known)
        sizes = host_sizes(found, nodes)
        return Verdict(not problems, tuple(problems), found, scope, nodes, sizes)
    return refusal(found, info, scope, foreign, complete=complete, ahead=ahead)


def other_sizes(store: Any, world: int) -> Any:
    """Return the `OtherSize` problem where ranks of this job's identity said they were started
    for another world size (`distenv.bootstrap.scope.ScopeCheck`, which then added `CUT` to the
    count); None where nobody did (a count past `CUT` is then a foreign write, named as such)."""
    raw = peek(store, SIZES.name)
    if raw is None or len(raw) > MAX_SIZES_BYTES:
        return None
    sizes: list[int] = []
    hosts: list[str] = []
    for line in raw.decode("ascii", "replace").splitlines():
        size, _, host = line.partition("@")
        if not (size.isdecimal() and len(size) <= 8 and matches("hostname", host)):
            continue
        if (
            0 < int(size) <= MAX_RANK
            and int(size) != world
            and (int(size), host) not in zip(sizes, hosts, strict=True)
        ):
            sizes.append(int(size))
            hosts.append(host)
    if not sizes:
        return None
    from distenv.bootstrap.problems import OtherSize

    return OtherSize(world, tuple(sizes[:MAX_SHOWN]), tuple(hosts[:MAX_SHOWN]))


def _records(
    keys: list[str],
    raws: list[bytes | None],
    scope: str,
    world: int,
    closed: AbstractSet[str] = frozenset(),
) -> tuple[list[CheckIn], list[str]]:
    """Return the valid check-ins among `raws`, and the keys of those this job did not write.

    Keys rank 0 `closed` hold no record; any other value, `CLOSED` included, is a record.
    """
    checkins: list[CheckIn] = []
    foreign: list[str] = []
    for rank, (key, raw) in enumerate(zip(keys, raws, strict=True)):
        if raw is None or key in closed:
            continue
        try:
            record = parse_checkin(key, raw)
        except ForeignRecordError:
            foreign.append(key)
            continue
        if (
            record.scope != scope
            or record.world_size != world
            or (rank < world and record.rank != rank)
        ):
            foreign.append(key)
            continue
        checkins.append(record)
    return checkins, foreign


def _close(
    store: Any, keys: list[str], raws: list[bytes | None], closed: set[str]
) -> list[bytes | None]:
    """Close the absent ranks' keys that the verdict will name (`MAX_SHOWN`), adding them to
    `closed`; return the records, with those that won the race to their key.

    ``compare_set`` is the cut: a key rank 0 closed is missing for good. Keys past the named ones
    stay open (they are only counted).
    """
    out = list(raws)
    for i, (key, raw) in enumerate(zip(keys, raws, strict=True)):
        if raw is not None:
            continue
        if len(closed) >= MAX_SHOWN:
            break
        value = bytes(store.compare_set(key, "", CLOSED))
        if value == CLOSED:
            closed.add(key)
        out[i] = value
    return out


def gather_batches(
    store: Any, info: RankInfo, scope: str, deadline: Deadline
) -> tuple[Verdict, int]:
    """Rank 0 of a batched roll call: return the verdict on the nodes' batches by `deadline`,
    and how many leaders besides rank 0 will read it.

    The count says when to look. At `deadline` rank 0 adds `CUT` to it: a leader that counts
    its node after that learns it came late and writes nothing, and every leader that counted
    before is waited for (its append follows its count at once) for `VERDICT_GRACE_S` at most.
    Then the shards (`shard_keys`: a few keys at any scale) are read whole. Ranks in no batch are
    named missing; a count that exceeds the batches' ranks, or a line that does not parse, was
    written by a process outside the job.
    """
    world = info.world_size
    counted = wait_counted(store, WRITTEN.name, world, ALL.name, deadline)
    resized = other_sizes(store, world) if counted >= CUT else None
    if resized is not None:
        return Verdict(False, (resized,), (), scope), 0
    if counted < world:
        counted = int(store.add(WRITTEN.name, CUT)) - CUT
    keys = shard_keys(world)
    grace = Deadline.after(VERDICT_GRACE_S)
    waits = pauses()
    while True:
        raws = read_many(store, keys)
        parsed = [
            parse_batches(key, raw, scope=scope, world_size=world)
            for key, raw in zip(keys, raws, strict=True)
        ]
        batches = [b for found, _ in parsed for b in found]
        carried = sum(len(b.checkins) for b in batches)
        foreign = [key for key, (_, bad) in zip(keys, parsed, strict=True) if bad]
        if carried >= counted or foreign or grace.passed():
            break
        pause(next(waits))
    found = tuple(sorted((c for b in batches for c in b.checkins), key=lambda c: c.rank))
    ahead = (counted, carried) if counted > carried else None
    readers = len(batches) - 1
    if carried == world and not foreign and ahead is None:
        problems = validate(found, world)
        nodes = () if problems else node_hosts(found, layout_known=info.layout_known)
        sizes = host_sizes(found, nodes)
        return Verdict(not problems, tuple(problems), found, scope, nodes, sizes), readers
    complete = {c.rank for c in found} == set(range(world))
    verdict = refusal(found, info, scope, foreign, complete=complete, ahead=ahead, batched=True)
    return verdict, readers
