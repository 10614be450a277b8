"""Benchmark 5: bootstrap time against world size, and the roll call with many simulated ranks.

Part A starts ``distenv run -n N`` (N = 2, 4, ... 32 local ranks: oversubscribed on this machine)
of _bootstrap_worker.py, for distenv's ``init_dist`` and for a bare ``init_process_group`` under
the same contract, interleaved; it stops after the first size whose launch took more than 60 s.

Part B times `distenv.rendezvous.roll_call` on rank 0 of N simulated ranks (64 .. 4096) over one
real TCPStore on loopback: ranks 1..N-1 check in first (a loop making the same three store calls
a rank makes), then rank 0's whole roll call is timed (its check-in, the gather of N records,
`validate`, publishing the verdict). Also timed: `validate` alone, one ``multi_get`` of all N
records (a possible one-round-trip gather), and a sample of verdict reads (every other rank reads
the verdict once; in the timed roll call their acknowledgements are pre-counted).

    python benchmarks/bench_scaling.py [--sizes 2,4,8,16,32] [--repeats 2] [--smoke] [--out F]
"""

from __future__ import annotations

import datetime
import random
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import SEED, emit, machine, median, note, parser, summary
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


def _checkin(rank: int, world: int) -> Any:
    from distenv.records import CheckIn

    return CheckIn(
        rank=rank,
        world_size=world,
        local_rank=rank % RANKS_PER_NODE,
        local_world_size=RANKS_PER_NODE,
        node_rank=rank // RANKS_PER_NODE,
        hostname=f"node{rank // RANKS_PER_NODE:05d}",
        pid=10000 + rank,
        launcher="slurm",
        master="node00000:29500",
        backend="nccl",
        torch_version="2.13.0",
        device=f"GPU-{rank // RANKS_PER_NODE:05d}-{rank % RANKS_PER_NODE}",
        scope=f"slurm/4242/0/n{world}",
    )


def rollcall(sizes: list[int], repeats: int) -> dict[str, Any]:
    import torch
    from torch.distributed import PrefixStore, TCPStore

    from distenv import rendezvous as rollcall_module
    from distenv.rankinfo import RankInfo
    from distenv.records import validate
    from distenv.rendezvous import check_in, roll_call

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    timeout = datetime.timedelta(seconds=60)
    master = TCPStore("127.0.0.1", port, 1, is_master=True, timeout=timeout, wait_for_workers=False)
    client = TCPStore("127.0.0.1", port, 1, is_master=False, timeout=timeout)
    out: dict[str, Any] = {"store": "TCPStore (libuv)" if master.libuvBackend else "TCPStore"}
    out["torch"] = torch.__version__
    out["poll_s"] = getattr(rollcall_module, "POLL_S", None)
    out["chunk"] = getattr(rollcall_module, "CHUNK", None)
    for n in sizes:
        info = RankInfo(
            launcher="slurm",
            rank=0,
            world_size=n,
            local_rank=0,
            local_world_size=RANKS_PER_NODE,
            node_rank=0,
            num_nodes=n // RANKS_PER_NODE,
            master_addr="127.0.0.1",
            master_port=port,
        )
        checkins = [_checkin(r, n) for r in range(n)]
        timings: dict[str, list[float]] = {
            k: []
            for k in ("checkin_loop", "rank0_roll_call", "validate", "multi_get", "verdict_read")
        }
        verdict_bytes = 0
        for rep in range(repeats):
            store = PrefixStore(f"bench/{n}/{rep}", client)
            start = time.perf_counter()
            for c in checkins[1:]:  # ranks 1..N-1, what roll_call makes each of them write
                check_in(store, c)
            timings["checkin_loop"].append(time.perf_counter() - start)
            # Rank 0 then waits until the others acknowledge reading the verdict; their reads
            # are timed below (verdict_read), so count them as done already.
            store.add("read", n - 1)

            start = time.perf_counter()
            verdict = roll_call(
                store, info, checkins[0], timeout=60.0, until=time.monotonic() + 70.0
            )
            timings["rank0_roll_call"].append(time.perf_counter() - start)
            assert verdict.ok, verdict.problems

            start = time.perf_counter()
            validate(verdict.checkins, n)
            timings["validate"].append(time.perf_counter() - start)

            start = time.perf_counter()
            store.multi_get([f"checkin/{i}" for i in range(n)])
            timings["multi_get"].append(time.perf_counter() - start)

            start = time.perf_counter()
            for _ in range(VERDICT_READ_SAMPLE):
                verdict_bytes = len(store.get("verdict"))
            timings["verdict_read"].append((time.perf_counter() - start) / VERDICT_READ_SAMPLE)
        out[str(n)] = {
            **{k: summary(v) for k, v in timings.items()},
            "verdict_bytes": verdict_bytes,
            "checkin_bytes": len(checkins[-1].to_json()),
            "all_verdict_reads_bytes": verdict_bytes * (n - 1),
            "rank0_per_rank_us": median(timings["rank0_roll_call"]) / n * 1e6,
        }
        note(f"roll call N={n}: rank 0 {median(timings['rank0_roll_call']) * 1000:.1f} ms")
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
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
