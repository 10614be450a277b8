"""MPI launchers for real: Open MPI's mpirun, MPICH's mpiexec.hydra, and srun --mpi=pmix/pmi2.

No MASTER_ADDR is given anywhere: alone, distenv.resolve asks rank 0 for its host over MPI
(mpi4py); inside a Slurm allocation the master is the allocation's first host. MPICH runs need
the mpi4py shim from setup.sh (LD_LIBRARY_PATH + MPI4PY_MPIABI=mpich), else every rank is a
singleton.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from distenv.detection.exchange import MPICH_RECIPE
from distenv.master import PORT_HIGH, PORT_LOW
from tests.support.integration.helpers import (
    HERE,
    JOB_NAME,
    OMPI,
    ONE_NODE,
    PYTHON,
    REPO,
    STEPS,
    TWO_BY_TWO,
    Harness,
    Launch,
    check_world,
    rank_check,
    wait_all,
)

pytestmark = pytest.mark.mpi

# The two engines started alone on this host, 4 ranks each: argv prefix and Harness.env options.
ENGINES: dict[str, tuple[list[str], dict[str, Any]]] = {
    "openmpi": ([*OMPI, "--oversubscribe", "-np", "4"], {"ompi": True}),
    "hydra": (["mpiexec.hydra", "-n", "4"], {"mpich": True}),
}
# DISTENV_TIMEOUT of the stall tests, and the bound issue #13 sets: timeout + 10 s + 5 s to end.
STALL_TIMEOUT_S = 3
BOUND_S = STALL_TIMEOUT_S + 10 + 5
LATE = "rank 0 did not publish its master over MPI within 13 s"


def test_mpirun_and_hydra_alone_find_the_master_over_mpi(harness: Harness) -> None:
    """`mpirun.openmpi -np 4` and `mpiexec.hydra -n 4`, auto and --launcher mpi: master via mpi4py.

    mpi4py's COMM_WORLD must see the same ranks as distenv (rank_check --mpi). Every rank is on
    this host, so rank 0 sends 127.0.0.1, not its host name (which need not resolve).
    """
    ompi_env = harness.env(ompi=True)
    mpich_env = harness.env(mpich=True)
    launches = [
        harness.start(
            [*OMPI, "--oversubscribe", "-np", "4", *rank_check("--mpi", *args)], env=ompi_env
        )
        for args in ((), ("--launcher", "mpi"))
    ] + [
        harness.start(["mpiexec.hydra", "-n", "4", *rank_check("--mpi", *args)], env=mpich_env)
        for args in ((), ("--launcher", "mpi"))
    ]
    for result in wait_all(launches):
        recs = check_world(result, launcher="mpi", layouts=ONE_NODE, master="127.0.0.1", mpi=True)
        assert {r["info"]["job_id"] for r in recs} == {None}


def test_one_machine_without_mpi4py_takes_loopback_and_a_port_from_the_launch(
    harness: Harness, tmp_path: Path
) -> None:
    """`mpirun.openmpi -np 4` and `mpiexec.hydra -n 4` where `import mpi4py` fails and no
    MASTER_* is set (the README's `mpirun -np N python train.py` on a workstation): every rank is
    on this host, so each takes 127.0.0.1 and the port derived from its launch (Open MPI's
    PMIX_NAMESPACE; Hydra, which exports no identity: its PMI proxy), and the all_reduce
    finishes. A derived port is below the kernel's ephemeral range, where a free port would be.
    """
    shim = tmp_path / "no-mpi4py"
    shim.mkdir()
    # Loaded by site before the program: mpi4py is then as absent as if it were not installed.
    (shim / "sitecustomize.py").write_text('import sys\n\nsys.modules["mpi4py"] = None\n')
    extra = {"PYTHONPATH": f"{shim}{os.pathsep}{REPO}"}
    control = harness.run([PYTHON, "-c", "import mpi4py"], env=harness.env(extra=extra))
    assert "ModuleNotFoundError: import of mpi4py halted" in control.stderr, control.text
    launches = [
        harness.start([*argv, *rank_check()], env=harness.env(**options, extra=extra))
        for argv, options in ENGINES.values()
    ]
    for result in wait_all(launches):
        recs = check_world(result, launcher="mpi", layouts=ONE_NODE, master="127.0.0.1")
        port = recs[0]["info"]["master_port"]
        assert PORT_LOW <= port < PORT_HIGH, result.text


def test_a_hint_under_mpirun_quotes_the_job_s_own_script(harness: Harness, tmp_path: Path) -> None:
    """`mpirun -np 2 python main_tv.py` and `mpiexec.hydra -n 2 python main_tv.py` whose script
    names the wrong launcher: every rank's line tells it to run `main_tv.py` under srun, not the
    generic `train.py` (#43 item 5)."""
    (tmp_path / "main_tv.py").write_text("import distenv\ndistenv.init_dist(launcher='slurm')\n")
    extra = {"PYTHONPATH": str(REPO)}
    launches = [
        harness.start(
            [*argv[:-1], "2", PYTHON, "main_tv.py"],
            env=harness.env(**options, extra=extra),
            cwd=tmp_path,
        )
        for argv, options in ENGINES.values()
    ]
    for result in wait_all(launches):
        assert result.returncode not in (0, None), result.text
        lines = [line for line in result.stderr.splitlines() if "LauncherNotFoundError" in line]
        assert sorted(line.split(":")[0] for line in lines) == ["rank 0", "rank 1"], result.text
        for line in lines:
            assert "whose script runs `srun python main_tv.py ...`" in line, line
            assert "train.py" not in line, line


@pytest.mark.slurm
def test_mpi_launchers_inside_salloc(harness: Harness) -> None:
    """mpirun / mpiexec.hydra inside `salloc -N 2` (run on the submit host): 2 ranks per node.

    auto and --launcher mpi agree (master = the allocation's first host); --launcher slurm
    is refused, naming mpi: SLURM_PROCID there describes mpirun's daemons, not the ranks.
    """
    alloc = ["salloc", "-J", JOB_NAME, "-N", "2", "--ntasks-per-node", "2", PYTHON, STEPS]

    def steps(launcher: list[str]) -> list[str]:
        cmds = [[*launcher, *rank_check(*args)] for args in ((), ("--launcher", "mpi"))]
        cmds.append([*launcher, *rank_check("--launcher", "slurm")])
        return [arg for cmd in cmds for arg in (*cmd, ":::")][:-1]

    ompi, hydra = wait_all(
        [
            harness.start(
                [*alloc, *steps([*OMPI, "-np", "4"])],
                env=harness.env("multi", ompi=True),
                cluster="multi",
            ),
            harness.start(
                [*alloc, *steps(["mpiexec.hydra", "-n", "4"])],
                env=harness.env("multi", mpich=True),
                cluster="multi",
            ),
        ]
    )
    for result in (ompi, hydra):
        result.ok()
        auto, named, wrong = result.steps()
        for s in (auto, named):
            # master: the allocation's first host, where ranks 0 and 1 run (n1 on an idle cluster)
            recs = check_world(s, launcher="mpi", layouts=TWO_BY_TWO)
            assert len({r["hostname"] for r in recs}) == 2
        assert wrong.returncode != 0, wrong.text
        assert "rank_check: slurm: " in wrong.stderr, wrong.text
        assert "started by mpi" in wrong.stderr, wrong.text
        assert "--launcher mpi" in wrong.stderr, wrong.text
        assert not wrong.records(), wrong.text


@pytest.mark.slurm
def test_srun_mpi_plugins(harness: Harness) -> None:
    """`srun --mpi=pmix` (Open MPI's mpi4py) and `--mpi=pmi2` (MPICH): auto says slurm, mpi too.

    Under these plug-ins the MPI ranks are Slurm's tasks, so `--launcher mpi` is accepted and takes
    the step's layout (labelled mpi); mpi4py sees the same world either way.
    """
    launches = []
    for plugin, mpich in (("pmix", False), ("pmi2", True)):
        env = harness.env("one", mpich=mpich)
        for args in ((), ("--launcher", "mpi")):
            argv = [
                "srun",
                "-J",
                JOB_NAME,
                f"--mpi={plugin}",
                "-n",
                "4",
                *rank_check("--mpi", *args),
            ]
            launches.append(harness.start(argv, env=env, cluster="one"))
    results = wait_all(launches)
    host = socket.gethostname()
    for result, launcher in zip(results, ["slurm", "mpi", "slurm", "mpi"], strict=True):
        check_world(result, launcher=launcher, layouts=ONE_NODE, master=host, mpi=True)


def test_mpi4py_on_the_wrong_mpi_library_is_explained(harness: Harness) -> None:
    """Hydra ranks whose mpi4py loads Open MPI (no shim) are singletons: a clear error, no hang.

    (`distenv info` asks MPI only with --mpi.)
    """
    env = harness.env()  # deliberately without the MPICH shim
    result = harness.run(
        ["mpiexec.hydra", "-n", "2", PYTHON, "-m", "distenv", "info", "--json", "--mpi"], env=env
    )
    assert result.returncode != 0, result.text
    assert "mpi4py sees rank 0 of 1, but the launcher's variables say rank" in result.stderr
    assert "MPI4PY_MPIABI=mpich" in result.stderr


def test_mpi4py_without_its_library_shows_the_cause_and_the_hint_recipe_works(
    harness: Harness, tmp_path: Path
) -> None:
    """MPI4PY_MPIABI=mpich without a libmpi.so.12 (Debian ships libmpich.so.12): the error shows
    the loader's message, not "not installed"; the hint's recipe, run as written, then works.
    """
    info = [PYTHON, "-m", "distenv", "info", "--json", "--mpi"]
    env = harness.env(extra={"MPI4PY_MPIABI": "mpich", "HOME": str(tmp_path)})
    broken = harness.run(["mpiexec.hydra", "-n", "2", *info], env=env)
    assert broken.returncode != 0, broken.text
    assert "mpi4py, which would ask rank 0 for its host, cannot be loaded: ImportError: " \
        "libmpi.so.12: cannot open shared object file" in broken.stderr, broken.text  # fmt: skip
    assert "not installed" not in broken.stderr
    link, run = re.findall(r"`([^`]*)`", MPICH_RECIPE)
    made = subprocess.run(["bash", "-c", link], env=env, capture_output=True, text=True,
                          timeout=30, check=False)  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "mpich-lib" / "libmpi.so.12").resolve().name.startswith("libmpich.so.12")
    # The hint's mpiexec line, with "..." being the job; mpiexec.hydra: Debian's mpiexec may be
    # Open MPI's.
    command = run.replace("mpiexec ", "mpiexec.hydra ").replace("...", "-n 2 " + shlex.join(info))
    fixed = harness.run(["bash", "-c", command], env=env)
    assert fixed.returncode == 0, fixed.text
    ranks = [json.loads(line) for line in fixed.stdout.splitlines()]
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    assert ranks[0]["master_addr"] is not None
    assert ranks[0]["master_addr"] == ranks[1]["master_addr"]


def stalled(
    harness: Harness, engine: str, stall: str, timeout_s: int, *args: str
) -> tuple[Path, Launch]:
    """Start 4 ranks of mpi_stall.py under `engine` whose rank 0 stalls 30 s `stall`."""
    argv, options = ENGINES[engine]
    out = harness.outdir(f"stall-{stall}-{engine}")
    env = harness.env(**options, extra={"DISTENV_TIMEOUT": str(timeout_s)})
    program = [PYTHON, str(HERE / "mpi_stall.py"), "--stall", stall, "--dir", str(out), *args]
    return out, harness.start([*argv, *program], env=env, timeout=90)


def entries(out: Path) -> list[float]:
    """Return when ranks 1-3 of a stall launch entered init_dist (`time.monotonic`)."""
    return [float((out / f"rank-{r}.start").read_text()) for r in (1, 2, 3)]


def waiting(out: Path, launch: Launch, within: float = 60) -> None:
    """Return once ranks 1-3 of a stall launch entered init_dist (or its launcher ended)."""
    until = time.monotonic() + within
    while not all((out / f"rank-{r}.start").exists() for r in (1, 2, 3)):
        if launch.proc.poll() is not None:
            return  # its assertions say what went wrong
        assert time.monotonic() < until, f"ranks 1-3 not in init_dist: {sorted(out.iterdir())}"
        time.sleep(0.05)


def survivors(marker: Path, within: float = 5) -> list[str]:
    """Return the processes whose command line names `marker` (ranks and their forks).

    Waits up to `within` s for them to go: a launcher may return while its last SIGKILLed rank
    (or its deadline helper, killed with it by PR_SET_PDEATHSIG) is still being torn down.
    """
    until = time.monotonic() + within
    while (found := _named(marker)) and time.monotonic() < until:
        time.sleep(0.05)
    return found


def _named(marker: Path) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(marker) in cmdline and state != "Z":
            found.append(f"{entry.name}: {cmdline}")
    return found


def gone(pid: int, within: float) -> float | None:
    """Return how long process `pid` took to exit (a zombie counts), or None after `within` s."""
    start = time.monotonic()
    while time.monotonic() - start < within:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return time.monotonic() - start
        if state == "Z":
            return time.monotonic() - start
        time.sleep(0.01)
    return None


def rank_pids(out: Path, within: float = 60) -> dict[int, int]:
    """Wait until the 4 ranks wrote their pid files; return {rank: pid}."""
    until = time.monotonic() + within
    while time.monotonic() < until:
        pids = {}
        for path in out.glob("rank-*.pid"):
            text = path.read_text()
            if text:
                pids[int(path.stem.split("-")[1])] = int(text)
        if len(pids) == 4:
            return pids
        time.sleep(0.05)
    raise AssertionError(f"ranks did not start: {sorted(out.iterdir())}")


def test_rank0_stalled_every_rank_ends_within_the_bound(harness: Harness) -> None:
    """Rank 0 sleeps 30 s before init_dist with DISTENV_TIMEOUT=3: the job ends within 3+10+5 s,
    under Open MPI and Hydra, rank 0 stalled after or before MPI_Init.

    after-mpi: rank 0 initialised MPI, its peers wait in the broadcast (a Python loop), print
    distenv's message at the deadline and MPI_Abort. before-mpi: the peers wait inside MPI_Init,
    holding the GIL; the forked deadline helper (`KillAtDeadline`) prints the message and kills
    them. Either way every rank, and every helper, is gone.

    The four jobs overlap in their waits only: each starts once the one before waits in
    init_dist, so its `import torch` runs while the others sleep (the bound is about distenv, not
    about 2 cores), and the test costs one deadline, not four.
    """
    launches: list[tuple[str, Path, Launch]] = []
    for stall in ("after-mpi", "before-mpi"):
        for engine in ENGINES:
            if launches:
                waiting(*launches[-1][1:])
            launches.append((stall, *stalled(harness, engine, stall, STALL_TIMEOUT_S)))
    # Each launch is waited for in its own thread: its seconds end when it did, not when the
    # launches before it were read.
    with ThreadPoolExecutor(len(launches)) as pool:
        results = list(pool.map(lambda launched: launched[2].wait(), launches))
    for (stall, out, launch), result in zip(launches, results, strict=True):
        assert result.returncode not in (0, None), result.text
        # Every rank is gone when the launcher returns: count from the earliest init_dist entry.
        took = launch.started + result.seconds - min(entries(out))
        assert took < BOUND_S, f"{took:.1f} s\n{result.text}"
        assert LATE in result.stderr, result.text
        assert "Hint: export MASTER_ADDR and MASTER_PORT" in result.stderr, result.text
        if stall == "before-mpi":
            assert f"{LATE} (MPI_Init did not return)" in result.stderr, result.text
        assert "initialised" not in result.stdout, result.text
        assert survivors(out) == [], result.text


def sleeping_in_a_loop(pid: int, within: float = 60) -> bool:
    """Return once `pid`'s main thread is seen asleep (clock_nanosleep) three times running.

    From init_dist's entry to the exchange's wait takes milliseconds, on a loaded machine
    seconds: the wait is `Test()` between sleeps, and nothing before it sleeps.
    """
    until, seen = time.monotonic() + within, 0
    while time.monotonic() < until and seen < 3:
        try:
            call = Path(f"/proc/{pid}/syscall").read_text().split()[0]
        except (OSError, IndexError):
            return False
        seen = seen + 1 if call in ("35", "230") else 0  # nanosleep, clock_nanosleep (x86-64)
        time.sleep(0.02)
    return seen >= 3


def test_sigint_to_a_waiting_rank_ends_it_within_2s(harness: Harness) -> None:
    """SIGINT to rank 2 while it waits for rank 0's master: it ends within 2 s, with a message.

    The rank dies by the signal (a broadcast cannot be left half done), the launcher ends the
    job, and nothing survives.
    """
    launches = [stalled(harness, engine, "after-mpi", 60, "--peers-init-mpi") for engine in ENGINES]
    took = []
    for out, _ in launches:
        pid = rank_pids(out)[2]
        started = out / "rank-2.start"
        until = time.monotonic() + 60
        while not started.exists() and time.monotonic() < until:
            time.sleep(0.05)
        assert sleeping_in_a_loop(pid), f"rank 2 never waited: {sorted(out.iterdir())}"
        os.kill(pid, signal.SIGINT)
        took.append(gone(pid, within=10))
    results = wait_all([launch for _, launch in launches])
    for (out, _), result, seconds in zip(launches, results, took, strict=True):
        assert seconds is not None, result.text
        assert seconds < 2, result.text
        assert result.returncode not in (0, None), result.text
        assert (
            "distenv: mpi: rank 2 of 4: interrupted by SIGINT while waiting for rank 0's master "
            "over MPI" in result.stderr
        ), result.text
        assert survivors(out) == [], result.text


def test_info_does_not_initialise_mpi_unless_asked(harness: Harness) -> None:
    """`distenv info --json` under mpirun/Hydra with no MASTER_ADDR: master null, no mpi4py at all.

    ``-X importtime`` lists every module the command imported; ``--mpi`` asks rank 0 over MPI.
    """
    launches = []
    for engine, (argv, options) in ENGINES.items():
        env = harness.env(**options)
        for extra in ((), ("--mpi",)):
            cmd = [PYTHON, "-X", "importtime", "-m", "distenv", "info", "--json", *extra]
            launches.append((engine, extra, harness.start([*argv, *cmd], env=env)))
    results = wait_all([launch for _, _, launch in launches])
    host = "127.0.0.1"  # what rank 0 sends with --mpi: every rank is on this host
    for (engine, extra, _), result in zip(launches, results, strict=True):
        result.ok()
        records = sorted(
            (json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")),
            key=lambda r: r["rank"],
        )
        assert [r["rank"] for r in records] == [0, 1, 2, 3], result.text
        assert {r["launcher"] for r in records} == {"mpi"}, result.text
        imported = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()]
        if extra:
            assert {(r["master_addr"], r["master_port"]) for r in records} == {
                (host, records[0]["master_port"])
            }, result.text
            assert "mpi4py.MPI" in imported, f"{engine}: {result.text}"
        else:
            assert {(r["master_addr"], r["master_port"]) for r in records} == {(None, None)}
            assert not [m for m in imported if m.startswith("mpi4py")], result.text
            assert result.seconds < 10, result.text
