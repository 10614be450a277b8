"""Write docs/benchmarks.md and its plots from the benchmarks' JSON results and the page's template.

    python benchmarks/report.py [--results docs/benchmarks] [--page docs/benchmarks.md]

The words are docs/benchmarks.md.in: the page with named placeholders (`{b[nprocs]}` is
bootstrap.json's "nprocs"), then the fragments (`<!-- fragment: NAME -->`) that rows and optional
parts are written from. This script picks the rows and computes what no result holds (a share, a
projection, a target's verdict), nothing else. run_all.py calls it after the benchmarks.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import string
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from _common import REPO
from run_all import BENCHMARKS

MIB = 1024 * 1024
# The per-rank log's and the hang watchdog's budget while training (issue #40 item 4): a share of
# the bare step.
RANKLOG_PCT = WATCHDOG_PCT = 1.0
# bench_watchdog's ways of running its job, and bench_bootstrap's phases, in the page's order: the
# template's fragments watched_<mode> and phase_<name> say what each is.
WATCHED = ("plain", "run", "init")
# Bootstrap times are bimodal here: launches above this count apart ("launches > 200 ms").
SLOW_S = 0.2
TEMPLATE = REPO / "docs" / "benchmarks.md.in"
# The bootstrap's targets (issue #42): distenv's p50 over bare env:// (srun: no slower than bare;
# others +2 ms) and its extra CPU per rank.
P50_LIMIT_MS, CPU_LIMIT_MS = {"srun": 0.0}, 1.5
PHASES = ("before_store", "store", "roll_call", "process_group", "after_group", "all_reduce")
# tests/run_gpu.sh's bootstrap runs on a GPU machine (the results' gpu/ folder), and their labels.
GPU_RUNS = {"bootstrap_nccl": "NCCL, `device_id=`", "bootstrap_cores": "gloo, GPUs hidden"}


# The units of Cells' format specs: how a value is scaled, and its default precision.
UNITS = {"ms": (1e3, ".1f"), "us": (1e6, ".0f"), "mib": (1 / MIB, ".1f"), "kib": (1 / 1024, ".0f"), "pct": (100, ".2f")}  # fmt: skip


class Cells(string.Formatter):
    """`str.format` with the page's `UNITS` as format specs (`ms`, `ms.0f`, `us`, `mib`, `kib`,
    `pct`), `spaced` (a count with spaces between thousands) and `met` (a target's verdict). None
    and NaN show as n/a; a string shows as itself whatever the spec."""

    def format_field(self, value: Any, spec: str) -> str:
        if isinstance(value, str):
            return value
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "n/a"
        if spec == "met":
            return "**met**" if value else "**missed**"
        if spec == "spaced":
            return f"{value:,.0f}".replace(",", " ")
        if (unit := spec[:3] if spec[:3] in UNITS else spec[:2]) in UNITS:
            scale, default = UNITS[unit]
            return format(value * scale, spec[len(unit) :] or default)
        return format(value, spec)


def numbered(d: dict[str, Any]) -> list[tuple[str, Any]]:
    """The entries of `d` keyed by a number (a world size), in numeric order."""
    return sorted(((k, v) for k, v in d.items() if k.isdigit()), key=lambda kv: int(kv[0]))


def cpu_share(extra_ms: float, d: dict[str, Any]) -> float:
    """What `extra_ms` of CPU per rank costs in wall time when `d`'s ranks share the cores (ms)."""
    return float(extra_ms * d["nprocs"] / d["machine"]["logical_cpus"])


def every(variant: dict[str, Any]) -> str:
    """How often a ranklog variant printed its line: "every step", "every 10 steps"."""
    return "every step" if (n := variant["print_every"]) == 1 else f"every {n} steps"


class Page:
    """docs/benchmarks.md.in filled from the results in one directory."""

    def __init__(self, template: str, results: Path) -> None:
        text, *parts = re.split(r"^<!-- fragment: (\w+) -->\n", template, flags=re.MULTILINE)
        self.text = text.rstrip("\n") + "\n"
        # A fragment ends with its line's newline, which joining the rows puts back.
        self.frags = {parts[i]: parts[i + 1][:-1] for i in range(0, len(parts), 2)}
        # Every result run_all.py writes, where it is there (a mode run apart may not be).
        self.data = {n: json.loads(f.read_text()) for n in BENCHMARKS if (f := results / f"{n}.json").is_file()}  # fmt: skip
        self.gpu_runs = {n: json.loads((results / "gpu" / f"{n}.json").read_text()) for n in GPU_RUNS}  # fmt: skip

    def fill(self, fragment: str, /, **values: Any) -> str:
        return Cells().vformat(self.frags[fragment], (), values)

    def rows(self, name: str, items: Iterable[dict[str, Any]]) -> str:
        return "\n".join(self.fill(name, **item) for item in items)

    def skipped(self, d: dict[str, Any]) -> str:
        """What a benchmark left out (a competitor not installed), or nothing."""
        what = "; ".join(f"{k} ({v})" for k, v in d["skipped"].items())
        return self.fill("skipped", what=what) if what else ""

    def targets(self) -> str:
        c, boot = self.data["import"]["cases"]["distenv"], self.data["bootstrap"]
        wall_ok, rss_ok = c["delta_wall_s"] <= 0.050, c["delta_rss_mib"] <= 15
        lines = [self.fill("target_import", c=c, wall_ok=wall_ok, rss_ok=rss_ok)]
        for launcher, res in boot["launchers"].items():
            if ab := res.get("distenv_vs_bare"):
                limit = P50_LIMIT_MS.get(launcher, 2.0)
                lines.append(self.fill(
                    "target_boot", launcher=launcher, nprocs=boot["nprocs"], ab=ab, limit=limit,
                    pct_ok=ab["overhead_pct"] <= 3, ms_ok=ab["median_paired_diff_ms"] <= limit,
                    share=cpu_share(ab["median_paired_cpu_diff_ms"], boot),
                    cores=boot["machine"]["logical_cpus"], cpu_ok=ab["median_paired_cpu_diff_ms"] <= CPU_LIMIT_MS,
                ))  # fmt: skip
        alone = self.data["bootstrap_per_core"]
        ab = alone["launchers"]["torchrun"]["distenv_vs_bare"]
        ok = ab["median_paired_diff_ms"] <= 2.0 and ab["median_paired_cpu_diff_ms"] <= CPU_LIMIT_MS
        lines.append(self.fill("target_per_core", nprocs=alone["nprocs"], ab=ab, ok=ok))
        procs = max(r["methods"]["distenv"]["events_per_rank_max"] for r in boot["launchers"].values())  # fmt: skip
        lines.append(self.fill("target_procs", n=procs, ok=procs == 0))
        a = self.data["allreduce"]
        d, twice = a["methods"]["distenv_default"], a["methods"]["distenv_25mb"]
        lines.append(self.fill("target_ar", d=d, twice=twice, ok=d["speedup_vs_per_tensor"] >= 3))
        if (mm := d["speedup_vs_mmengine_all"]) is not None:
            lines.append(self.fill("target_ar_mmengine", mm=mm, ok=mm >= 1.3))
        bound = max(25 * MIB, a["largest_grad_bytes"])
        lines.append(self.fill("target_ar_memory", d=d, ok=d["peak_extra_bytes"] <= bound))
        for v in self.data["ranklog"]["variants"].values():
            ok = v["overhead_pct"] <= RANKLOG_PCT
            lines.append(self.fill("target_ranklog", v=v, label=every(v), ok=ok))
        n = max(v["children"] for v in self.data["ranklog"]["variants"].values())
        lines.append(self.fill("target_ranklog_procs", n=n, ok=n == 0))
        w = self.data["watchdog"]
        for mode, res in ((m, w["watched"][m]) for m in WATCHED if m in w["watched"]):
            ok = res["threads_cpu_share_max"] * 100 <= WATCHDOG_PCT
            label = self.fill(f"watched_{mode}")
            lines.append(self.fill("target_watchdog", w=w, res=res, label=label, ok=ok))
        lines.append(self.fill("target_watchdog_procs", n=w["children"], ok=w["children"] == 0))
        return "\n".join(lines)

    def watchdog(self) -> Iterable[dict[str, Any]]:
        """Section 7's rows: each way of running the job; plain is the baseline of the others."""
        w = self.data["watchdog"]
        for mode in WATCHED:
            rates = ", ".join(f"{r:,}" for r in w["steps_per_s"][mode])
            row = {"label": self.fill(f"watched_{mode}"), "t": w["step_s"][mode], "rates": rates,
                   "threads": w["threads"][mode]}  # fmt: skip
            if (res := w["watched"].get(mode)) is None:
                yield {**row, "overhead": "(the baseline)", "cpu": "", "children": w["children"]}
                continue
            low, high = res["overhead_pct_ci95"]
            overhead = f"{res['overhead_pct']:+.1f} % [{low:+.1f}, {high:+.1f}]"
            cpu = Cells().format_field(res["threads_cpu_share_max"], "pct.3f") + " %"
            yield {**row, "overhead": overhead, "cpu": cpu, "children": w["children"]}

    def phases(self, d: dict[str, Any]) -> str:
        """Each launcher's phases (bench_bootstrap.phase_table): where distenv's overhead lies."""
        rows = [
            {"launcher": launcher, "label": self.fill(f"phase_{phase}"), "row": row}
            for launcher, res in d["launchers"].items()
            for phase in PHASES
            if (row := res.get("phases", {}).get(phase)) is not None
        ]
        return self.fill("phases", rows=self.rows("phase_row", rows)) if rows else ""

    def cpu_profile(self) -> str:
        """bench_bootstrap.py --profile's table: each launcher's CPU per phase and rank."""
        d, zero = self.data["bootstrap_profile"], {"rank0": 0.0, "others": 0.0}
        rows = [
            {"launcher": launcher, "phase": phase, "bare": bare.get(phase, zero), "dist": dist.get(phase, zero)}
            for launcher, res in d["launchers"].items()
            for bare, dist in [(res["methods"][m]["phases"] for m in ("bare", "distenv"))]
            for phase in [*res["order"], "total"]
            if phase in bare or phase in dist
        ]  # fmt: skip
        diffs = [{"launcher": launcher, "res": res} for launcher, res in d["launchers"].items()]
        return self.fill(
            "cpu_profile", p=d, rows=self.rows("cpu_row", rows), diffs=self.rows("cpu_diff", diffs)
        )

    def bootstrap(self) -> dict[str, str]:
        boot, alone = self.data["bootstrap"], self.data["bootstrap_per_core"]
        runs = [
            {"launcher": launcher, "method": method, "m": m, "cpu": m.get("cpu_per_rank_ms"),
             "slow": sum(v > SLOW_S for v in m["raw_max_s"]),
             "example": ", ".join(m["rank0_events_example"][:2]) or "-"}
            for launcher, res in boot["launchers"].items()
            for method, m in res["methods"].items()
        ]  # fmt: skip
        # torchrun with the main run's ranks beside one rank per core: how much of distenv's
        # overhead is its ranks' extra CPU time, paid in wall time where ranks share cores.
        per_core = []
        for d in (boot, alone):
            r = d["launchers"].get("torchrun", {})
            if "median_paired_cpu_diff_ms" in (ab := r.get("distenv_vs_bare", {})):
                m, share = r["methods"], cpu_share(ab["median_paired_cpu_diff_ms"], d)
                per_core.append({"d": d, "bare": m["bare"], "dist": m["distenv"], "ab": ab, "share": share})  # fmt: skip
        return {
            "boot_rows": self.rows("boot_row", runs),
            "proc_rows": self.rows("proc_row", runs),
            "phases": self.phases(boot),
            "per_core_rows": self.rows("per_core_row", per_core),
            "per_core_phases": self.phases(alone),
            "cpu_profile": self.cpu_profile(),
        }

    def gpu(self) -> str:
        """Section 2's runs on a GPU machine (tests/run_gpu.sh), committed in the results' gpu/."""
        runs = [{"run": GPU_RUNS[n], "d": d, "r": d["launchers"]["torchrun"], "table": self.phases(d)}
                for n, d in self.gpu_runs.items()]  # fmt: skip
        # The last run's machine: the first, NCCL's, was recorded before `machine()` read the GPU.
        rows, phases = self.rows("gpu_row", runs), self.rows("gpu_phases", runs)
        return self.fill("gpu", m=runs[-1]["d"]["machine"], rows=rows, phases=phases)

    def scaling(self) -> dict[str, Any]:
        s, scale = self.data["scaling"], self.data["rendezvous_scale"]

        def launch(m: dict[str, Any] | None) -> list[str]:
            return ["-", "-"] if m is None else [
                Cells().format_field(m["max_over_ranks_s"]["median"], "ms"), f"{m['launch_wall_s']['median']:.1f}"
            ]  # fmt: skip

        init = [
            {"n": n, "distenv": launch(r.get("distenv")), "bare": launch(r.get("bare"))}
            for n, r in numbered(s["init"])
        ]
        text = self.rows("init_row", init)
        if "stopped_after" in s["init"]:
            text += self.fill("stopped", n=s["init"]["stopped_after"])
        rollcall = [{"n": n, "r": r} for n, r in numbered(s["rollcall"])]
        layout = [{**nr, "l": lay} for nr in rollcall if (lay := nr["r"].get("layout_from_roll_call"))]  # fmt: skip
        largest, top = (sizes := numbered(scale["sizes"]))[-1]
        modes = ("flat", "leaders")
        per_rank = {m: top[m]["rank0_wall_s"]["median"] / int(largest) for m in modes}
        per_node = {m: top[m]["store"]["per_node"]["requests"] for m in modes}
        leaders = ({"n": n, "mode": m, "r": r[m]} for n, r in sizes for m in modes)
        projection = [
            {"gpus": gpus, "lead": per_rank["leaders"] * gpus, "flat": per_rank["flat"] * gpus,
             "lead_req": per_node["leaders"] * gpus / 8, "flat_req": per_node["flat"] * gpus / 8}
            for gpus in (10_000, 100_000)
        ]  # fmt: skip
        return {
            "init_rows": text,
            "rc_rows": self.rows("rc_row", rollcall),
            "layout_rows": self.rows("layout_row", layout),
            "leaders_rows": self.rows("leaders_row", leaders),
            "scale_targets": self.rows(
                "scale_target_row", ({"mode": m, "t": t} for m, t in scale["targets"].items())
            ),
            "projection_rows": self.rows("projection_row", projection),
            "largest": largest,
            "per_rank": per_rank,
        }

    def render(self) -> str:
        d = self.data
        i, a, s = d["import"], d["allreduce"], d["scaling"]
        n_max, top = numbered(s["rollcall"])[-1]
        cases = sorted(i["cases"].values(), key=lambda c: c["wall_s"]["median"])
        methods = sorted(a["methods"].items(), key=lambda nm: nm[1]["p50"])
        # The Reproduce section's run time: the main benchmarks' (not the per-core or scale runs').
        total = sum(d[n].get("total_s", 0) for n in ("import", "bootstrap", "allreduce", "scaling"))
        total += sum(sum(c["raw_wall_s"]) for c in i["cases"].values())
        return Cells().vformat(self.text, (), {
            "m": i["machine"], "i": i, "b": d["bootstrap"], "a": a, "s": s, "sc": d["rendezvous_scale"],
            "pc": d["bootstrap_per_core"], "slurm": i["machine"]["slurm"] or "not installed",
            "targets": self.targets(),
            "import_rows": self.rows("import_row", ({"c": c} for c in cases)) + self.skipped(i),
            "ar_rows": self.rows("ar_row", ({"name": n, "m": m} for n, m in methods)) + self.skipped(a),
            "r": d["ranklog"],
            "ranklog_rows": self.rows("ranklog_row", (
                {"v": v, "label": every(v), "floor_s": v["line_us"] / 1e6 / v["print_every"] * 100 / RANKLOG_PCT}
                for v in d["ranklog"]["variants"].values()
            )),
            "w": d["watchdog"],
            "watchdog_rows": self.rows("watchdog_row", self.watchdog()),
            **self.bootstrap(), **self.scaling(), "gpu": self.gpu(), "n_max": n_max, "top": top, "total_min": total / 60,
        })  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=REPO / "docs" / "benchmarks")
    p.add_argument("--page", type=Path, default=REPO / "docs" / "benchmarks.md")
    args = p.parse_args(argv)
    args.page.write_text((filled := Page(TEMPLATE.read_text(), args.results)).render())
    (img := args.page.parent / "benchmarks").mkdir(parents=True, exist_ok=True)
    from _plots import plot_all  # matplotlib: only where the plots are drawn

    plot_all(filled.data, img)
    print(f"wrote {args.page} and its plots in {img}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
