"""Wrapper scripts and enroot's PyTorch hook under the real srun and mpirun.

The wrappers are docs/start/containers.md's own blocks (`recipe`), written to a folder every
simulated node sees: enroot's hook formula as a per-task wrapper, a cluster guide's wrapper and an
`mpirun` wrapper. Each launch of the multi cluster is `srun -N 2 -n 4 --ntasks-per-node 2`; the
launches start together (a module fixture) and each test reads its own.
"""

from __future__ import annotations

import json
import uuid

import pytest

from distenv.master import free_port
from tests.support.docblocks import recipe
from tests.support.integration.faults import survivors
from tests.support.integration.helpers import JOB_NAME as JOB
from tests.support.integration.helpers import (
    OMPI,
    ONE_NODE,
    PYTHON,
    STEPS,
    TWO_BY_TWO,
    Harness,
    Launch,
    Result,
    check_world,
    rank_check,
)

pytestmark = pytest.mark.slurm

HERE = "tests/integration/test_wrappers.py::"
SRUN_2X2 = ["srun", "-J", JOB, "-N", "2", "-n", "4", "--ntasks-per-node", "2"]
BOUND = {"DISTENV_TIMEOUT": "10"}  # should a refusal regress, no rank waits long
INIT_ONLY = [PYTHON, "-c", "import distenv; distenv.init_dist()"]
# A refusal costs one torch import per task (init_dist imports torch.distributed first): 24 s
# measured with six launches on 2 cores at a load of 15. The messages tell a refusal from a
# rank that waited DISTENV_TIMEOUT; the bound only keeps a hang from passing.
REFUSAL_S = 60.0
TAG = f"wrapper-refusal-{uuid.uuid4().hex[:8]}"  # in the refused tasks' argv, to find survivors
# What `distenv export` printed in task 1 of an earlier 2x2 job, left in the batch script's
# environment (--export=ALL): that job's master is gone (TEST-NET-1: never routed).
STALE = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "192.0.2.1",
         "MASTER_PORT": "29598"}  # fmt: skip


def _script(harness: Harness, test: str, name: str, edit: tuple[str, str] = ("", "")) -> str:
    """Write the page's bash block marked for `test` as an executable under a shared folder."""
    block = recipe(HERE + test, "bash")[0]
    path = harness.outdir(name) / f"{name}.sh"
    path.write_text(block.code.replace(*edit) if edit[0] else block.code, encoding="utf-8")
    path.chmod(0o755)
    return str(path)


def _start(harness: Harness) -> dict[str, Launch]:
    hook = _script(harness, "test_the_hooks_formula_in_a_wrapper_meets_and_all_reduces", "hook")
    guide = _script(
        harness,
        "test_launcher_pytorch_under_a_wrapper_without_local_world_size_completes",
        "guide",
        ("29500", str(free_port())),
    )
    mpi_wrapper = _script(harness, "test_an_mpirun_wrapper_is_accepted", "mpi-wrapper")
    multi = harness.env("multi")
    bound = harness.env("multi", extra=BOUND)
    # A step of 2 tasks in an allocation of 4: the hook's WORLD_SIZE=$SLURM_NTASKS there.
    subset = ["salloc", "-J", JOB, "-N", "2", "-n", "4", "--ntasks-per-node", "2", PYTHON, STEPS,
              "srun", "-n", "2", hook, PYTHON, "-m", "distenv", "info", "--json"]  # fmt: skip
    master = ["-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={free_port()}"]
    info = f"{PYTHON} -m distenv info"  # detection alone: no torch import, in a --wrap line
    return {
        "hook": harness.start([*SRUN_2X2, hook, *rank_check()], env=multi),
        "info": harness.start([*SRUN_2X2, hook, PYTHON, "-m", "distenv", "info"], env=multi),
        # A step of 2 tasks in an allocation of 4: what the hook's WORLD_SIZE=$SLURM_NTASKS is.
        "subset": harness.start(subset, env=multi),
        "disagree": harness.start(
            [*SRUN_2X2, hook, "env", "WORLD_SIZE=8", *INIT_ONLY, TAG], env=bound
        ),
        "guide": harness.start([*SRUN_2X2, guide, *rank_check("--launcher", "pytorch")], env=multi),
        "mpirun": harness.start(
            [*OMPI, "--oversubscribe", "-np", "4", *master, mpi_wrapper, *rank_check()],
            env=harness.env(ompi=True),
        ),
        # The batch script exports a stale set, then runs `distenv info` in an srun step and itself.
        "batch": harness.sbatch(
            None,
            cluster="multi",
            options=[
                "-N",
                "2",
                "-n",
                "4",
                "--ntasks-per-node",
                "2",
                "--wrap",
                f"srun {info}; {info}",
            ],
            export={**STALE, **BOUND},
            env=bound,
            label="stale-batch",
        ),
    }


@pytest.fixture(scope="module")
def launches(harness: Harness) -> dict[str, Result]:
    started = _start(harness)
    # The refusal first: a launch's seconds are counted until it is waited for.
    return {name: started[name].wait() for name in sorted(started, key="disagree".__ne__)}


def test_the_hooks_formula_in_a_wrapper_meets_and_all_reduces(launches: dict[str, Result]) -> None:
    """enroot's hook, as a per-task wrapper under `srun -N 2 -n 4`: the 2x2 ranks read Slurm's
    layout, meet at the hook's master (the step's first host) and all-reduce; `distenv info`
    says it accepted the translation, on every task."""
    check_world(launches["hook"], launcher="slurm", layouts=TWO_BY_TWO)
    info = launches["info"].ok()
    accepted = [line for line in info.stdout.splitlines() if "accepted: RANK=" in line]
    assert len(accepted) == 4, info.text
    assert all("translate slurm's numbering of this task" in line for line in accepted)


def test_the_hooks_world_size_in_a_step_on_part_of_the_allocation(
    launches: dict[str, Result],
) -> None:
    """`srun -n 2` inside `salloc -n 4`: SLURM_NTASKS is the step's 2, so the hook's WORLD_SIZE
    translates the step and both tasks are rank r of 2."""
    (step,) = launches["subset"].ok().steps()
    assert step.returncode == 0, step.stderr
    infos = sorted((json.loads(line) for line in step.stdout.splitlines()), key=lambda i: i["rank"])
    assert [(i["launcher"], i["rank"], i["world_size"]) for i in infos] == [
        ("slurm", 0, 2),
        ("slurm", 1, 2),
    ], step.stdout


def test_a_wrapper_that_disagrees_is_refused_on_every_task(launches: dict[str, Result]) -> None:
    """The same wrapper with WORLD_SIZE=8: every task exits 1 at once, naming the variable, both
    values and where such exports come from; no process of the launch survives."""
    result = launches["disagree"]
    assert result.returncode != 0, result.text
    assert result.seconds < REFUSAL_S, result.text
    refusals = [
        line
        for line in result.stderr.splitlines()
        if "WORLD_SIZE='8' where slurm has SLURM_STEP_NUM_TASKS=4" in line
    ]
    assert len(refusals) == 4, result.text
    for task in range(4):
        assert sum(f"as SLURM_PROCID={task} SLURM_STEP_NUM_TASKS=4," in r for r in refusals) == 1
    assert all("container hook (enroot's 50-slurm-pytorch.sh)" in r for r in refusals)
    assert survivors(TAG) == []


def test_launcher_pytorch_under_a_wrapper_without_local_world_size_completes(
    launches: dict[str, Result],
) -> None:
    """A guide's wrapper (no LOCAL_WORLD_SIZE) with --launcher pytorch: the roll call counts the
    ranks per host and numbers the nodes; the 2x2 job all-reduces."""
    check_world(launches["guide"], launcher="pytorch", layouts=TWO_BY_TWO)


def test_an_mpirun_wrapper_is_accepted(launches: dict[str, Result]) -> None:
    """`mpirun.openmpi -np 4 mpi-wrapper.sh`: RANK etc. copied from OMPI_COMM_WORLD_* translate
    Open MPI's numbering; the ranks use MPI's layout and the master given with -x."""
    check_world(launches["mpirun"], launcher="mpi", layouts=ONE_NODE, master="127.0.0.1")


def test_a_stale_batch_script_export_is_still_refused(launches: dict[str, Result]) -> None:
    """RANK=1 WORLD_SIZE=4 LOCAL_RANK=1 and an old MASTER_ADDR exported in the batch script: every
    task of its srun step is refused (task 1's numbering matches, its master is no host of the
    job), and so is `distenv info` run in the batch script itself (set with no step)."""
    result = launches["batch"]
    err = "".join(body for name, body in result.files.items() if name.endswith(".err"))
    lines = err.splitlines()
    contradict = [line for line in lines if "pytorch: RANK=1 WORLD_SIZE=4 contradict slurm" in line]
    match = [line for line in lines if "pytorch: RANK=1 WORLD_SIZE=4 match slurm" in line]
    assert len(contradict) == 3, result.text
    assert len(match) == 1, result.text
    assert (
        "MASTER_ADDR='192.0.2.1' names no host of this job, whose step and job start on n"
        in (match[0])
    )
    assert sum("were set with no step" in line for line in lines) == 1, result.text
    assert "Hint: start one task per GPU with `srun" in err, result.text
    assert result.returncode != 0, result.text
    assert not result.records(), result.text
