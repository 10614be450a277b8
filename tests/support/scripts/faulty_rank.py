"""A rank that can be told to fail at one point of init_dist, and reports where it is.

Used by the fault tests (tests/support/integration/faults.py). Every rank imports torch and distenv, waits
at a file barrier in `--events` until every rank of the launch has (so that one rank's slow
``import torch`` on a loaded machine does not change the scenario), then calls init_dist. It
appends one JSON line per event to ``<events>/rank<R>.jsonl``, each written with one ``os.write``:
``start`` (pid, host, just before init_dist), ``phase`` (entering a phase: ``connecting``,
``rollcall`` once checked in, ``init``, ``groupup``), ``fault`` (just before it injects its own
fault), ``error`` (a DistEnvError: class and message; exit status 1) and ``ok``.

Faults are injected by wrapping distenv's and torch's functions in this process only (never the
launcher or the store), one ``--fault RANK:WHAT[:SECONDS]`` each:

- ``ranks:R1,R2``: (RANK ``ranks``) only these ranks are started here, wait for them alone;
- ``late:S``: sleep S seconds before init_dist;
- ``kill-after-checkin``: SIGKILL itself right after its roll-call check-in is written;
- ``kill-in-init``: SIGKILL itself on entering init_process_group (after the roll call);
- ``stop-after-init``: SIGSTOP itself once its init_process_group returned (before the group-up
  check);
- ``stop-before-rollcall``, ``stop-after-rollcall``, ``stop-in-init``: SIGSTOP itself once its
  store is reached (before its check-in), once the roll call is over (before the process group),
  or on entering init_process_group;
- ``forge-up-then-stop``: as ``stop-after-init``, after writing what a forger on the network would
  to pass the group-up check of 0.2.0 and earlier: the "all up" key, and 1000 on the up count;
- ``hold-start``, ``hold-init``, ``hold-groupup``: stay until killed before init_dist, inside the bounded
  init_process_group call, or before the group-up check;
- ``kill-before-batch``: (a node leader) SIGKILL itself once it has gathered its node's check-ins,
  before it reports them to rank 0;
- ``stop-before-batch``: (a node leader) SIGSTOP itself once it has gathered its node's check-ins,
  holding them (a debugger, an overloaded node);
- ``forge-batch``: (a node leader) append what a forger on the network would to the roll call's
  batches (a line of garbage, no newline), then report its node as usual;
- ``kill-after-init``: SIGKILL itself once its init_process_group returned (before the group-up
  check);
- ``stop-after-publish``: SIGSTOP itself inside init_process_group, right after gloo published its
  address in the store and before it connected to any peer (its store's first ``set``).

The marker ``--tag`` (in argv) lets the test find every process of the launch in /proc.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HOLD_S = 600.0
BARRIER_S = 300.0


class Events:
    """This rank's event file."""

    def __init__(self, folder: Path, rank: int) -> None:
        self.fd = os.open(folder / f"rank{rank}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        self.rank = rank

    def write(self, event: str, **fields: Any) -> None:
        line = json.dumps({"rank": self.rank, "event": event, "t": time.time(), **fields})
        os.write(self.fd, (line + "\n").encode())


def rank_from_env() -> int:
    for name in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if name in os.environ:
            return int(os.environ[name])
    raise SystemExit("faulty_rank.py: no rank variable in the environment")


def size_from_env() -> int:
    for name in ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        if name in os.environ:
            return int(os.environ[name])
    raise SystemExit("faulty_rank.py: no world size in the environment")


def barrier(folder: Path, rank: int, ranks: list[int]) -> None:
    """Wait until every rank of the launch has imported torch (a file each)."""
    (folder / f"ready{rank}").touch()
    until = time.monotonic() + BARRIER_S
    while not all((folder / f"ready{r}").exists() for r in ranks):
        if time.monotonic() > until:
            raise SystemExit(f"faulty_rank.py: rank {rank}: the others never got ready")
        time.sleep(0.05)


def inject(what: str, events: Events) -> None:
    """Install the fault `what` in this process (see the module docstring)."""
    import torch.distributed as dist

    import distenv.bootstrap.group
    import distenv.bootstrap.init
    import distenv.bootstrap.nodes
    import distenv.bootstrap.rollcall

    def before(module: Any, name: str, action: Callable[[], None]) -> None:
        original = getattr(module, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            action()
            return original(*args, **kwargs)

        setattr(module, name, wrapper)

    def die(how: signal.Signals, where: str) -> Callable[[], None]:
        def act() -> None:
            events.write("fault", fault=f"{how.name} {where}", pid=os.getpid())
            os.kill(os.getpid(), how)
            # A signal a process sends itself takes effect asynchronously when other threads
            # exist (torch's): measured here, the sender ran on for several system calls, enough
            # to finish the group-up check. Wait, as a process stopped from outside would.
            time.sleep(5.0)

        return act

    def hold(where: str) -> Callable[[], None]:
        def act() -> None:
            events.write("fault", fault=f"held in {where}", pid=os.getpid())
            time.sleep(HOLD_S)

        return act

    if what == "kill-after-checkin":
        checked_in.append(die(signal.SIGKILL, "after its roll-call check-in"))
    elif what == "kill-in-init":
        before(dist, "init_process_group", die(signal.SIGKILL, "in init_process_group"))
    elif what == "stop-after-init":
        before(distenv.bootstrap.group, "group_up", die(signal.SIGSTOP, "after init_process_group"))
    elif what == "stop-before-rollcall":
        before(distenv.bootstrap.rollcall, "roll_call", die(signal.SIGSTOP, "before the roll call"))
    elif what == "stop-after-rollcall":
        before(distenv.bootstrap.init, "join_group", die(signal.SIGSTOP, "after the roll call"))
    elif what == "stop-in-init":
        before(dist, "init_process_group", die(signal.SIGSTOP, "in init_process_group"))
    elif what == "forge-up-then-stop":
        group_up = distenv.bootstrap.group.group_up
        stop = die(signal.SIGSTOP, "after forging the group-up keys")

        def forged(boot: Any, *args: Any, **kwargs: Any) -> Any:
            keys = boot.session.keys("up")
            boot.session.store.set(f"{keys}/all", "1")
            boot.session.store.add(f"{keys}/count", 1000)
            stop()
            return group_up(boot, *args, **kwargs)

        distenv.bootstrap.group.group_up = forged
    elif what == "kill-before-batch":
        before(
            distenv.bootstrap.nodes,
            "check_in_batch",
            die(signal.SIGKILL, "before reporting its node"),
        )
    elif what == "stop-before-batch":
        before(
            distenv.bootstrap.nodes,
            "check_in_batch",
            die(signal.SIGSTOP, "before reporting its node"),
        )
    elif what == "forge-batch":
        report = distenv.bootstrap.nodes.check_in_batch

        def forged_batch(store: Any, batch: Any) -> Any:
            from distenv.bootstrap.batches import shard_key

            events.write("fault", fault="forged a batch line", pid=os.getpid())
            store.append(shard_key(0), '{"leader": 0, "EVIL TEXT"')
            return report(store, batch)

        distenv.bootstrap.nodes.check_in_batch = forged_batch
    elif what == "kill-after-init":
        before(distenv.bootstrap.group, "group_up", die(signal.SIGKILL, "after init_process_group"))
    elif what == "stop-after-publish":
        init = dist.init_process_group
        stop = die(signal.SIGSTOP, "after publishing its gloo address")

        def publishing(*args: Any, store: Any, **kwargs: Any) -> Any:
            return init(*args, store=stop_after_first_set(store, stop), **kwargs)

        dist.init_process_group = publishing  # type: ignore[assignment]
    elif what == "hold-init":
        before(dist, "init_process_group", hold("init_process_group"))
    elif what == "hold-groupup":
        before(distenv.bootstrap.group, "group_up", hold("the group-up check"))
    else:
        raise SystemExit(f"faulty_rank.py: unknown fault {what!r}")


def stop_after_first_set(store: Any, stop: Callable[[], None]) -> Any:
    """Return `store` wrapped so that `stop` runs right after its first ``set``: gloo's first
    write in ``init_process_group`` is this rank's address, before it connects to any peer."""
    import torch.distributed as dist

    class Stopping(dist.Store):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.sets = 0

        def set(self, key: str, value: Any) -> None:
            store.set(key, value)
            self.sets += 1
            if self.sets == 1:
                stop()

        def get(self, key: str) -> Any:
            return store.get(key)

        def wait(self, keys: Any, timeout: Any = None) -> Any:
            return store.wait(keys) if timeout is None else store.wait(keys, timeout)

        def add(self, key: str, amount: int) -> Any:
            return store.add(key, amount)

        def check(self, keys: Any) -> Any:
            return store.check(keys)

        def compare_set(self, key: str, expected: Any, desired: Any) -> Any:
            return store.compare_set(key, expected, desired)

        def multi_get(self, keys: Any) -> Any:
            return store.multi_get(keys)

        def multi_set(self, keys: Any, values: Any) -> Any:
            return store.multi_set(keys, values)

    return Stopping()


# Actions run right after this rank's check-in is written (the roll call's "written" count).
checked_in: list[Callable[[], None]] = []


class CheckInHook:
    """The roll call's store, running `checked_in` after this rank's check-in is counted."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def add(self, key: str, value: int) -> int:
        result = int(self._store.add(key, value))
        if key == "written" and value == 1:
            for action in checked_in:
                action()
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def trace_phases(events: Events) -> None:
    """Write a ``phase`` event as this rank enters each phase of init_dist."""
    import torch.distributed as dist

    import distenv.bootstrap.flat
    import distenv.bootstrap.group
    import distenv.bootstrap.rollcall

    # Patched where they are looked up: `distenv.bootstrap.flat.StoreChannel.reach` connects,
    # `distenv.bootstrap.rollcall.meet` holds the roll call.
    connect, roll_call = (
        distenv.bootstrap.flat.connect_store,
        distenv.bootstrap.rollcall.roll_call,
    )
    init, group_up = dist.init_process_group, distenv.bootstrap.group.group_up

    def traced_connect(*args: Any, **kwargs: Any) -> Any:
        events.write("phase", phase="connecting")
        return connect(*args, **kwargs)

    def traced_roll_call(store: Any, *args: Any, **kwargs: Any) -> Any:
        checked_in.insert(0, lambda: events.write("phase", phase="rollcall"))
        return roll_call(CheckInHook(store), *args, **kwargs)

    def traced_init(*args: Any, **kwargs: Any) -> Any:
        events.write("phase", phase="init")
        return init(*args, **kwargs)

    def traced_group_up(*args: Any, **kwargs: Any) -> Any:
        events.write("phase", phase="groupup")
        return group_up(*args, **kwargs)

    distenv.bootstrap.flat.connect_store = traced_connect
    distenv.bootstrap.rollcall.roll_call = traced_roll_call
    dist.init_process_group = traced_init  # type: ignore[assignment]
    distenv.bootstrap.group.group_up = traced_group_up


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=Path, required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--fault", action="append", default=[], help="RANK:WHAT[:SECONDS]")
    args = parser.parse_args()
    rank, world = rank_from_env(), size_from_env()
    events = Events(args.events, rank)
    import torch  # noqa: F401 -- imported before the barrier: its cost is not the scenario's

    import distenv

    trace_phases(events)
    late = 0.0
    present = list(range(world))
    for spec in args.fault:
        who, what, *seconds = spec.split(":")
        if who == "ranks":  # only these ranks are started (one node of several)
            present = [int(r) for r in what.split(",")]
            continue
        if int(who) != rank:
            continue
        if what == "late":
            late = float(seconds[0])
        elif what == "hold-start":
            late = HOLD_S
        else:
            inject(what, events)
    barrier(args.events, rank, present)
    if late:
        if late == HOLD_S:
            events.write("fault", fault="held before init_dist", pid=os.getpid())
        time.sleep(late)
    events.write("start", pid=os.getpid(), host=socket.gethostname())
    try:
        info = distenv.init_dist()
    except distenv.DistEnvError as exc:
        events.write("error", error=type(exc).__name__, message=str(exc))
        print(f"ERROR rank {rank}: {type(exc).__name__}: {exc}", flush=True)
        return 1
    events.write("ok", world=info.world_size)
    print(f"OK rank {rank}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
