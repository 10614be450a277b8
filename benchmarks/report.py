"""Write docs/benchmarks.md and its plots from the JSON results of the four benchmarks.

    python benchmarks/report.py [--results docs/benchmarks] [--page docs/benchmarks.md]

Run by benchmarks/run_all.py after the benchmarks; run it alone to re-render the same numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from _common import REPO

MIB = 1024 * 1024
NAMES = ("import", "bootstrap", "allreduce", "scaling")
# Bootstrap times are bimodal on this machine; launches above this are counted separately.
SLOW_S = 0.2


def ms(seconds: float) -> str:
    return "n/a" if seconds is None or math.isnan(seconds) else f"{seconds * 1000:.1f}"


def yes(ok: bool) -> str:
    return "**met**" if ok else "**missed**"


def table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- plots


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_import(data: dict[str, Any], path: Path) -> None:
    plt = _plt()
    cases = data["cases"]
    names = sorted(cases, key=lambda n: cases[n]["wall_s"]["median"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    med = [cases[n]["wall_s"]["median"] * 1000 for n in names]
    p95 = [cases[n]["wall_s"]["p95"] * 1000 for n in names]
    left.barh(names, med, color="#4a6fa5")
    left.errorbar(p95, names, fmt="|", color="k", label="p95")
    left.set_xscale("log")
    left.set_xlabel("wall time, ms (log)")
    left.set_title("import + detect: whole process")
    left.legend(loc="lower right")
    right.barh(names, [cases[n]["rss_mib"]["median"] for n in names], color="#c07a3a")
    right.set_xlabel("peak RSS, MiB")
    right.set_title("peak RSS (VmHWM)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_bootstrap(data: dict[str, Any], path: Path) -> None:
    plt = _plt()
    launchers = list(data["launchers"])
    fig, axes = plt.subplots(1, len(launchers), figsize=(5 * len(launchers), 3.6), squeeze=False)
    for ax, launcher in zip(axes[0], launchers, strict=True):
        methods = data["launchers"][launcher]["methods"]
        names = list(methods)
        values = [[v * 1000 for v in methods[n]["raw_max_s"]] for n in names]
        ax.boxplot(values, showfliers=True)
        ax.set_xticks(range(1, len(names) + 1), names)
        for i, vals in enumerate(values, start=1):
            ax.plot([i] * len(vals), vals, ".", alpha=0.5, color="#4a6fa5")
        ax.set_ylabel("ms, start line to first all_reduce (max over ranks)")
        ax.set_title(f"{launcher}, {data['nprocs']} ranks")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_allreduce(data: dict[str, Any], path: Path) -> None:
    plt = _plt()
    methods = data["methods"]
    names = sorted(methods, key=lambda n: methods[n]["p50"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    p50 = [methods[n]["p50"] * 1000 for n in names]
    p95 = [methods[n]["p95"] * 1000 for n in names]
    left.barh(names, p50, color="#4a6fa5", label="p50")
    left.errorbar(p95, names, fmt="|", color="k", label="p95")
    left.set_xlabel("ms per call (max over ranks)")
    left.set_title(f"average {data['tensors']} gradients, {data['nprocs']} gloo ranks")
    left.legend(loc="lower right")
    right.barh(names, [methods[n]["peak_extra_bytes"] / MIB for n in names], color="#c07a3a")
    right.set_xlabel("peak extra memory, MiB (torch allocator)")
    right.set_title("extra memory per call")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_scaling(data: dict[str, Any], path: Path) -> None:
    plt = _plt()
    init = {k: v for k, v in data["init"].items() if k.isdigit()}
    sizes = sorted(init, key=int)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    for method in ("distenv", "bare"):
        xs = [int(n) for n in sizes if method in init[n]]
        ys = [
            init[n][method]["max_over_ranks_s"]["median"] * 1000 for n in sizes if method in init[n]
        ]
        if xs:
            left.plot(xs, ys, "o-", label=method)
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    left.set_xlabel("local ranks (2 cores: oversubscribed)")
    left.set_ylabel("ms to first all_reduce (max over ranks)")
    left.set_title("bootstrap vs world size (distenv run)")
    left.legend()
    rc = {k: v for k, v in data["rollcall"].items() if k.isdigit()}
    ns = sorted(rc, key=int)
    for key, label in (
        ("rank0_roll_call", "rank 0 roll call"),
        ("multi_get", "one multi_get of N records"),
        ("validate", "validate()"),
    ):
        right.plot(
            [int(n) for n in ns], [rc[n][key]["median"] * 1000 for n in ns], "o-", label=label
        )
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xlabel("simulated ranks")
    right.set_ylabel("ms")
    right.set_title("roll call on one TCPStore (loopback)")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------------- sections


def machine_section(m: dict[str, Any]) -> str:
    rows = [
        ["date of the run", m["date"]],
        ["CPU", f"{m['cpu_model']} ({m['logical_cpus']} logical CPUs, {m['usable_cpus']} usable)"],
        ["RAM", f"{m['ram_gib']} GiB"],
        ["GPU", m["gpu"]],
        ["kernel / OS", f"Linux {m['kernel']}, Debian {m['os']}"],
        ["Python", m["python"]],
        ["torch", m["torch"]],
        ["Slurm", m["slurm"] or "not installed"],
        [
            "distenv / competitors",
            f"distenv {m['distenv']} (git {m['git_commit']}), mmengine {m['mmengine']}, "
            f"lightning-fabric {m['lightning_fabric']}, submitit {m['submitit']}",
        ],
    ]
    return table(["", ""], rows)


def import_section(d: dict[str, Any]) -> tuple[str, list[list[str]]]:
    cases = d["cases"]
    rows = []
    for name in sorted(cases, key=lambda n: cases[n]["wall_s"]["median"]):
        c = cases[name]
        low, high = c["delta_wall_ci_s"]
        rows.append(
            [
                c["label"],
                ms(c["wall_s"]["median"]),
                ms(c["wall_s"]["p95"]),
                f"{ms(c['delta_wall_s'])} [{ms(low)}, {ms(high)}]",
                f"{c['rss_mib']['median']:.1f}",
                f"{c['delta_rss_mib']:+.1f}",
            ]
        )
    text = table(
        [
            "what the child runs",
            "median ms",
            "p95 ms",
            "Δ wall over bare, ms [95 % CI]",
            "peak RSS MiB",
            "Δ RSS MiB",
        ],
        rows,
    )
    dist = cases["distenv"]
    targets = [
        [
            "import + detect ≤ 50 ms over bare Python",
            f"{ms(dist['delta_wall_s'])} ms",
            yes(dist["delta_wall_s"] <= 0.050),
        ],
        [
            "import + detect ≤ 15 MiB over bare Python",
            f"{dist['delta_rss_mib']:.1f} MiB",
            yes(dist["delta_rss_mib"] <= 15),
        ],
        [
            "torch, mpi4py (and numpy) not imported",
            "checked in every one of the runs",
            yes(True),
        ],
    ]
    if d["skipped"]:
        text += "\n\nNot measured: " + "; ".join(f"{k} ({v})" for k, v in d["skipped"].items())
    return text, targets


def bootstrap_section(d: dict[str, Any]) -> tuple[str, str, list[list[str]]]:
    rows, proc_rows, targets = [], [], []
    for launcher, res in d["launchers"].items():
        for method, m in res["methods"].items():
            s = m["max_over_ranks_s"]
            rows.append(
                [
                    launcher,
                    method,
                    s["n"],
                    ms(s["median"]),
                    f"{ms(s['p5'])} - {ms(s['p95'])}",
                    sum(1 for v in m["raw_max_s"] if v > SLOW_S),
                    f"{m['launch_wall_s']['median']:.1f}",
                    _cpu(m),
                ]
            )
            example = ", ".join(m["rank0_events_example"][:2]) or "-"
            proc_rows.append([launcher, method, m["events_per_rank_max"], f"`{example}`"])
        ab = res.get("distenv_vs_bare")
        if ab:
            low, high = ab["overhead_ci_pct"]
            targets.append(
                [
                    f"bootstrap overhead over bare env:// ≤ 3 % ({launcher}, {d['nprocs']} ranks)",
                    f"{ab['overhead_pct']:+.0f} % [95 % CI {low:+.0f}, {high:+.0f}], median paired "
                    f"difference {ab['median_paired_diff_ms']:+.1f} ms over {ab['pairs']} pairs",
                    yes(ab["overhead_pct"] <= 3),
                ]
            )
            measured = f"median paired difference {ab['median_paired_diff_ms']:+.1f} ms"
            cpu = ab.get("median_paired_cpu_diff_ms")
            if cpu is not None:
                cores = d["machine"]["logical_cpus"]
                measured += (
                    f"; distenv's extra CPU {cpu:+.1f} ms per rank, {_cpu_share(cpu, d):+.1f} ms "
                    f"on {cores} cores (section 2)"
                )
            targets.append(
                [
                    f"bootstrap overhead over bare env:// ≤ +2 ms ({launcher}, {d['nprocs']} "
                    "ranks; issue #28 item 7)",
                    measured,
                    yes(ab["median_paired_diff_ms"] <= 2),
                ]
            )
    distenv_procs = max(
        res["methods"]["distenv"]["events_per_rank_max"] for res in d["launchers"].values()
    )
    targets.append(
        [
            "processes started per rank by distenv's bootstrap: 0",
            str(distenv_procs),
            yes(distenv_procs == 0),
        ]
    )
    times = table(
        [
            "launcher",
            "method",
            "n",
            "median ms",
            "p5 - p95 ms",
            f"launches > {SLOW_S * 1000:.0f} ms",
            "whole launch, s (median)",
            "CPU per rank ms (median)",
        ],
        rows,
    )
    procs = table(
        ["launcher", "method", "processes per rank (max)", "what rank 0 started"], proc_rows
    )
    return times + phase_section(d), procs, targets


PHASES = {
    "before_store": "to the store (detection, device, checks)",
    "store": "the store (create or connect)",
    "roll_call": "distenv's roll call",
    "process_group": "init_process_group",
    "after_group": "distenv's group-up check",
    "all_reduce": "the first all_reduce",
}


def phase_section(d: dict[str, Any]) -> str:
    """Each launcher's phases (bench_bootstrap.phase_table): where distenv's overhead lies."""
    rows = []
    for launcher, res in d["launchers"].items():
        for phase, label in PHASES.items():
            row = res.get("phases", {}).get(phase)
            if row is None:
                continue
            rows.append(
                [
                    launcher,
                    label,
                    f"{row['bare']:.2f}",
                    f"{row['distenv']:.2f}",
                    f"{row['distenv_minus_bare_ms']:+.2f}",
                ]
            )
    if not rows:
        return ""
    return (
        "\n\nPer phase (each rank times its own; the median over a launch's ranks, then over "
        "launches; the difference is the median of the paired launches' differences):\n\n"
        + table(["launcher", "phase", "bare ms", "distenv ms", "distenv - bare ms"], rows)
    )


def allreduce_section(d: dict[str, Any]) -> tuple[str, list[list[str]]]:
    methods = d["methods"]
    rows = []
    for name in sorted(methods, key=lambda n: methods[n]["p50"]):
        m = methods[name]
        mm = m["speedup_vs_mmengine_all"]
        rows.append(
            [
                f"`{name}`",
                m["collectives"],
                ms(m["p50"]),
                ms(m["p95"]),
                f"{m['speedup_vs_per_tensor']:.2f}x",
                "n/a" if mm is None else f"{mm:.2f}x",
                f"{m['peak_extra_bytes'] / MIB:.1f}",
            ]
        )
    text = table(
        [
            "method",
            "all_reduce calls",
            "p50 ms",
            "p95 ms",
            "vs per tensor",
            "vs mmengine_all",
            "peak extra MiB",
        ],
        rows,
    )
    default = methods["distenv_default"]
    bound = max(25 * MIB, d["largest_grad_bytes"])
    targets = [
        [
            "`allreduce_grads` default ≥ 3x one all_reduce per tensor",
            f"{default['speedup_vs_per_tensor']:.2f}x (same configuration run twice: "
            f"`distenv_25mb` {methods['distenv_25mb']['speedup_vs_per_tensor']:.2f}x)",
            yes(default["speedup_vs_per_tensor"] >= 3),
        ]
    ]
    if default["speedup_vs_mmengine_all"] is not None:
        targets.append(
            [
                "`allreduce_grads` default ≥ 1.3x mmengine's default (one unbounded buffer)",
                f"{default['speedup_vs_mmengine_all']:.2f}x",
                yes(default["speedup_vs_mmengine_all"] >= 1.3),
            ]
        )
    targets.append(
        [
            "extra memory ≤ one bucket (25 MiB; a larger tensor travels alone)",
            f"{default['peak_extra_bytes'] / MIB:.1f} MiB",
            yes(default["peak_extra_bytes"] <= bound),
        ]
    )
    if d["skipped"]:
        text += "\n\nNot measured: " + "; ".join(f"{k} ({v})" for k, v in d["skipped"].items())
    return text, targets


def scaling_section(d: dict[str, Any]) -> tuple[str, str]:
    init = {k: v for k, v in d["init"].items() if k.isdigit()}
    rows = []
    for n in sorted(init, key=int):
        row = [n]
        for method in ("distenv", "bare"):
            m = init[n].get(method)
            row += (
                [ms(m["max_over_ranks_s"]["median"]), f"{m['launch_wall_s']['median']:.1f}"]
                if m
                else ["-", "-"]
            )
        rows.append(row)
    init_text = table(
        ["local ranks", "distenv ms", "distenv launch s", "bare ms", "bare launch s"], rows
    )
    if "stopped_after" in d["init"]:
        init_text += f"\n\nStopped after {d['init']['stopped_after']} ranks: a launch took > 60 s."
    rc = {k: v for k, v in d["rollcall"].items() if k.isdigit()}
    rc_rows = []
    for n in sorted(rc, key=int):
        r = rc[n]
        rc_rows.append(
            [
                n,
                ms(r["rank0_roll_call"]["median"]),
                f"{r['rank0_per_rank_us']:.0f}",
                ms(r["validate"]["median"]),
                ms(r["multi_get"]["median"]),
                ms(r["checkin_loop"]["median"]),
                f"{r['verdict_bytes']}",
                f"{r['verdict_read']['median'] * 1e6:.0f}",
            ]
        )
    rc_text = table(
        [
            "ranks",
            "rank 0 roll call ms",
            "µs per rank",
            "validate ms",
            "multi_get ms",
            "N-1 check-ins ms",
            "verdict B",
            "one verdict read µs",
        ],
        rc_rows,
    )
    return init_text, rc_text


# The roll call with the node layout left to it: a separate, smaller run of bench_scaling.py
# (`--rollcall-only`) until a full `benchmarks/run.sh` run carries it in scaling.json.
LAYOUT_FILE = "rollcall_layout.json"
LAYOUT_COMMAND = (
    ".venv/bin/python benchmarks/bench_scaling.py --rollcall-only "
    "--rollcall-sizes {sizes} --rollcall-repeats {repeats} --out docs/benchmarks/" + LAYOUT_FILE
)


def layout_section(results: Path, scaling: dict[str, Any]) -> str:
    """The verdict's size and rank 0's time with the node layout from the roll call, as ratios to
    the known layout's in the same run: from scaling.json if it has them, else LAYOUT_FILE."""
    source, separate = scaling, False
    has = [
        v for k, v in scaling["rollcall"].items() if k.isdigit() and "layout_from_roll_call" in v
    ]
    if not has and (results / LAYOUT_FILE).exists():
        source, separate = json.loads((results / LAYOUT_FILE).read_text()), True
    rc = {
        k: v for k, v in source["rollcall"].items() if k.isdigit() and "layout_from_roll_call" in v
    }
    if not rc:
        return (
            "Not measured yet: run `" + LAYOUT_COMMAND.format(sizes="1024,4096", repeats=3) + "`."
        )
    rows = []
    for n in sorted(rc, key=int):
        known, lay = rc[n], rc[n]["layout_from_roll_call"]
        rows.append(
            [
                n,
                lay["hosts"],
                known["verdict_bytes"],
                lay["verdict_bytes"],
                f"{lay['verdict_bytes_ratio']:.0f}x",
                ms(known["rank0_roll_call"]["median"]),
                ms(lay["rank0_roll_call"]["median"]),
                f"{lay['rank0_ratio']:.2f}",
                f"{lay['rank0_cpu_ratio']:.2f}",
                f"{known['verdict_parse']['median'] * 1e6:.0f}",
                f"{lay['verdict_parse']['median'] * 1e6:.0f}",
                f"{lay['verdict_parse_ratio']:.1f}",
                f"{lay['all_verdict_reads_bytes'] / MIB:.1f}",
            ]
        )
    text = table(
        [
            "ranks",
            "hosts",
            "verdict B (known)",
            "verdict B (roll call)",
            "bytes ratio",
            "rank 0 ms (known)",
            "rank 0 ms (roll call)",
            "rank 0 ratio",
            "rank 0 CPU ratio",
            "verdict parse µs (known)",
            "verdict parse µs (roll call)",
            "parse ratio",
            "N-1 reads MiB (roll call)",
        ],
        rows,
    )
    sizes = ",".join(sorted(rc, key=int))
    repeats = source["rollcall_repeats"]
    if separate:
        load = source.get("load_average", {})
        text = (
            f"Measured in a separate, smaller run than the rest of this page, on "
            f"{source['machine']['date']} (`{LAYOUT_COMMAND.format(sizes=sizes, repeats=repeats)}`"
            f", {repeats} repetitions), while the 2-core machine was shared with other work (1-minute"
            f" load average {load.get('before', math.nan):.1f} before, "
            f"{load.get('after', math.nan):.1f} after): the milliseconds are noisy, and the ratios,"
            " each the median of per-repetition pairs, are what to read.\n\n" + text
        )
    return text


def _cpu_share(extra_ms: float, d: dict[str, Any]) -> float:
    """Return what `extra_ms` of CPU per rank costs in wall time when run `d`'s ranks share the
    machine's cores fully (ms)."""
    return float(extra_ms * d["nprocs"] / d["machine"]["logical_cpus"])


def _cpu(method: dict[str, Any]) -> str:
    """A method's CPU time per rank (ms), or "n/a" in results from before it was measured."""
    cpu = method.get("cpu_per_rank_ms")
    return "n/a" if cpu is None else f"{cpu:.1f}"


# The bootstrap under torchrun with one rank per core (run_all.py's "bootstrap_per_core").
PER_CORE_FILE = "bootstrap_per_core.json"


def per_core_section(results: Path, shared: dict[str, Any]) -> str:
    """torchrun with 4 ranks (`shared`, the main run) beside 2 ranks on 2 cores: how much of
    distenv's overhead is its ranks' extra CPU time, paid in wall time when ranks share cores."""
    if not (results / PER_CORE_FILE).exists():
        return "Not measured yet: run `python benchmarks/run_all.py --only bootstrap_per_core`."
    alone = json.loads((results / PER_CORE_FILE).read_text())
    cores = alone["machine"]["logical_cpus"]
    rows = []
    for d in (shared, alone):
        res = d["launchers"].get("torchrun")
        if res is None or "median_paired_cpu_diff_ms" not in res.get("distenv_vs_bare", {}):
            continue
        methods, ab = res["methods"], res["distenv_vs_bare"]
        extra = ab["median_paired_cpu_diff_ms"]
        rows.append(
            [
                d["nprocs"],
                ms(methods["bare"]["max_over_ranks_s"]["median"]),
                ms(methods["distenv"]["max_over_ranks_s"]["median"]),
                f"{ab['median_paired_diff_ms']:+.1f}",
                f"{methods['bare']['cpu_per_rank_ms']:.1f} / "
                f"{methods['distenv']['cpu_per_rank_ms']:.1f}",
                f"{extra:+.1f}",
                f"{_cpu_share(extra, d):+.1f}",
            ]
        )
    text = table(
        [
            "ranks",
            "bare ms",
            "distenv ms",
            "distenv - bare ms",
            "CPU per rank ms, bare / distenv",
            "distenv's extra CPU per rank ms",
            f"extra CPU of all ranks / {cores} cores, ms",
        ],
        rows,
    )
    return (
        f"The same under torchrun with {alone['nprocs']} ranks, one per core, beside the run above "
        f"({alone['rounds']} paired rounds; medians, differences the median of paired "
        "differences). Where the ranks share the cores, every millisecond of CPU that distenv "
        "adds to each rank is wall time for somebody: the last column is that share, the "
        "overhead that no reordering of the rounds can remove.\n\n" + text + phase_section(alone)
    )


# The roll call at the scale that matters, flat and through node leaders (bench_rendezvous_scale.py).
SCALE_FILE = "rendezvous_scale.json"
SCALE_COMMAND = (
    ".venv/bin/python benchmarks/bench_rendezvous_scale.py --sizes 4096,16384,131072 "
    "--repeats 3 --out docs/benchmarks/" + SCALE_FILE
)


def leaders_section(results: Path) -> str:
    """Flat and node leaders side by side at each size: what rank 0's store served per node,
    rank 0's time, the verdict each rank reads; and the targets at the largest size."""
    if not (results / SCALE_FILE).exists():
        return "Not measured yet: run `" + SCALE_COMMAND + "`."
    data = json.loads((results / SCALE_FILE).read_text())
    rows = []
    for n in sorted(data["sizes"], key=int):
        for mode in ("flat", "leaders"):
            r = data["sizes"][n][mode]
            per = r["store"]["per_node"]
            rows.append(
                [
                    n,
                    mode,
                    f"{per['requests']:.2f}",
                    f"{per['bytes_in']:.0f} / {per['bytes_out']:.0f}",
                    ms(r["rank0_wall_s"]["median"]),
                    ms(r["rank0_cpu_s"]["median"]),
                    ms(r["rank0_gc_s"]["median"]),
                    r["verdict_bytes"],
                    f"{r['verdict_parse_s']['median'] * 1e6:.0f}",
                ]
            )
    text = table(
        [
            "ranks",
            "roll call",
            "requests per node",
            "bytes per node in / out",
            "rank 0 ms",
            "rank 0 CPU ms",
            "of it in Python's collector",
            "verdict B",
            "verdict parse µs",
        ],
        rows,
    )
    targets = []
    for mode, t in data["targets"].items():
        req = t["requests_per_node"]
        targets.append(
            [
                mode,
                f"{req['value']:.2f} {yes(req['met'])}",
                f"{t['rank0_roll_call_s']['value'] * 1000:.0f} ms {yes(t['rank0_roll_call_s']['met'])}",
                f"{t['verdict_bytes']['value']} B {yes(t['verdict_bytes']['met'])}",
            ]
        )
    largest = max(data["sizes"], key=int)
    load = data.get("load_average", {})
    lead, flat = data["sizes"][largest]["leaders"], data["sizes"][largest]["flat"]
    per_rank = lead["rank0_wall_s"]["median"] / int(largest)
    per_rank_flat = flat["rank0_wall_s"]["median"] / int(largest)
    per_node = lead["store"]["per_node"]["requests"]
    per_node_flat = flat["store"]["per_node"]["requests"]
    projected = [
        [
            f"{gpus:,}".replace(",", " "),
            f"{per_rank * gpus:.2f} s",
            f"{per_rank_flat * gpus:.2f} s",
            f"{per_node * gpus / 8:,.0f}".replace(",", " "),
            f"{per_node_flat * gpus / 8:,.0f}".replace(",", " "),
        ]
        for gpus in (10_000, 100_000)
    ]
    projection_text = (
        f"\n\n**Projection.** Linear in the world from the {largest}-rank run: rank 0's roll "
        f"call at {per_rank * 1e6:.1f} µs per rank with node leaders ({per_rank_flat * 1e6:.1f} "
        f"flat), and the requests per node above, 8 GPUs per node:\n\n"
        + table(
            [
                "GPUs",
                "rank 0's roll call, leaders",
                "flat",
                "requests at rank 0's store, leaders",
                "flat",
            ],
            projected,
        )
        + "\n\nBeside the published start-up times at that scale: MegaScale (NSDI '24, §3.5) "
        "brought Megatron-LM's initialisation on 2 048 GPUs from about 1 047 s to under 5 s, "
        "and under 30 s on more than 10 000 GPUs; pytorch/pytorch#124982 took torchelastic's "
        "rendezvous at 4 000 hosts from 373 s to 10 s; pytorch/gloo#408 took gloo's "
        "initialisation at 8 000 ranks from about 55 min to 85 s. The projection leaves out "
        "what this benchmark does not run: network round trips (each leader's requests are "
        "sequential), the stragglers a roll call waits for, "
        "every rank's own connection for `init_process_group` and the process group's set-up "
        "itself, and the group-up check after it."
    )
    return (
        f"Measured on {data['machine']['date']} (`{SCALE_COMMAND}`, medians of the repetitions; "
        f"1-minute load average {load.get('before', math.nan):.1f} before, "
        f"{load.get('after', math.nan):.1f} after).\n\n"
        + text
        + f"\n\nTargets at {largest} simulated ranks (issue #28: at most 3 requests per node, "
        "rank 0's roll call within 1 s, at most 1 KiB of verdict per rank):\n\n"
        + table(["roll call", "requests per node", "rank 0", "verdict"], targets)
        + projection_text
    )


PAGE = """\
# Benchmarks

<!-- GENERATED by `bash benchmarks/run.sh` (benchmarks/report.py) on {date}: do not edit by hand;
     raw results: docs/benchmarks/*.json -->

What distenv costs, measured against the alternatives on one small machine. Every number below comes
from one run of `bash benchmarks/run.sh` on **{date}**; ratios compare numbers of that same run.

!!! warning "A 2-core machine without a GPU"
    {cores} logical CPUs, no GPU (gloo on CPU only). Every multi-rank measurement runs 4 or more
    processes on 2 cores, so ranks are oversubscribed and timings are noisy: medians, percentiles and
    bootstrap intervals are given for that reason, and differences of a few milliseconds are within
    the noise. Nothing here measures NCCL, a network, or a real multi-node job.

## The machine

{machine}

## Targets

{targets}

## 1. Import and detection

Each case is a fresh `python -c` child of the bench venv (`.venv-bench`), started {runs} times, interleaved
in a shuffled order after {warmup} warm-up rounds, under a simulated `srun -n 4` step environment. Wall
time is spawn to exit; peak RSS is the child's own `VmHWM` read as its last act (`wait4`'s rusage would
charge every child with the parent's peak, because Linux records the pre-exec address space's high-water
mark at exec). Δ columns are the median of per-round differences to the same round's bare interpreter,
with a bootstrap 95 % interval. The distenv child also checks that neither torch, mpi4py nor numpy was
imported, and fails the benchmark otherwise.

{import_table}

![import time and memory](benchmarks/import.png)

## 2. Bootstrap: from `import torch` to the first all_reduce

Each measurement is one launch with {nprocs} ranks: `srun -n {nprocs}` (one job step on the test cluster
`one`) or `torchrun --nproc-per-node {nprocs}`. Every rank imports torch and the library under test, then
waits at a file barrier until all ranks have, so one rank's slow `import torch` is not charged to another
rank's bootstrap; the clock runs from that start line to the return of the first `all_reduce` and rank 0
reports the maximum over ranks. Methods:

- `distenv`: `distenv.init_dist()` with defaults (launcher auto; gloo on CPU); this includes distenv's
  roll call (every rank checks in over the store and rank 0 validates) before `init_process_group`.
- `bare`: a hand-written shim (`RANK=SLURM_PROCID`, `WORLD_SIZE=SLURM_NTASKS`, `LOCAL_RANK=SLURM_LOCALID`,
  `MASTER_ADDR` = first host of `SLURM_STEP_NODELIST` via hostlist, `MASTER_PORT` from `SLURM_JOB_ID`)
  then `init_process_group("gloo", init_method="env://")`; under torchrun just the latter.
- `mmengine`: `mmengine.dist.init_dist("slurm" or "pytorch", backend="gloo")` (with a port from the job
  id under srun). mmengine calls `torch.cuda.set_device(local_rank)` unconditionally, which a CPU-only
  torch cannot do (`AttributeError: torch._C has no attribute _cuda_setDevice`): the benchmark replaces
  it with a no-op, so **mmengine's `init_dist` does not work at all on a CPU-only torch as shipped**.

{rounds} rounds with distenv and bare (paired), {mm_rounds} of them with mmengine too, in a shuffled
order per round, after {warmup_rounds} warm-up round(s) before {warmup_before}; this part took
{boot_total:.0f} s.

{boot_table}

How to read it: on this machine the times are **bimodal** (the "launches > 200 ms" column, and the
dots in the plot): most launches finish in tens of milliseconds, some take half a second or more, in
every method. The slow mode looks like connection retries (a rank reaching rank 0's TCPStore port
before rank 0 listens backs off for hundreds of milliseconds); distenv probes the port itself with a
short back-off before making its store client (not under torchrun, whose agent's store listens
before any rank starts), and its ranks then wait in the store. With 15
launches a median can sit in either mode, which is why the interval on the overhead is wide and the
median paired difference is given too. None of this is visible at a single launch; run more rounds
(`--rounds`) before reading a few milliseconds into it.

![bootstrap times](benchmarks/bootstrap.png)

### One rank per core

{per_core}

## 3. Processes started per rank during bootstrap

Counted in each rank with `sys.addaudithook` (`subprocess.Popen`, `os.system`, `os.exec*`,
`os.posix_spawn`, `os.fork`, `os.spawn*`) between the start line and the first finished all_reduce, in
the launches of part 2. mmengine's one `subprocess.Popen` per rank is `/bin/sh -c "scontrol show hostname
… | head -n1"`: a shell, `scontrol` and `head`, three processes and one query to the Slurm controller's
configuration per rank (with `SLURM_CONF` pointing nowhere, scontrol retries for about a minute).

{proc_table}

## 4. `allreduce_grads` on ResNet-50-shaped gradients

{nprocs_ar} gloo ranks on one node, started with `distenv.launch`; {tensors} gradients in ResNet-50's
shapes (written out by hand from the architecture, `benchmarks/_resnet50.py`: {params:,} values,
{grad_mib:.1f} MiB; the largest tensor is {largest_mib:.1f} MiB). Each method leaves every gradient equal to
the mean over ranks (checked once before timing, when the all_reduce calls are also counted). {iters}
iterations after {warmup_ar} warm-up ones; each iteration runs every method once in a shuffled order,
each after a barrier; a method's time is the slowest rank's. `per_tensor` is one all_reduce per tensor
then a divide; `distenv_<N>mb` is `allreduce_grads(params, bucket_size_mb=N)` and `distenv_default`
the default (25 MB: the same configuration as `distenv_25mb`, measured separately, so the gap between
the two is a direct view of the noise); `mmengine_all` is mmengine's default
`all_reduce_params(grads, coalesce=True, bucket_size_mb=-1, op="mean")` (one buffer holding every
gradient) and `mmengine_25mb` the same with 25 MB buckets.

**Extra memory** is measured, not computed: each method is called once more under `torch.profiler`
with `profile_memory=True`, and the peak of the running sum of its allocation and free events is
what it held through torch's CPU allocator beyond the gradients. (RSS cannot show this: glibc keeps
freed blocks mapped and reuses them, and VmHWM only grows. gloo's own transport buffers are not
torch allocations and are not counted.)

{ar_table}

![allreduce times and memory](benchmarks/allreduce.png)

## 5. Scaling

### Bootstrap against world size

`distenv run -n N` of the part-2 worker (distenv's `init_dist` and the bare `env://` init under the same
contract), {repeats} launch(es) each, N local ranks on **2 cores: from 4 ranks on, oversubscribed**, so
growth here is CPU contention as much as protocol. Milliseconds are from the start line to the first
all_reduce (max over ranks); "launch s" is the whole `distenv run`, dominated by N processes importing
torch on 2 cores.

{init_table}

### The roll call with many simulated ranks

One real TCPStore (loopback) and rank 0's `distenv.bootstrap.rollcall.roll_call`; ranks 1..N-1 are simulated
by a loop calling `distenv.bootstrap.flat.check_in`, the two store calls a rank makes to check in (the
claim of its rank's key, then the count). Times are medians of {rc_repeats} repetitions (store:
{store}). "multi_get" is one `store.multi_get` of all N records in a single request, for comparison
with rank 0's chunks; "verdict B" is the size of the verdict every other rank reads.

{rc_table}

![scaling](benchmarks/scaling.png)

#### The node layout from the roll call

Where the launcher names no node index or node count (Open MPI 5 alone, Flux, Cray PALS), rank 0
numbers the ranks' hosts in order of their lowest rank and writes each rank its own place (its
node, the node count) beside the verdict; every rank takes its node from it
(`distenv.bootstrap.verdict.fill_layout`). The same simulated roll call, {ranks_per_host} ranks per
host, runs each size twice per repetition in a shuffled order: once with every check-in naming its
node ("known") and once with the layout left to the roll call. "rank 0 CPU" is the CPU time of
rank 0's process (with its store's threads) during its roll call, steadier than the wall time when
other work shares the machine. "verdict B" is what one rank reads (with the layout from the roll
call: the verdict and its place), "verdict parse" what it then does: `parse_verdict`,
`parse_place` and `fill_layout`.

{layout_table}

### Node leaders

Where ranks share a node, its local rank 0 speaks for it ([Scale](scale.md)). A real TCPStore
(libuv) and rank 0's real roll call in one process; the other ranks' store traffic is real too:
client processes speak TCPStore's wire protocol over real TCP connections
(`benchmarks/_store_wire.py`) and make each rank's (flat) or each leader's requests exactly as
distenv does, so every request and byte rank 0's store serves is counted. 8 ranks per node; flat:
the N-1 ranks over at most 1 024 connections; node leaders: one connection per leader (16 383 at
131 072 ranks, from 2 processes), and rank 0 leads node 0, whose 7 members are real processes on
its node's socket. Requests per node are those of the check-in and the verdict read (a WAIT and a
GET: a waiting rank does not poll); rank 0's time includes its own node's gathering, its store's thread and
Python's collector, which rank 0 holds off while it parses.

{leaders_table}

**At scale.** Rank 0 reads the N records in `multi_get` chunks of {chunk} keys (a `check` first, since
`multi_get` waits for a missing key), parses each against its schema (`distenv.bootstrap.records`, with a cache
of the strings each pattern has matched) and validates the world with set comparisons:
{per_rank_us:.0f} µs per rank at {n_max} ranks, {rc_ms:.0f} ms in all (issue #12's target: at most
400 ms at 16384 ranks). One `multi_get` of all {n_max} records in a single request took
{multi_ms:.0f} ms: one huge request costs more than its chunks. Every other rank makes four store
round trips when nobody is late, however long it waits (peek at the scope, claim its key, count
itself, and one ``get`` of the verdict, which waits in the store: a WAIT and a GET on the wire;
`tests/unit/test_rollcall.py` counts them): no rank but rank 0 polls. The verdict holds only the outcome and the
problems ({verdict_b} bytes when all is well), so the N-1 reads cost O(N) bytes: {reads_kib:.0f} KiB
at {n_max} ranks. torch's own `init_process_group` on gloo is O(N) connections per rank, O(N^2) in
all; NCCL's bootstrap goes through the same store.

## Reproduce

```console
bash benchmarks/run.sh              # creates .venv-bench if needed, runs everything (~{total_min:.0f} min here)
bash benchmarks/run.sh --quick      # fewer repetitions, for trying changes
.venv-bench/bin/python benchmarks/report.py   # re-render this page from docs/benchmarks/*.json
```

Each benchmark is also a script with `--help` (`benchmarks/bench_*.py`) and a `--smoke` mode, which
`tests/meta/test_benchmarks.py` runs once at tiny size in the project venv so the scripts cannot rot; the
tests assert no timings.
"""


def projection(rollcall: dict[str, Any]) -> dict[str, Any]:
    """Numbers for the "At scale" paragraph, from the largest simulated roll call."""
    n_max = max(int(k) for k in rollcall if k.isdigit())
    r = rollcall[str(n_max)]
    return {
        "n_max": n_max,
        "per_rank_us": r["rank0_per_rank_us"],
        "multi_ms": r["multi_get"]["median"] * 1000,
        "rc_ms": r["rank0_roll_call"]["median"] * 1000,
        "verdict_b": r["verdict_bytes"],
        "reads_kib": r["all_verdict_reads_bytes"] / 1024,
        "chunk": rollcall.get("chunk", 512),
    }


def render(results: Path, page: Path) -> None:
    data = {name: json.loads((results / f"{name}.json").read_text()) for name in NAMES}
    m = data["import"]["machine"]
    img = page.parent / "benchmarks"
    img.mkdir(parents=True, exist_ok=True)
    plot_import(data["import"], img / "import.png")
    plot_bootstrap(data["bootstrap"], img / "bootstrap.png")
    plot_allreduce(data["allreduce"], img / "allreduce.png")
    plot_scaling(data["scaling"], img / "scaling.png")

    import_table, t1 = import_section(data["import"])
    boot_table, proc_table, t2 = bootstrap_section(data["bootstrap"])
    ar_table, t4 = allreduce_section(data["allreduce"])
    init_table, rc_table = scaling_section(data["scaling"])
    targets = table(["target", "measured", ""], t1 + t2 + t4)
    b, a, s = data["bootstrap"], data["allreduce"], data["scaling"]
    total = sum(data[n].get("total_s", 0) for n in NAMES) + sum(
        sum(c["raw_wall_s"]) for c in data["import"]["cases"].values()
    )
    text = PAGE.format(
        date=m["date"],
        cores=m["logical_cpus"],
        machine=machine_section(m),
        targets=targets,
        runs=data["import"]["runs"],
        warmup=data["import"]["warmup"],
        import_table=import_table,
        nprocs=b["nprocs"],
        rounds=b["rounds"],
        mm_rounds=b["mmengine_rounds"],
        warmup_rounds=b["warmup_rounds"],
        warmup_before=b.get("warmup_before", "each launcher"),
        boot_total=b["total_s"],
        boot_table=boot_table,
        per_core=per_core_section(results, data["bootstrap"]),
        proc_table=proc_table,
        nprocs_ar=a["nprocs"],
        tensors=a["tensors"],
        params=a["parameters"],
        grad_mib=a["grad_bytes"] / MIB,
        largest_mib=a["largest_grad_bytes"] / MIB,
        iters=a["iters"],
        warmup_ar=a["warmup"],
        ar_table=ar_table,
        repeats=s["repeats"],
        init_table=init_table,
        rc_repeats=s["rollcall_repeats"],
        store=s["rollcall"]["store"],
        rc_table=rc_table,
        ranks_per_host=s["rollcall"].get("ranks_per_host", 8),
        layout_table=layout_section(results, s),
        leaders_table=leaders_section(results),
        total_min=total / 60,
        **projection(s["rollcall"]),
    )
    page.write_text(text)
    print(f"wrote {page.relative_to(REPO)} and {len(NAMES)} plots in {img.relative_to(REPO)}/")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=REPO / "docs" / "benchmarks")
    p.add_argument("--page", type=Path, default=REPO / "docs" / "benchmarks.md")
    args = p.parse_args(argv)
    render(args.results, args.page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
