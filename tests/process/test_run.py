"""`distenv run`: the env contract, fail-fast, signals, no orphans, output filters, refused flags.

Real processes throughout: the launcher is started as ``python -m distenv run`` and its ranks are
tests/support/scripts/rank_child.py (plain Python, no torch), which report to a temporary directory.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from distenv.cli import build_parser, main
from distenv.detection.pipeline import detect, explain
from distenv.errors import ConfigurationError
from distenv.local.options import REFUSED_FLAGS, RefusedFlag
from distenv.local.run import build_children, plan_from_args
from tests.conftest import scrubbed_environ
from tests.support.envs import lsf, mpi, slurm

CHILD = str(Path(__file__).resolve().parents[1] / "support" / "scripts" / "rank_child.py")
REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 30


def launcher_env(**extra: str) -> dict[str, str]:
    """Return an environment for the launcher: scrubbed, plus `extra`."""
    env = scrubbed_environ()
    env.pop("OMP_NUM_THREADS", None)
    env.update(extra)
    return env


def run_cli(
    args: Sequence[str], env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m distenv run ARGS`` to completion."""
    return subprocess.run(
        [sys.executable, "-m", "distenv", "run", *args],
        env=dict(env if env is not None else launcher_env()),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


@contextlib.contextmanager
def started(args: Sequence[str]) -> Iterator[subprocess.Popen[str]]:
    """Start ``python -m distenv run ARGS`` in the background; kill and reap it on the way out."""
    launcher = subprocess.Popen(
        [sys.executable, "-m", "distenv", "run", *args],
        env=launcher_env(),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield launcher
    finally:
        launcher.kill()
        launcher.communicate(timeout=TIMEOUT)  # closes the pipes too


def wait_for(condition: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    """Poll `condition` until it holds; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout}s")
        time.sleep(0.02)


def gone(pid: int) -> bool:
    """Return whether `pid` has exited (a zombie counts: some containers' init never reaps)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] in "ZX"


def pids(out: Path, prefix: str = "pid") -> list[int]:
    """Return the pids the ranks wrote as DIR/<prefix><rank>."""
    return [int(p.read_text()) for p in sorted(out.glob(f"{prefix}[0-9]*"))]


def reports(out: Path) -> list[dict[str, object]]:
    """Return the ranks' reports, in rank order."""
    found = [json.loads(p.read_text()) for p in out.glob("rank*.json")]
    return sorted(found, key=lambda r: int(str(r["RANK"])))


def test_ranks_get_the_torchrun_contract(tmp_path: Path) -> None:
    """Every rank 0..N-1 runs once, with torchrun's variables, OMP=1, no export tag, one port."""
    env = launcher_env(DISTENV_SCOPE="slurm/12/0", TORCHELASTIC_USE_AGENT_STORE="True")
    args = ["-n", "3", CHILD, str(tmp_path), "-n", "5", "--foo", "--", "x"]
    result = run_cli(args, env)
    assert result.returncode == 0, result.stderr
    found = reports(tmp_path)
    assert [r["RANK"] for r in found] == ["0", "1", "2"]
    for rank, report in enumerate(found):
        assert report["WORLD_SIZE"] == report["ROLE_WORLD_SIZE"] == "3"
        assert report["LOCAL_RANK"] == report["ROLE_RANK"] == str(rank)
        assert report["LOCAL_WORLD_SIZE"] == "3"
        assert (report["GROUP_RANK"], report["GROUP_WORLD_SIZE"]) == ("0", "1")
        assert report["MASTER_ADDR"] == "127.0.0.1"
        assert report["OMP_NUM_THREADS"] == "1"
        assert report["DISTENV_SCOPE"] is None
        assert report["TORCHELASTIC_USE_AGENT_STORE"] is None
        assert report["detected"] == "pytorch"
        # Everything after the script reaches it untouched, even options distenv run knows.
        assert report["argv"] == [str(tmp_path), "-n", "5", "--foo", "--", "x"]
    assert len({r["MASTER_PORT"] for r in found}) == 1
    assert "OMP_NUM_THREADS=1" in result.stderr


def test_user_omp_num_threads_is_kept(tmp_path: Path) -> None:
    """A user's OMP_NUM_THREADS reaches the ranks unchanged, without the notice."""
    result = run_cli(["-n", "2", CHILD, str(tmp_path)], launcher_env(OMP_NUM_THREADS="3"))
    assert result.returncode == 0, result.stderr
    assert {r["OMP_NUM_THREADS"] for r in reports(tmp_path)} == {"3"}
    assert "OMP_NUM_THREADS" not in result.stderr


@pytest.mark.parametrize(
    ("spelling", "extra"), [("--local-rank", []), ("--local_rank", ["--use_env"])]
)
def test_legacy_local_rank_argument(tmp_path: Path, spelling: str, extra: list[str]) -> None:
    """--local-rank passes `<spelling>=N` before the script's own arguments, as torch's launch."""
    result = run_cli(["-n", "2", spelling, *extra, CHILD, str(tmp_path), "a"])
    assert result.returncode == 0, result.stderr
    assert [r["argv"] for r in reports(tmp_path)] == [
        [f"{spelling}={rank}", str(tmp_path), "a"] for rank in range(2)
    ]


def test_module_and_no_python(tmp_path: Path) -> None:
    """-m runs a module with python; --no-python runs a program as is."""
    (tmp_path / "m").mkdir()
    result = run_cli(["-n", "2", "-m", "tests.support.scripts.rank_child", str(tmp_path / "m")])
    assert result.returncode == 0, result.stderr
    assert len(reports(tmp_path / "m")) == 2
    result = run_cli(["-n", "2", "--no-python", sys.executable, CHILD, str(tmp_path)])
    assert result.returncode == 0, result.stderr
    assert len(reports(tmp_path)) == 2
    result = run_cli(["--no-python", str(tmp_path / "missing")])
    assert result.returncode == 127
    assert "cannot execute" in result.stderr


@pytest.mark.parametrize(
    ("mode", "status", "why"),
    [
        ("exit3", 3, "exited with status 3 (SystemExit: 3)"),
        ("raise", 1, "raised RuntimeError: rank_child failing on purpose (exit status 1)"),
        ("segv", 128 + signal.SIGSEGV, "was killed by SIGSEGV"),
        ("kill", 128 + signal.SIGKILL, "was killed by SIGKILL"),
    ],
)
def test_first_failure_stops_the_others(tmp_path: Path, mode: str, status: int, why: str) -> None:
    """A failing rank makes the launcher stop the others at once and exit with its status."""
    args = ["-n", "3", CHILD, str(tmp_path), "--fail-rank", "1", "--fail-mode", mode]
    started = time.monotonic()
    result = run_cli(["--grace-period", "10", *args, "--sleep", "60"])
    assert result.returncode == status, result.stderr
    # Well inside the grace period: SIGTERM alone stopped the sleeping ranks.
    assert time.monotonic() - started < 8
    # The card, last: the rank, how, its pid, and the others stopped.
    card = result.stderr[result.stderr.index("distenv run: rank 1 failed first: ") :]
    assert f"failed first: {why}" in card
    assert f"local rank 1 on {socket.gethostname()}, pid {pids(tmp_path)[1]}" in card
    assert "ranks 0,2 stopped by distenv run" in card
    assert all(gone(pid) for pid in pids(tmp_path))


def test_stragglers_get_sigkill_after_the_grace_period(tmp_path: Path) -> None:
    """Ranks that ignore SIGTERM are SIGKILLed once the grace period is over, grandchildren too."""
    args = [CHILD, str(tmp_path), "--fail-rank", "0", "--ignore-term", "--grandchild"]
    started = time.monotonic()
    result = run_cli(["-n", "2", "--grace-period", "1", *args, "--sleep", "60"])
    elapsed = time.monotonic() - started
    assert result.returncode == 3, result.stderr
    assert 1 <= elapsed < 10
    assert "sent SIGKILL" in result.stderr
    assert all(gone(pid) for pid in pids(tmp_path) + pids(tmp_path, "gpid"))


def test_grandchildren_are_stopped_with_their_rank(tmp_path: Path) -> None:
    """Processes the ranks started are stopped too, on failure and after success alike."""
    (tmp_path / "ok").mkdir()
    result = run_cli(["-n", "2", CHILD, str(tmp_path / "ok"), "--grandchild"])
    assert result.returncode == 0, result.stderr
    result = run_cli(["-n", "2", CHILD, str(tmp_path), "--grandchild", "--fail-rank", "1"])
    assert result.returncode == 3, result.stderr
    for out in (tmp_path, tmp_path / "ok"):
        grandchildren = pids(out, "gpid")
        assert len(grandchildren) == 2
        assert all(gone(pid) for pid in grandchildren)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stopping_signal_reaches_every_rank(tmp_path: Path, signum: int) -> None:
    """SIGTERM/SIGINT to the launcher reach every rank; it exits 128+N once they have stopped."""
    with started(["-n", "3", CHILD, str(tmp_path), "--on-signal", "--sleep", "60"]) as launcher:
        wait_for(lambda: len(pids(tmp_path)) == 3)
        launcher.send_signal(signum)
        _, stderr = launcher.communicate(timeout=TIMEOUT)
    assert launcher.returncode == 128 + signum, stderr
    name = signal.Signals(signum).name
    assert sorted(p.name for p in tmp_path.glob(f"{name}*")) == [f"{name}{r}" for r in range(3)]
    assert all(gone(pid) for pid in pids(tmp_path))


def test_sigusr1_is_forwarded_without_stopping(tmp_path: Path) -> None:
    """SIGUSR1 reaches every rank and stops nothing by itself: the ranks' own exit (0) counts."""
    with started(["-n", "2", CHILD, str(tmp_path), "--on-signal", "--sleep", "60"]) as launcher:
        wait_for(lambda: len(pids(tmp_path)) == 2)
        launcher.send_signal(signal.SIGUSR1)
        _, stderr = launcher.communicate(timeout=TIMEOUT)
    assert launcher.returncode == 0, stderr
    assert len(list(tmp_path.glob("SIGUSR1*"))) == 2


def test_sigkilled_launcher_leaves_no_process(tmp_path: Path) -> None:
    """When the launcher itself is SIGKILLed, its ranks and their children die too."""
    with started(["-n", "2", CHILD, str(tmp_path), "--grandchild", "--sleep", "60"]) as launcher:
        wait_for(lambda: len(pids(tmp_path)) == 2 and len(pids(tmp_path, "gpid")) == 2)
        launcher.kill()
        launcher.wait(timeout=TIMEOUT)
    everyone = pids(tmp_path) + pids(tmp_path, "gpid")
    assert len(everyone) == 4
    wait_for(lambda: all(gone(pid) for pid in everyone), timeout=10)


@pytest.mark.parametrize(
    ("options", "stdout", "stderr"),
    [
        (
            ["--prefix-output", "--ranks", "0,2"],
            {"[rank 0] hello from 0", "[rank 2] hello from 2"},
            {"[rank 0] complaint from 0", "[rank 2] complaint from 2"},
        ),
        (["--ranks", "1"], {"hello from 1"}, {"complaint from 1"}),
        (
            ["--prefix-output"],
            {f"[rank {r}] hello from {r}" for r in range(3)},
            {f"[rank {r}] complaint from {r}" for r in range(3)},
        ),
    ],
    ids=["prefix-ranks", "ranks", "prefix"],
)
def test_output_prefix_and_rank_filter(
    tmp_path: Path, options: list[str], stdout: set[str], stderr: set[str]
) -> None:
    """--prefix-output marks each line with its rank; --ranks shows the chosen ranks only."""
    result = run_cli(["-n", "3", *options, CHILD, str(tmp_path), "--say"])
    assert result.returncode == 0, result.stderr
    assert set(result.stdout.splitlines()) == stdout
    assert {line for line in result.stderr.splitlines() if "from" in line} == stderr


def test_a_busy_master_port_is_refused_before_any_rank_starts(tmp_path: Path) -> None:
    """--master-port naming a port in use here: one line naming the option, exit 1, no rank
    started (rank 0 would have found it only later, naming $MASTER_PORT)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        result = run_cli(["-n", "2", "--master-port", str(port), CHILD, str(tmp_path), "--say"])
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    assert result.stderr.splitlines()[-1] == (
        f"distenv: run: port {port} (--master-port) is already in use on this host, where rank "
        "0's store must listen. Hint: pass another --master-port (on every node), or leave it "
        "out on one node for a free one"
    )


def test_refused_flag_exits_1_with_the_reason() -> None:
    """A real launcher process refuses a torchrun flag: exit 1, one line naming it and the fix."""
    result = run_cli(["--role", "trainer", CHILD, "x"])
    assert result.returncode == 1
    assert result.stderr == (
        "distenv: run: --role is not supported. Hint: distenv run starts a single role; use "
        "torchrun for named roles\n"
    )


@pytest.mark.parametrize("flag", REFUSED_FLAGS, ids=lambda f: f.flag)
def test_every_refused_flag_is_refused(
    flag: RefusedFlag, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each refused torchrun option, in every spelling, is a DistEnvError (exit 1), never a start."""
    underscored = "--" + flag.flag[2:].replace("-", "_")
    for spelling in {flag.flag, underscored, flag.short or flag.flag}:
        value = ["v"] if flag.takes_value else []
        # The script's own arguments may repeat the option: they are the script's business.
        assert main(["run", spelling, *value, "script.py", spelling]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"distenv: run: {flag.flag} is not supported. Hint: ")


@pytest.mark.parametrize(
    "argv",
    [
        ["run"],
        ["run", "--nproc-per-node", "x", "s.py"],
        ["run", "-n", "0", "s.py"],
        ["run", "--nnodes", "1:4", "s.py"],
        ["run", "--grace-period", "-1", "s.py"],
        ["run", "--master-port", "70000", "s.py"],
        ["run", "--ranks", "a", "s.py"],
        ["run", "--bogus", "s.py"],
        ["run", "--nproc", "2", "s.py"],  # no abbreviations
    ],
)
def test_bad_usage_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Malformed options are usage errors: argparse's exit status 2."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    capsys.readouterr()


def parse(*argv: str) -> argparse.Namespace:
    """Return the parsed arguments of ``distenv run ARGV script.py``."""
    return build_parser().parse_args(["run", *argv, "script.py"])


@pytest.mark.parametrize("node", [0, 2])
def test_one_launcher_per_slurm_node_takes_the_nodes(node: int) -> None:
    """Under srun (one task per node), nodes, node rank and master come from Slurm."""
    env = slurm.SRUN_4N_4T[node]
    expected = detect("slurm", env)
    children = build_children(parse("-n", "2"), env)
    assert [c.rank for c in children] == [2 * node, 2 * node + 1]
    for local_rank, child in enumerate(children):
        assert child.env["RANK"] == str(2 * node + local_rank)
        assert child.env["WORLD_SIZE"] == "8"
        assert (child.env["GROUP_RANK"], child.env["GROUP_WORLD_SIZE"]) == (str(node), "4")
        assert child.env["MASTER_ADDR"] == expected.master_addr
        assert child.env["MASTER_PORT"] == str(expected.master_port)
        assert detect("auto", child.env).launcher == "pytorch"


def test_explicit_flags_win_over_slurm() -> None:
    """--master-port (or --nnodes with --node-rank) overrides what Slurm says."""
    env = slurm.SRUN_4N_4T[1]
    plan = plan_from_args(parse("--master-port", "4242"), env)
    assert (plan.nnodes, plan.node_rank, plan.master_port) == (4, 1, 4242)
    manual = plan_from_args(
        parse("--nnodes", "2", "--node-rank", "0", "--master-addr", "h0", "--run-id", "exp-1"),
        env,
    )
    assert (manual.nnodes, manual.node_rank, manual.master_addr, manual.master_port) == (
        2,
        0,
        "h0",
        29500,
    )
    assert manual.run_id == "exp-1"


def test_run_id_is_the_job_step_else_drawn_else_required() -> None:
    """The ranks' identity: --run-id, else the scheduler's step, else random on one node only."""
    srun = plan_from_args(parse("-n", "2"), slurm.SRUN_4N_4T[1])
    assert srun.run_id == explain("auto", slurm.SRUN_4N_4T[1]).scope
    one, other = plan_from_args(parse("-n", "2"), {}), plan_from_args(parse("-n", "2"), {})
    assert one.run_id != other.run_id
    assert len(one.run_id) == 16
    with pytest.raises(ConfigurationError, match="--run-id") as info:
        plan_from_args(parse("--nnodes", "2", "--node-rank", "1", "--master-addr", "h0"), {})
    assert "same --run-id on every node" in str(info.value)
    with pytest.raises(ConfigurationError, match="'a b'"):
        plan_from_args(parse("--run-id", "a b"), {})


def test_ranks_carry_the_run_id(tmp_path: Path) -> None:
    """Each rank gets DISTENV_RUN_ID, which becomes its launcher's job id and scope."""
    children = build_children(parse("-n", "2", "--run-id", "exp-7", "s.py"), {})
    for child in children:
        assert child.env["DISTENV_RUN_ID"] == "exp-7"
        detection = explain("auto", child.env)
        assert detection.info.job_id == "exp-7"
        assert detection.scope == "pytorch/exp-7/-"


@pytest.mark.parametrize(
    "env",
    [
        pytest.param(slurm.SRUN_2N_4T[0], id="srun-2-tasks-per-node"),
        pytest.param(mpi.OMPI_4[0], id="mpirun"),
        pytest.param(lsf.JSRUN_CORAL_RANK7, id="jsrun-several-per-host"),
    ],
)
def test_several_tasks_per_node_are_refused(env: dict[str, str]) -> None:
    """A launcher task that is not alone on its node (or is an MPI rank) is a clear error."""
    with pytest.raises(ConfigurationError, match="distenv run") as info:
        plan_from_args(parse("-n", "2"), env)
    assert info.value.hint is not None


def test_batch_script_runs_on_this_node(capsys: pytest.CaptureFixture[str]) -> None:
    """In a batch script (no srun step), distenv run is one node on 127.0.0.1, with a notice."""
    plan = plan_from_args(parse("-n", "2"), slurm.SBATCH_BATCH_4T[0])
    assert (plan.nnodes, plan.node_rank, plan.master_addr) == (1, 0, "127.0.0.1")
    assert "not started by srun" in capsys.readouterr().err


def test_several_nodes_need_a_master() -> None:
    """--nnodes 2 without a scheduler or --master-addr is refused, naming the fix."""
    with pytest.raises(ConfigurationError, match="--master-addr"):
        plan_from_args(parse("--nnodes", "2", "--node-rank", "1", "--run-id", "x"), {})
    with pytest.raises(ConfigurationError, match="outside"):
        plan_from_args(parse("--nnodes", "2", "--node-rank", "2"), {})


@pytest.mark.parametrize("restarts", [[], ["--max-restarts", "1"]], ids=["plain", "agent"])
def test_a_closed_stderr_changes_nothing_but_the_messages(
    tmp_path: Path, restarts: list[str]
) -> None:
    """stdout and stderr a pipe whose reader is gone (`2>&1 | head -1` once head has read, a dead
    tee): the failure message cannot be written, yet the others still get SIGTERM and the grace
    period, and the launcher exits with the failing rank's status (#44 item 6)."""
    reader, writer = os.pipe()
    os.close(reader)
    args = ["-n", "3", *restarts, CHILD, str(tmp_path), "--on-signal", "--fail-rank", "1"]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "distenv", "run", *args, "--sleep", "60"],
            env=launcher_env(), cwd=REPO, stdin=subprocess.DEVNULL, stdout=writer,
            stderr=writer, timeout=TIMEOUT, check=False,
        )  # fmt: skip
    finally:
        os.close(writer)
    assert done.returncode == 3
    # The two others stopped on SIGTERM, in their own handler: no SIGKILL.
    assert sorted(p.name for p in tmp_path.glob("SIGTERM*")) == ["SIGTERM0", "SIGTERM2"]
    assert all(gone(pid) for pid in pids(tmp_path))


def test_a_program_that_cannot_start_is_refused_once(tmp_path: Path) -> None:
    """A missing script: one line and python's status 2, not a traceback per rank per attempt
    (0.2.0.dev: 4 attempts, 57 lines, status 1); a missing --no-python program: a shell's 127
    (#44 item 10)."""
    script = str(tmp_path / "missing.py")
    result = run_cli(["--max-restarts", "3", "-n", "2", script, "--flag"])
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        f"distenv: run: cannot open the script {script!r}: No such file or directory. Hint: "
        "check the path (a relative one starts from the directory distenv run runs in); every "
        "rank would fail the same way\n"
    )
    result = run_cli(["--no-python", "-n", "2", str(tmp_path / "missing")])
    assert result.returncode == 127, result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert "cannot execute" in result.stderr


def test_two_different_rank_counts_are_refused(tmp_path: Path) -> None:
    """``-n 2 --nproc-per-node 3`` starts nothing and names both (argparse kept the last: 3
    ranks); the same count twice is no contradiction (#43 item 4)."""
    result = run_cli(["-n", "2", "--nproc-per-node", "3", CHILD, str(tmp_path)])
    assert result.returncode == 1, result.stderr
    assert result.stderr == (
        "distenv: run: -n 2 and --nproc-per-node 3 give different numbers of ranks on this "
        "node. Hint: give the number once: -n 3 (or -n 2)\n"
    )
    assert reports(tmp_path) == []
    result = run_cli(["-n", "2", "--nproc_per_node", "2", CHILD, str(tmp_path)])
    assert result.returncode == 0, result.stderr
    assert [r["WORLD_SIZE"] for r in reports(tmp_path)] == ["2", "2"]


def test_python_given_as_the_script_is_refused_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``distenv run -n 2 python train.py`` (the mpirun habit): one line with the command meant,
    no rank started (each rank printed python's "can't open file .../python") (#43 item 4)."""
    result = run_cli(["-n", "2", "python", CHILD, str(tmp_path)])
    assert result.returncode == 1, result.stderr
    assert result.stderr == (
        "distenv: run: the script is 'python', a Python interpreter: distenv run starts "
        "Python itself, so every rank would run it as a script. Hint: drop it: distenv run -n 2 "
        f"{CHILD} {tmp_path} (--no-python runs a program as given)\n"
    )
    assert reports(tmp_path) == []
    for python in ("python3.11", sys.executable):  # the same check, in-process
        assert main(["run", "-n", "2", python, CHILD, str(tmp_path)]) == 1
        assert capsys.readouterr().err.startswith(f"distenv: run: the script is {python!r}")
    assert reports(tmp_path) == []
    result = run_cli(["--no-python", "-n", "1", sys.executable, CHILD, str(tmp_path)])
    assert result.returncode == 0, result.stderr
    assert [r["RANK"] for r in reports(tmp_path)] == ["0"]


def test_a_second_init_dist_with_another_backend_is_refused(tmp_path: Path) -> None:
    """``init_dist()`` then ``init_dist(backend="mpi")`` on each of 2 ranks: a ConfigurationError
    naming both backends, status 1, and the card points at the call (it kept gloo without a
    word) (#43 item 4)."""
    script = tmp_path / "twice.py"
    script.write_text(
        "import distenv\n"
        "distenv.init_dist()\n"
        "distenv.init_dist()  # the same again is fine\n"
        "distenv.init_dist(backend='mpi')\n"
        "print('kept going')\n"
    )
    env = launcher_env(PYTHONPATH=str(REPO))
    result = subprocess.run(
        [sys.executable, "-m", "distenv", "run", "-n", "2", str(script)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert "kept going" not in result.stdout
    # Rank 0's line; the card holds the other rank's back as a repeat of the first failure.
    lines = [line for line in result.stderr.splitlines() if line.startswith("rank ")]
    assert lines, result.stderr
    assert "  where:   twice.py:4 in <module>: distenv.init_dist(backend='mpi')" in result.stderr
    for line in lines:
        assert (
            "twice.py:4: distenv.errors.ConfigurationError: pytorch: torch.distributed is already "
            "initialised with backend 'gloo', but init_dist was now asked for backend='mpi'. "
            "Hint: call init_dist once, with backend='mpi'" in line
        ), line


def test_a_hint_quotes_the_job_s_own_script_and_size(tmp_path: Path) -> None:
    """A 2-rank job running main_tv.py that names the wrong launcher is told `mpirun -np 2 python
    main_tv.py`, not the generic `mpirun -np 4 python train.py` (#43 item 5)."""
    (tmp_path / "main_tv.py").write_text("import distenv\ndistenv.init_dist(launcher='mpi')\n")
    result = subprocess.run(
        [sys.executable, "-m", "distenv", "run", "-n", "2", "main_tv.py"],
        env=launcher_env(PYTHONPATH=str(REPO)),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    # The first failure's line; the card holds the other rank's back as its repeat.
    line = next(line for line in result.stderr.splitlines() if line.startswith("rank "))
    assert (
        "or start it with `mpirun -np 2 python main_tv.py ...` (Open MPI) or `mpiexec -n 2 "
        "python main_tv.py ...` (MPICH, Intel MPI)" in line
    ), line
    assert "train.py" not in result.stderr


def test_a_script_gone_when_its_rank_starts_is_reported_not_worth_retrying(tmp_path: Path) -> None:
    """A rank whose script cannot be opened (gone since the check, or absent on another node)
    ends as python does, with its line and status 2, and reports it as not worth retrying."""
    from distenv.local.reporting import REPORT_FD_VAR, read_report

    script = str(tmp_path / "missing.py")
    plain = subprocess.run([sys.executable, script], capture_output=True, text=True, check=False)
    reader, writer = os.pipe()
    try:
        os.set_blocking(reader, False)
        done = subprocess.run(
            [sys.executable, "-m", "distenv.local.reporting", script],
            env=launcher_env(**{REPORT_FD_VAR: str(writer)}), cwd=REPO, pass_fds=(writer,),
            capture_output=True, text=True, timeout=TIMEOUT, check=False,
        )  # fmt: skip
        report = read_report(reader)
    finally:
        os.close(reader)
        os.close(writer)
    assert (done.returncode, done.stderr) == (plain.returncode, plain.stderr) == (2, plain.stderr)
    assert report is not None
    assert (report.kind, report.retried) == ("import", False)
    assert report.what == f"can't open file {script!r}: [Errno 2] No such file or directory"
