"""Phase probes for one rank of a bootstrap benchmark (bench_bootstrap.py, bench_versions.py --trace).

Wraps the calls every way of bootstrapping makes on its way to a first all_reduce — torch's
``TCPStore`` constructor, ``init_process_group``, ``all_reduce``, and the socket calls
``getaddrinfo`` and ``create_connection`` — with timers, and writes this rank's events as JSON to
``$BENCH_TRACE_DIR/<rank>.json`` at exit. Times are seconds from the entry to the bootstrap call
that `install` wraps (``distenv.init_dist``, or the bare shim). The probes name torch's and the
standard library's functions only, so the same probes fit distenv 0.1.0, later versions and bare
torch alike (distenv imports ``TCPStore`` from ``torch._C._distributed_c10d`` at call time; bare
``env://`` creates its store inside ``init_process_group``).

`phases` turns one rank's events into the spans the benchmarks report:

  before_store   the bootstrap's entry to its store (detection, the master, the device; for
                 ranks other than 0 also the wait for rank 0's store to listen)
  store          the TCPStore constructor (rank 0: create the server; others: connect)
  roll_call      the store's return to init_process_group's entry (distenv's scope check and
                 roll call; 0 for bare torch)
  process_group  init_process_group, less a store it created itself (bare ``env://``)
  after_group    init_process_group's return to the bootstrap's return (distenv's group-up check)
  all_reduce     the first all_reduce
  probes         time inside create_connection (the others' wait for rank 0's store)
  resolve        time inside getaddrinfo
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

TRACE_VAR = "BENCH_TRACE_DIR"


def install(rank: int, out_dir: Path) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wrap the probed calls for this process (events written at exit); return `traced`, which
    wraps the bootstrap call whose entry is every event's origin."""
    import torch._C._distributed_c10d as c10d
    import torch.distributed as dist

    origin: list[float] = []
    events: list[tuple[str, float, float]] = []

    def now() -> float:
        return time.perf_counter() - (origin[0] if origin else 0.0)

    def timed(
        name: str, call: Callable[..., Any], *, first_only: bool = False
    ) -> Callable[..., Any]:
        @functools.wraps(call)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not origin or (first_only and any(e[0] == name for e in events)):
                return call(*args, **kwargs)
            start = now()
            try:
                return call(*args, **kwargs)
            finally:
                events.append((name, start, now()))

        return wrapper

    def traced(bootstrap: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(bootstrap)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            origin.append(time.perf_counter())
            try:
                return bootstrap(*args, **kwargs)
            finally:
                events.append(("bootstrap", 0.0, now()))

        return wrapper

    c10d.TCPStore = timed("TCPStore", c10d.TCPStore)
    # Bare env:// makes its store in torch.distributed.rendezvous (the package's attribute of
    # that name is a function).
    sys.modules["torch.distributed.rendezvous"].TCPStore = c10d.TCPStore
    dist.init_process_group = timed("init_process_group", dist.init_process_group)
    dist.all_reduce = timed("all_reduce", dist.all_reduce, first_only=True)
    socket.getaddrinfo = timed("getaddrinfo", socket.getaddrinfo)
    socket.create_connection = timed("create_connection", socket.create_connection)

    def write() -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"{rank}.json").write_text(json.dumps({"rank": rank, "events": events}))

    atexit.register(write)
    return traced


def phases(events: list[list[Any]]) -> dict[str, float]:
    """Return one rank's spans (ms, see the module docstring) from its events."""

    def first(name: str) -> tuple[float, float]:
        for event in events:
            if event[0] == name:
                return float(event[1]), float(event[2])
        raise ValueError(f"no {name} event")

    def total(name: str) -> float:
        return sum(float(e[2]) - float(e[1]) for e in events if e[0] == name)

    store = first("TCPStore")
    group = first("init_process_group")
    boot = first("bootstrap")
    reduce = first("all_reduce")
    inside = group[0] <= store[0] and store[1] <= group[1]  # bare env:// makes its own store
    spans = {
        "before_store": min(store[0], group[0]),
        "store": store[1] - store[0],
        "roll_call": 0.0 if inside else group[0] - store[1],
        "process_group": group[1] - group[0] - (store[1] - store[0] if inside else 0.0),
        "after_group": boot[1] - group[1],
        "all_reduce": reduce[1] - reduce[0],
        "probes": total("create_connection"),
        "resolve": total("getaddrinfo"),
    }
    return {name: value * 1000 for name, value in spans.items()}


def rank_of_env() -> int:
    """This rank's number as the launcher states it (benchmark plumbing)."""
    env = os.environ
    return int(env["RANK"] if "RANK" in env else env["SLURM_PROCID"])
