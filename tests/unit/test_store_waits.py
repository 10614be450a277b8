"""The store facts `distenv.bootstrap.waits.wait_value` relies on, pinned on torch's own TCPStore.

A rank waiting for rank 0 waits in the store (TCPStore's ``get``) instead of polling it; that is
sound only while a timed-out wait leaves the connection in step, and it must survive the wake-up a
``compare_set`` on the missing key gives (torch 2.13: the blocked ``get`` returns an empty value).
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Iterator

import pytest

from distenv.bootstrap.waits import peek, wait_value
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
