"""The user templates in scripts/, run as users run them: submitted unmodified.

Slurm templates are submitted byte-identical from scripts/ and waited for as ``sbatch --wait``
does (sbatch_wait.py); what differs on the test clusters is given on sbatch's command line
(options override #SBATCH lines) and through ``--export=ALL,TRAIN=...,LAUNCHER=...``. The LSF
templates run with a fake ``jsrun`` or ``blaunch`` that prints its arguments (no LSF here), the PBS
template with a fake ``mpiexec`` and the Flux one with a fake ``flux``; the rank command each
prints then runs for real with the environment recorded for that launcher (tests/support/envs), and must
give the recorded answer. Every template passes ``bash -n`` and shellcheck.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest

from distenv import detect
from distenv.master import free_port
from tests.conftest import scrubbed_environ
from tests.support.envs import flux, lsf, pbs
from tests.support.integration.faults import survivors
from tests.support.integration.helpers import (
    OMPI,
    ONE_NODE,
    PYTHON,
    RANK_CHECK,
    REPO,
    SCRIPTS,
    TWO_BY_TWO,
    Harness,
    Result,
    check_world,
    layout,
    wait_all,
)

CARD_RANK = REPO / "tests" / "support" / "scripts" / "card_rank.py"
TEMPLATES = sorted(p for p in SCRIPTS.rglob("*") if p.is_file())
SUMMARY = re.compile(r"^train: launcher=slurm world_size=4 .*weights_identical=True$", re.M)


def _outputs(result: Result) -> str:
    return "".join(body for name, body in result.files.items() if name.endswith(".out"))


@pytest.mark.slurm
@pytest.mark.mpi
def test_slurm_templates_submitted_unmodified(harness: Harness) -> None:
    """Every Slurm template (and the mpirun one as a batch script) starts correct ranks.

    single_node: 4 tasks, one fake GPU each (device 0), and once running examples/train.py for real;
    multi_node: 2 nodes x 2 tasks; multi_node_torchrun: one torchrun per node, each task seeing both
    GPUs (device == local rank); the requeue templates run examples/train.py through a requeue in
    test_preemption.py;
    mpi/mpirun_hostfile.sh: mpirun from a batch script over a hostfile written from the allocation
    (MPICH's mpiexec.hydra: its own test below); multi_node once more with a step whose rank 2
    raises: the job fails and its stderr holds `distenv why`'s card naming rank 1.
    """
    # The templates keep the ranks' logs in $PWD/distenv-logs (the repository here) unless told.
    check = {"TRAIN": str(RANK_CHECK), "DISTENV_LOG_DIR": str(harness.outdir("logs"))}
    slurm = SCRIPTS / "slurm"
    failing_out = harness.outdir("failing-out")
    launches = [
        harness.sbatch(slurm / "single_node.sbatch", cluster="one",
                       export={**check, "LAUNCHER": "auto"}, label="single"),
        harness.sbatch(slurm / "single_node.sbatch", cluster="one", label="train",
                       export={**check, "TRAIN": str(REPO / "examples" / "train.py")},
                       args=["--steps", "5"]),
        # multi: 2 fake GPUs and 4 CPUs per node.
        harness.sbatch(slurm / "multi_node.sbatch", cluster="multi",
                       options=["--ntasks-per-node=2"], export=check, label="multi"),
        harness.sbatch(slurm / "multi_node_torchrun.sbatch", cluster="multi",
                       options=["--gpus-per-node=2", "--cpus-per-task=4"], export=check,
                       label="torchrun"),
        harness.sbatch(SCRIPTS / "mpi" / "mpirun_hostfile.sh", cluster="multi",
                       options=["-N", "2", "--ntasks-per-node", "2"],
                       export={**check, "MPIRUN": "mpirun.openmpi"},
                       env=harness.env("multi", ompi=True), label="mpirun"),
        # A failing step, one rank per node: rank 1 raises at step 3; the template prints
        # `distenv why`'s card.
        harness.sbatch(slurm / "multi_node.sbatch", cluster="multi",
                       options=["--ntasks-per-node=1"], label="failing",
                       export={"TRAIN": str(CARD_RANK), "DISTENV_TIMEOUT": "60",
                               "DISTENV_LOG_DIR": str(harness.outdir("failing-logs"))},
                       args=[str(failing_out), "--fail", "1:3:raise"]),
    ]  # fmt: skip
    single, train, multi, torchrun, mpirun, failing = wait_all(launches)

    assert failing.returncode != 0, failing.text
    assert not survivors(str(failing_out)), failing.text
    errors = "".join(body for name, body in failing.files.items() if name.endswith(".err"))
    card = errors[errors.index("distenv why: ") :].splitlines()
    assert card[0] == (
        "distenv why: rank 1 failed first: raised ValueError: bad batch at step 3 (exit status 1)"
    ), failing.text
    assert re.match(r"  rank:    1 of 2, local rank 0 on \S+, pid \d+, at ", card[1]), failing.text
    assert card[2].startswith("  where:   card_rank.py:"), failing.text
    assert "in inject: raise ValueError" in card[2], failing.text
    assert "  output:  rank 1 at step 3" in card, failing.text
    assert card[-1].startswith("  logs:    "), failing.text

    recs = check_world(single, launcher="slurm", layouts=ONE_NODE)
    assert sorted(r["cuda_visible_devices"] for r in recs) == ["0", "1", "2", "3"], recs
    assert [r["device"] for r in recs] == [0, 0, 0, 0]

    train.ok()
    assert SUMMARY.search(_outputs(train)), train.text

    recs = check_world(multi, launcher="slurm", layouts=TWO_BY_TWO)
    assert len({r["hostname"] for r in recs}) == 2
    assert [r["device"] for r in recs] == [0, 0, 0, 0]

    recs = check_world(torchrun, launcher="pytorch", layouts=TWO_BY_TWO)
    assert {r["cuda_visible_devices"] for r in recs} == {"0,1"}, recs
    assert [r["device"] for r in recs] == [0, 1, 0, 1]

    recs = check_world(mpirun, launcher="mpi", layouts=TWO_BY_TWO)
    assert len({r["hostname"] for r in recs}) == 2


@pytest.mark.slurm
@pytest.mark.mpi
def test_mpirun_hostfile_template_under_sbatch_with_mpich(harness: Harness) -> None:
    """mpi/mpirun_hostfile.sh as a batch script with MPIRUN=mpiexec.hydra: the allocation's
    hostfile is written in Hydra's syntax (it refused Open MPI's), 2 nodes x 2 ranks."""
    hydra = harness.sbatch(SCRIPTS / "mpi" / "mpirun_hostfile.sh", cluster="multi",
                           options=["-N", "2", "--ntasks-per-node", "2"],
                           export={"TRAIN": str(RANK_CHECK), "MPIRUN": "mpiexec.hydra",
                                   "DISTENV_LOG_DIR": str(harness.outdir("hydra-logs"))},
                           env=harness.env("multi", mpich=True), label="hydra").wait()  # fmt: skip
    recs = check_world(hydra, launcher="mpi", layouts=TWO_BY_TWO)
    assert len({r["hostname"] for r in recs}) == 2


THREE_RANKS = [(r, 3, r, 3, 0, 1) for r in range(3)]


@pytest.mark.mpi
def test_mpirun_hostfile_template_with_open_mpi_and_mpich(harness: Harness) -> None:
    """scripts/mpi/mpirun_hostfile.sh run as users run it, by Open MPI's mpirun and by MPICH's
    mpiexec.hydra, over a hostfile in each syntax its comment gives ("host slots=3", "host:3"):
    3 ranks every time (MPICH got NP=0 from "host:N", and Hydra refused "slots=")."""
    host = socket.gethostname()
    engines = {
        "openmpi": ({"MPIRUN": OMPI[0], "MPIRUN_ARGS": shlex.join([*OMPI[1:], "--oversubscribe"])},
                    {"ompi": True}),
        "hydra": ({"MPIRUN": "mpiexec.hydra"}, {"mpich": True}),
    }  # fmt: skip
    launches = []
    for engine, (variables, options) in engines.items():
        for label, text in (("slots", f"{host} slots=3\n"), ("colon", f"# ranks\n{host}:3\n")):
            hostfile = harness.outdir(f"hostfile-{engine}-{label}") / "hosts.txt"
            hostfile.write_text(text)
            extra = {**variables, "TRAIN": str(RANK_CHECK), "HOSTFILE": str(hostfile),
                     "DISTENV_LOG_DIR": str(hostfile.parent / "logs")}  # fmt: skip
            env = harness.env(**options, extra=extra)
            launches.append(
                harness.start(["bash", SCRIPTS / "mpi" / "mpirun_hostfile.sh"], env=env)
            )
    for result in wait_all(launches):
        # One host: every rank is local, so the master is 127.0.0.1 (docs/master.md).
        recs = check_world(result, launcher="mpi", layouts=THREE_RANKS, master="127.0.0.1")
        assert {r["hostname"] for r in recs} == {host}


def test_templates_pass_bash_n_and_shellcheck() -> None:
    """Every template in scripts/ parses (bash -n) and is shellcheck-clean."""
    assert len(TEMPLATES) >= 6, TEMPLATES
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck missing: run tests/harness/setup.sh"
    for path in TEMPLATES:
        syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True,
                                timeout=30, check=False)  # fmt: skip
        assert syntax.returncode == 0, f"{path}: {syntax.stderr}"
    lint = subprocess.run([shellcheck, "--shell=bash", *map(str, TEMPLATES)], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert lint.returncode == 0, lint.stdout + lint.stderr


STARTERS = ("srun", "mpirun", "mpiexec", "jsrun", "blaunch", "flux", "torchrun", "python",
            "scontrol", "distenv")  # fmt: skip


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: p.name)
def test_templates_require_train(tmp_path: Path, template: Path) -> None:
    """Every template stops at once, naming TRAIN, when the training script is not given.

    It starts nothing: every launcher it could call is a stand-in that records being called.
    """
    fake = tmp_path / "bin"
    fake.mkdir()
    for name in STARTERS:
        (fake / name).write_text(f"#!/bin/sh\necho {name} >>{tmp_path}/called\n")
        (fake / name).chmod(0o755)
    env = {**scrubbed_environ(), "PATH": f"{fake}:/usr/bin:/bin", "SLURM_JOB_ID": "7",
           "SLURM_JOB_NODELIST": "n1", "LSB_MCPU_HOSTS": "h1 4", "HOSTFILE": "/dev/null"}  # fmt: skip
    env.pop("TRAIN", None)
    done = subprocess.run(["bash", str(template)], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=30, check=False)  # fmt: skip
    assert done.returncode != 0, done.stdout + done.stderr
    assert "TRAIN: set TRAIN to your training script" in done.stderr, done.stderr
    assert not (tmp_path / "called").exists(), (tmp_path / "called").read_text()


FAKE_JSRUN = """#!/bin/sh
# Stand-in for jsrun: print each argument on its own line, then the thread count it was given.
printf 'arg=%s\\n' "$@"
echo "OMP_NUM_THREADS=$OMP_NUM_THREADS"
"""


@pytest.mark.parametrize(
    ("hosts", "nodes"),
    [
        pytest.param("batch2 1 h22n07 42 h22n08 42", 2, id="coral-launch-node-dropped"),
        pytest.param("h22n07 42 h22n08 42 h22n09 42", 3, id="no-launch-node"),
    ],
)
def test_lsf_template_renders_jsrun_command(tmp_path: Path, hosts: str, nodes: int) -> None:
    """jsrun.bsub asks for one resource set per GPU on the job's compute nodes, runs TRAIN.

    The ranks jsrun would start are then read by distenv's lsf backend: the master is the first
    compute host (the CORAL launch node owns no rank).
    """
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "jsrun").write_text(FAKE_JSRUN)
    (fake / "jsrun").chmod(0o755)
    env = {
        **scrubbed_environ(),
        "PATH": f"{fake}:/usr/bin:/bin",
        "LSB_JOBID": "4242",
        "LSB_MCPU_HOSTS": hosts,
        "TRAIN": "my_train.py",
    }
    done = subprocess.run(["bash", str(SCRIPTS / "lsf" / "jsrun.bsub"), "--epochs", "3"], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    args = [line[4:] for line in done.stdout.splitlines() if line.startswith("arg=")]
    assert args == [
        "--nrs", str(6 * nodes), "--rs_per_host", "6", "--tasks_per_rs", "1",
        "--gpu_per_rs", "1", "--cpu_per_rs", "7", "--bind", "packed:7",
        "--launch_distribution", "packed",
        "python", "my_train.py", "--launcher", "lsf", "--epochs", "3",
    ]  # fmt: skip
    assert "OMP_NUM_THREADS=7" in done.stdout
    # What rank 7 of those ranks would get from distenv (jsrun's variables, LSF's host list).
    rank7 = {"LSB_JOBID": "4242", "LSB_MCPU_HOSTS": hosts, "JSM_NAMESPACE_RANK": "7",
             "JSM_NAMESPACE_SIZE": str(6 * nodes), "JSM_NAMESPACE_LOCAL_RANK": "1",
             "JSM_NAMESPACE_LOCAL_SIZE": "6"}  # fmt: skip
    info = detect("auto", rank7)
    assert (info.launcher, info.rank, info.node_rank, info.num_nodes) == ("lsf", 7, 1, nodes)
    assert info.master_addr == "h22n07"


# Stand-in for a starter (blaunch, mpiexec, flux): print each argument on its own line, then the
# variables it would hand to the ranks; `flux getattr size` and `flux hostlist` answer as Flux does.
FAKE_STARTER = """#!/bin/sh
case "$1 $2" in
    "getattr size") echo 2; exit 0 ;;
    "hostlist --nth=0") echo 127.0.0.1; exit 0 ;;
esac
printf 'arg=%s\\n' "$@"
echo "env=MASTER_ADDR=${MASTER_ADDR:-}"
echo "env=MASTER_PORT=${MASTER_PORT:-}"
echo "env=OMP_NUM_THREADS=${OMP_NUM_THREADS:-}"
"""
# The rank program the templates' rank commands run here: `distenv info --json --launcher NAME`,
# NAME from its own `--launcher NAME` (the template's); the training arguments are ignored.
INFO_RANK = """import sys
from distenv.cli import main
args = sys.argv[1:]
sys.exit(main(["info", "--json", "--launcher", args[args.index("--launcher") + 1]]))
"""
VENV_BIN = str(Path(PYTHON).parent)


def _render(
    tmp_path: Path,
    template: str,
    starter: str,
    env: Mapping[str, str],
    *,
    train: Path | None = None,
    args: tuple[str, ...] = ("--epochs", "3"),
) -> tuple[list[str], dict[str, str]]:
    """Run `template` (scripts/NAME) with a stand-in `starter`; return its argv and the variables.

    TRAIN is `train`, else INFO_RANK written under `tmp_path`; `args` go to the template.
    """
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / starter).write_text(FAKE_STARTER)
    (fake / starter).chmod(0o755)
    if train is None:
        train = tmp_path / "info_rank.py"
        train.write_text(INFO_RANK)
    child = {**scrubbed_environ(), "PATH": f"{fake}:{VENV_BIN}:/usr/bin:/bin",
             "TRAIN": str(train), **env}  # fmt: skip
    done = subprocess.run(["bash", str(SCRIPTS / template), *args], env=child, cwd=tmp_path,
                          capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    args = [line[4:] for line in lines if line.startswith("arg=")]
    exported = dict(line[4:].split("=", 1) for line in lines if line.startswith("env="))
    return args, exported


def _rank(argv: list[str], env: Mapping[str, str]) -> dict[str, object]:
    """Run one rank command (`python info_rank.py ...`) with `env`; return its RankInfo dict."""
    child = {**scrubbed_environ(), "PATH": f"{VENV_BIN}:/usr/bin:/bin", **env}
    done = subprocess.run(argv, env=child, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    info: dict[str, object] = json.loads(done.stdout)
    return info


def test_blaunch_template_runs_one_task_per_slot(tmp_path: Path) -> None:
    """lsf/blaunch.bsub runs `blaunch python TRAIN --launcher lsf ARGS` (one task per slot); that
    command, given each task's recorded environment (tests/support/envs/lsf.py BLAUNCH_2X2), is rank
    0..3 of 4 on 2 nodes, master the first slot's host."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(lsf.blaunch_hostfile)
    args, exported = _render(tmp_path, "lsf/blaunch.bsub", "blaunch", {"LSB_JOBID": "7001"})
    train = str(tmp_path / "info_rank.py")
    assert args == ["python", train, "--launcher", "lsf", "--epochs", "3"]
    assert exported == {"MASTER_ADDR": "", "MASTER_PORT": "", "OMP_NUM_THREADS": ""}
    for task, answer in zip(lsf.BLAUNCH_2X2, lsf.BLAUNCH_2X2_ANSWERS, strict=True):
        info = _rank(args, {**task, "LSB_DJOB_HOSTFILE": str(hostfile)})
        assert (info["launcher"], layout(info), info["master_addr"]) == ("lsf", answer, "c01")


def test_pbs_template_runs_pals_mpiexec_with_the_master(tmp_path: Path) -> None:
    """pbs/pals_mpiexec.qsub runs `mpiexec -n NODES*GPUS --ppn GPUS ... python TRAIN --launcher
    mpi ARGS` with MASTER_ADDR (the node file's first host) and MASTER_PORT (from PBS_JOBID); that
    command, given each rank's recorded PALS environment (tests/support/envs/pbs.py PALS_2X2) and those
    two, is rank 0..3 of 4 with PALS's node index, the node count left to the roll call."""
    nodefile = tmp_path / "nodefile"
    nodefile.write_text(pbs.nodefile_2x2)
    job = {**pbs.PALS_2X2[0], "PBS_NODEFILE": str(nodefile), "GPUS_PER_NODE": "2"}
    args, exported = _render(tmp_path, "pbs/pals_mpiexec.qsub", "mpiexec", job)
    train = str(tmp_path / "info_rank.py")
    assert args == ["-n", "4", "--ppn", "2", "--depth", "8", "--cpu-bind", "depth",
                    "python", train, "--launcher", "mpi", "--epochs", "3"]  # fmt: skip
    # 2024713.polaris-pbs-01...: 20000 + 2024713 % 10000.
    assert exported == {"MASTER_ADDR": pbs.NODES[0], "MASTER_PORT": "24713", "OMP_NUM_THREADS": "8"}
    rank_command = args[args.index("python") :]
    for rank_env, answer in zip(pbs.PALS_2X2, pbs.PALS_2X2_ANSWERS, strict=True):
        info = _rank(rank_command, {**rank_env, **exported})
        assert (info["launcher"], layout(info)) == ("mpi", answer)
        assert (info["master_addr"], info["master_port"]) == (pbs.NODES[0], 24713)


def test_flux_template_runs_distenv_run_per_node(harness: Harness, tmp_path: Path) -> None:
    """flux/distenv_run.flux runs `flux run -N NODES --tasks-per-node=1 --gpus-per-task=GPUS
    distenv run --nproc-per-node GPUS --master-addr HOST TRAIN --launcher pytorch ARGS`; that
    command, started for real as both tasks with their recorded environments (tests/support/envs/flux.py
    FLUX_2X1, the host 127.0.0.1 here, TRAIN rank_check.py), starts 2 x 2 ranks that finish one
    all_reduce."""
    task = {"FLUX_URI": "local:///run/flux/local", "GPUS_PER_NODE": "2"}
    args, exported = _render(tmp_path, "flux/distenv_run.flux", "flux", task, train=RANK_CHECK,
                             args=())  # fmt: skip
    assert args == ["run", "-N", "2", "--tasks-per-node=1", "--gpus-per-task=2", "distenv", "run",
                    "--nproc-per-node", "2", "--master-addr", "127.0.0.1", str(RANK_CHECK),
                    "--launcher", "pytorch"]  # fmt: skip
    assert exported == {"MASTER_ADDR": "", "MASTER_PORT": "", "OMP_NUM_THREADS": ""}
    # Each task runs that rank command as is, but for a port free here (Flux's default, 29500,
    # may be taken on a shared machine).
    command = args[args.index("distenv") :]
    port = str(free_port("127.0.0.1"))
    launches = [
        harness.start(
            [*command[:2], "--master-port", port, *command[2:]],
            env=harness.env(extra={**task, "DISTENV_TIMEOUT": "30"}),
        )
        for task in flux.FLUX_2X1
    ]
    records = sorted(
        [rec for result in wait_all(launches) for rec in result.ok().records()],
        key=lambda rec: rec["info"]["rank"],
    )
    assert [layout(rec["info"]) for rec in records] == [
        (r, 4, r % 2, 2, r // 2, 2) for r in range(4)
    ], records
    for rec in records:
        assert rec["info"]["launcher"] == "pytorch", rec
        assert rec["info"]["master_addr"] == "127.0.0.1", rec
        assert rec["all_reduce"] == 10, rec
