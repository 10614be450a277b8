"""Benchmark 5: bootstrap time against world size, and the roll call with many simulated ranks.

Part A launches ``distenv run -n N`` of _bootstrap_worker.py (distenv and bare, interleaved) and
stops after the first size whose launch took more than 60 s; part B times rank 0's
`distenv.bootstrap.rollcall.roll_call` of N simulated ranks over one real TCPStore, with the node
layout known and left to the roll call. docs/benchmarks.md.in (section 5) says how.

    python benchmarks/bench_scaling.py [--sizes 2,4,8,16,32] [--repeats 2] [--smoke] [--out F]
"""

from __future__ import annotations

import datetime
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    SEED,
    emit,
    load_average,
    machine,
    median,
    note,
    parser,
    summary,
    time_verdict_parse,
)
from bench_bootstrap import launch

STOP_AFTER_S = 60.0
ROLLCALL_SIZES = (64, 256, 1024, 4096, 8192, 16384)
RANKS_PER_NODE = 8
VERDICT_READ_SAMPLE = 16


def init_scaling(sizes: list[int], repeats: int, methods: tuple[str, ...]) -> dict[str, Any]:
    rng = random.Random(SEED)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="distenv-bench-") as tmp:
        for n in sizes:
            records: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
            slowest = 0.0
            for _ in range(repeats):
                order = list(records)
                rng.shuffle(order)
                for method in order:
                    record = launch("distenv-run", method, n, None, Path(tmp))
                    records[method].append(record)
                    slowest = max(slowest, record["launch_wall_s"])
                    note(f"distenv run -n {n} {method}: {record['max_s'] * 1000:.0f} ms")
            out[str(n)] = {
                m: {
                    "max_over_ranks_s": summary([r["max_s"] for r in recs]),
                    "launch_wall_s": summary([r["launch_wall_s"] for r in recs]),
                    "processes_per_rank": max(max(r["events_per_rank"]) for r in recs),
                }
                for m, recs in records.items()
            }
            if slowest > STOP_AFTER_S:
                note(f"stopping at N={n}: a launch took {slowest:.0f} s (> {STOP_AFTER_S:.0f} s)")
                out["stopped_after"] = n
                break
    return out


# The two node layouts part B compares: named by the launcher, or left to the roll call.
LAYOUTS = ("known", "from_roll_call")
TIMED = (
    "checkin_loop",
    "rank0_roll_call",
    "rank0_roll_call_cpu",
    "validate",
    "multi_get",
    "verdict_read",
    "verdict_parse",
)


def _checkin(rank: int, world: int, *, known: bool = True) -> Any:
    from distenv.bootstrap.records import CheckIn

    return CheckIn(
        rank=rank,
        world_size=world,
        local_rank=rank % RANKS_PER_NODE,
        local_world_size=RANKS_PER_NODE,
        node_rank=rank // RANKS_PER_NODE if known else None,
        hostname=f"node{rank // RANKS_PER_NODE:05d}",
        pid=10000 + rank,
        launcher="slurm",
        master="node00000:29500",
        backend="nccl",
        torch_version="2.13.0",
        device=f"GPU-{rank // RANKS_PER_NODE:05d}-{rank % RANKS_PER_NODE}",
        scope=f"slurm/4242/0/n{world}",
    )


def _info(rank: int, n: int, port: int) -> Any:
    """Rank `rank`'s RankInfo in a world of `n` ranks, 8 a node, its master on loopback."""
    from distenv.rankinfo import RankInfo

    return RankInfo(
        launcher="slurm",
        rank=rank,
        world_size=n,
        local_rank=rank % RANKS_PER_NODE,
        local_world_size=RANKS_PER_NODE,
        node_rank=rank // RANKS_PER_NODE,
        num_nodes=n // RANKS_PER_NODE,
        master_addr="127.0.0.1",
        master_port=port,
    )


def _one_roll_call(store: Any, info: Any, checkins: list[Any]) -> tuple[dict[str, float], int]:
    """Time one roll call of `checkins` on `store` (all of part B's steps); return the verdict's size."""
    from distenv.bootstrap.flat import check_in
    from distenv.bootstrap.rollcall import roll_call
    from distenv.bootstrap.session import Bootstrap, Session
    from distenv.bootstrap.verdict import validate
    from distenv.deadline import Deadline

    n = len(checkins)
    times: dict[str, float] = {}
    start = time.perf_counter()
    for c in checkins[1:]:  # ranks 1..N-1, what roll_call makes each of them write
        check_in(store, c)
    times["checkin_loop"] = time.perf_counter() - start
    # Rank 0 then waits until the others acknowledge reading the verdict; their reads are timed
    # below (verdict_read), so count them as done already.
    store.add("read", n - 1)

    start, cpu = time.perf_counter(), time.process_time()
    boot = Bootstrap(Session(info, checkins[0].scope), 60.0, Deadline.after(70.0))
    verdict = roll_call(store, boot, checkins[0])
    times["rank0_roll_call"] = time.perf_counter() - start
    # CPU time of this process meanwhile (rank 0 and its store's threads): less at the mercy of
    # other work on a shared machine than the wall time.
    times["rank0_roll_call_cpu"] = time.process_time() - cpu
    assert verdict.ok, verdict.problems

    start = time.perf_counter()
    validate(verdict.checkins, n)
    times["validate"] = time.perf_counter() - start

    start = time.perf_counter()
    store.multi_get([f"checkin/{i}" for i in range(n)])
    times["multi_get"] = time.perf_counter() - start

    start = time.perf_counter()
    for _ in range(VERDICT_READ_SAMPLE):
        raw = store.get("verdict")
    times["verdict_read"] = (time.perf_counter() - start) / VERDICT_READ_SAMPLE

    # What the last rank does with it: parse it against its schema, and where it places ranks,
    # its own place (written by rank 0 under place/<rank>), and take its node from them.
    last = checkins[-1]
    last_info = info.replace(rank=n - 1, local_rank=last.local_rank, node_rank=last.node_rank)
    placed_raw = store.get(f"place/{n - 1}") if store.check([f"place/{n - 1}"]) else b""
    times["verdict_parse"], filled, _ = time_verdict_parse(
        "verdict", raw, last, last_info, VERDICT_READ_SAMPLE, placed_raw
    )
    layout = (filled.node_rank, filled.num_nodes)
    assert layout == ((n - 1) // RANKS_PER_NODE, n // RANKS_PER_NODE), layout
    return times, len(raw) + len(placed_raw)


def _paired_ratio(
    unknown: dict[str, list[float]], known: dict[str, list[float]], key: str
) -> float:
    """Median over repetitions of `key`'s time with the layout from the roll call / known."""
    return median([u / k for u, k in zip(unknown[key], known[key], strict=True)])


def rollcall(sizes: list[int], repeats: int) -> dict[str, Any]:
    import torch
    from torch.distributed import PrefixStore, TCPStore

    from distenv import timing
    from distenv.bootstrap import waits
    from distenv.master import free_port

    rng = random.Random(SEED)
    port = free_port("127.0.0.1")
    timeout = datetime.timedelta(seconds=60)
    master = TCPStore("127.0.0.1", port, 1, is_master=True, timeout=timeout, wait_for_workers=False)
    client = TCPStore("127.0.0.1", port, 1, is_master=False, timeout=timeout)
    out: dict[str, Any] = {"store": "TCPStore (libuv)" if master.libuvBackend else "TCPStore"}
    out["torch"] = torch.__version__
    out["poll_s"] = timing.POLL_S
    out["chunk"] = waits.CHUNK
    out["ranks_per_host"] = RANKS_PER_NODE
    for n in sizes:
        rank0 = _info(0, n, port)
        infos = {"known": rank0, "from_roll_call": rank0.replace(node_rank=None, num_nodes=None)}
        checkins = {
            layout: [_checkin(r, n, known=layout == "known") for r in range(n)]
            for layout in LAYOUTS
        }
        timings = {layout: {k: [] for k in TIMED} for layout in LAYOUTS}
        verdict_bytes = dict.fromkeys(LAYOUTS, 0)
        for rep in range(repeats):
            order = list(LAYOUTS)
            rng.shuffle(order)  # interleaved: neither layout always runs on a warmer store
            for layout in order:
                store = PrefixStore(f"bench/{n}/{rep}/{layout}", client)
                times, verdict_bytes[layout] = _one_roll_call(
                    store, infos[layout], checkins[layout]
                )
                for k, v in times.items():
                    timings[layout][k].append(v)
        known, unknown = timings["known"], timings["from_roll_call"]
        out[str(n)] = {
            **{k: summary(v) for k, v in known.items()},
            "verdict_bytes": verdict_bytes["known"],
            "checkin_bytes": len(checkins["known"][-1].to_json()),
            "all_verdict_reads_bytes": verdict_bytes["known"] * (n - 1),
            "rank0_per_rank_us": median(known["rank0_roll_call"]) / n * 1e6,
            "layout_from_roll_call": {
                **{k: summary(v) for k, v in unknown.items()},
                "hosts": n // RANKS_PER_NODE,
                "verdict_bytes": verdict_bytes["from_roll_call"],
                "all_verdict_reads_bytes": verdict_bytes["from_roll_call"] * (n - 1),
                # Paired by repetition: each ratio compares two roll calls of the same round.
                "rank0_ratio": _paired_ratio(unknown, known, "rank0_roll_call"),
                "rank0_cpu_ratio": _paired_ratio(unknown, known, "rank0_roll_call_cpu"),
                "verdict_parse_ratio": _paired_ratio(unknown, known, "verdict_parse"),
                "verdict_bytes_ratio": verdict_bytes["from_roll_call"] / verdict_bytes["known"],
            },
        }
        layout_ms = median(unknown["rank0_roll_call"]) * 1000
        note(
            f"roll call N={n}: rank 0 {median(known['rank0_roll_call']) * 1000:.1f} ms, "
            f"{layout_ms:.1f} ms with the layout from the roll call "
            f"(verdict {verdict_bytes['known']} vs {verdict_bytes['from_roll_call']} B)"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--sizes", default="2,4,8,16,32")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--rollcall-sizes", default=",".join(map(str, ROLLCALL_SIZES)))
    p.add_argument("--rollcall-repeats", type=int, default=5)
    args = p.parse_args(argv)
    if args.smoke:
        sizes, repeats, rc_sizes, rc_repeats = [2], 1, [16], 1
    else:
        sizes = [int(s) for s in args.sizes.split(",")]
        rc_sizes = [int(s) for s in args.rollcall_sizes.split(",")]
        repeats, rc_repeats = args.repeats, args.rollcall_repeats
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    result = {
        "benchmark": "scaling",
        "smoke": args.smoke,
        "repeats": repeats,
        "rollcall_repeats": rc_repeats,
        # --smoke: distenv's path only (one launch), to stay within the test's time.
        "init": init_scaling(sizes, repeats, ("distenv",) if args.smoke else ("distenv", "bare")),
        "rollcall": rollcall(rc_sizes, rc_repeats),
        "machine": machine(),
    }
    result["total_s"] = time.perf_counter() - started
    result["load_average"] = load_average(load_before)
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
