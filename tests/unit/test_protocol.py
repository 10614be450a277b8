"""The bootstrap's protocol (`distenv.bootstrap.protocol`): the node-socket messages round-trip, the
docs' key table is the module's, and the scale benchmark's simulated ranks send, request for
request and byte for byte, what distenv's own code sends.
"""

from __future__ import annotations

import datetime
import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from distenv.bootstrap.protocol import KEYS, ROLLCALL, Message, scope_key
from distenv.bootstrap.protocol import prefix as protocol_prefix

REPO = Path(__file__).resolve().parents[2]
WORLD = 16  # two nodes of eight ranks (the benchmark's RANKS_PER_NODE)


@pytest.mark.parametrize(
    ("message", "fields", "line"),
    [
        pytest.param(Message.VERDICT, ('{"ok":true}', ""), 'verdict\t{"ok":true}\t', id="verdict"),
        pytest.param(Message.LATE, (), "late", id="late"),
        pytest.param(Message.REFUSED, (), "refused", id="refused"),
        pytest.param(Message.UP, ("0123456789abcdef",), "up\t0123456789abcdef", id="up"),
        pytest.param(Message.ACK, ("0123456789abcdef",), "ack\t0123456789abcdef", id="ack"),
    ],
)
def test_a_node_socket_message_decodes_to_what_was_encoded(
    message: Message, fields: tuple[str, ...], line: str
) -> None:
    """Each tagged message is its kind and its fields, tab-separated, and decodes back."""
    assert message.encode(*fields) == line
    kind, tag, rest = Message.decode(line)
    assert (kind, tag) == (message, message.value)
    assert rest == "\t".join(fields)


def test_a_check_in_goes_untagged_and_an_unknown_tag_decodes_to_none() -> None:
    """A member's first line is its record as it is; a line of no known kind keeps its tag for
    the message that names it."""
    assert Message.CHECKIN.encode('{"rank":1}') == '{"rank":1}'
    assert Message.decode("hello\tworld") == (None, "hello", "world")
    assert Message.decode("checkin\tx")[0] is None  # never tagged on the wire


def test_the_architecture_page_tables_every_store_key() -> None:
    """docs/architecture.md states each key's name, phase, writer, reader and format as the
    protocol module does (one row each)."""
    page = (REPO / "docs" / "architecture.md").read_text()
    for key in KEYS:
        row = f"| `{key.name}` | {key.phase} | {key.writer} | {key.reader} | {key.format} |"
        assert row in page, row


# ---- the scale benchmark's simulated ranks against distenv's code --------------------------------


@pytest.fixture(scope="module")
def bench() -> Iterator[tuple[ModuleType, ModuleType]]:
    """The scale benchmark and its wire client, imported from benchmarks/ as the script does."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        yield (
            importlib.import_module("bench_rendezvous_scale"),
            importlib.import_module("_store_wire"),
        )
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


class Wire:
    """A Python store that records the requests its TCPStore client puts on the wire (as the
    benchmark's `_store_wire` encodes them), under `prefix`."""

    def __init__(self, wire: ModuleType, store: Any, prefix: str, sent: list[Any]) -> None:
        self.wire, self.store, self.sent = wire, store, sent
        self.prefix = prefix + "/" if prefix else ""

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        self.sent.append(self.wire.compare_set(self.prefix + key, expected, desired))
        return bytes(self.store.compare_set(key, expected, desired))

    def add(self, key: str, amount: int) -> int:
        self.sent.append(self.wire.add(self.prefix + key, amount))
        return int(self.store.add(key, amount))

    def set(self, key: str, value: str | bytes) -> None:
        self.sent.append(self.wire.set_(self.prefix + key, value))
        self.store.set(key, value)

    def append(self, key: str, value: str | bytes) -> None:
        self.sent.append(self.wire.append(self.prefix + key, value))
        self.store.append(key, value)

    def get(self, key: str) -> bytes:
        # TCPStore::get waits for the key first: a WAIT, then the GET.
        self.sent += [self.wire.wait([self.prefix + key]), self.wire.get(self.prefix + key)]
        return bytes(self.store.get(key))

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self.store.set_timeout(timeout)


class Side:
    """One store server and what was sent to it: distenv's code (`real`) or the benchmark's."""

    def __init__(self, wire: ModuleType, server: Any, prefix: str) -> None:
        from torch.distributed import PrefixStore, TCPStore

        self.wire, self.prefix = wire, prefix
        self.counts, self.sent = wire.Counts(), []
        client = TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False)
        self.real: list[Any] = []  # what distenv's code sent, in order
        self.root = Wire(wire, client, "", self.real)
        self.scoped = Wire(wire, PrefixStore(prefix, client), prefix, self.real)

    def counted(self, wire_store: Wire, prefix: str) -> Any:
        """`wire_store` behind the benchmark's counting store."""
        return self.wire.CountedStore(wire_store, prefix, self.counts, step="rank")

    def run(self, task: Any, port: int) -> Any:
        """Run one simulated rank's task over its own wire connection; count what it sends."""
        mux = self.wire.Mux("127.0.0.1", port, 1)
        mux.counts = self.counts  # the handshake is not the protocol's

        def recorded() -> Any:
            reply = None
            while True:
                try:
                    request = task.send(reply)
                except StopIteration as stop:
                    return stop.value
                self.sent.append(request)
                reply = yield request

        try:
            [result] = mux.run([recorded()])
        finally:
            mux.close()
        return result

    def sent_since(self, start: int, real: bool) -> list[bytes]:
        sent = self.real if real else self.sent
        return [r.data for r in sent[start:]]


def _server() -> Any:
    from torch.distributed import TCPStore

    timeout = datetime.timedelta(seconds=30)
    return TCPStore("127.0.0.1", 0, 1, True, timeout=timeout, wait_for_workers=False)


def _by_type(counts: Any) -> dict[str, Any]:
    return dict(counts.report()["by_type"])


def _rank0(bench: ModuleType, server: Any, prefix: str, attempt: str, leaders: str) -> Any:
    """Rank 0's session on `server`, its scope claimed (before the others look)."""
    from distenv.bootstrap.session import Session

    own = bench._checkin(0, WORLD)
    session = Session(bench._info(0, WORLD, server.port), own.scope, restart=attempt,
                      leaders=leaders)  # fmt: skip
    session.store = server
    session.claim(own.hostname)
    assert session.keys(ROLLCALL) == prefix
    return session


def _same(
    real: Side, sim: Side, real_step: Callable[[], object], sim_step: Callable[[], object]
) -> None:
    """Run one rank's step on each side; assert both sent the same requests."""
    start_real = len(real.real)
    start_sim = len(sim.sent)
    real_step()
    sim_step()
    assert real.sent_since(start_real, True) == sim.sent_since(start_sim, False)


@pytest.mark.parametrize("mode", ["flat", "leaders"])
def test_the_scale_benchmark_sends_what_distenv_sends(
    bench: tuple[ModuleType, ModuleType], mode: str
) -> None:
    """On two fresh stores, distenv's code and the benchmark's simulated ranks check in (flat:
    every rank; leaders: node 1's leader), then every rank (flat) reads rank 0's verdict: each
    rank's requests are the same bytes in the same order, and the counting store
    (`_store_wire.CountedStore`) counts for distenv's what the wire counts for the benchmark's.
    """
    from distenv.bootstrap.batches import Batch
    from distenv.bootstrap.flat import check_in, read_verdict
    from distenv.bootstrap.nodes import check_in_batch
    from distenv.bootstrap.rollcall import roll_call
    from distenv.bootstrap.session import Bootstrap, Session
    from distenv.deadline import Deadline

    module, wire = bench
    attempt = f"protocol-{mode}"
    servers = {"real": _server(), "sim": _server()}
    scope = module._checkin(0, WORLD).scope
    prefix = protocol_prefix(scope, ROLLCALL, attempt)
    leaders = "on" if mode == "leaders" else "off"
    zero = {side: _rank0(module, s, prefix, attempt, leaders) for side, s in servers.items()}
    real = Side(wire, servers["real"], prefix)
    sim = Side(wire, servers["sim"], prefix)
    key = scope_key(attempt)
    port = servers["sim"].port

    def real_checkin(rank: int) -> None:
        session = Session(module._info(rank, WORLD, servers["real"].port), scope, restart=attempt)
        session.store = real.counted(real.root, "")
        assert session.check(Deadline.after(30)).poll()
        scoped = real.counted(real.scoped, prefix)
        if mode == "flat":
            assert check_in(scoped, module._checkin(rank, WORLD)) is None
        else:
            node = tuple(module._checkin(r, WORLD) for r in range(rank, rank + 8))
            assert len(node) == module.RANKS_PER_NODE
            assert check_in_batch(scoped, Batch(rank, node)) is None

    if mode == "flat":
        for rank in range(1, WORLD):
            _same(
                real,
                sim,
                lambda rank=rank: real_checkin(rank),  # type: ignore[misc]
                lambda rank=rank: sim.run(module._flat_checkin(rank, WORLD, key, prefix), port),  # type: ignore[misc]
            )
    else:
        _same(
            real,
            sim,
            lambda: real_checkin(8),
            lambda: sim.run(module._leader_checkin(8, WORLD, key, prefix), port),
        )
    assert sim.sent, "the benchmark's ranks sent nothing"
    assert _by_type(real.counts) == _by_type(sim.counts)
    if mode == "leaders":
        return  # rank 0 would gather its node's members first: the verdict's reads are flat's

    # Rank 0 (distenv's roll call on each side) publishes; every other rank reads the verdict.
    from torch.distributed import PrefixStore

    for side, server in servers.items():
        boot = Bootstrap(zero[side], 30.0, Deadline.after(60.0))
        verdict = roll_call(PrefixStore(prefix, server), boot, module._checkin(0, WORLD))
        assert verdict.ok, verdict.problems
        assert not verdict.placed
    for rank in range(1, WORLD):
        own = module._checkin(rank, WORLD)

        def real_read(rank: int = rank, own: Any = own) -> None:
            info = module._info(rank, WORLD, servers["real"].port)
            boot = Bootstrap(Session(info, scope, restart=attempt), 30.0, Deadline.after(60.0))
            scoped = real.counted(real.scoped, prefix)
            verdict, _, _ = read_verdict(scoped, boot, own, None, holds_key=True)
            assert verdict.ok

        _same(
            real,
            sim,
            real_read,
            lambda rank=rank: sim.run(module._verdict_read(rank, prefix, False), port),  # type: ignore[misc]
        )
    assert _by_type(real.counts) == _by_type(sim.counts)
    assert _by_type(sim.counts)["wait"]["requests"] == WORLD - 1
