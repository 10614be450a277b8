"""Benchmark: the roll call at the scale that matters, flat and through node leaders (#28 item 4).

Rank 0 runs distenv's real roll call (`distenv.bootstrap.rollcall.roll_call`) in the process that
hosts a real torch TCPStore (libuv server), at 4 096, 16 384 and 131 072 simulated ranks, 8 per
node. The other ranks' store traffic is real too: client processes (`_store_wire.Clients`, no
torch) speak TCPStore's wire protocol over real TCP connections and make each rank's requests
exactly as distenv's code makes them, so the store serves, and this script counts, every request
and byte of the job.

Two modes, side by side in one run, interleaved in a shuffled order per repetition:

- ``flat``: every rank is a client of rank 0's store. Ranks 1..N-1 (multiplexed over at most
  1 024 connections) peek at the scope key, claim ``checkin/<r>`` with their check-in
  (``compare_set``) and count themselves (``add written 1``), as `distenv.bootstrap.flat.check_in` does.
- ``leaders``: the node leaders (local rank 0 of each node: ranks 8, 16, ...), one real
  connection each (16 383 connections at 131 072 ranks, from at least 2 processes), peek at the
  scope key, count their node (``add written 8``) and append its `Batch` to their shard, as
  `distenv.bootstrap.nodes.check_in_batch` does. Rank 0 leads node 0: its 7 members are real
  processes' `Link`s to its `LeaderChannel`'s node socket, connected and sent before the clock starts.
  The members of other nodes never reach rank 0's store in the roll call.

Then rank 0's whole roll call is timed (wall, and CPU of this process: its own thread and the
store's libuv thread, and the time Python's collector took), with rank 0's own store calls
counted through `_store_wire.CountedStore` (distenv holds the collector off while rank 0 gathers
and validates: what it still takes is reported).
Then every simulated rank (flat) or leader reads the verdict as `distenv.bootstrap.waits.wait_value`
does, with TCPStore's ``get`` (a WAIT, answered once the key exists, then the GET: two requests
however long a rank waits, and no polls), all N-1 or N/8-1 reads real and counted, and one rank's
`parse_verdict` + `fill_layout` is timed. The node layout is known (as under srun), so the verdict
places no rank (no ``place/<rank>`` reads).

What this does not measure: the waits arriving *while* rank 0 gathers (here they are sent once the
verdict exists; their count is the same, and the store only registers a wait until the key is
written), the members' hop to their leader on other nodes, connection set-up (reported apart, as
``connect``), and a real network (loopback here).

    python benchmarks/bench_rendezvous_scale.py [--sizes 4096,16384,131072] [--repeats 3]
        [--processes 2] [--smoke] [--out F]
"""

from __future__ import annotations

import collections
import contextlib
import gc
import multiprocessing
import os
import random
import resource
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import _store_wire as wire
from _common import SEED, emit, load_average, machine, note, parser, summary, time_verdict_parse
from bench_scaling import RANKS_PER_NODE, _checkin, _info

SIZES = (4096, 16384, 131072)
MODES = ("flat", "leaders")
#: Connections the flat roll call's simulated ranks share (each runs its ranks in turn).
FLAT_CONNECTIONS = 1024
#: The targets at the largest size (issue #28 item 4).
TARGET_REQUESTS_PER_NODE = 3
TARGET_RANK0_S = 1.0
TARGET_VERDICT_BYTES = 1024
PARSE_SAMPLE = 16
HOST0 = "node00000"


# ---- what the simulated ranks do (run in the client processes) ---------------------------------


def flat_checkins(ranks: Sequence[int], extra: tuple[int, str, str]) -> Iterator[wire.Task]:
    """Ranks of a flat roll call: peek at the scope key, claim the rank's key, count it."""
    n, scope_key, prefix = extra
    for rank in ranks:
        yield _flat_checkin(rank, n, scope_key, prefix)


def _flat_checkin(rank: int, n: int, scope_key: str, prefix: str) -> wire.Task:
    from distenv.bootstrap.protocol import CHECKIN

    record = _checkin(rank, n).to_json()
    claim = yield wire.peek(scope_key, "peek scope")
    assert claim != wire.ABSENT, "rank 0 claims the scope before the ranks check in"
    held = yield wire.compare_set(f"{prefix}/{CHECKIN.of(rank)}", "", record, "claim checkin/<r>")
    assert held == record.encode(), held[:80]
    yield from _count(prefix, 1, n)
    return None


def _count(prefix: str, amount: int, n: int) -> wire.Task:
    """Count in, as `distenv.bootstrap.waits.count_to` does: the addition that completes the
    count also writes the word rank 0 waits for. Returns the count the addition found."""
    from distenv.bootstrap.protocol import ALL, WRITTEN

    count = yield wire.add(f"{prefix}/{WRITTEN.name}", amount, "add written")
    if count >= n:
        yield wire.set_(f"{prefix}/{ALL.name}", str(count), "set all")
    return count


def leader_checkins(leaders: Sequence[int], extra: tuple[int, str, str]) -> Iterator[wire.Task]:
    """Node leaders of a batched roll call: peek at the scope, count the node, append its batch."""
    n, scope_key, prefix = extra
    for leader in leaders:
        yield _leader_checkin(leader, n, scope_key, prefix)


def _leader_checkin(leader: int, n: int, scope_key: str, prefix: str) -> wire.Task:
    from distenv.bootstrap.batches import Batch, shard_key
    from distenv.bootstrap.protocol import CUT

    node = tuple(_checkin(r, n) for r in range(leader, leader + RANKS_PER_NODE))
    line = Batch(leader, node).to_line()
    claim = yield wire.peek(scope_key, "peek scope")
    assert claim != wire.ABSENT, "rank 0 claims the scope before the leaders check in"
    count = yield from _count(prefix, len(node), n)
    assert count < CUT, "rank 0 made its cut before this leader counted its node"
    yield wire.append(f"{prefix}/{shard_key(leader)}", line, "append batch")
    return None


def verdict_reads(ranks: Sequence[int], extra: tuple[str, bool]) -> Iterator[wire.Task]:
    """Each rank (or leader) waits for the verdict and reads it; where placed, its place too."""
    prefix, placed = extra
    for rank in ranks:
        yield _verdict_read(rank, prefix, placed)


def _verdict_read(rank: int, prefix: str, placed: bool) -> wire.Task:
    from distenv.bootstrap.protocol import PLACE, VERDICT

    # distenv.bootstrap.waits.wait_value: TCPStore's get, a WAIT and then the GET on the wire.
    yield wire.wait([f"{prefix}/{VERDICT.name}"], "wait verdict")
    raw = yield wire.get(f"{prefix}/{VERDICT.name}", "get verdict")
    if placed:
        yield wire.wait([f"{prefix}/{PLACE.of(rank)}"], "wait place/<r>")
        yield wire.get(f"{prefix}/{PLACE.of(rank)}", "get place/<r>")
    return len(raw)


def _members(pipe: Any, role: Any, n: int, port: int) -> None:
    """Node 0's members (local ranks 1..7): check in with rank 0 over the node's Unix socket,
    then wait for the verdict line it hands on."""
    from distenv.bootstrap.leaders import Link
    from distenv.bootstrap.protocol import Message
    from distenv.deadline import Deadline

    links = []
    for rank in range(1, RANKS_PER_NODE):
        info = _info(rank, n, port)
        link = Link.connect(role, info, Deadline.after(60.0))
        assert link.send(Message.CHECKIN.encode(_checkin(rank, n).to_json()), Deadline.after(10.0))
        links.append(link)
    pipe.send("sent")
    lines = [link.receive(Deadline.after(600.0)) for link in links]
    pipe.send([len(line or "") for line in lines])
    for link in links:
        link.close()


# ---- rank 0 (this process) ----------------------------------------------------------------------


def _host_store() -> tuple[Any, int]:
    """Start the store as distenv's rank 0 does for a literal MASTER_ADDR: its own code, which
    listens on the address family MASTER_ADDR resolves to (an IPv4 socket here).

    torch's libuv server names each accepted peer with ``getnameinfo`` in its loop thread
    (``formatSockAddr``, pytorch/pytorch#159007); on its own dual-stack socket a loopback peer
    is ``::ffff:127.0.0.1``, which /etc/hosts does not name, so each accept asked DNS here
    (up to 1 s each).
    """
    from distenv.bootstrap.store import host_store
    from distenv.master import free_port

    port = free_port("127.0.0.1")
    store = host_store("bench", "127.0.0.1", port, timeout=600)
    assert getattr(store, "libuvBackend", False), "the benchmark measures torch's libuv store"
    return store, port


class GcClock:
    """Time this process spends in the garbage collector, per generation (`gc.callbacks`)."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.collections = [0, 0, 0]
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._start
            self.collections[info["generation"]] += 1

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


class Run:
    """One size's roll calls: the store, the client processes, rank 0's state."""

    def __init__(self, store: Any, port: int, clients: wire.Clients, n: int) -> None:
        self.store, self.port, self.clients, self.n = store, port, clients, n
        self.nodes = n // RANKS_PER_NODE
        self.checkins = [_checkin(r, n) for r in range(RANKS_PER_NODE)]

    def roll_call(self, mode: str, attempt: str) -> dict[str, Any]:
        """Hold one roll call in `mode`; return its counts and timings."""
        from torch._C._distributed_c10d import PrefixStore

        from distenv.bootstrap.flat import FLAT
        from distenv.bootstrap.nodes import open_channel
        from distenv.bootstrap.protocol import ROLLCALL, VERDICT, scope_key
        from distenv.bootstrap.role import Role
        from distenv.bootstrap.rollcall import roll_call
        from distenv.bootstrap.session import Bootstrap, Session
        from distenv.deadline import Deadline

        n, own = self.n, self.checkins[0]
        info = _info(0, n, self.port)
        leaders = "on" if mode == "leaders" else "off"
        session = Session(info, own.scope, restart=attempt, leaders=leaders)
        prefix = session.keys(ROLLCALL)
        key = scope_key(attempt)
        rank0 = wire.Counts()
        session.store = wire.CountedStore(self.store, "", rank0)
        session.claim(own.hostname)  # rank 0 claims the store before the others look
        out: dict[str, Any] = {"mode": mode}

        # The others check in first.
        cpu0 = wire.store_thread_cpu() or 0.0
        if mode == "flat":
            ranks, conns = list(range(1, n)), min(FLAT_CONNECTIONS, n - 1)
            counts, _, wall, _ = self.clients.run(flat_checkins, ranks, (n, key, prefix), conns)
        else:
            ranks = list(range(RANKS_PER_NODE, n, RANKS_PER_NODE))
            conns = len(ranks)
            counts, _, wall, _ = self.clients.run(leader_checkins, ranks, (n, key, prefix), conns)
        out["connections"] = conns
        out["checkin_phase"] = {
            "counts": counts,
            "wall_s": wall,
            "store_thread_cpu_s": (wire.store_thread_cpu() or 0.0) - cpu0,
        }

        # Node 0's members reach rank 0 over the node's socket (leaders only).
        channel, members, pipe = FLAT, None, None
        if mode == "leaders":
            role = Role.of(info, leaders, own.scope, attempt, own.hostname)
            assert role is not None, "DISTENV_NODE_LEADERS=on batches this world"
            assert role.leader, role
            channel = open_channel(role, info)  # the node's socket, open before the members come
            pipe, child = multiprocessing.get_context("spawn").Pipe()
            members = multiprocessing.get_context("spawn").Process(
                target=_members, args=(child, role, n, self.port), daemon=True
            )
            members.start()
            child.close()
            assert pipe.recv() == "sent"

        # Rank 0's roll call, timed.
        scoped = wire.CountedStore(PrefixStore(prefix, self.store), prefix, rank0)
        boot = Bootstrap(session, 600.0, Deadline.after(660.0))
        store_cpu, cpu, start = (
            wire.store_thread_cpu() or 0.0,
            time.process_time(),
            time.perf_counter(),
        )
        with GcClock() as collector:
            verdict = roll_call(scoped, boot, own, channel=channel)
        wall = time.perf_counter() - start
        out["rank0"] = {
            "wall_s": wall,
            "cpu_s": time.process_time() - cpu,
            "store_thread_cpu_s": (wire.store_thread_cpu() or 0.0) - store_cpu,
            "gc_s": sum(collector.seconds),
            "gc_collections": collector.collections,
            "counts": rank0,
        }
        assert verdict.ok, verdict.problems
        if pipe is not None and members is not None:
            out["member_lines_bytes"] = pipe.recv()
            members.join(timeout=30)
        channel.close()

        # Every other rank (flat) or leader reads the verdict.
        published = verdict.to_json().encode()
        cpu0 = wire.store_thread_cpu() or 0.0
        counts, lengths, wall, _ = self.clients.run(
            verdict_reads, ranks, (prefix, verdict.placed), conns
        )
        assert lengths == {len(published): len(ranks)}, lengths
        out["verdict_phase"] = {
            "counts": counts,
            "wall_s": wall,
            "store_thread_cpu_s": (wire.store_thread_cpu() or 0.0) - cpu0,
        }

        # What the last rank does with it.
        last = _checkin(n - 1, n)
        last_info = _info(n - 1, n, self.port)
        out["verdict_parse_s"], filled, placed = time_verdict_parse(
            VERDICT.name, published, last, last_info, PARSE_SAMPLE
        )
        assert not placed, "a known layout places no rank"
        assert filled.node_rank == (n - 1) // RANKS_PER_NODE
        out["verdict_bytes"] = len(published)
        out["waiters"] = len(ranks)
        connect = self.clients.counts.report()
        out["handshake"] = {
            k: connect[k] / connect["connections"] for k in ("requests", "bytes_in", "bytes_out")
        }
        return out


def _aggregate(n: int, records: list[dict[str, Any]]) -> dict[str, Any]:
    """One size and mode: counts (the same every repetition), timings as summaries."""
    first = records[0]
    nodes = n // RANKS_PER_NODE
    total = wire.Counts()
    phases = {}
    for phase, counts in (
        ("checkin", first["checkin_phase"]["counts"]),
        ("rank0", first["rank0"]["counts"]),
        ("verdict", first["verdict_phase"]["counts"]),
    ):
        phases[phase] = counts.report()
        total.merge(counts)
    # Every rank (flat) or leader opens its own connection (validate, then ping): modelled from
    # the handshake measured on the simulated connections, which carry many ranks each.
    handshake = first["handshake"]
    opened = first["waiters"]
    report = total.report()
    roll = report["requests"]
    connect = {k: v * opened for k, v in handshake.items()}
    rank0_wall = [r["rank0"]["wall_s"] for r in records]
    return {
        "ranks": n,
        "nodes": nodes,
        "mode": first["mode"],
        "connections": first["connections"],
        "store": {
            **{k: report[k] for k in ("requests", "bytes_in", "bytes_out")},
            "connect": {"connections": opened, **connect},
            "per_node": {
                "requests": roll / nodes,
                "bytes_in": report["bytes_in"] / nodes,
                "bytes_out": report["bytes_out"] / nodes,
                "requests_with_connect": (roll + connect["requests"]) / nodes,
            },
            "by_type": report["by_type"],
            "by_step": report["by_step"],
            "phases": phases,
        },
        "rank0_wall_s": summary(rank0_wall),
        "rank0_cpu_s": summary([r["rank0"]["cpu_s"] for r in records]),
        "rank0_store_thread_cpu_s": summary([r["rank0"]["store_thread_cpu_s"] for r in records]),
        # Inside rank 0's wall time: Python's collector, over every object of the process
        # (torch's included); gc_collections counts generations 0, 1 and 2 of the first roll call.
        "rank0_gc_s": summary([r["rank0"]["gc_s"] for r in records]),
        "rank0_gc_collections": first["rank0"]["gc_collections"],
        "checkin_phase_wall_s": summary([r["checkin_phase"]["wall_s"] for r in records]),
        "checkin_phase_store_cpu_s": summary(
            [r["checkin_phase"]["store_thread_cpu_s"] for r in records]
        ),
        "verdict_phase_wall_s": summary([r["verdict_phase"]["wall_s"] for r in records]),
        "verdict_phase_store_cpu_s": summary(
            [r["verdict_phase"]["store_thread_cpu_s"] for r in records]
        ),
        "verdict_bytes": first["verdict_bytes"],
        "verdict_parse_s": summary([r["verdict_parse_s"] for r in records]),
        "waiters": first["waiters"],
    }


def _targets(result: dict[str, Any]) -> dict[str, Any]:
    """The targets at the largest size, met or missed, with the numbers."""
    per_node = result["store"]["per_node"]
    requests = per_node["requests"]
    steps = result["store"]["by_step"]
    reads = (
        sum(
            steps.get(step, {"requests": 0})["requests"] for step in ("wait verdict", "get verdict")
        )
        / result["nodes"]
    )
    wall = result["rank0_wall_s"]["median"]
    return {
        "ranks": result["ranks"],
        "mode": result["mode"],
        "requests_per_node": {
            "target": TARGET_REQUESTS_PER_NODE,
            "value": requests,
            "without_verdict_reads": requests - reads,
            "verdict_reads": reads,
            "with_connect": per_node["requests_with_connect"],
            "met": requests <= TARGET_REQUESTS_PER_NODE,
        },
        "rank0_roll_call_s": {
            "target": TARGET_RANK0_S,
            "value": wall,
            "met": wall <= TARGET_RANK0_S,
        },
        "verdict_bytes": {
            "target": TARGET_VERDICT_BYTES,
            "value": result["verdict_bytes"],
            "met": result["verdict_bytes"] <= TARGET_VERDICT_BYTES,
        },
    }


def _sources() -> dict[str, str]:
    """Return a digest of each roll-call module measured (the tree may hold uncommitted work)."""
    import hashlib

    from _common import REPO

    return {
        str(path.relative_to(REPO)): hashlib.sha256(path.read_bytes()).hexdigest()[:12]
        for path in sorted((REPO / "distenv" / "bootstrap").glob("*.py"))
    }


def _raise_descriptors() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--sizes", default=",".join(map(str, SIZES)))
    p.add_argument("--repeats", type=int, default=3, help="roll calls per size and mode")
    p.add_argument("--processes", type=int, default=2, help="client processes (at least 2)")
    args = p.parse_args(argv)
    sizes = [64] if args.smoke else [int(s) for s in args.sizes.split(",")]
    for n in sizes:
        if n % RANKS_PER_NODE or n < 2 * RANKS_PER_NODE:
            p.error(f"--sizes: {n} is not a multiple of {RANKS_PER_NODE} ranks of 2 nodes or more")
    _raise_descriptors()
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    store, port = _host_store()
    # One connection per leader (rank 0 leads its own node), at most FLAT_CONNECTIONS for flat.
    connections = max(max(n // RANKS_PER_NODE - 1, min(FLAT_CONNECTIONS, n - 1)) for n in sizes)
    start, cpu = time.perf_counter(), wire.store_thread_cpu() or 0.0
    clients = wire.Clients("127.0.0.1", port, connections, processes=max(2, args.processes))
    connect = {
        "connections": connections,
        "processes": max(2, args.processes),
        "wall_s": time.perf_counter() - start,
        # What accepting them cost rank 0's store (libuv accepts one per loop turn and names
        # each peer with getnameinfo, here from /etc/hosts).
        "store_thread_cpu_s": (wire.store_thread_cpu() or 0.0) - cpu,
        "counts": clients.counts.report(),
    }
    note(f"{connections} connections open in {connect['wall_s']:.1f} s")
    rng = random.Random(SEED)
    results: dict[str, Any] = {}
    try:
        # Warm: the first roll call of a process compiles the record schema's patterns and
        # imports the verdict's modules; a real rank 0 pays that once, not per rank.
        warm = Run(store, port, clients, 2 * RANKS_PER_NODE)
        for mode in MODES:
            warm.roll_call(mode, f"warm-{mode}")
        for n in sizes:
            run = Run(store, port, clients, n)
            repeats = 1 if args.smoke else args.repeats
            records: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
            for rep in range(repeats):
                order = list(MODES)
                rng.shuffle(order)  # interleaved: neither mode always runs on a warmer store
                for mode in order:
                    record = run.roll_call(mode, f"{n}-{rep}-{mode}")
                    records[mode].append(record)
                    note(
                        f"N={n} {mode}: rank 0 {record['rank0']['wall_s'] * 1000:.0f} ms "
                        f"(cpu {record['rank0']['cpu_s'] * 1000:.0f} ms, gc "
                        f"{record['rank0']['gc_s'] * 1000:.0f} ms), check-ins "
                        f"{record['checkin_phase']['wall_s']:.1f} s"
                    )
            results[str(n)] = {
                "repeats": repeats,
                **{mode: _aggregate(n, records[mode]) for mode in MODES},
            }
            flat, leaders = results[str(n)]["flat"], results[str(n)]["leaders"]
            results[str(n)]["leaders_vs_flat"] = {
                "requests_per_node": leaders["store"]["per_node"]["requests"]
                / flat["store"]["per_node"]["requests"],
                "rank0_wall": leaders["rank0_wall_s"]["median"] / flat["rank0_wall_s"]["median"],
                "bytes_out": leaders["store"]["bytes_out"] / flat["store"]["bytes_out"],
            }
    finally:
        clients.close()
    largest = results[str(max(sizes))]
    result = {
        "benchmark": "rendezvous_scale",
        "smoke": args.smoke,
        "ranks_per_node": RANKS_PER_NODE,
        "store": "TCPStore (libuv), IPv4 listening socket passed in, as distenv's rank 0",
        "connect": connect,
        "sizes": results,
        "targets": {mode: _targets(largest[mode]) for mode in MODES},
        "notes": [
            "requests and bytes are those rank 0's store served: the simulated ranks' counted "
            "on their client side, rank 0's own computed from its calls (CountedStore)",
            "bytes_in: received by the store (requests), bytes_out: sent by it (replies)",
            "rank0 cpu_s is this process's CPU time: rank 0's thread and the store's libuv "
            "thread (which serves only rank 0 then)",
            "leaders: rank 0's roll call includes gathering node 0's 7 members over the node's "
            "Unix socket (real processes, sent before the clock starts)",
            "the verdict reads (a WAIT and a GET each) are sent once the verdict exists, not "
            "while rank 0 gathers; their count is the same",
        ],
        "machine": machine(),
        "sources": _sources(),
    }
    result["total_s"] = time.perf_counter() - started
    result["load_average"] = load_average(load_before)
    emit(result, args.out)
    with contextlib.suppress(Exception):
        del store
    return 0


if __name__ == "__main__":
    sys.exit(main())
