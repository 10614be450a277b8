"""The roll call: every rank checks in before the process group exists, so nobody hangs silently.

Over the job's one store (rank 0's TCPStore, or torchrun's agent store), under a prefix:

1. every rank writes its `CheckIn` under a key numbered by its arrival (``store.add``), so two
   processes that both claim rank 3 are both seen, then counts itself as written;
2. rank 0 waits until ``world_size`` check-ins arrived or the timeout passed, then validates them
   (`validate`, a pure function) and publishes one verdict; on timeout the verdict names the ranks
   that never arrived and the hosts they were expected on;
3. every other rank waits for the verdict (same timeout, plus a grace for rank 0's own wait) and
   raises what it says.

Rank 0 reads N records and every rank reads one verdict: O(N) store traffic, not O(N^2).
Waits poll in short slices so that SIGINT/SIGTERM end the process promptly.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from types import FrameType
from typing import Any

from distenv.errors import RendezvousError, RendezvousTimeoutError
from distenv.rankinfo import RankInfo

__all__ = ["CheckIn", "Verdict", "interruptible", "roll_call", "validate"]

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
