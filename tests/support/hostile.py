"""Listeners that hold a master port and answer as no torch store does.

Used by `tests/process/test_bounds.py` (a few runs per mode) and by
`benchmarks/lab/hostile_master.py` (20 per mode under a CPU burner). Each mode is what an attacker,
or an ordinary service that happens to hold the port, does to a rank that connects:

- ``silent``: accepts and never answers;
- ``reset``: resets the connection (RST) when the rank speaks;
- ``close``: closes it (FIN) when the rank speaks;
- ``wrong-ping``: answers as an HTTP server would, which is no echo of the store's ping;
- ``absurd-length``: echoes the ping as a store does, then answers every request with a length of
  2**62 (torch's client fails to allocate it).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator

MODES = ("silent", "reset", "close", "wrong-ping", "absurd-length")
# What torch's client sends first: VALIDATE (1 + 4 bytes), then PING (1 + 4 bytes, the nonce).
_GREETING = 10


def _recv_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _serve(conn: socket.socket, mode: str) -> None:
    """Answer one connection as `mode` says (module doc)."""
    with contextlib.suppress(OSError):
        if mode == "silent":
            return  # held open by the caller until the listener closes
        if mode == "reset":
            conn.recv(64)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()
        elif mode == "close":
            conn.recv(64)
            conn.close()
        elif mode == "wrong-ping":
            conn.recv(64)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            conn.close()
        elif mode == "absurd-length":
            greeting = _recv_exactly(conn, _GREETING)
            conn.sendall(greeting[6:])  # the nonce, as a store echoes it
            while conn.recv(4096):
                conn.sendall(struct.pack("<Q", 2**62) * 4)
        else:
            raise ValueError(f"unknown mode {mode!r}")


@contextlib.contextmanager
def hostile_listener(mode: str) -> Iterator[int]:
    """Listen on a free loopback port and answer every connection as `mode`; yield the port.

    The kernel picks the port as it binds (a port picked first could be taken in between).
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}")
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                conn = server.accept()[0]
                held.append(conn)
                threading.Thread(target=_serve, args=(conn, mode), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(2)
        for conn in held:
            conn.close()
        server.close()
