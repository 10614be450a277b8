"""TCPStore's wire protocol over raw sockets: many simulated ranks as clients of one real torch store.

Python ``TCPStore`` clients are one connection and one thread's blocking call each, stall after a
few dozen quick connects on a small machine, and 131 072 of them would exceed the descriptor
limit. This module speaks the store's protocol itself, so that a few processes can carry
thousands of real TCP connections, each running many simulated ranks' requests one after another,
and count every request and byte that rank 0's store serves.

The protocol, as torch 2.13's client (``TCPStore.cpp``) writes it and its libuv server
(``TCPStoreLibUvBackend.cpp``) reads it; the numbers are ``QueryType`` in ``TCPStoreBackend.hpp``
(shipped in torch's wheel under ``torch/include``). Integers are in the machine's byte order;
a string or a value is a ``uint64`` length and its bytes. Every key is sent with the client's
prefix ``/`` (``TCPStore::keyPrefix_``), so a key this module names ``a/b`` is the key a Python
client, or a ``PrefixStore("a", store)``, names ``b``. The requests the simulated ranks make:

    request                              reply
    VALIDATE  u32 magic 0x3C85F7CE       none (a connection's first request; anything else closes it)
    SET       key, value                 none
    COMPARE_SET key, expected, desired   value (the key's value now; `expected` if absent and
                                         `expected` is not empty)
    GET       key                        value (empty if absent: the Python client waits first)
    ADD       key, i64                   i64 (the new count)
    WAIT      u64 n, n keys              u8 (STOP_WAITING, once every key exists)
    APPEND    key, value                 none
    PING      u32 nonce                  u32 nonce

Requests without a reply are ordered by the connection: the next request's reply proves them
served. Pure standard library: the client processes never import torch.
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import os
import selectors
import socket
import struct
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any, NamedTuple

MAGIC = 0x3C85F7CE
KEY_PREFIX = "/"
# QueryType (torch/csrc/distributed/c10d/TCPStoreBackend.hpp).
VALIDATE, SET, COMPARE_SET, GET, ADD, WAIT, APPEND, PING = 0, 1, 2, 3, 4, 6, 9, 13
#: What `peek` compares with (distenv.bootstrap.store._ABSENT): never a value distenv writes.
ABSENT = b"\x00distenv:absent"

_U64 = struct.Struct("=Q")
_I64 = struct.Struct("=q")
_U32 = struct.Struct("=I")

# What a request's reply is.
NONE, VALUE, I64, BYTE, U32 = range(5)
#: Tasks a connection runs at once (their requests pipelined), and connections opened at once (so
#: that the listen backlog, ``somaxconn``, never overflows).
WINDOW, WAVE = 8, 256
#: The columns of every row `Counts.report` returns.
FIELDS = ("requests", "bytes_in", "bytes_out")


class Request(NamedTuple):
    """One request as sent: its wire type, its bytes, the reply it expects, and what it is for."""

    kind: str
    data: bytes
    reply: int
    step: str = ""  # what the protocol uses it for ("peek verdict"), for the counts


def _text(raw: bytes) -> bytes:
    return _U64.pack(len(raw)) + raw


def _key(key: str) -> bytes:
    return _text((KEY_PREFIX + key).encode())


def _bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


def validate() -> Request:
    return Request("validate", bytes([VALIDATE]) + _U32.pack(MAGIC), NONE, step="connect")


def set_(key: str, value: str | bytes, step: str = "") -> Request:
    return Request("set", bytes([SET]) + _key(key) + _text(_bytes(value)), NONE, step=step)


def compare_set(key: str, expected: str | bytes, desired: str | bytes, step: str = "") -> Request:
    data = bytes([COMPARE_SET]) + _key(key) + _text(_bytes(expected)) + _text(_bytes(desired))
    return Request("compare_set", data, VALUE, step=step)


def peek(key: str, step: str = "") -> Request:
    """`distenv.bootstrap.waits.peek`'s request: its reply is `ABSENT` where the key is absent."""
    return compare_set(key, ABSENT, ABSENT, step or f"peek {key.rsplit('/', 1)[-1]}")


def get(key: str, step: str = "") -> Request:
    return Request("get", bytes([GET]) + _key(key), VALUE, step=step)


def wait(keys: Sequence[str], step: str = "") -> Request:
    """TCPStore's WAIT: answered (one byte, STOP_WAITING) once every key exists."""
    data = bytes([WAIT]) + _U64.pack(len(keys)) + b"".join(_key(k) for k in keys)
    return Request("wait", data, BYTE, step=step)


def add(key: str, amount: int, step: str = "") -> Request:
    return Request("add", bytes([ADD]) + _key(key) + _I64.pack(amount), I64, step=step)


def append(key: str, value: str | bytes, step: str = "") -> Request:
    return Request("append", bytes([APPEND]) + _key(key) + _text(_bytes(value)), NONE, step=step)


def ping(nonce: int, step: str = "") -> Request:
    return Request("ping", bytes([PING]) + _U32.pack(nonce), U32, step=step)


def _parse(buf: bytearray, pos: int, reply: int) -> tuple[Any, int] | None:
    """Return one reply read from `buf` at `pos` and where it ends, or None if not all there."""
    end = len(buf)
    if reply == VALUE:
        if end - pos < 8:
            return None
        (size,) = _U64.unpack_from(buf, pos)
        if end - pos - 8 < size:
            return None
        return bytes(buf[pos + 8 : pos + 8 + size]), pos + 8 + size
    if reply == I64:
        return (_I64.unpack_from(buf, pos)[0], pos + 8) if end - pos >= 8 else None
    if reply == BYTE:
        return (buf[pos] == 0, pos + 1) if end > pos else None
    if reply == U32:
        return (_U32.unpack_from(buf, pos)[0], pos + 4) if end - pos >= 4 else None
    raise ValueError(f"no reply of kind {reply}")


class Counts:
    """Requests and bytes per request type and per protocol step, as the store sees them.

    ``bytes_in`` is what the store received (the requests' bytes), ``bytes_out`` what it sent (the
    replies'). Picklable: the client processes send theirs to the parent.
    """

    def __init__(self) -> None:
        self.connections = 0
        self.rows: collections.Counter[tuple[str, str, str]] = collections.Counter()

    def add(self, kind: str, step: str, **fields: int) -> None:
        """Count `fields` (FIELDS' names) for the request type `kind` and the step `step`."""
        for table, name in (("by_type", kind), ("by_step", step or kind)):
            for field, value in fields.items():
                self.rows[table, name, field] += value

    def sent(self, request: Request) -> None:
        self.add(request.kind, request.step, requests=1, bytes_in=len(request.data))

    def received(self, request: Request, size: int) -> None:
        self.add(request.kind, request.step, bytes_out=size)

    def merge(self, other: Counts) -> None:
        self.connections += other.connections
        self.rows.update(other.rows)

    def report(self) -> dict[str, Any]:
        """Return the totals, per request type and per step: requests, bytes in and out."""
        tables: dict[str, dict[str, dict[str, int]]] = {"by_type": {}, "by_step": {}}
        for (table, name, field), value in sorted(self.rows.items()):
            tables[table].setdefault(name, dict.fromkeys(FIELDS, 0))[field] = value
        total = {f: sum(row[f] for row in tables["by_type"].values()) for f in FIELDS}
        return {"connections": self.connections, **total, **tables}


def _handshake(sock: socket.socket, counts: Counts, timeout: float) -> None:
    """Open a connection as torch's client does: VALIDATE, then a PING answered with its nonce."""
    sock.settimeout(max(timeout, 1.0))
    buf = bytearray()
    for request in (validate(), ping(os.getpid(), "connect")):
        sock.sendall(request.data)
        counts.sent(request)
        if request.reply == NONE:
            continue
        while (parsed := _parse(buf, 0, request.reply)) is None:
            chunk = sock.recv(64)
            if not chunk:
                raise ConnectionError("the store closed the connection during its handshake")
            buf += chunk
        counts.received(request, parsed[1])
    counts.connections += 1


#: A simulated rank's part in a run: it yields a `Request` (and is sent its reply), and may return
#: a value (`Mux.run` counts the values returned).
Task = Generator[Request, Any, Any]


class _Conn:
    __slots__ = ("active", "buf", "out", "queue", "sock", "waiting", "writing")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.out = bytearray()
        self.buf = bytearray()
        self.waiting: collections.deque[tuple[Task, Request]] = collections.deque()
        self.queue: collections.deque[Task] = collections.deque()
        self.active = 0
        self.writing = False


class Mux:
    """Many connections to one store, each running simulated ranks' tasks (non-blocking).

    Each connection runs up to WINDOW tasks at once, their requests pipelined in one stream
    (the server answers a connection's requests in order); a task that ends makes room for the
    connection's next. Connections are opened WAVE at a time.
    """

    def __init__(self, host: str, port: int, connections: int) -> None:
        self.counts = Counts()
        self.selector = selectors.DefaultSelector()
        self.conns: list[_Conn] = []
        self.results: collections.Counter[Any] = collections.Counter()
        deadline = time.monotonic() + 60.0
        for start in range(0, connections, WAVE):
            self._open(host, port, min(WAVE, connections - start), deadline)

    def _open(self, host: str, port: int, count: int, deadline: float) -> None:
        """Open `count` connections at once (non-blocking connects), validate each."""
        pending: dict[int, socket.socket] = {}
        with selectors.DefaultSelector() as sel:
            for _ in range(count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                err = sock.connect_ex((host, port))
                if err not in (0, 115):  # EINPROGRESS
                    sock.close()
                    raise OSError(err, os.strerror(err))
                pending[sock.fileno()] = sock
                sel.register(sock, selectors.EVENT_WRITE)
            while pending:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{len(pending)} connections to {host}:{port} pending")
                for key, _ in sel.select(1.0):
                    sock = pending.pop(key.fd)
                    sel.unregister(sock)
                    err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        raise OSError(err, f"connect to {host}:{port}: {os.strerror(err)}")
                    _handshake(sock, self.counts, deadline - time.monotonic())
                    sock.setblocking(False)
                    conn = _Conn(sock)
                    self.conns.append(conn)
                    self.selector.register(sock, selectors.EVENT_READ, conn)

    def run(
        self, tasks: Iterable[Task], timeout: float = 600.0, limit: int | None = None
    ) -> collections.Counter[Any]:
        """Run every task to its end, spread over the connections (the first `limit` of them);
        return the tasks' returns, counted.

        Raises:
            TimeoutError: Tasks were still running after `timeout` seconds.
            ConnectionError: The store closed a connection.
        """
        self.results = collections.Counter()
        n = len(self.conns) if limit is None else max(1, min(limit, len(self.conns)))
        for i, task in enumerate(tasks):
            self.conns[i % n].queue.append(task)
        for conn in self.conns:
            for _ in range(min(WINDOW, len(conn.queue))):
                self._start(conn)
            self._flush(conn)
        deadline = time.monotonic() + timeout
        while any(c.active for c in self.conns):
            if time.monotonic() > deadline:
                running = sum(c.active for c in self.conns)
                raise TimeoutError(f"{running} simulated ranks still running after {timeout} s")
            for key, events in self.selector.select(1.0):
                if events & selectors.EVENT_READ:
                    self._read(key.data)
                self._flush(key.data)
        return self.results

    def _start(self, conn: _Conn) -> None:
        task = conn.queue.popleft()
        conn.active += 1
        self._advance(conn, task, None)

    def _advance(self, conn: _Conn, task: Task, value: Any) -> None:
        """Send `value` into `task`; queue what it asks next, until it waits for a reply."""
        while True:
            try:
                step = task.send(value)
            except StopIteration as stop:
                self.results[stop.value] += 1
                conn.active -= 1
                if conn.queue:
                    self._start(conn)
                return
            conn.out += step.data
            self.counts.sent(step)
            if step.reply != NONE:
                conn.waiting.append((task, step))
                return
            value = None

    def _read(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(1 << 20)
        except BlockingIOError:
            return
        if not chunk:
            raise ConnectionError("the store closed a connection")
        conn.buf += chunk
        pos = 0
        while conn.waiting:
            task, request = conn.waiting[0]
            parsed = _parse(conn.buf, pos, request.reply)
            if parsed is None:
                break
            value, end = parsed
            self.counts.received(request, end - pos)
            pos = end
            conn.waiting.popleft()
            self._advance(conn, task, value)
        if pos:
            del conn.buf[:pos]

    def _flush(self, conn: _Conn) -> None:
        if conn.out:
            try:
                sent = conn.sock.send(conn.out)
            except BlockingIOError:
                sent = 0
            del conn.out[:sent]
        want = bool(conn.out)
        if want != conn.writing:
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0)
            self.selector.modify(conn.sock, events, conn)
            conn.writing = want

    def close(self) -> None:
        for conn in self.conns:
            self.selector.unregister(conn.sock)
            conn.sock.close()
        self.conns = []
        self.selector.close()


# ---- several client processes -----------------------------------------------------------------

#: What a client process runs: a function of (its items, its extra argument) returning tasks. It
#: must be importable by name (a module-level function), as multiprocessing pickles it.
Factory = Callable[[Sequence[Any], Any], Iterable[Task]]


def _serve(pipe: Any, host: str, port: int, connections: int) -> None:
    """A client process: open the connections, then run each batch of tasks it is sent."""
    try:
        mux = Mux(host, port, connections)
        pipe.send(("ready", mux.counts))
        while (message := pipe.recv()) is not None:
            factory, items, extra, limit = message
            mux.counts = Counts()
            start, cpu = time.perf_counter(), time.process_time()
            results = mux.run(factory(items, extra), limit=limit)
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
            pipe.send(("done", mux.counts, dict(results), wall, cpu))
        mux.close()
    except BaseException as exc:  # reported to the parent, which raises it
        with contextlib.suppress(Exception):
            pipe.send(("error", f"{type(exc).__name__}: {exc}"))
        raise


class Clients:
    """Client processes (spawned: no torch, no threads inherited) sharing `connections`.

    Each process opens its share of connections at start and keeps them for every `run`, as
    real ranks keep their connection to rank 0's store for the whole bootstrap.
    """

    def __init__(self, host: str, port: int, connections: int, processes: int = 2) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.pipes = []
        self.procs = []
        self.counts = Counts()
        for i in range(processes):
            share = connections // processes + (i < connections % processes)
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(child, host, port, share), daemon=True)
            proc.start()
            child.close()
            self.pipes.append(parent)
            self.procs.append(proc)
        for pipe in self.pipes:
            self.counts.merge(self._receive(pipe)[1])

    @staticmethod
    def _receive(pipe: Any) -> tuple[Any, ...]:
        reply: tuple[Any, ...] = pipe.recv()
        if reply[0] == "error":
            raise RuntimeError(f"a client process failed: {reply[1]}")
        return reply

    def run(
        self,
        factory: Factory,
        items: Sequence[Any],
        extra: Any = None,
        connections: int | None = None,
    ) -> tuple[Counts, collections.Counter[Any], float, float]:
        """Run ``factory(share, extra)``'s tasks in every process on its share of `items`.

        Items are dealt round-robin; at most `connections` connections carry them (all: None).
        Returns the counts, the tasks' returns (counted), the slowest process's wall time and
        the processes' CPU time together.
        """
        n = len(self.pipes)
        limit = None if connections is None else -(-connections // n)
        for i, pipe in enumerate(self.pipes):
            pipe.send((factory, list(items[i::n]), extra, limit))
        counts = Counts()
        results: collections.Counter[Any] = collections.Counter()
        wall = cpu = 0.0
        for pipe in self.pipes:
            _, theirs, returned, took, used = self._receive(pipe)
            counts.merge(theirs)
            results.update(returned)
            wall, cpu = max(wall, took), cpu + used
        return counts, results, wall, cpu

    def close(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send(None)
        for proc in self.procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join()


class CountedStore:
    """A Python store whose requests are counted as its TCPStore client puts them on the wire.

    Wraps `store` (a ``PrefixStore`` over a ``TCPStore``, or the ``TCPStore`` itself) whose keys
    lie under `prefix` (``""``: none). torch's client sends a ``WAIT`` before each ``GET`` and
    ``MULTI_GET`` (``TCPStore::get``, ``TCPStore::multiGet``): counted as sent. Bytes are
    computed from the arguments and results, not captured. A method not counted here raises,
    so that nothing the code under test asks goes uncounted.
    """

    def __init__(self, store: Any, prefix: str, counts: Counts, step: str = "rank 0") -> None:
        self.store, self.counts, self.step = store, counts, step
        self.prefix = prefix + "/" if prefix else ""

    def _count(self, request: Request, received: int) -> None:
        """Count `request` as sent (a single key's: its bytes built as the wire's)."""
        self._add(request.kind, len(request.data), received)

    def _add(self, kind: str, sent: int, received: int) -> None:
        self.counts.add(kind, f"{self.step} {kind}", requests=1, bytes_in=sent, bytes_out=received)

    def _keys(self, keys: Sequence[str]) -> int:
        """The bytes of `keys` in a request (one pass in C: rank 0 names every rank's key, and
        this runs inside its timed call)."""
        size = 8 + len((KEY_PREFIX + self.prefix).encode())
        return 1 + 8 + len(keys) * size + len("".join(keys).encode())

    def set(self, key: str, value: str | bytes) -> None:
        self._count(set_(self.prefix + key, value), 0)
        self.store.set(key, value)

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        found = bytes(self.store.compare_set(key, expected, desired))
        self._count(compare_set(self.prefix + key, expected, desired), 8 + len(found))
        return found

    def get(self, key: str) -> bytes:
        value = bytes(self.store.get(key))
        self._count(wait([self.prefix + key]), 1)
        self._count(get(self.prefix + key), 8 + len(value))
        return value

    def add(self, key: str, amount: int) -> int:
        self._count(add(self.prefix + key, amount), 8)
        return int(self.store.add(key, amount))

    def check(self, keys: list[str]) -> bool:
        self._add("check", self._keys(keys), 1)
        return bool(self.store.check(keys))

    def append(self, key: str, value: str | bytes) -> None:
        self._count(append(self.prefix + key, value), 0)
        self.store.append(key, value)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        values = [bytes(v) for v in self.store.multi_get(keys)]
        self._add("wait", self._keys(keys), 1)
        self._add("multi_get", self._keys(keys), 8 * len(values) + sum(map(len, values)))
        return values

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        body = sum(8 + len(_bytes(v)) for v in values)
        self._add("multi_set", self._keys(keys) + body, 0)
        self.store.multi_set(keys, values)

    def set_timeout(self, timeout: Any) -> None:
        """The client's own timeout (`distenv.bootstrap.waits.wait_value`): nothing on the wire."""
        self.store.set_timeout(timeout)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"CountedStore does not count {name!r}: add it before measuring")


def store_thread_cpu() -> float | None:
    """Return the CPU seconds of this process's libuv store thread (``pt_tcpstore_uv``) so far.

    None where no such thread runs (the server is another process, or not libuv).
    """
    with contextlib.suppress(OSError):
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    if f.read().strip() != "pt_tcpstore_uv":
                        continue
            except OSError:
                continue
            # Linux's CPU-time clock of one thread (MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED) in
            # the kernel's posix-cpu-timers): nanoseconds, where /proc's stat counts 10 ms ticks.
            return time.clock_gettime((~int(tid) << 3) | 6)
    return None
