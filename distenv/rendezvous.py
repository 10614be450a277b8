"""The rendezvous: rank 0's store, the keys distenv writes there, the records, and the roll call.

Every rank reaches the job's one store (rank 0's TCPStore, or torchrun's agent store) within the
rendezvous timeout (`connect_store`), then the roll call runs over it under a prefix, before the
process group exists, so nobody hangs silently:

1. every rank writes its `CheckIn` under a key numbered by its arrival (``store.add``), so two
   processes that both claim rank 3 are both seen, then counts itself as written;
2. rank 0 waits until ``world_size`` check-ins arrived or the timeout passed, then validates them
   (`validate`, a pure function) and publishes one verdict; on timeout the verdict names the ranks
   that never arrived and the hosts they were expected on;
3. every other rank waits for the verdict (same timeout, plus a grace for rank 0's own wait) and
   raises what it says.

Rank 0 reads N records and every rank reads one verdict: O(N) store traffic, not O(N^2).
Waits poll in short slices so that SIGINT/SIGTERM end the process promptly. `meet` runs the whole
sequence for `init_dist` and `distenv doctor`; torch is imported inside the functions.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from types import FrameType
from typing import TYPE_CHECKING, Any

from distenv.device import device_identity
from distenv.errors import (
    DistEnvError,
    InitError,
    MasterResolutionError,
    RendezvousError,
    RendezvousTimeoutError,
)
from distenv.master import host_port
from distenv.rankinfo import RankInfo
from distenv.settings import TIMEOUT_VAR, Settings

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

__all__ = [
    "DOCTOR_PREFIX",
    "CheckIn",
    "Verdict",
    "connect_store",
    "first_line",
    "group_prefix",
    "interruptible",
    "make_checkin",
    "master_address",
    "meet",
    "roll_call",
    "validate",
]

# Key prefixes in the store. torchrun's agent store outlives a worker restart; keys of one attempt
# must not be read by the next (torch prefixes "/worker/attempt_N" for the same reason).
ROLLCALL_PREFIX = "distenv/rollcall"
GROUP_PREFIX = "distenv/pg"
DOCTOR_PREFIX = "distenv/doctor"


def rollcall_prefix(settings: Settings) -> str:
    """Return the prefix of `init_dist`'s roll call for this torchrun attempt."""
    return f"{ROLLCALL_PREFIX}/{settings.restart}"


def group_prefix(settings: Settings) -> str:
    """Return the prefix under which torch's process group keeps its keys, for this attempt."""
    return f"{GROUP_PREFIX}/{settings.restart}"


def master_address(info: RankInfo) -> str:
    """Return ``host:port`` of rank 0's store."""
    return host_port(str(info.master_addr), int(info.master_port or 0))


POLL_S = 0.5
# Rank 0 publishes the verdict only after its own wait; the others allow it this much longer.
VERDICT_GRACE_S = 10.0


@dataclass(frozen=True)
class CheckIn:
    """What one rank reports about itself."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    hostname: str
    pid: int
    launcher: str
    master: str
    backend: str
    torch_version: str
    device: str | None = None
    allow_gpu_sharing: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> CheckIn:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class Verdict:
    """Rank 0's conclusion, published to every rank."""

    ok: bool
    problems: tuple[str, ...]
    checkins: tuple[CheckIn, ...]

    def to_json(self) -> str:
        return json.dumps(
            {
                "ok": self.ok,
                "problems": list(self.problems),
                "checkins": [asdict(c) for c in self.checkins],
            }
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> Verdict:
        data = json.loads(text)
        return cls(
            ok=data["ok"],
            problems=tuple(data["problems"]),
            checkins=tuple(CheckIn(**c) for c in data["checkins"]),
        )


def _agreement(checkins: Sequence[CheckIn], field: str) -> list[str]:
    values: dict[Any, list[int]] = defaultdict(list)
    for c in checkins:
        values[getattr(c, field)].append(c.rank)
    if len(values) <= 1:
        return []
    parts = "; ".join(
        f"{value!r} on ranks {_ranks(r)}" for value, r in sorted(values.items(), key=str)
    )
    return [f"ranks disagree on {field}: {parts}"]


def _ranks(ranks: Sequence[int]) -> str:
    shown = ", ".join(str(r) for r in sorted(ranks)[:8])
    return shown + (f", ... ({len(ranks)} in all)" if len(ranks) > 8 else "")


def validate(checkins: Sequence[CheckIn], world_size: int) -> list[str]:
    """Return what is wrong with a complete set of check-ins (an empty list when all is well).

    Checks: agreement on world size, master, backend and torch version; unique ranks covering
    ``0..world_size-1``; unique local ranks per host; for MPI, the assumed by-node placement
    against the host names; no two ranks of one host on the same physical GPU unless sharing was
    allowed.
    """
    problems: list[str] = []
    for field in ("world_size", "master", "backend", "torch_version", "launcher"):
        problems += _agreement(checkins, field)

    by_rank: dict[int, list[CheckIn]] = defaultdict(list)
    for c in checkins:
        by_rank[c.rank].append(c)
    for rank, same in sorted(by_rank.items()):
        if len(same) > 1:
            who = ", ".join(f"pid {c.pid} on {c.hostname}" for c in same)
            problems.append(f"rank {rank} was claimed by {len(same)} processes ({who})")
    missing = sorted(set(range(world_size)) - set(by_rank))
    if missing and not any(len(s) > 1 for s in by_rank.values()):
        problems.append(f"ranks {_ranks(missing)} did not check in")

    # Keyed by node as well as host: tests (and `distenv run --nnodes 2` twice on one machine)
    # legitimately run several "nodes" on one host.
    local = Counter((c.hostname, c.node_rank, c.local_rank) for c in checkins)
    for (host, node, local_rank), count in sorted(local.items()):
        if count > 1:
            problems.append(f"{count} ranks on {host} (node {node}) share local rank {local_rank}")

    if checkins and checkins[0].launcher == "mpi":
        hosts_of_node: dict[int, set[str]] = defaultdict(set)
        for c in checkins:
            hosts_of_node[c.node_rank].add(c.hostname)
        for node, hosts in sorted(hosts_of_node.items()):
            if len(hosts) > 1:
                problems.append(
                    f"MPI ranks assumed on node {node} (by-node placement) run on "
                    f"{sorted(hosts)}: the job does not place ranks node by node; export "
                    "MASTER_ADDR and use --map-by node-compatible placement"
                )

    devices: dict[tuple[str, str], list[CheckIn]] = defaultdict(list)
    for c in checkins:
        if c.device is not None:
            devices[(c.hostname, c.device)].append(c)
    for (host, device), users in sorted(devices.items()):
        if len(users) > 1 and not all(c.allow_gpu_sharing for c in users):
            problems.append(
                f"ranks {_ranks([c.rank for c in users])} on {host} drive the same GPU "
                f"({device}); give each rank its own GPU or pass allow_gpu_sharing=True"
            )
    return problems


def _expected_host(rank: int, info: RankInfo, arrived: Sequence[CheckIn]) -> str:
    """Guess where a missing rank should run, from the ranks that did arrive."""
    node = rank // info.local_world_size if info.world_size % info.local_world_size == 0 else None
    hosts = {c.hostname for c in arrived if node is not None and c.node_rank == node}
    if hosts:
        return ", ".join(sorted(hosts))
    return f"node {node}" if node is not None else "an unknown host"


class _InterruptedError(Exception):
    pass


@contextmanager
def interruptible(what: str) -> Iterator[None]:
    """Turn SIGTERM into a prompt, clear exit while blocked in the roll call (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise _InterruptedError(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    except (_InterruptedError, KeyboardInterrupt) as exc:
        name = str(exc) or "SIGINT"
        raise RendezvousError(
            "distenv",
            f"interrupted by {name} during {what}",
            hint="the job was stopped (a scheduler time limit, scancel, Ctrl-C); nothing to fix "
            "here unless that was not intended",
        ) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def _pauses(cap: float) -> Iterator[float]:
    """Yield sleep lengths: 1 ms, doubling up to `cap` (quick when peers are quick)."""
    pause = 0.001
    while True:
        yield pause
        pause = min(pause * 2, cap)


def _poll_cap(world_size: int) -> float:
    """How long the N - 1 waiting ranks may sleep between polls of rank 0's store.

    Short for small jobs (every millisecond shows in their start-up), longer for large ones so
    the store is asked at most about 2000 times a second in all. Store.wait() would avoid polling,
    but it cannot be interrupted by a signal and logs a warning each time it times out.
    """
    return min(max(world_size / 2000, 0.002), POLL_S)


def _wait_count(store: Any, key: str, count: int, deadline: float) -> None:
    # Only rank 0 waits on counts: one poller, so it can afford to look often.
    pauses = _pauses(0.002)
    while int(store.add(key, 0)) < count and time.monotonic() < deadline:
        time.sleep(next(pauses))


def _wait_key(store: Any, key: str, deadline: float, cap: float) -> bool:
    pauses = _pauses(cap)
    while True:
        if store.check([key]):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(next(pauses))


def roll_call(
    store: Any, info: RankInfo, checkin: CheckIn, *, timeout: float, check: bool = True
) -> Verdict:
    """Check in, and on rank 0 gather, validate and publish; return the verdict or raise it.

    Args:
        store: A torch.distributed Store all ranks share (use a PrefixStore per attempt).
        info: This rank's RankInfo.
        checkin: What this rank reports.
        timeout: Seconds rank 0 waits for everybody (others wait a little longer for the verdict).
        check: Raise when the verdict is negative (`distenv doctor` passes False to print it).

    Raises:
        RendezvousTimeoutError: Ranks missing (rank 0), or no verdict arrived (others).
        RendezvousError: The verdict found problems, or a signal interrupted the wait.
    """
    with interruptible("the roll call"):
        arrival = int(store.add("arrived", 1))
        store.set(f"checkin/{arrival}", checkin.to_json())
        store.add("written", 1)  # counted after the write, so rank 0 never reads a missing key
        if info.rank == 0:
            verdict = _gather(store, info, timeout)
            # The others need the outcome, not every record: a verdict carrying N check-ins,
            # read by N - 1 ranks, makes rank 0's store serve O(N^2) bytes (docs/benchmarks.md).
            # Rank 0 keeps the full verdict (distenv doctor prints its table there).
            store.set("verdict", replace(verdict, checkins=()).to_json())
            # Rank 0 may exit next (a negative verdict, `distenv doctor`), and its store with it:
            # let the others read first. They poll, so this costs milliseconds.
            arrived = len(verdict.checkins) - 1
            _wait_count(store, "read", arrived, time.monotonic() + VERDICT_GRACE_S)
        else:
            try:
                found = _wait_key(
                    store,
                    "verdict",
                    time.monotonic() + timeout + VERDICT_GRACE_S,
                    _poll_cap(info.world_size),
                )
                published = Verdict.from_json(store.get("verdict")) if found else None
                store.add("read", 1)
            except RuntimeError as exc:  # torch's DistError: the store went away
                raise RendezvousError(
                    info.launcher,
                    f"rank {info.rank} lost rank 0's store at {checkin.master}: {exc}".split("\n")[
                        0
                    ],
                    hint="rank 0 exited during the roll call; its log says why",
                ) from None
            if published is None:
                raise RendezvousTimeoutError(
                    info.launcher,
                    f"rank {info.rank} checked in at {checkin.master} but rank 0 published no "
                    f"verdict within {timeout + VERDICT_GRACE_S:.0f} s",
                    hint="rank 0 may have died or be stuck before init_dist; check its log",
                )
            verdict = published
    if check and not verdict.ok:
        error = (
            RendezvousTimeoutError
            if "did not check in" in " ".join(verdict.problems)
            else (RendezvousError)
        )
        raise error(
            info.launcher,
            "roll call failed: " + "; ".join(verdict.problems),
            hint="run `distenv doctor` under the same launcher for a per-rank table",
        )
    return verdict


def _gather(store: Any, info: RankInfo, timeout: float) -> Verdict:
    deadline = time.monotonic() + timeout
    world = info.world_size
    _wait_count(store, "written", world, deadline)
    count = min(int(store.add("written", 0)), 10 * world)
    keys = [f"checkin/{i}" for i in range(1, count + 1)]
    if int(store.add("arrived", 0)) == count and hasattr(store, "multi_get"):
        # Every arrival wrote its record: fetch them all in one round trip.
        records = store.multi_get(keys)
    else:
        records = [store.get(key) for key in keys if store.check([key])]
    checkins = tuple(CheckIn.from_json(record) for record in records)
    if count < world:
        seen = {c.rank for c in checkins}
        missing = [r for r in range(world) if r not in seen]
        lines = [
            f"rank {r} (expected on {_expected_host(r, info, checkins)})" for r in missing[:16]
        ]
        more = f" and {len(missing) - 16} more" if len(missing) > 16 else ""
        problem = (
            f"{len(missing)} of {world} ranks did not check in within {timeout:.0f} s: "
            + ", ".join(lines)
            + more
        )
        return Verdict(False, (problem,), checkins)
    problems = validate(checkins, world)
    return Verdict(not problems, tuple(problems), checkins)


def first_line(exc: BaseException) -> str:
    """Return the first line of an exception's text (torch's carry C++ stack dumps after it)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _check_resolvable(info: RankInfo, host: str, port: int) -> None:
    """Raise at once, naming MASTER_ADDR, when the master's name does not resolve here."""
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise MasterResolutionError(
            info.launcher,
            f"rank {info.rank} cannot resolve the master address {host!r} "
            f"($MASTER_ADDR={host!r}): {exc.strerror}",
            hint="use a name every node resolves (or its IP address); on clusters whose fast "
            "network has other names, set DISTENV_MASTER_ADDR_FORMAT, e.g. '{host}-ib'",
            variable="MASTER_ADDR",
            value=host,
        ) from None


def _wait_reachable(info: RankInfo, host: str, port: int, deadline: float, limit: float) -> None:
    """Return once ``host:port`` accepts a TCP connection; raise at `deadline`.

    Probing with a plain socket first keeps torch's C++ retry logs and stack dumps out of the
    user's first message, and bounds the wait exactly.
    """
    # Start at 1 ms: rank 0 usually listens within milliseconds of the others' first probe, and
    # a 50 ms first pause cost every srun bootstrap ~100 ms (docs/benchmarks.md).
    delay, last = 0.001, ""
    while True:
        remaining = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(min(remaining, 5.0), 0.1)):
                return
        except OSError as exc:
            last = str(exc) or type(exc).__name__
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RendezvousTimeoutError(
                info.launcher,
                f"rank {info.rank} of {info.world_size} could not reach rank 0's store at "
                f"{host_port(host, port)} within {limit:g} s (last error: {last})",
                hint="check that rank 0 is running and that MASTER_ADDR/MASTER_PORT name a host "
                "and port this node can reach (a firewall, or DISTENV_MASTER_ADDR_FORMAT for the "
                f"right interface); raise the limit with rendezvous_timeout= or ${TIMEOUT_VAR}",
                variable="MASTER_ADDR",
                value=host,
            )
        # Back off: rank 0 may still be importing torch.
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 1.0)


def connect_store(info: RankInfo, seconds: float, *, agent_store: bool) -> Store:
    """Create (rank 0) or reach (others) the TCPStore at the master within `seconds`.

    Under torchrun's agent store (`agent_store`) every rank, rank 0 included, is a client.
    """
    import torch.distributed as dist

    # The classes' home; torch.distributed re-exports them without declaring it to type checkers.
    from torch._C._distributed_c10d import TCPStore

    host, port = str(info.master_addr), int(info.master_port or 0)
    _check_resolvable(info, host, port)
    timeout = datetime.timedelta(seconds=seconds)
    if info.rank == 0 and not agent_store:
        try:
            return TCPStore(
                host, port, info.world_size, is_master=True, timeout=timeout, wait_for_workers=False
            )
        except dist.DistError as exc:
            text = str(exc)
            if "EADDRINUSE" in text or "address already in use" in text.lower():
                raise DistEnvError(
                    info.launcher,
                    f"rank 0 cannot listen on port {port} ($MASTER_PORT={port!r}) for the "
                    "store: the port is already in use",
                    hint="another process on this node holds it; export MASTER_PORT=<another "
                    "port>, or unset it where the launcher derives one",
                    variable="MASTER_PORT",
                    value=str(port),
                ) from None
            raise InitError(
                info.launcher,
                f"rank 0 cannot start the store on {host_port(host, port)}: {first_line(exc)}",
                hint="check MASTER_ADDR names this host and MASTER_PORT is a usable port",
            ) from None
    deadline = time.monotonic() + seconds
    _wait_reachable(info, host, port, deadline, seconds)
    remaining = max(deadline - time.monotonic(), 1.0)
    try:
        return TCPStore(
            host,
            port,
            info.world_size,
            is_master=False,
            timeout=datetime.timedelta(seconds=remaining),
        )
    except dist.DistError as exc:
        raise RendezvousTimeoutError(
            info.launcher,
            f"rank {info.rank} of {info.world_size} reached {host_port(host, port)} but could not "
            f"join its store within {seconds:g} s: {first_line(exc)}",
            hint="is another job's store on that port? give each job its own MASTER_PORT",
            variable="MASTER_PORT",
            value=str(port),
        ) from None


def make_checkin(
    info: RankInfo, backend: str, device: int | None, *, allow_gpu_sharing: bool
) -> CheckIn:
    """Return what this rank reports in the roll call."""
    import torch

    return CheckIn(
        rank=info.rank,
        world_size=info.world_size,
        local_rank=info.local_rank,
        local_world_size=info.local_world_size,
        node_rank=info.node_rank,
        hostname=socket.gethostname(),
        pid=os.getpid(),
        launcher=info.launcher,
        master=master_address(info),
        backend=backend,
        torch_version=str(torch.__version__),
        device=None if device is None else device_identity(device),
        allow_gpu_sharing=allow_gpu_sharing,
    )


def meet(
    info: RankInfo,
    checkin: CheckIn,
    *,
    seconds: float,
    settings: Settings,
    prefix: str,
    check: bool = True,
) -> tuple[Store, Verdict]:
    """Reach rank 0's store and hold the roll call under `prefix`; return the store and verdict.

    Raises:
        RendezvousTimeoutError: The store was not reached, or ranks are missing.
        RendezvousError: The verdict found problems (with `check`), or a signal interrupted.
        DistEnvError: Rank 0 cannot listen on the port, or the master does not resolve.
    """
    from torch._C._distributed_c10d import PrefixStore

    with interruptible("the connection to rank 0's store"):
        store = connect_store(info, seconds, agent_store=settings.agent_store)
    verdict = roll_call(PrefixStore(prefix, store), info, checkin, timeout=seconds, check=check)
    return store, verdict
