"""Ranks inside real container runtimes under the multi cluster's srun: charliecloud's ch-run, podman.

The image is a directory made from local files (no registry): empty mount points plus the usr-merged
symlinks, with the host's /usr, the checkout and the venv's python bound in (podman's ``--rootfs``
takes the same directory). docs/start/containers.md's srun lines are what runs: with the environment
passed the ranks meet and all_reduce; with ``--unset-env='*'`` every task is refused within seconds,
naming slurmstepd and the flag; podman without ``--env-host`` trains alone on every task (its conmon
detaches, so slurmstepd is no ancestor: the page says so).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from pathlib import Path

import pytest

from tests.support.docblocks import recipe
from tests.support.integration.helpers import (
    PYTHON,
    RANK_CHECK,
    REPO,
    TWO_BY_TWO,
    Harness,
    Result,
    check_world,
    wait_all,
)

pytestmark = pytest.mark.slurm

HERE = "tests/integration/test_containers.py::"
# Seconds from a task's start to its refusal: the bound is 5; python starts in about 0.3.
REFUSAL_S = 5.0
# Times the program inside the container and reports it on stderr, then exits with its status.
TIMED = (
    "import subprocess, sys, time\n"
    "start = time.monotonic()\n"
    "code = subprocess.call(sys.argv[1:])\n"
    "sys.stderr.write(f'elapsed {time.monotonic() - start:.3f}\\n')\n"
    "sys.exit(code)\n"
)


def image(root: Path) -> tuple[Path, list[str]]:
    """Make a directory image from local files; return it and the top-level directories to bind.

    Every top-level directory that holds the checkout, the venv's python or the interpreter it
    links to is bound at its own path; /usr carries the rest (bin, lib, lib64 are links into it).
    """
    tops = {"usr"}
    for path in (REPO, Path(PYTHON).resolve(), Path(sys.base_prefix).resolve(), root):
        tops.add(path.resolve().parts[1])
    made = root / "image"
    for name in {"dev", "proc", "sys", "tmp", "home", "etc", "mnt", "run", "root", *tops}:
        (made / name).mkdir(parents=True, exist_ok=True)
    for link in ("bin", "lib", "lib64", "sbin"):
        if not (made / link).exists():
            os.symlink(f"usr/{link}", made / link)
    for name in ("passwd", "group", "hosts", "resolv.conf"):  # ch-run binds the node's own
        (made / "etc" / name).touch()
    return made, sorted(tops)


def srun_line(test: str) -> list[str]:
    """Return the srun line of the docs block that `test` runs, as argv."""
    (block,) = recipe(HERE + test, lang="bash")
    code = block.code.replace("\\\n", " ")  # a line continued with a backslash is one line
    (line,) = [line for line in code.splitlines() if line.startswith("srun ")]
    return shlex.split(line)


def in_image(argv: list[str], made: Path, tops: list[str], program: list[str]) -> list[str]:
    """Put the test's image, binds and rank program in place of the docs' ``./pytorch`` and
    ``python train.py``."""
    at = argv.index("ch-run") + 1
    argv = [*argv[:at], *[f"--bind=/{top}:/{top}" for top in tops], *argv[at:]]
    command = argv.index("--") + 1
    assert argv[command:] == ["python", "train.py"], argv
    return [str(made) if a == "./pytorch" else a for a in argv[:command]] + program


def test_charliecloud_ranks_all_reduce(harness: Harness) -> None:
    """`srun -N 2 --ntasks-per-node 2 ch-run ./pytorch -- python train.py` (the page's line): ch-run
    passes the environment, every rank meets its peers and the all_reduce is right."""
    made, tops = image(harness.outdir("charliecloud-image"))
    argv = in_image(srun_line("test_charliecloud_ranks_all_reduce"), made, tops,
                    [PYTHON, str(RANK_CHECK)])  # fmt: skip
    env = harness.env("multi", extra={"USER": "root", "PYTHONPATH": str(REPO)})
    result = harness.run(argv, cluster="multi", env=env)
    check_world(result, launcher="slurm", layouts=TWO_BY_TWO)


def test_charliecloud_stripped_environment_is_refused(harness: Harness) -> None:
    """`ch-run --unset-env='*'`: each of the 4 tasks is refused within 5 s, exit non-zero, naming
    slurmstepd and its step, charliecloud's flag and --launcher none; none trains alone."""
    made, tops = image(harness.outdir("charliecloud-image"))
    timed = [PYTHON, "-c", TIMED, PYTHON, str(RANK_CHECK)]
    argv = in_image(srun_line("test_charliecloud_stripped_environment_is_refused"), made, tops,
                    timed)  # fmt: skip
    # The checkout's distenv, not an installed one: the only variable let back in.
    at = argv.index("--unset-env=*") + 1
    argv.insert(at, f"--set-env=PYTHONPATH={REPO}")
    env = harness.env("multi", extra={"USER": "root", "PYTHONPATH": str(REPO)})
    started = time.monotonic()
    result = harness.run(argv, cluster="multi", env=env, timeout=60)
    assert result.returncode not in (0, None), result.text
    refusals = re.findall(
        r"(?m)^rank_check: slurm: this process was started by slurmstepd \(pid \d+, step \d+\.0\), but "
        r"none of slurm's variables .* it runs in charliecloud \(\$CH_RUNNING is set\), where "
        r"`ch-run --unset-env` removes them; .*to run this process alone on purpose, pass "
        r"--launcher none",
        result.stderr,
    )
    assert len(refusals) == 4, result.text
    elapsed = [float(s) for s in re.findall(r"^elapsed ([\d.]+)$", result.stderr, re.M)]
    assert len(elapsed) == 4, result.text
    assert max(elapsed) < REFUSAL_S, elapsed
    assert result.records() == [], result.text  # no rank trained alone
    assert time.monotonic() - started < 60


def test_distenv_info_and_run_in_a_stripped_task_explain(harness: Harness) -> None:
    """`distenv info` and `distenv run` in the same stripped tasks: one line per task naming
    slurmstepd, exit 1, no traceback; `distenv run` starts no node of its own."""
    made, tops = image(harness.outdir("charliecloud-image"))
    env = harness.env("multi", extra={"USER": "root", "PYTHONPATH": str(REPO)})
    launches = []
    for command in (["info"], ["run", "-n", "2", "--no-python", "true"]):
        program = [PYTHON, "-m", "distenv", *command]
        argv = in_image(srun_line("test_charliecloud_stripped_environment_is_refused"), made,
                        tops, program)  # fmt: skip
        argv.insert(argv.index("--unset-env=*") + 1, f"--set-env=PYTHONPATH={REPO}")
        launches.append(harness.start(argv, cluster="multi", env=env, timeout=60))
    for result in wait_all(launches):
        assert result.returncode not in (0, None), result.text
        lines = re.findall(r"(?m)^distenv: slurm: this process was started by slurmstepd",
                           result.stderr)  # fmt: skip
        assert len(lines) == 4, result.text
        assert "Traceback" not in result.stderr


# What this test machine's podman needs besides the page's flags (the page says why): crun cannot
# raise RLIMIT_NOFILE to podman's 1048576 without CAP_SYS_RESOURCE and refuses the hybrid cgroup
# layout; runc with limits no higher than podman's own starts the container.
PODMAN_HOST_FLAGS = ["--runtime", "runc", "--ulimit", "nofile=4096:4096", "--ulimit",
                     "nproc=32768:32768"]  # fmt: skip


def in_podman(argv: list[str], made: Path, tops: list[str], program: list[str]) -> list[str]:
    """Turn the page's `podman run` line into this machine's: its flags and binds, `--rootfs`
    with the test's image for ``pytorch``, no GPU device, the checkout for ``$PWD``, and the rank
    program for ``python train.py``."""
    at = argv.index("run", argv.index("podman")) + 1
    binds = [flag for top in tops for flag in ("-v", f"/{top}:/{top}")]
    argv = [*argv[:at], *PODMAN_HOST_FLAGS, *binds, *argv[at:]]
    if "--device" in argv:  # the page's GPUs (CDI); the simulated nodes have none
        at = argv.index("--device")
        del argv[at : at + 2]
    argv = [a.replace("$PWD", str(REPO)) for a in argv]
    assert argv[-3:] == ["pytorch", "python", "train.py"], argv
    return [*argv[:-3], "--rootfs", str(made), *program]


@pytest.fixture(scope="module")
def podman_runs(harness: Harness) -> dict[str, Result]:
    """Run the page's two podman lines at the same time under the multi cluster's srun."""
    made, tops = image(harness.outdir("podman-image"))
    env = harness.env("multi", extra={"USER": "root", "PYTHONPATH": str(REPO)})
    program = [PYTHON, str(RANK_CHECK)]
    passed = in_podman(srun_line("test_podman_ranks_all_reduce"), made, tops, program)
    stripped = in_podman(srun_line("test_podman_without_the_environment_trains_alone"), made,
                         tops, program)  # fmt: skip
    # The checkout's distenv, not an installed one: the only variable passed in.
    at = stripped.index("--rm")
    stripped[at:at] = ["-e", "PYTHONPATH"]
    names = ("passed", "stripped")
    launches = [harness.start(argv, cluster="multi", env=env) for argv in (passed, stripped)]
    return dict(zip(names, wait_all(launches), strict=True))


def test_podman_ranks_all_reduce(podman_runs: dict[str, Result]) -> None:
    """`srun -N 2 --ntasks-per-node 2 podman run --env-host --network=host --ipc=host ...` (the
    page's line): the environment passed, every rank meets its peers and the all_reduce is right."""
    check_world(podman_runs["passed"], launcher="slurm", layouts=TWO_BY_TWO)


def test_podman_without_the_environment_trains_alone(podman_runs: dict[str, Result]) -> None:
    """`podman run` without `--env-host` or `-e`, even with `--pid=host`: conmon detaches, so no
    task has slurmstepd among its ancestors and each trains alone as rank 0 of 1 (what the page
    warns of), exit 0."""
    result = podman_runs["stripped"].ok()
    recs = result.records()
    assert len(recs) == 4, result.text
    assert len({rec["hostname"] for rec in recs}) == 2, result.text  # srun's 4 tasks on 2 nodes
    for rec in recs:
        assert (rec["info"]["launcher"], rec["info"]["world_size"]) == ("none", 1), rec
        assert rec["all_reduce"] == 1, rec


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("launcher", "daemon"),
    [
        (["mpirun.openmpi", "--allow-run-as-root", "-np", "2"], "mpirun.openmpi"),
        (["mpiexec.hydra", "-n", "2"], "hydra_pmi_proxy"),
    ],
    ids=["openmpi", "mpich"],
)
def test_mpi_ranks_with_an_emptied_environment_are_refused(
    harness: Harness, launcher: list[str], daemon: str
) -> None:
    """`env -i` between mpirun and the rank (as a stripping container would): both ranks are
    refused as `mpi`, naming the daemon that started them (mpirun itself on its own node,
    Hydra's proxy)."""
    program = ["env", "-i", f"PYTHONPATH={REPO}", PYTHON, str(RANK_CHECK)]
    result = harness.run([*launcher, *program], env=harness.env(ompi=True), timeout=60)
    assert result.returncode not in (0, None), result.text
    refusals = re.findall(rf"(?m)^rank_check: mpi: this process was started by {daemon} \(pid",
                          result.stderr)  # fmt: skip
    assert len(refusals) == 2, result.text
    assert result.records() == [], result.text
