"""The restart matrix: many injected failures, restarted by ``distenv run --max-restarts``, then
by ``torchrun --max-restarts``, with the same plan.

One job of 4 ranks per launcher (tests/support/scripts/restart_rank.py, which logs each event with
its wall time); a seeded plan fails one random rank at each of the first ``--crashes`` attempts, in
a random phase and way. Recorded per launcher: miscounted attempts and orphans (both must be 0),
and each failure's recovery in the three parts docs/restarts.md ("Measured") describes.

    .venv/bin/python benchmarks/lab/restart_matrix.py --out docs/benchmarks/restarts.json

``--smoke`` runs 1 failure of 2 ranks under distenv only, for tests/meta/test_benchmarks.py.
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

# benchmarks/, whose modules this lab tool builds on, is not its own directory.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import REPO, emit, machine, note, parser, summary

sys.path.insert(0, str(REPO))

from tests.conftest import scrubbed_environ
from tests.support.integration.faults import gone, survivors

RANK = REPO / "tests" / "support" / "scripts" / "restart_rank.py"
PYTHON = REPO / ".venv" / "bin" / "python"
PHASES = ("start", "init", "train")
HOWS = ("raise", "kill")
# A recovery's time, and its three parts (the module's docstring says which).
PARTS = ("recovery_s", "stopped_s", "restart_s", "rank_start_s")
SEED = 20261125


def plan(crashes: int, nproc: int) -> list[tuple[int, int, str, str]]:
    """Return the failures: ``(attempt, rank, phase, how)``, one per attempt, seeded."""
    rng = random.Random(SEED)
    return [
        (attempt, rng.randrange(nproc), rng.choice(PHASES), rng.choice(HOWS))
        for attempt in range(crashes)
    ]


def command(launcher: str, nproc: int, crashes: int) -> list[str]:
    if launcher == "distenv":
        return [str(PYTHON), "-m", "distenv", "run", "-n", str(nproc), "--max-restarts",
                str(crashes)]  # fmt: skip
    return [str(PYTHON), "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            str(nproc), "--max-restarts", str(crashes), "--monitor-interval", "0.1"]  # fmt: skip


class Exits:
    """Notes, within 5 ms, when each rank process that logged an event has ended (a zombie
    counts: its launcher reaps it later)."""

    def __init__(self, path: Path) -> None:
        self.path, self.ended, self.pids = path, {}, set()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        next_read = 0.0
        while not self.done.is_set():
            now = time.monotonic()
            if now >= next_read and self.path.exists():
                for line in self.path.read_text().splitlines():
                    with contextlib.suppress(ValueError):
                        self.pids.add(json.loads(line)["pid"])
                next_read = now + 0.02
            for pid in self.pids - set(self.ended):
                if gone(pid):
                    self.ended[pid] = time.time()
            time.sleep(0.005)

    def stop(self) -> dict[int, float]:
        self.done.set()
        self.thread.join()
        return self.ended


def run(launcher: str, nproc: int, failures: list[tuple[int, int, str, str]]) -> dict[str, Any]:
    """Run one job under `launcher` with `failures`; return its record."""
    crashes = len(failures)
    tag = f"restarts-{uuid.uuid4().hex[:12]}"
    with tempfile.TemporaryDirectory(prefix="distenv-restarts-") as tmp:
        out = Path(tmp)
        spec = ",".join(f"{a}:{r}:{p}:{h}" for a, r, p, h in failures)
        argv = [*command(launcher, nproc, crashes), str(RANK), "--out", str(out), "--tag", tag,
                "--plan", spec]  # fmt: skip
        env = {**scrubbed_environ(), "OMP_NUM_THREADS": "1", "DISTENV_TIMEOUT": "60"}
        exits = Exits(out / "events.jsonl")
        began = time.monotonic()
        done = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=120 + 30 * crashes, check=False)  # fmt: skip
        seconds = time.monotonic() - began
        ended = exits.stop()
        path = out / "events.jsonl"
        events = (
            [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        )
    left = survivors(tag)
    by_attempt: dict[int, list[dict[str, Any]]] = {}
    for event in events:
        by_attempt.setdefault(event["attempt"], []).append(event)
    miscounted = []
    for attempt in sorted(set(by_attempt) | set(range(crashes + 1))):
        group = by_attempt.get(attempt, [])
        counts = {e["restart_count"] for e in group if "restart_count" in e}
        if attempt > crashes or not group or counts - {attempt}:
            started = sorted(e["rank"] for e in group if e["event"] == "start")
            miscounted.append({"attempt": attempt, "started": started, "counts": sorted(counts)})
    recoveries = []
    for attempt, rank, phase, how in failures:
        group = by_attempt.get(attempt, [])
        fails = [e for e in group if e["event"] == "fail"]
        starts = [e for e in by_attempt.get(attempt + 1, []) if e["event"] == "start"]
        pids = {e["pid"] for e in group}
        if not fails or len(starts) < nproc or not pids <= set(ended):
            continue
        failed = fails[0]["t"]
        last = max(starts, key=lambda e: e["t"])
        stopped = max(ended[pid] for pid in pids)
        started = max(e["exec"] for e in starts)
        recoveries.append(
            {
                "attempt": attempt,
                "rank": rank,
                "phase": phase,
                "how": how,
                "recovery_s": round(last["t"] - failed, 3),
                "stopped_s": round(stopped - failed, 3),
                "restart_s": round(started - stopped, 3),
                "rank_start_s": round(last["t"] - last["exec"], 3),
            }
        )
    oks = [e for e in events if e["event"] == "ok"]
    return {
        "argv": argv[:-6],
        "exit": done.returncode,
        "seconds": round(seconds, 1),
        "passed": done.returncode == 0 and len(oks) == nproc,
        "attempts": len(by_attempt),
        "miscounted": miscounted,
        "orphans": left,
        "recoveries": recoveries,
        **{k: summary([r[k] for r in recoveries]) for k in PARTS},
        "stderr_tail": done.stderr[-1500:],
    }


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--crashes", type=int, default=50, help="failures injected (default 50)")
    p.add_argument("--nproc", type=int, default=4, help="ranks (default 4)")
    args = p.parse_args()
    crashes, nproc = (1, 2) if args.smoke else (args.crashes, args.nproc)
    failures = plan(crashes, nproc)
    launchers = ("distenv",) if args.smoke else ("distenv", "torchrun")
    began = time.monotonic()
    results = {}
    for launcher in launchers:
        note(f"{launcher}: {crashes} failures of {nproc} ranks")
        results[launcher] = run(launcher, nproc, failures)
    record: dict[str, Any] = {
        "benchmark": "restarts",
        "smoke": args.smoke,
        "machine": machine(),
        "seed": SEED,
        "crashes": crashes,
        "nproc": nproc,
        "total_s": round(time.monotonic() - began, 1),
        "launchers": results,
    }
    if "torchrun" in results:
        ours, theirs = results["distenv"]["recovery_s"], results["torchrun"]["recovery_s"]
        record["recovery_ratio_median"] = round(ours["median"] / theirs["median"], 3)
    emit(record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
