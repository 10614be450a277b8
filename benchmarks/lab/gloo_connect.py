"""Does gloo's full-mesh connect prove the group? 4 plain torch ranks, rank 3 SIGSTOPped in init.

The evidence behind `distenv.bootstrap.proof` (docs/faults.md, "Which check proves the group"):
no distenv, only torch. Four processes on this machine share a TCPStore and call
``init_process_group("gloo", timeout=--timeout)``; rank 3 stops itself (SIGSTOP, resumed after
``--stop`` seconds by a helper) at one point:

- ``before``: before ``init_process_group``;
- ``published``: right after it published its gloo address in the store (the first ``set``
  gloo makes through a wrapping store), before it connected anything;
- ``after``: right after its ``init_process_group`` returned.

Each rank then runs one ``barrier`` (``after`` only, to show what a returned init leads to).
Which side of a pair listens depends on the order of the ranks' addresses (ports drawn anew in
each run), so ``published`` runs ``--runs`` times. Printed, as JSON, per case and rank: what
init did (returned / raised, with the first line of the error) and when, in seconds from the
stop; and whether that was while rank 3 was stopped.

    .venv/bin/python benchmarks/lab/gloo_connect.py [--stop 20] [--timeout 5] [--runs 3]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CASES = ("before", "published", "after")


def _rank(rank: int, port: int, case: str, stop_s: float, timeout_s: float, out: Path) -> None:
    import torch.distributed as dist

    def record(**fields: Any) -> None:
        with open(out / f"rank{rank}.jsonl", "a") as f:
            f.write(json.dumps({"rank": rank, "t": time.time(), **fields}) + "\n")

    def stop(where: str) -> None:
        helper = [
            sys.executable,
            "-c",
            f"import os,time;time.sleep({stop_s});os.kill({os.getpid()},18)",
        ]
        subprocess.Popen(helper)
        record(event="stopped", where=where)
        os.kill(os.getpid(), signal.SIGSTOP)
        record(event="resumed")

    class Stopping(dist.Store):  # type: ignore[misc]
        """Rank 3's store in case ``published``: stops right after its first set (its address)."""

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner, self.sets = inner, 0

        def set(self, key: str, value: Any) -> None:
            self.inner.set(key, value)
            self.sets += 1
            if self.sets == 1 and rank == 3 and case == "published":
                stop(f"after publishing {key!r}")

        def get(self, key: str) -> Any:
            return self.inner.get(key)

        def wait(self, keys: Any, timeout: Any = None) -> Any:
            return self.inner.wait(keys) if timeout is None else self.inner.wait(keys, timeout)

        def add(self, key: str, n: int) -> Any:
            return self.inner.add(key, n)

        def check(self, keys: Any) -> Any:
            return self.inner.check(keys)

        def compare_set(self, key: str, expected: Any, desired: Any) -> Any:
            return self.inner.compare_set(key, expected, desired)

        def multi_get(self, keys: Any) -> Any:
            return self.inner.multi_get(keys)

        def multi_set(self, keys: Any, values: Any) -> Any:
            return self.inner.multi_set(keys, values)

    inner = dist.TCPStore(
        "127.0.0.1", port, 4, rank == 0, timeout=datetime.timedelta(seconds=120),
        wait_for_workers=False,
    )  # fmt: skip
    if rank == 3 and case == "before":
        stop("before init_process_group")
    try:
        dist.init_process_group(
            "gloo", store=Stopping(inner), rank=rank, world_size=4,
            timeout=datetime.timedelta(seconds=timeout_s),
        )  # fmt: skip
        record(event="init", outcome="returned")
    except Exception as exc:
        record(event="init", outcome="raised", error=str(exc).splitlines()[0][:200])
    else:
        if rank == 3 and case == "after":
            stop("after init_process_group returned")
        if case == "after":
            try:
                dist.barrier()
                record(event="barrier", outcome="returned")
            except Exception as exc:
                record(event="barrier", outcome="raised", error=str(exc).splitlines()[0][:200])
    time.sleep(max(0.0, stop_s + timeout_s + 5 - (time.time() - inner_start)))
    os._exit(0)


def _case(case: str, stop_s: float, timeout_s: float) -> dict[str, Any]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        argv = [sys.executable, __file__, "--rank-of", case, str(port), str(stop_s), str(timeout_s)]
        procs = [subprocess.Popen([*argv, str(r), folder]) for r in range(4)]
        for p in procs:
            p.wait(timeout=stop_s + timeout_s + 120)
        events = [json.loads(line) for f in sorted(out.glob("*.jsonl")) for line in f.open()]
    stopped = next(e["t"] for e in events if e.get("event") == "stopped")
    resumed = next((e["t"] for e in events if e.get("event") == "resumed"), stopped + stop_s)
    ranks = {}
    for e in events:
        if e.get("event") in ("init", "barrier"):
            entry = ranks.setdefault(e["rank"], {})
            entry[e["event"]] = {
                "outcome": e["outcome"],
                "s_after_stop": round(e["t"] - stopped, 2),
                "while_stopped": stopped <= e["t"] < resumed,
                **({"error": e["error"]} if "error" in e else {}),
            }
    return {"stop_s": stop_s, "timeout_s": timeout_s, "ranks": dict(sorted(ranks.items()))}


inner_start = time.time()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-of":
        case, port, stop_s, timeout_s, rank, folder = sys.argv[2:8]
        _rank(int(rank), int(port), case, float(stop_s), float(timeout_s), Path(folder))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stop", type=float, default=20.0)
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument(
        "--runs", type=int, default=3, help="runs of the published case (addresses differ)"
    )
    args = parser.parse_args()
    import torch

    found: dict[str, Any] = {case: _case(case, args.stop, args.timeout) for case in CASES}
    found["published"] = [found["published"]] + [
        _case("published", args.stop, args.timeout) for _ in range(args.runs - 1)
    ]
    print(json.dumps({"torch": torch.__version__, "cases": found}, indent=1))


if __name__ == "__main__":
    main()
