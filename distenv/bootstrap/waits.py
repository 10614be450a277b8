"""Waiting on rank 0's store and reading it in bulk: how every rank polls, waits and batches.

A rank that waits for rank 0 (its claim, its verdict, its acknowledgement) waits in the store
itself (`wait_value`): it sends two requests however long it waits and wakes when the key is
written, where polling would keep N - 1 ranks asking rank 0's store, and on a busy node take the
CPU rank 0 needs. Rank 0, the one rank that waits for counts, polls them (`wait_count`, `pauses`),
or, where the counters say when they are done (`count_to`: the roll call's and the group-up's
counts), waits in the store for that word and then looks at the count (`wait_counted`).
Many keys travel in one request per `CHUNK` (`read_many`, `write_many`); `peek` reads a key
without waiting. Reaching the store is `distenv.bootstrap.store`'s.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator, Sequence
from typing import Any

from distenv.deadline import Deadline, pause
from distenv.timing import FIRST_POLL_S, POLL_S

__all__ = [
    "CHUNK",
    "count_to",
    "pauses",
    "peek",
    "read_many",
    "wait_count",
    "wait_counted",
    "wait_keys",
    "wait_value",
    "write_many",
]

# Keys per multi_get when rank 0 reads the check-ins: one huge request costs more than its chunks.
CHUNK = 512
# What `peek` compares with: never written by distenv (its values are JSON, scopes and states).
_ABSENT = b"\x00distenv:absent"


def pauses() -> Iterator[float]:
    """Yield sleep lengths: `FIRST_POLL_S`, doubling up to `POLL_S` (rank 0's polls).

    Ranks usually arrive close together: the first looks cost a few round trips, and a rank that
    arrives sees rank 0 notice within twice its lateness.
    """
    length = FIRST_POLL_S
    while True:
        yield length
        length = min(length * 2, POLL_S)


def wait_keys(store: Any, keys: list[str], deadline: Deadline) -> bool:
    """Poll until every one of `keys` exists (True) or `deadline` passes (False)."""
    waits = pauses()
    while True:
        if all(store.check(keys[i : i + CHUNK]) for i in range(0, len(keys), CHUNK)):
            return True
        if deadline.passed():
            return False
        pause(next(waits))


def peek(store: Any, key: str) -> bytes | None:
    """Return `key`'s value, or None if it does not exist: one round trip, never blocking.

    ``compare_set`` with an expected value nobody writes returns the value a key holds, or, for a
    missing key, the expected value itself without creating the key. (A key that holds exactly
    that value reads as absent: what a forger gains is a wait, bounded by the deadline.)
    """
    value = bytes(store.compare_set(key, _ABSENT, _ABSENT))
    return None if value == _ABSENT else value


def wait_value(store: Any, key: str, deadline: Deadline) -> bytes | None:
    """Return `key`'s value once it is written, waiting in the store; None once `deadline` passes.

    TCPStore's ``get`` waits for the key in the server (a WAIT, answered when the key is written,
    then the GET), under the store's timeout, set here to the time left. In torch 2.13 a wait that
    times out raises and leaves the connection in step (`tests/unit/test_store_waits.py` pins
    this and the next fact); it holds the connection meanwhile, so a signal's record goes over a
    connection of its own (`distenv.bootstrap.session.Session.mark`). A ``compare_set`` that finds
    the key missing (`peek`, by another rank) wakes the key's waiters although nothing was
    written, and their ``get`` returns an empty value: distenv writes none, so an empty value
    means "look again", after a pause, so that a forged one cannot make this loop spin.
    """
    import torch.distributed as dist  # here: importing this module stays cheap

    while True:
        left = deadline.left()
        if left <= 0:
            return None
        store.set_timeout(datetime.timedelta(seconds=left))
        try:
            value = bytes(store.get(key))
        except dist.DistStoreError:  # the timeout: a lost connection is a DistNetworkError
            return None
        if value:
            return value
        pause(POLL_S)


def wait_count(store: Any, key: str, count: int, deadline: Deadline) -> int:
    """Poll until the counter `key` reaches `count` or `deadline` passes; return its last value.

    Rank 0 alone waits for counts: one poller, so it can afford to look often.
    """
    waits = pauses()
    while (counted := int(store.add(key, 0))) < count and not deadline.passed():
        pause(next(waits))
    return counted


def count_to(store: Any, key: str, amount: int, total: int, done: str) -> int:
    """Add `amount` to the counter `key`; the add that reaches `total` also writes `done`.

    Every add that finds the count at `total` or past it writes `done` (its value, the count it
    found): one writer where only the counters add, and a word at once where a forger's add ran
    the count past `total` first, so that the waiter looks (and names the foreign count) without
    waiting for its deadline. Returns the count the add found.
    """
    counted = int(store.add(key, amount))
    if counted >= total:
        store.set(done, str(counted))
    return counted


def wait_counted(store: Any, key: str, count: int, done: str, deadline: Deadline) -> int:
    """Look at the counter `key` once; short of `count`, wait in the store for `done`
    (`count_to`'s word), then poll the counter until it reaches `count` or `deadline` passes;
    return its last value.

    The word only says when to look, like the count itself: a word written early (by a process
    outside the job) leaves the waiter polling, as `wait_count` alone would, so that what it
    decides afterwards rests on the count and the records, never on the word. A count already
    complete costs one request; one still short costs the wait and a look after it, however long
    the counters take: the waiter's store serves no polls meanwhile. (One wait, not slices of it:
    each of TCPStore's timed-out waits prints two lines of warnings.)
    """
    counted = int(store.add(key, 0))
    if counted >= count:
        return counted
    wait_value(store, done, deadline)
    return wait_count(store, key, count, deadline)


def write_many(store: Any, items: Sequence[tuple[str, str]]) -> None:
    """Write `items` (key, value pairs) with a multi_set per `CHUNK`."""
    for start in range(0, len(items), CHUNK):
        chunk = items[start : start + CHUNK]
        store.multi_set([key for key, _ in chunk], [value for _, value in chunk])


def read_many(store: Any, keys: list[str]) -> list[bytes | None]:
    """Return the values of `keys` (None where absent): a multi_get per chunk when all are there."""
    values: list[bytes | None] = []
    for start in range(0, len(keys), CHUNK):
        chunk = keys[start : start + CHUNK]
        # multi_get waits for a missing key: ask first (one round trip per chunk).
        if hasattr(store, "multi_get") and store.check(chunk):
            values += [bytes(v) for v in store.multi_get(chunk)]
        else:
            values += [peek(store, key) for key in chunk]
    return values
