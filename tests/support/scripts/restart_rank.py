"""A rank that fails on purpose at chosen attempts: the restart tests' and benchmark's workload.

``restart_rank.py --out DIR --tag TAG [--plan PLAN] [--mode MODE]``

Each rank appends one JSON line per event to ``DIR/events.jsonl`` (one ``os.write`` each, well
under PIPE_BUF, so lines of concurrent ranks never mix): ``start`` just before init_dist (with
``exec``, when this process was started, from /proc), ``fail`` just before an injected failure,
``up`` after the first all_reduce, ``ok`` at the end. Every line has the rank, the attempt
(``TORCHELASTIC_RESTART_COUNT``), the host, the pid and the wall time ``t``.

PLAN lists failures, ``ATTEMPT:RANK:PHASE:HOW`` separated by commas (ATTEMPT ``*``: every attempt):
PHASE ``start`` (before init_dist, once every rank of the attempt got there), ``init`` (on entering torch's init_process_group, inside
init_dist), ``train`` (after an all_reduce); HOW ``raise`` (RuntimeError), ``exitN`` (sys.exit(N)),
``kill`` (SIGKILL itself, as the OOM killer would), ``slowraise`` (raise, then take `LINGER_S` more to
exit once distenv has ended the process group, so that its peers fail first: an atexit handler
registered before init_dist's runs after it).

MODE ``refuse`` asks init_dist for the MPI launcher, which is not there (distenv refuses it);
``import`` imports a module that does not exist; ``usage`` refuses its own arguments as argparse
does; ``hold`` stays in training until killed, after its ``up`` line.

The marker ``--tag`` (in argv) lets a test find every process of the launch in /proc.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

#: Seconds a ``slowraise`` rank lingers at exit after its process group is gone.
LINGER_S = 3.0


def started_at() -> float:
    """Return when this process started (wall time): now minus its age, both from /proc.

    The age is the boot clock (/proc/uptime) minus the process's start in clock ticks after
    boot (/proc/self/stat), both within 10 ms; /proc/stat's btime, whole seconds, would be off by
    up to a second.
    """
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


class Events:
    """This rank's lines in the shared event file."""

    def __init__(self, path: Path, rank: int, attempt: int) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        self.base = {"rank": rank, "attempt": attempt, "host": socket.gethostname()}

    def write(self, event: str, **fields: Any) -> None:
        record = {"event": event, **self.base, "pid": os.getpid(), "t": time.time(), **fields}
        os.write(self.fd, (json.dumps(record) + "\n").encode())


def all_started(events: Events, path: Path, limit: float = 120.0) -> None:
    """Wait until every rank of this attempt has written its ``start`` line (or `limit` passed),
    so that a failure before init_dist leaves every rank's start of the attempt measured."""
    world, attempt = int(os.environ["WORLD_SIZE"]), events.base["attempt"]
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        started = {e["rank"] for e in lines if e["event"] == "start" and e["attempt"] == attempt}
        if len(started) >= world:
            return
        time.sleep(0.02)


def fail(events: Events, how: str, phase: str) -> None:
    """Fail as `how` says, after saying so."""
    events.write("fail", phase=phase, how=how)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how.startswith("exit"):
        sys.exit(int(how[4:]))
    raise RuntimeError(f"injected failure in {phase} at attempt {events.base['attempt']}")


def planned(plan: str, attempt: int, rank: int) -> tuple[str, str] | None:
    """Return ``(phase, how)`` of this rank's failure at this attempt, if the plan has one."""
    for item in filter(None, plan.split(",")):
        when, who, phase, how = item.split(":")
        if when in ("*", str(attempt)) and int(who) == rank:
            return phase, how
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--plan", default="")
    parser.add_argument("--mode", default="normal")
    args = parser.parse_args()
    rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    events = Events(args.out / "events.jsonl", rank, attempt)
    if args.mode == "usage":
        parser.error("--mode usage: this script refuses its arguments, as asked")
    if args.mode == "import":
        import distenv_test_no_such_module  # noqa: F401
    failure = planned(args.plan, attempt, rank)
    if failure is not None and failure[1] == "slowraise":
        atexit.register(time.sleep, LINGER_S)
    import distenv

    if args.mode == "refuse":  # refused by detection, before torch is imported
        events.write("start", exec=started_at())
        distenv.init_dist(launcher="mpi")
    import torch
    import torch.distributed as dist

    events.write("start", exec=started_at())
    if failure is not None and failure[0] == "start":
        all_started(events, args.out / "events.jsonl")
        fail(events, failure[1], "start")
    if failure is not None and failure[0] == "init":
        real = dist.init_process_group

        def init_then_fail(*a: Any, **k: Any) -> Any:
            fail(events, failure[1], "init")
            return real(*a, **k)

        dist.init_process_group = init_then_fail
    info = distenv.init_dist(launcher="auto")
    total = torch.ones(1)
    dist.all_reduce(total)
    events.write("up", restart_count=info.restart_count, sum=total.item())
    if failure is not None and failure[0] == "train":
        fail(events, failure[1], "train")
    if args.mode == "hold":
        while True:
            time.sleep(1)
    dist.barrier()
    events.write("ok", restart_count=info.restart_count, world_size=info.world_size)


if __name__ == "__main__":
    main()
