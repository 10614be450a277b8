"""Ranks inside a real container runtime under the multi cluster's srun: charliecloud's ch-run.

The image is a directory made from local files (no registry): empty mount points plus the usr-merged
symlinks, with the host's /usr, the checkout and the venv's python bound in. docs/start/containers.md's
srun lines are what runs: with the environment passed the ranks meet and all_reduce; with
``--unset-env='*'`` every task is refused within seconds, naming slurmstepd and the flag.
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
    """Make a ch-run directory image from local files; return it and the bind flags it needs.

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
    binds = [f"--bind=/{top}:/{top}" for top in sorted(tops)]
    return made, binds


def srun_line(test: str) -> list[str]:
    """Return the srun line of the docs block that `test` runs, as argv."""
    (block,) = recipe(HERE + test, lang="bash")
    (line,) = [line for line in block.code.splitlines() if line.startswith("srun ")]
    return shlex.split(line)


def in_image(argv: list[str], made: Path, binds: list[str], program: list[str]) -> list[str]:
    """Put the test's image, binds and rank program in place of the docs' ``./pytorch`` and
    ``python train.py``."""
    at = argv.index("ch-run") + 1
    argv = [*argv[:at], *binds, *argv[at:]]
    command = argv.index("--") + 1
    assert argv[command:] == ["python", "train.py"], argv
    return [str(made) if a == "./pytorch" else a for a in argv[:command]] + program


def test_charliecloud_ranks_all_reduce(harness: Harness) -> None:
    """`srun -N 2 --ntasks-per-node 2 ch-run ./pytorch -- python train.py` (the page's line): ch-run
    passes the environment, every rank meets its peers and the all_reduce is right."""
    made, binds = image(harness.outdir("charliecloud-image"))
    argv = in_image(srun_line("test_charliecloud_ranks_all_reduce"), made, binds,
                    [PYTHON, str(RANK_CHECK)])  # fmt: skip
    env = harness.env("multi", extra={"USER": "root", "PYTHONPATH": str(REPO)})
    result = harness.run(argv, cluster="multi", env=env)
    check_world(result, launcher="slurm", layouts=TWO_BY_TWO)


def test_charliecloud_stripped_environment_is_refused(harness: Harness) -> None:
    """`ch-run --unset-env='*'`: each of the 4 tasks is refused within 5 s, exit non-zero, naming
    slurmstepd and its step, charliecloud's flag and --launcher none; none trains alone."""
    made, binds = image(harness.outdir("charliecloud-image"))
    timed = [PYTHON, "-c", TIMED, PYTHON, str(RANK_CHECK)]
    argv = in_image(srun_line("test_charliecloud_stripped_environment_is_refused"), made, binds,
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
    made, binds = image(harness.outdir("charliecloud-image"))
    env = harness.env("multi", extra={"USER": "root", "PYTHONPATH": str(REPO)})
    launches = []
    for command in (["info"], ["run", "-n", "2", "--no-python", "true"]):
        program = [PYTHON, "-m", "distenv", *command]
        argv = in_image(srun_line("test_charliecloud_stripped_environment_is_refused"), made,
                        binds, program)  # fmt: skip
        argv.insert(argv.index("--unset-env=*") + 1, f"--set-env=PYTHONPATH={REPO}")
        launches.append(harness.start(argv, cluster="multi", env=env, timeout=60))
    for result in wait_all(launches):
        assert result.returncode not in (0, None), result.text
        lines = re.findall(r"(?m)^distenv: slurm: this process was started by slurmstepd",
                           result.stderr)  # fmt: skip
        assert len(lines) == 4, result.text
        assert "Traceback" not in result.stderr


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
