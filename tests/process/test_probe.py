"""The network probe's sockets (distenv.bootstrap.probe), on this machine's loopback.

A probe passes only where the process that offered the address answers with its token: a refusal,
silence, another process or an address nobody could listen on each fail, with their reason, and
many probes together take the time of one.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

from distenv.bootstrap.probe import Listener, reach

TOKEN = b"00112233aabbccdd"


@contextlib.contextmanager
def silent_listeners(count: int) -> Iterator[list[tuple[str, int, bytes]]]:
    """Sockets that accept in the kernel's backlog but never answer, as `reach`'s targets."""
    silent = []
    try:
        for _ in range(count):
            sock = socket.socket()
            silent.append(sock)
            sock.bind(("127.0.0.1", 0))
            sock.listen(64)
        yield [("127.0.0.1", sock.getsockname()[1], TOKEN) for sock in silent]
    finally:
        for sock in silent:
            sock.close()


def test_the_owner_answers_and_everything_else_fails_with_its_reason() -> None:
    listener = Listener(["127.0.0.1", "::1", "192.0.2.77"], TOKEN)
    try:
        v4, v6, unbound = listener.ports
        assert v4 > 0
        assert v6 > 0
        assert unbound == 0  # TEST-NET-1: not this machine's, so nobody can listen there
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            free = closed.getsockname()[1]
        results = reach(
            [
                ("127.0.0.1", v4, TOKEN),
                ("::1", v6, TOKEN),
                ("127.0.0.1", v4, b"ffffffffffffffff"),  # another process's token
                ("127.0.0.1", free, TOKEN),
                ("192.0.2.77", 0, TOKEN),
            ],
            1.0,
        )
        assert results == [None, None, "foreign", "refused", "unbound"]
    finally:
        listener.close()
        listener.close()  # idempotent
    assert "distenv-probe" not in {t.name for t in threading.enumerate()}
    assert reach([("127.0.0.1", v4, TOKEN)], 1.0) == ["refused"]  # closed for good


def test_silent_listeners_time_out_together_within_the_probes_time() -> None:
    """Twenty sockets that accept in the kernel's backlog but never answer: each is "timeout",
    all of them within the one probe time, not twenty."""
    with silent_listeners(20) as targets:
        began = time.monotonic()
        results = reach(targets, 0.5)
        took = time.monotonic() - began
    assert results == ["timeout"] * 20
    # One after another would take 10 s; the margin is a loaded machine's scheduling.
    assert 0.5 <= took < 3


def test_more_targets_than_the_window_are_dialled_a_window_at_a_time() -> None:
    """300 probes of one listener with 16 in flight all pass (a thousand nodes must not run rank 0
    out of descriptors and read as unreachable); 40 silent ones with 8 in flight each time out
    after their own 0.2 s, in five waves, not in one 0.2 s for all."""
    listener = Listener(["127.0.0.1"], TOKEN)
    try:
        assert (
            reach([("127.0.0.1", listener.ports[0], TOKEN)] * 300, 5.0, window=16) == [None] * 300
        )
    finally:
        listener.close()
    with silent_listeners(40) as targets:
        began = time.monotonic()
        results = reach(targets, 0.2, window=8)
        took = time.monotonic() - began
    assert results == ["timeout"] * 40
    assert 5 * 0.2 <= took < 5
