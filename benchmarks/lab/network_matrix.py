"""The network matrix: a 3-rank gloo all_reduce on each topology of issue #24, bare torch vs distenv.

Every topology of tests/support/topologies.py is built as Linux network namespaces
(tests/support/netlab.py: root and iproute2 needed; torn down after each topology), one rank per
node. On each, the ranks run benchmarks/lab/_netlab_rank.py twice, with RANK, WORLD_SIZE, MASTER_ADDR
(the topology's, as its users would set it) and MASTER_PORT set, and nothing else:

- ``bare``: ``init_process_group("gloo", init_method="env://", timeout=15 s)``;
- ``distenv``: ``distenv.init_dist(launcher="pytorch")`` with DISTENV_TIMEOUT=10.

Each run is killed at a hard bound (``--bound``, 45 s: above distenv's own deadlines, 10 s for
the roll call and 20 s for ``init_process_group``, so that its errors are seen). Recorded per
run: passed (every rank exited 0 with the right sum), the seconds until the last rank exited (or
the bound), and per rank its exit status, seconds and the first line of its error ("killed at
the bound" for a hang).

    .venv/bin/python benchmarks/lab/network_matrix.py --out docs/benchmarks/network.json

``--smoke`` runs the clean control only (about 10 s), for tests/meta/test_benchmarks.py.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# benchmarks/, whose modules this lab tool builds on, is not its own directory.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import REPO, emit, machine, note, parser

sys.path.insert(0, str(REPO))

from tests.conftest import scrubbed_environ
from tests.support import netlab
from tests.support.netlab import Lab, Topology
from tests.support.topologies import TOPOLOGIES

RANK = Path(__file__).resolve().parent / "_netlab_rank.py"
MODES = {"bare": {}, "distenv": {"DISTENV_TIMEOUT": "10"}}
PORTS = {"bare": 29500, "distenv": 29501}  # fresh namespaces: nothing else listens there
SMOKE = ("control",)


def first_error(stdout: str, stderr: str) -> str:
    """The rank's reported error, else the last stderr line that is no torch warning (a crash)."""
    for line in stdout.splitlines():
        if line.startswith("{") and '"error"' in line:
            return str(json.loads(line)["error"])
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if not line.startswith("[W")] or lines or ["(no output)"]
    return errors[-1][:400]


def run_case(lab: Lab, topology: Topology, mode: str, bound: float, work: Path) -> dict[str, Any]:
    """Start one rank per node, wait for all (killing them at `bound`), return the record."""
    size = len(topology.nodes)
    base = scrubbed_environ()
    base.pop("GLOO_SOCKET_IFNAME", None)  # the matrix measures the defaults
    procs = []
    began = time.monotonic()
    for node in range(size):
        env = {**base, **MODES[mode], "RANK": str(node), "WORLD_SIZE": str(size),
               "MASTER_ADDR": topology.master_addr, "MASTER_PORT": str(PORTS[mode])}  # fmt: skip
        out = (work / f"{mode}-{node}.out").open("wb")
        err = (work / f"{mode}-{node}.err").open("wb")
        procs.append(lab.popen(node, [sys.executable, str(RANK), mode], env=env, stdout=out,
                               stderr=err, cwd=REPO))  # fmt: skip
        out.close()
        err.close()
    ended: dict[int, float] = {}
    while len(ended) < size and time.monotonic() - began < bound:
        for node, proc in enumerate(procs):
            if node not in ended and proc.poll() is not None:
                ended[node] = time.monotonic() - began
        time.sleep(0.05)
    for proc in procs:
        netlab.kill_session(proc)
        proc.wait(timeout=10)
    ranks = []
    for node in range(size):
        stdout = (work / f"{mode}-{node}.out").read_text(errors="replace")
        stderr = (work / f"{mode}-{node}.err").read_text(errors="replace")
        reports = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
        killed = node not in ended
        ok = bool(reports and reports[-1]["ok"])
        error = None if ok else first_error(stdout, stderr)
        if killed:
            error = f"killed at the {bound:.0f} s bound"
        ranks.append(
            {
                "rank": node,
                "node": topology.nodes[node].hostname,
                "exit": None if killed else procs[node].returncode,
                "seconds": round(ended.get(node, bound), 2),
                "ok": ok,
                "sum": reports[-1].get("sum") if reports else None,
                "error": error,
            }
        )
    expected = size * (size + 1) // 2
    return {
        "passed": all(r["exit"] == 0 and r["sum"] == expected for r in ranks),
        "seconds": round(max(r["seconds"] for r in ranks), 2),
        "ranks": ranks,
    }


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--bound", type=float, default=45.0, help="kill a run after this many seconds")
    p.add_argument("--only", help="comma-separated topology names (default: all)")
    args = p.parse_args()
    names = list(SMOKE) if args.smoke else (args.only.split(",") if args.only else list(TOPOLOGIES))
    results: dict[str, dict[str, Any]] = {}
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="network-matrix-") as tmp:
        try:
            for name in names:
                topology = TOPOLOGIES[name]
                record: dict[str, Any] = {
                    "report": topology.report,
                    "nodes": len(topology.nodes),
                    "master_addr": topology.master_addr,
                    "routable": topology.routable,
                }
                with Lab(topology) as lab:
                    for mode in MODES:
                        work = Path(tmp) / name
                        work.mkdir(exist_ok=True)
                        record[mode] = run_case(lab, topology, mode, args.bound, work)
                        note(f"{name} {mode}: passed={record[mode]['passed']} "
                             f"{record[mode]['seconds']} s")  # fmt: skip
                results[name] = record
        finally:
            netlab.sweep()
    emit(
        {
            "benchmark": "network",
            "smoke": args.smoke,
            "machine": machine(),
            "bound_s": args.bound,
            "netns_prefix": netlab.RUN_PREFIX,  # every namespace it made was named so
            "total_s": round(time.monotonic() - began, 1),
            "passed": {mode: sum(r[mode]["passed"] for r in results.values()) for mode in MODES},
            "topologies": results,
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
