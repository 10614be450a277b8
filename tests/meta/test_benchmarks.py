"""The benchmarks still run: each script once at tiny size (``--smoke``), in the project venv.

No timing is asserted (CI machines are noisy); what is pinned is the shape of each result and the
facts that do not depend on speed: distenv's import leaves torch out and its bootstrap starts no
process. Competitors are not installed in the project venv; the scripts say so and skip them.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import scrubbed_environ
from tests.support.integration.helpers import STATE, load_env_sh

pytestmark = pytest.mark.slow  # out of a bare pytest's fast lane (tests/conftest.py)

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def smoke(script: str, *args: str, timeout: float = 60) -> dict[str, Any]:
    """Run ``benchmarks/<script> --smoke`` and return the JSON it prints."""
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--smoke", *args],
        env=scrubbed_environ(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    data: dict[str, Any] = json.loads(result.stdout)
    assert data["smoke"] is True
    assert data["machine"]["logical_cpus"] >= 1
    return data


def test_import_benchmark_keeps_torch_out() -> None:
    """The import benchmark measures distenv against bare Python: its detection and what a
    training script loads (`from distenv import init_dist`); neither imported torch."""
    data = smoke("bench_import.py")
    assert data["benchmark"] == "import"
    assert {"python", "distenv", "distenv_init"} <= set(data["cases"])
    for case in data["cases"].values():
        assert case["wall_s"]["n"] == 1
        assert case["rss_mib"]["median"] > 0
    # The child fails the run if torch/mpi4py/numpy were imported; reaching here means they were not.
    assert data["cases"]["distenv"]["label"].startswith("`import distenv")


@pytest.mark.slurm
def test_bootstrap_benchmark_under_srun_and_torchrun_starts_no_process() -> None:
    """One launch per method under srun and torchrun; distenv's ranks start 0 processes."""
    conf = load_env_sh(STATE / "env.sh")["DISTENV_TEST_SLURM_ONE"]
    data = smoke("bench_bootstrap.py", "--slurm-conf", conf, timeout=120)
    assert set(data["launchers"]) == {"srun", "torchrun"}
    for result in data["launchers"].values():
        methods = result["methods"]
        assert {"distenv", "bare"} <= set(methods)
        assert methods["distenv"]["events_per_rank_max"] == 0
        assert methods["distenv"]["max_over_ranks_s"]["n"] == 1
        assert "overhead_pct" in result["distenv_vs_bare"]
        # CPU time is the process's, every thread's: a bootstrap that finished used some.
        assert methods["distenv"]["cpu_per_rank_ms"] > 0
        assert methods["bare"]["cpu_per_rank_ms"] > 0
        # Importing distenv's bootstrap after torch takes CPU (tens of modules); it is reported
        # apart from the bootstrap's, which starts after every rank imported its library.
        assert methods["distenv"]["import_cpu_per_rank_ms"] > 1


def test_bootstrap_profile_puts_distenv_cpu_in_its_phases() -> None:
    """``--profile`` under torchrun: every rank's CPU per phase, adding up to its process CPU;
    distenv's detection, store and roll call are phases of their own, bare has none of them."""
    data = smoke("bench_bootstrap.py", "--profile", "--launchers", "torchrun", timeout=120)
    assert data["benchmark"] == "bootstrap_profile"
    result = data["launchers"]["torchrun"]
    distenv, bare = result["methods"]["distenv"]["phases"], result["methods"]["bare"]["phases"]
    for phase in ("detection", "store connect", "check-in", "init_process_group", "all_reduce"):
        assert distenv[phase]["rank0"] > 0, phase
        assert distenv[phase]["others"] > 0, phase
    assert distenv["gather and verdict (rank 0)"]["rank0"] > 0
    assert "detection" not in bare
    assert bare["init_process_group"]["rank0"] > 0
    for phases in (distenv, bare):
        parts = sum(row["rank0"] for name, row in phases.items() if name != "total")
        assert parts == pytest.approx(phases["total"]["rank0"], abs=0.01)
    assert "median_paired_cpu_diff_ms" in result


def test_allreduce_benchmark_averages_with_fewer_collectives() -> None:
    """Every method averages correctly; distenv's buckets issue fewer collectives than tensors."""
    data = smoke("bench_allreduce.py")
    methods = data["methods"]
    assert {"per_tensor", "distenv_default", "distenv_1mb", "distenv_25mb"} <= set(methods)
    assert methods["per_tensor"]["collectives"] == data["tensors"]
    assert methods["distenv_default"]["collectives"] < data["tensors"]
    assert methods["distenv_default"]["peak_extra_bytes"] > 0


def test_scaling_benchmark_runs_the_roll_call() -> None:
    """One `distenv run -n 2` launch and a 16-rank simulated roll call with a valid verdict, with
    the node layout known and left to the roll call: then each rank also reads its own place."""
    data = smoke("bench_scaling.py")
    assert data["init"]["2"]["distenv"]["processes_per_rank"] == 0
    rollcall = data["rollcall"]["16"]
    assert rollcall["rank0_roll_call"]["n"] == 1
    assert rollcall["verdict_bytes"] > 0
    layout = rollcall["layout_from_roll_call"]
    assert layout["hosts"] == 2
    assert layout["rank0_roll_call"]["n"] == layout["verdict_parse"]["n"] == 1
    assert layout["verdict_bytes"] > rollcall["verdict_bytes"]
    assert layout["verdict_bytes_ratio"] == layout["verdict_bytes"] / rollcall["verdict_bytes"]
    assert layout["rank0_ratio"] > 0


def test_fault_matrix_records_the_silent_listener() -> None:
    """The fault matrix's smoke run: one fault, timed, its rank exits and message recorded."""
    data = smoke("lab/fault_matrix.py", timeout=120)
    rec = data["faults"]["silent-master-port"]
    assert rec["launcher_exit"] == 1
    assert rec["measured_s"] is not None
    assert rec["measured_s"] <= rec["bound_s"]
    assert "not answering as a torch store" in rec["excerpt"]
    assert rec["survivors"] == []


@pytest.mark.netns
def test_network_matrix_passes_the_control_bare_and_with_distenv() -> None:
    """The network matrix's smoke run: the clean control's 3 namespaced nodes finish the
    all_reduce bare and through distenv, every rank exits 0 with no error, and no namespace is left."""
    from tests.support import netlab

    data = smoke("lab/network_matrix.py", timeout=120)
    control = data["topologies"]["control"]
    assert control["nodes"] == 3
    for mode in ("bare", "distenv"):
        ranks = control[mode]["ranks"]
        assert control[mode]["passed"] is True, ranks
        assert [(r["node"], r["exit"], r["sum"], r["error"]) for r in ranks] == [
            (f"node{i}", 0, 6, None) for i in range(3)
        ]
        assert control[mode]["seconds"] <= data["bound_s"]
    assert data["passed"] == {"bare": 1, "distenv": 1}
    assert netlab.leftovers(data["netns_prefix"]) == []


def test_restart_matrix_restarts_one_failure_with_nothing_miscounted() -> None:
    """The restart matrix's smoke run: one injected failure of 2 ranks under distenv run
    --max-restarts, restarted once, every attempt counted right, no orphan, its recovery timed."""
    data = smoke("lab/restart_matrix.py", timeout=120)
    rec = data["launchers"]["distenv"]
    assert rec["passed"] is True, rec["stderr_tail"]
    assert rec["attempts"] == 2
    assert rec["miscounted"] == []
    assert rec["orphans"] == []
    assert len(rec["recoveries"]) == 1
    recovery = rec["recoveries"][0]
    assert recovery["recovery_s"] >= recovery["rank_start_s"] > 0
    assert recovery["stopped_s"] > 0
    assert recovery["restart_s"] > 0


def test_exit_race_benchmark_runs_the_bare_torch_control() -> None:
    """The exit race's smoke run: one job of 4 bare-torch ranks under test_teardown.py's forcing,
    each rank ending 0 or aborted at exit (SIGABRT) and nothing else, every exit counted."""
    data = smoke("lab/exit_race.py", timeout=600)
    [job] = data["jobs"]
    assert len(job["codes"]) == len(job["aborted"]) == data["exits"] == 4
    for code, aborted in zip(job["codes"], job["aborted"], strict=True):
        assert code in (0, -signal.SIGABRT), job
        assert aborted or code == 0, job
    assert data["aborted_exits"] == sum(job["aborted"])
    first = data["first_abort_exit"]
    assert first == (job["aborted"].index(True) + 1 if any(job["aborted"]) else None)


def test_preempt_benchmark_times_the_step_with_and_without_the_check() -> None:
    """Two ranks run train.py's step plain and with `stop_requested()`; no stop is ever seen."""
    data = smoke("bench_preempt.py")
    assert set(data["methods"]) == {"plain", "check", "check_10"}
    assert all(m["p50"] > 0 for m in data["methods"].values())
    assert data["methods"]["plain"]["overhead_vs_plain"] == 0


def test_watchdog_benchmark_times_both_watchdogs_and_counts_no_process() -> None:
    """The watchdog benchmark runs plain, distenv run's and init_dist's watchdog: one thread in a
    rank under distenv run, two with init_dist's in-process autopsy, no child process."""
    data = smoke("bench_watchdog.py", timeout=300)
    assert data["benchmark"] == "watchdog"
    assert set(data["steps_per_s"]) == {"plain", "run", "init"}
    assert set(data["watched"]) == {"run", "init"}
    assert all(data["step_s"][mode]["median"] > 0 for mode in ("plain", "run", "init"))
    assert data["threads"] == {"plain": 0, "run": 1, "init": 2}
    assert data["children"] == 0
    assert 0 < data["sample_s"] < 0.01


def test_ranklog_benchmark_tees_every_byte_with_one_thread_and_no_process() -> None:
    """The per-rank log benchmark runs the step loop bare and logged: the logged process has one
    more thread (the copying thread) and no child, and its log holds what its console got."""
    data = smoke("bench_ranklog.py", timeout=60)
    assert data["benchmark"] == "ranklog"
    [variant] = data["variants"].values()
    assert variant["print_every"] == 1
    assert variant["threads_added"] == {"bare": 0, "logged": 1}
    assert variant["children"] == 0
    # 150 lines of 65 bytes at least (50 untimed steps, 100 timed).
    assert variant["log_bytes"] == variant["console_bytes"] >= 150 * 65
    assert all(variant["step_s"][mode]["median"] > 0 for mode in ("bare", "logged"))


def test_the_security_page_states_the_versions_benchmark_as_recorded() -> None:
    """docs/security.md's cost table is docs/benchmarks/versions.json's bootstrap rows, rounded."""
    repo = Path(__file__).resolve().parents[2]
    result = json.loads((repo / "docs" / "benchmarks" / "versions.json").read_text())
    page = (repo / "docs" / "security.md").read_text()
    for launcher in ("srun", "torchrun"):
        row = result["measurements"][f"bootstrap {launcher}"]
        low, high = row["ci95_diff_ms"]
        expected = (
            f"| `{launcher}` | {row['baseline_ms']['median']:.1f} ms | "
            f"{row['candidate_ms']['median']:.1f} ms | {row['median_diff_ms']:+.1f} ms "
            f"[{low:+.1f}, {high:+.1f}] |"
        )
        assert expected in page, expected


def watchdog_phrases(result: dict[str, Any]) -> list[str]:
    """What docs/failures.md says of docs/benchmarks/watchdog.json, each number as it rounds it."""
    rates = [rate for mode in result["steps_per_s"].values() for rate in mode]
    load = result["load_average"]
    phrases = [
        f"1-minute load average {load['before']:.1f} to {load['after']:.1f}",
        f"one sample took {result['sample_s'] * 1e6:.1f} µs "
        f"({result['sample_period_pct']:.4f} % of a 0.25 s period)",
        f"({min(rates):,} to {max(rates):,} steps/s from one job to the next)",
    ]
    for mode in ("run", "init"):
        watched = result["watched"][mode]
        low, high = watched["overhead_pct_ci95"]
        phrases += [
            f"at most {watched['threads_cpu_share_max'] * 100:.3f} %",
            f"{watched['overhead_pct']:+.1f} % (median of {result['rounds']} paired rounds, "
            f"95 % interval {low:+.1f} to {high:+.1f} %)",
        ]
    return phrases


def ranklog_phrases(result: dict[str, Any]) -> list[str]:
    """What docs/failures.md says of docs/benchmarks/ranklog.json, each number as it rounds it."""
    every, tenth = result["variants"]["every_1"], result["variants"]["every_10"]
    low, high = every["overhead_pct_ci95"]
    # The shortest step a line every step keeps within 1 % (benchmarks/report.py's floor).
    floor_ms = every["line_us"] / 1e3 * 100
    return [
        f"1-minute load average {result['load_average']['before']:.1f}",
        f"a {every['step_s']['bare']['median'] * 1e3:.2f} ms step",
        f"{every['overhead_pct']:+.2f} % longer logged than bare (median of {result['rounds']} "
        f"paired rounds, 95 % interval {low:+.2f} to {high:+.2f} %), "
        f"{tenth['overhead_pct']:+.2f} % printing every 10 steps",
        f"cost {every['line_us']:.1f} µs more logged than bare "
        f"({every['line_s']['bare']['median'] * 1e6:.1f} µs)",
        f"from {floor_ms:.2f} ms up",
        f"held the {every['log_bytes']:,} bytes its console got",
    ]


@pytest.mark.parametrize(
    ("name", "phrases"),
    [("watchdog", watchdog_phrases), ("ranklog", ranklog_phrases)],
)
def test_the_failures_page_states_the_benchmarks_as_recorded(
    name: str, phrases: Callable[[dict[str, Any]], list[str]]
) -> None:
    """docs/failures.md's costs of the watchdog and the per-rank log are the numbers of
    docs/benchmarks/<name>.json, rounded: the page and the benchmarks page (rendered from the
    same JSON) cannot drift apart."""
    repo = Path(__file__).resolve().parents[2]
    result = json.loads((repo / "docs" / "benchmarks" / f"{name}.json").read_text())
    page = " ".join((repo / "docs" / "failures.md").read_text().split())
    assert not result["smoke"]
    for phrase in phrases(result):
        assert phrase in page, phrase


def test_rendezvous_scale_benchmark_counts_fewer_requests_per_node_with_leaders() -> None:
    """64 simulated ranks over a real TCPStore, flat and through node leaders: every rank's (or
    leader's) requests reach the store and are counted, the verdict does not grow with the
    world, and leaders make the store serve fewer requests and bytes per node than flat."""
    data = smoke("bench_rendezvous_scale.py")
    assert data["benchmark"] == "rendezvous_scale"
    size = data["sizes"]["64"]
    flat, leaders = size["flat"], size["leaders"]
    for result in (flat, leaders):
        assert result["rank0_wall_s"]["n"] == 1
        assert result["verdict_bytes"] <= data["targets"][result["mode"]]["verdict_bytes"]["target"]
        assert result["store"]["requests"] == sum(
            row["requests"] for row in result["store"]["by_type"].values()
        )
    # Each of ranks 1..63 peeks at the scope, claims its key, counts itself, waits for the
    # verdict in the store and reads it (a WAIT and a GET).
    steps = flat["store"]["by_step"]
    assert [steps[s]["requests"] for s in ("peek scope", "claim checkin/<r>", "add written")] == [
        63
    ] * 3
    assert steps["wait verdict"]["requests"] == steps["get verdict"]["requests"] == 63
    # Each of the 7 other leaders peeks, counts its node, appends its batch, waits for the
    # verdict and reads it.
    steps = leaders["store"]["by_step"]
    assert [steps[s]["requests"] for s in ("peek scope", "add written", "append batch")] == [7] * 3
    assert steps["wait verdict"]["requests"] == steps["get verdict"]["requests"] == 7
    assert leaders["store"]["per_node"]["requests"] < flat["store"]["per_node"]["requests"]
    assert leaders["store"]["bytes_out"] < flat["store"]["bytes_out"]
    assert set(data["targets"]) == {"flat", "leaders"}


def test_placement_benchmark_reads_every_layout_without_a_process() -> None:
    """The cost per rank of CPU binding: this machine and three recorded nodes are read and
    planned, with no process started (docs/placement.md reports the full run's times)."""
    data = smoke("bench_placement.py")
    assert data["benchmark"] == "placement"
    assert data["processes"] == 0
    assert set(data["cases"]) == {"live", "dgx-h100", "frontier", "aurora-pvc"}
    assert data["cases"]["dgx-h100"]["cpus"] == 224
    assert data["cases"]["frontier"]["accelerators"] == 8
    assert all(case["ms"]["median"] > 0 for case in data["cases"].values())


def test_the_placement_page_states_the_benchmark_as_recorded() -> None:
    """docs/placement.md's cost table is docs/benchmarks/placement.json's cases, rounded."""
    repo = Path(__file__).resolve().parents[2]
    result = json.loads((repo / "docs" / "benchmarks" / "placement.json").read_text())
    page = (repo / "docs" / "placement.md").read_text()
    assert result["processes"] == 0
    assert f"{result['repeats']} repeats" in page
    for name, case in result["cases"].items():
        expected = (
            f"| {name} | {case['cpus']} | {case['accelerators']} | {case['ranks']} | "
            f"{case['ms']['median']:.2f} ms | {case['ms']['p95']:.1f} ms |"
        )
        assert expected in page, expected


def test_the_gpu_script_runs_every_step_and_exits_with_the_first_failure(tmp_path: Path) -> None:
    """tests/run_gpu.sh, which CI cannot run whole (no GPU), on this venv's Python: with the
    placement benchmark alone it records the machine and writes the benchmark's JSON; a failing
    step (pytest given no such file: status 4) still lets the next run, and sets the exit status."""
    repo = BENCHMARKS.parent
    env = {
        **scrubbed_environ(),
        "PATH": f"{repo / '.venv' / 'bin'}:{scrubbed_environ()['PATH']}",
        "BENCHMARKS": "placement",
        "TESTS": "tests/no_such_test.py",
    }
    done = subprocess.run(
        ["bash", str(repo / "tests" / "run_gpu.sh"), str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 4, out
    assert "== pytest -m gpu: exit 4" in out, out
    assert "== placement: exit 0" in out, out
    assert "bootstrap" not in out, out
    assert "nproc " in (tmp_path / "machine.txt").read_text()
    placement = json.loads((tmp_path / "placement.json").read_text())
    assert placement["processes"] == 0
    assert placement["cases"]["live"]["cpus"] >= 1
