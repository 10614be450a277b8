"""The benchmarks page's plots (docs/benchmarks/*.png), drawn from the same JSON results as its tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

MIB = 1024 * 1024


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


def plot_all(data: dict[str, dict[str, Any]], img: Path) -> None:
    """Draw the four plots of the page from `data` (benchmark name -> its results) into `img`."""
    plot_import(data["import"], img / "import.png")
    plot_bootstrap(data["bootstrap"], img / "bootstrap.png")
    plot_allreduce(data["allreduce"], img / "allreduce.png")
    plot_scaling(data["scaling"], img / "scaling.png")
