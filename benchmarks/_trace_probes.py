"""Phase probes for one rank of a bootstrap benchmark (bench_versions.py --trace).

Wraps the calls every version of distenv makes on its way to a first all_reduce — torch's
``TCPStore`` constructor, ``init_process_group``, ``all_reduce``, and the socket calls
``getaddrinfo`` and ``create_connection`` — with timers, and writes this rank's events as JSON to
``$BENCH_TRACE_DIR/<rank>.json`` at exit. Times are seconds from ``init_dist``'s entry. The probes
name torch's and the standard library's functions only, so the same probes fit distenv 0.1.0 and
later versions alike (both import ``TCPStore`` from ``torch._C._distributed_c10d`` at call time).

`phases` turns one rank's events into the spans bench_versions.py reports:

  before_store   init_dist's entry to the TCPStore constructor (detection, the master, the
                 device; for ranks other than 0 also the wait for rank 0's store to listen)
  store          the TCPStore constructor (rank 0: create the server; others: connect)
  roll_call      TCPStore's return to init_process_group's entry (scope check, roll call)
  process_group  init_process_group
  after_group    init_process_group's return to init_dist's return (distenv's group-up check)
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
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

TRACE_VAR = "BENCH_TRACE_DIR"


def install(rank: int, out_dir: Path, distenv_module: Any) -> None:
    """Wrap the probed calls for this process; write the events at exit."""
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

    init_dist = distenv_module.init_dist

    @functools.wraps(init_dist)
    def traced_init_dist(*args: Any, **kwargs: Any) -> Any:
        origin.append(time.perf_counter())
        try:
            return init_dist(*args, **kwargs)
        finally:
            events.append(("init_dist", 0.0, now()))

    distenv_module.init_dist = traced_init_dist
    c10d.TCPStore = timed("TCPStore", c10d.TCPStore)
    dist.init_process_group = timed("init_process_group", dist.init_process_group)
    dist.all_reduce = timed("all_reduce", dist.all_reduce, first_only=True)
    socket.getaddrinfo = timed("getaddrinfo", socket.getaddrinfo)
    socket.create_connection = timed("create_connection", socket.create_connection)

    def write() -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"{rank}.json").write_text(json.dumps({"rank": rank, "events": events}))

    atexit.register(write)


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
    init = first("init_dist")
    reduce = first("all_reduce")
    spans = {
        "before_store": store[0],
        "store": store[1] - store[0],
        "roll_call": group[0] - store[1],
        "process_group": group[1] - group[0],
        "after_group": init[1] - group[1],
        "all_reduce": reduce[1] - reduce[0],
        "probes": total("create_connection"),
        "resolve": total("getaddrinfo"),
    }
    return {name: value * 1000 for name, value in spans.items()}


def rank_of_env() -> int:
    """This rank's number as the launcher states it (benchmark plumbing)."""
    env = os.environ
    return int(env["RANK"] if "RANK" in env else env["SLURM_PROCID"])
