"""The network probe's sockets: a rank listens on its candidate addresses, a peer dials them.

A `Listener` listens on each address a rank offers (port 0: the kernel picks) and answers every
connection with the rank's token, from one thread, until closed. `reach` dials many
``(address, port, token)`` at once (`WINDOW` in flight), non-blocking, and says of each whether
the right process answered within `distenv.timing.NET_PROBE_S` of its own start: a connection to the same address on another node
(a docker0 address every node has, a loopback address) finds no listener there, or one that does
not know the token. What the results mean is `distenv.bootstrap.paths`'s.
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import threading
import time
from collections.abc import Sequence

__all__ = ["Listener", "reach"]

#: What a failed probe reports: a refusal, silence, no route, another process, nothing to dial.
REASONS = ("refused", "timeout", "unreachable", "foreign", "unbound", "error")


def _sockaddr(address: str, port: int) -> tuple[int, tuple[object, ...]]:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    info = socket.getaddrinfo(address, port, family, socket.SOCK_STREAM, 0, socket.AI_NUMERICHOST)
    return family, info[0][4]


class Listener:
    """Listens on `addresses` for the probe, answering each connection with `token`.

    `ports[i]` is the port of `addresses[i]`, 0 where it could not listen (an address this node
    cannot bind cannot be advertised by a backend either).
    """

    def __init__(self, addresses: Sequence[str], token: bytes) -> None:
        self.token = token
        self.ports: list[int] = []
        self._sockets: list[socket.socket] = []
        for address in addresses:
            try:
                family, sockaddr = _sockaddr(address, 0)
                sock = socket.socket(family, socket.SOCK_STREAM)
            except OSError:
                self.ports.append(0)
                continue
            try:
                sock.bind(sockaddr)
                sock.listen(socket.SOMAXCONN)
                sock.setblocking(False)
            except OSError:
                sock.close()
                self.ports.append(0)
                continue
            self._sockets.append(sock)
            self.ports.append(int(sock.getsockname()[1]))
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._serve, name="distenv-probe", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        with selectors.DefaultSelector() as selector:
            for sock in self._sockets:
                selector.register(sock, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while True:
                for key, _ in selector.select():
                    if key.fileobj is self._wake_r:
                        return
                    assert isinstance(key.fileobj, socket.socket)
                    with contextlib.suppress(OSError):
                        conn, _ = key.fileobj.accept()
                        with conn:
                            conn.setblocking(True)
                            conn.settimeout(0.1)
                            conn.sendall(self.token)

    def close(self) -> None:
        """Stop answering and close every socket (idempotent)."""
        if self._wake_w.fileno() < 0:
            return
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join()
        for sock in (*self._sockets, self._wake_r, self._wake_w):
            sock.close()


def _reason(code: int) -> str:
    if code == errno.ECONNREFUSED:
        return "refused"
    if code in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL):
        return "unreachable"
    if code in (errno.ETIMEDOUT, errno.EINPROGRESS):
        return "timeout"
    return "error"


#: Probes in flight at once: the descriptors one rank opens for them (a soft limit of 1024 is
#: common), however many nodes it dials; each probe's time runs from its own start.
WINDOW = 256


def reach(
    targets: Sequence[tuple[str, int, bytes]], seconds: float, window: int = WINDOW
) -> list[str | None]:
    """Dial every ``(address, port, token)``, `window` at a time; return, per target, None where
    the process that answered sent `token`, else why not (`REASONS`), each within `seconds` of
    its own start (all at once up to `window` targets)."""
    results: list[str | None] = ["timeout"] * len(targets)
    received: dict[int, bytes] = {}
    ends: dict[int, float] = {}
    waiting = iter(range(len(targets)))
    with selectors.DefaultSelector() as selector:

        def finish(conn: socket.socket, index: int, outcome: str | None) -> None:
            results[index] = outcome
            del ends[index]
            selector.unregister(conn)
            conn.close()

        def start(index: int) -> None:
            address, port, _ = targets[index]
            if port == 0:
                results[index] = "unbound"
                return
            try:
                family, sockaddr = _sockaddr(address, port)
            except OSError:
                results[index] = "unreachable"
                return
            try:
                sock = socket.socket(family, socket.SOCK_STREAM)
            except OSError:  # out of descriptors: not the address's fault
                results[index] = "error"
                return
            sock.setblocking(False)
            code = sock.connect_ex(sockaddr)
            if code not in (0, errno.EINPROGRESS):
                results[index] = _reason(code)
                sock.close()
                return
            received[index], ends[index] = b"", time.monotonic() + seconds
            selector.register(sock, selectors.EVENT_WRITE | selectors.EVENT_READ, index)

        while True:
            while len(ends) < window and (index := next(waiting, None)) is not None:
                start(index)
            if not ends:
                return results
            now = time.monotonic()
            for key in list(selector.get_map().values()):
                if ends[key.data] <= now:  # stays "timeout"
                    assert isinstance(key.fileobj, socket.socket)
                    finish(key.fileobj, key.data, "timeout")
            if not ends:
                continue
            for key, events in selector.select(max(min(ends.values()) - now, 0)):
                conn, index = key.fileobj, key.data
                assert isinstance(conn, socket.socket)
                if events == selectors.EVENT_WRITE:
                    code = conn.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if not code:  # connected: wait for the answer
                        selector.modify(conn, selectors.EVENT_READ, index)
                        continue
                    finish(conn, index, _reason(code))
                    continue
                outcome = _read(conn, targets[index][2], received, index)
                if outcome is not None:
                    finish(conn, index, outcome or None)


def _read(sock: socket.socket, token: bytes, received: dict[int, bytes], index: int) -> str | None:
    """Read one probe's answer: None while it goes on, ``""`` once the token came, else why not."""
    try:
        chunk = sock.recv(len(token) + 1)
    except BlockingIOError:
        return None
    except OSError as exc:
        return _reason(exc.errno or 0)
    got = received[index] = received[index] + chunk
    if got == token:
        return ""
    if not chunk or not token.startswith(got):
        return "foreign"
    return None
