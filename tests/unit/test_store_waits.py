"""The store facts `distenv.bootstrap.waits.wait_value` relies on, pinned on torch's own TCPStore.

A rank waiting for rank 0 waits in the store (TCPStore's ``get``) instead of polling it; that is
sound only while a timed-out wait leaves the connection in step, and it must survive the wake-up a
``compare_set`` on the missing key gives (torch 2.13: the blocked ``get`` returns an empty value).
Rank 0 waits the same way for the word that a count is complete (`count_to`, `wait_counted`), and
a word written early leaves it polling the count as before.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Iterator

import pytest

from distenv.bootstrap.waits import count_to, peek, wait_counted, wait_value
from distenv.deadline import Deadline


@pytest.fixture
def stores() -> Iterator[tuple[object, object]]:
    """A libuv TCPStore server and two client connections to it (two ranks)."""
    from torch.distributed import TCPStore

    timeout = datetime.timedelta(seconds=10)
    # Port 0: the server binds the port the kernel picks (no window for another to take it).
    server = TCPStore("127.0.0.1", 0, 3, True, timeout=timeout, wait_for_workers=False)
    port = server.port
    yield (
        TCPStore("127.0.0.1", port, 3, False, timeout=timeout),
        TCPStore("127.0.0.1", port, 3, False, timeout=timeout),
    )
    del server


def _later(seconds: float, call: object) -> threading.Thread:
    def run() -> None:
        time.sleep(seconds)
        call()  # type: ignore[operator]

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_timed_out_get_leaves_the_connection_in_step(stores: tuple[object, object]) -> None:
    """torch: the get times out with DistStoreError, and the next requests get their own replies."""
    import torch.distributed as dist

    waiter, _ = stores
    waiter.set_timeout(datetime.timedelta(milliseconds=50))  # type: ignore[attr-defined]
    for round_ in range(3):
        with pytest.raises(dist.DistStoreError):
            waiter.get("never")  # type: ignore[attr-defined]
        waiter.set(f"k{round_}", f"v{round_}")  # type: ignore[attr-defined]
        assert bytes(waiter.get(f"k{round_}")) == f"v{round_}".encode()  # type: ignore[attr-defined]
        assert int(waiter.add("n", 1)) == round_ + 1  # type: ignore[attr-defined]


def test_a_peek_at_a_missing_key_wakes_its_waiters_empty(stores: tuple[object, object]) -> None:
    """torch 2.13: compare_set on a missing key wakes a blocked get, which reads b'' (no key)."""
    waiter, other = stores
    woke: list[bytes] = []
    thread = threading.Thread(target=lambda: woke.append(bytes(waiter.get("k"))))  # type: ignore[attr-defined]
    thread.start()
    # Peek until the waiter wakes: a peek made before its wait reached the server wakes nobody.
    until = time.monotonic() + 8
    while thread.is_alive() and time.monotonic() < until:
        assert peek(other, "k") is None
        thread.join(0.05)
    assert woke == [b""]
    assert not other.check(["k"])  # type: ignore[attr-defined]


def test_wait_value_wakes_when_the_key_is_written(stores: tuple[object, object]) -> None:
    """The waiter returns the value as soon as it is written, through peeks that wake it empty."""
    waiter, other = stores
    peeks = [_later(0.05 * i, lambda: peek(other, "verdict")) for i in range(1, 5)]
    writer = _later(0.4, lambda: other.compare_set("verdict", "", "ok"))  # type: ignore[attr-defined]
    start = time.monotonic()
    assert wait_value(waiter, "verdict", Deadline.after(10)) == b"ok"
    took = time.monotonic() - start
    assert 0.35 < took < 2.0, took
    for thread in (*peeks, writer):
        thread.join(5)


def test_wait_value_returns_none_at_the_deadline(stores: tuple[object, object]) -> None:
    """Nothing written: None once the deadline passes, not before, and the connection still works."""
    waiter, other = stores
    start = time.monotonic()
    assert wait_value(waiter, "absent", Deadline.after(0.3)) is None
    took = time.monotonic() - start
    assert 0.25 < took < 2.0, took
    other.set("later", "x")  # type: ignore[attr-defined]
    assert wait_value(waiter, "later", Deadline.after(5)) == b"x"


def test_wait_value_does_not_spin_on_a_forged_empty_value(stores: tuple[object, object]) -> None:
    """An empty value written under the key (distenv writes none) is looked at again after a
    pause, until the deadline: a bounded wait, not a busy loop of requests."""
    waiter, other = stores
    other.set("verdict", "")  # type: ignore[attr-defined]
    gets = 0
    real_get = waiter.get  # type: ignore[attr-defined]

    class Counting:
        def set_timeout(self, timeout: datetime.timedelta) -> None:
            waiter.set_timeout(timeout)  # type: ignore[attr-defined]

        def get(self, key: str) -> bytes:
            nonlocal gets
            gets += 1
            return bytes(real_get(key))

    assert wait_value(Counting(), "verdict", Deadline.after(0.2)) is None
    # It looked again (more than once) and paused between looks (at most one per 0.5 ms).
    assert 3 <= gets <= 0.2 / 0.0005 + 1, gets


class _CountingAdds:
    """A store client that counts its ``add`` requests (rank 0's polls of a count)."""

    def __init__(self, store: object) -> None:
        self.store = store
        self.adds = 0

    def add(self, key: str, amount: int) -> int:
        self.adds += 1
        return int(self.store.add(key, amount))  # type: ignore[attr-defined]

    def get(self, key: str) -> bytes:
        return bytes(self.store.get(key))  # type: ignore[attr-defined]

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self.store.set_timeout(timeout)  # type: ignore[attr-defined]


def test_only_the_add_that_completes_the_count_writes_the_word(
    stores: tuple[object, object],
) -> None:
    """Three counters of one, then a late one: the third writes the word (its count); the others
    wrote nothing before it, and every add past the total writes it again."""
    _, other = stores
    assert count_to(other, "count", 1, 3, "all") == 1
    assert count_to(other, "count", 1, 3, "all") == 2
    assert not other.check(["all"])  # type: ignore[attr-defined]
    assert count_to(other, "count", 1, 3, "all") == 3
    assert bytes(other.get("all")) == b"3"  # type: ignore[attr-defined]
    assert count_to(other, "count", 5, 3, "all") == 8
    assert bytes(other.get("all")) == b"8"  # type: ignore[attr-defined]


def test_wait_counted_waits_in_the_store_and_looks_once(stores: tuple[object, object]) -> None:
    """Rank 0 sends two adds however long the counters take (a look, then one after the word): it
    wakes on the word, not by polling; a count already complete costs one add."""
    waiter, other = stores
    counting = _CountingAdds(waiter)
    counters = [_later(0.1 * i, lambda: count_to(other, "n", 2, 6, "done")) for i in (1, 2, 3)]
    start = time.monotonic()
    assert wait_counted(counting, "n", 6, "done", Deadline.after(10)) == 6
    assert 0.25 < time.monotonic() - start < 5.0
    assert counting.adds == 2
    for thread in counters:
        thread.join(5)
    assert wait_counted(counting, "n", 6, "done", Deadline.after(10)) == 6
    assert counting.adds == 3


def test_an_early_word_leaves_rank_0_polling_the_count(stores: tuple[object, object]) -> None:
    """A word written before the count is complete (a forger's) decides nothing: rank 0 polls the
    count as before, returns it once complete, and at the deadline returns it short."""
    waiter, other = stores
    other.set("done", "999")  # type: ignore[attr-defined]
    counting = _CountingAdds(waiter)
    completes = _later(0.3, lambda: count_to(other, "n", 4, 4, "done"))
    start = time.monotonic()
    assert wait_counted(counting, "n", 4, "done", Deadline.after(10)) == 4
    assert 0.25 < time.monotonic() - start < 5.0
    assert counting.adds > 1  # it polled
    completes.join(5)
    start = time.monotonic()
    assert wait_counted(counting, "never", 4, "done", Deadline.after(0.3)) == 0
    assert 0.25 < time.monotonic() - start < 2.0
