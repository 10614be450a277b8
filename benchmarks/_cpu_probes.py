"""CPU probes for one rank of a bootstrap benchmark (bench_bootstrap.py --profile).

Where a rank's CPU goes between the start line and its first finished all_reduce, per phase of
distenv's bootstrap (and of bare ``env://``: torch's calls and the imports only). Each probe
wraps one function with a timer of the calling thread's CPU (``time.thread_time``) and counts it
exclusively: a probed call inside another probed call is taken out of the outer one, so the
phases add up. What no probe covers in the rank's process CPU (``time.process_time``: every
thread) is ``other``: rank 0's store server thread, gloo's threads, the main thread's waits in
slices while the bootstrap's thread works, and distenv's glue between the probed calls.

Probes name the module attribute through which the bootstrap calls a function (``init`` imports
``locate_rank`` by name, so the probe patches ``distenv.bootstrap.init.locate_rank``), and only
modules already imported are patched: bare ``env://`` gets torch's probes and the imports only.
A probe whose attribute no longer exists is skipped, so the table shows what a version still has.
Imports are probed at ``importlib._bootstrap._find_and_load`` (what every first ``import`` of a
module calls), outermost only.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CPU_VAR = "BENCH_CPU_DIR"

# phase -> the attributes it probes ("module:attribute" or "module:Class.method"), in the order
# a rank meets them. The page's table keeps this order.
PROBES: dict[str, tuple[str, ...]] = {
    "settings": ("distenv.bootstrap.init:Settings.read",),
    "detection": ("distenv.bootstrap.init:locate_rank",),
    "preparation": ("distenv.bootstrap.init:prepare", "distenv.bootstrap.init:rank_backend"),
    "session": ("distenv.bootstrap.session:Session.of",),
    "check-in record": ("distenv.bootstrap.init:make_checkin",),
    "network prediction": (
        "distenv.bootstrap.flat:probed_backends",
        "distenv.bootstrap.flat:predict",
        "distenv.bootstrap.flat:offer",
        "distenv.bootstrap.flat:dial",
        "distenv.bootstrap.rollcall:judged",
        "distenv.bootstrap.init:network_exports",
    ),
    "descriptors": ("distenv.bootstrap.flat:ensure_descriptors",),
    "store connect": ("distenv.bootstrap.flat:connect_store",),
    "scope claim and check": (
        "distenv.bootstrap.session:Session.claim",
        "distenv.bootstrap.session:Session.check",
    ),
    "check-in": ("distenv.bootstrap.flat:FlatChannel.check_in",),
    "gather and verdict (rank 0)": ("distenv.bootstrap.flat:FlatChannel.gather",),
    "publish (rank 0)": ("distenv.bootstrap.rollcall:publish",),
    "await verdict": ("distenv.bootstrap.flat:FlatChannel.await_verdict",),
    "roll call glue": (
        "distenv.bootstrap.init:meet",
        "distenv.bootstrap.init:fill_layout",
    ),
    "group-up check": ("distenv.bootstrap.init:join_group",),
    "init_process_group": ("torch.distributed:init_process_group",),
    "all_reduce": ("torch.distributed:all_reduce",),
    "imports": ("importlib._bootstrap:_find_and_load",),
}
OTHER = "other"


class Meter:
    """Exclusive thread-CPU per phase: each thread keeps a stack of the probed calls it is in."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.local = threading.local()
        self.on = False

    def wrap(self, phase: str, call: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(call)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            stack: list[list[float]] | None = getattr(self.local, "stack", None)
            if stack is None:
                stack = self.local.stack = []
            if not self.on or (phase == "imports" and any(f[1] == -1.0 for f in stack)):
                return call(*args, **kwargs)
            # [start, marker (-1: an import, nested imports are its own), time of nested probes]
            frame = [time.thread_time(), -1.0 if phase == "imports" else 0.0, 0.0]
            stack.append(frame)
            try:
                return call(*args, **kwargs)
            finally:
                stack.pop()
                inclusive = time.thread_time() - frame[0]
                self.spent[phase] = self.spent.get(phase, 0.0) + inclusive - frame[2]
                self.calls[phase] = self.calls.get(phase, 0) + 1
                if stack:
                    stack[-1][2] += inclusive

        return wrapper


def _patch(meter: Meter, phase: str, target: str) -> bool:
    module_name, _, dotted = target.partition(":")
    module = sys.modules.get(module_name)
    if module is None:
        return False
    owner: Any = module
    *path, name = dotted.split(".")
    for part in path:
        owner = getattr(owner, part, None)
        if owner is None:
            return False
    raw = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    if raw is None:
        return False
    if isinstance(raw, classmethod | staticmethod):
        setattr(owner, name, type(raw)(meter.wrap(phase, raw.__func__)))
    else:
        setattr(owner, name, meter.wrap(phase, raw))
    return True


def install(rank: int, out_dir: Path) -> tuple[Callable[[], None], Callable[[], None]]:
    """Patch the probes of the modules imported so far; return `start` and `stop`, which bound
    the measured span. This rank's phases (ms) are written to ``out_dir/<rank>.json`` at exit."""
    importlib.import_module("importlib._bootstrap")
    meter = Meter()
    probed = [t for phase, ts in PROBES.items() for t in ts if _patch(meter, phase, t)]
    span: list[float] = []

    def start() -> None:
        span[:] = [time.process_time(), time.perf_counter()]
        meter.on = True

    def stop() -> None:
        meter.on = False
        span[:] = [time.process_time() - span[0], time.perf_counter() - span[1]]

    def write() -> None:
        if len(span) != 2:
            return
        total = span[0] * 1000
        phases = {p: meter.spent[p] * 1000 for p in PROBES if p in meter.spent}
        phases[OTHER] = total - sum(phases.values())
        out_dir.mkdir(parents=True, exist_ok=True)
        record = {
            "rank": rank,
            "cpu_ms": total,
            "wall_ms": span[1] * 1000,
            "phases": phases,
            "calls": meter.calls,
            "probed": probed,
        }
        (out_dir / f"{rank}.json").write_text(json.dumps(record))

    atexit.register(write)
    return start, stop
