"""Leftover launcher variables inside a scheduler step: refused at once, naming both sets.

The environments are copies of captured real runs (tests/support/envs) with the leftovers added: what a
stale ``export RANK=3 WORLD_SIZE=4 ...`` in ~/.bashrc, or an outer mpirun's OMPI_*, looks like
inside an srun step.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from distenv import detect, explain
from distenv.detection.agreement import LAUNCH_MARKS, refuse_leftovers
from distenv.detection.layer import Layers
from distenv.errors import InconsistentEnvironmentError
from distenv.launchers.registry import auto_candidates
from distenv.master import RUN_ID_VAR, SCOPE_VAR
from tests.conftest import scrubbed_environ
from tests.support.envs import kubeflow, lsf, mpi, slurm, torchrun

# What the 0.1.0 report had exported: every task of the step became "rank 3 of 4".
STALE = {"RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "login7", "MASTER_PORT": "29500"}
FULL_STALE = {**STALE, "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
# Open MPI's variables of rank 3 of `mpirun -np 4` (captured), as inherited or exported.
OMPI_RANK3 = {k: v for k, v in mpi.OMPI_4[3].items() if k.startswith(("OMPI_", "PMIX_"))}
HYDRA_RANK3 = {k: v for k, v in mpi.HYDRA_4[3].items() if k.startswith(("PMI_", "MPI_"))}


def _steps() -> list[object]:
    """Every rank of srun steps whose own numbering is not rank 3 of 4."""
    cases = []
    for name, envs, size_var in [
        ("srun-1n-4t", slurm.SRUN_1N_4T, "SLURM_STEP_NUM_TASKS"),
        ("srun-2n-4t", slurm.SRUN_2N_4T, "SLURM_STEP_NUM_TASKS"),
        ("srun-pmix", slurm.SRUN_PMIX_4, "SLURM_STEP_NUM_TASKS"),
        ("srun-pmi2", slurm.SRUN_PMI2_4, "SLURM_STEP_NUM_TASKS"),
    ]:
        for rank, env in enumerate(envs[:3]):
            cases.append(
                pytest.param(env, f"SLURM_PROCID={rank} {size_var}=4", id=f"{name}-{rank}")
            )
    return cases


def _refused(launcher: str, env: dict[str, str]) -> InconsistentEnvironmentError:
    with pytest.raises(InconsistentEnvironmentError) as caught:
        detect(launcher, env)
    return caught.value


@pytest.mark.parametrize("extra", [STALE, FULL_STALE], ids=["kubeflow-set", "full-set"])
@pytest.mark.parametrize(("env", "step"), _steps())
@pytest.mark.parametrize("launcher", ["auto", "slurm"])
def test_stale_torchrun_contract_in_an_srun_step_is_refused(
    launcher: str, env: dict[str, str], step: str, extra: dict[str, str]
) -> None:
    """RANK/WORLD_SIZE/MASTER_* exported into an srun step that numbers it otherwise: refused."""
    error = _refused(launcher, {**env, **extra})
    message = str(error)
    assert message.startswith("pytorch: RANK=3 WORLD_SIZE=4 contradict slurm"), message
    assert f"started this process as {step}," in message
    assert "were not set by any launcher inside the step" in message
    assert "exported by an earlier job or a shell profile" in message
    assert "Hint: unset RANK WORLD_SIZE" in message
    assert "MASTER_ADDR MASTER_PORT where they are exported" in message
    assert "distenv reads slurm's numbering itself" in message
    assert (error.source, error.variable, error.value) == ("pytorch", "RANK", "3")
    # --launcher pytorch is offered only where it would work: never for another numbering.
    assert "--launcher pytorch" not in message
    assert error.considered[-1][0] == "pytorch"
    assert error.considered[-1][1].startswith("refused: rank 3 of 4 vs slurm's rank")


@pytest.mark.parametrize(
    ("env", "step"),
    [
        pytest.param(mpi.OMPI_4[1], "OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=4", id="mpirun"),
        pytest.param(mpi.HYDRA_4[0], "PMI_RANK=0 PMI_SIZE=4", id="hydra"),
        pytest.param(
            lsf.JSRUN_PLAIN_RANK5, "JSM_NAMESPACE_RANK=5 JSM_NAMESPACE_SIZE=8", id="jsrun"
        ),
    ],
)
def test_stale_torchrun_contract_in_an_mpi_launch_or_jsrun_is_refused(
    env: dict[str, str], step: str
) -> None:
    """An MPI launch and a jsrun step are steps too: their numbering is named."""
    message = str(_refused("auto", {**env, **STALE}))
    assert "pytorch: RANK=3 WORLD_SIZE=4 contradict " in message
    assert f"started this process as {step}," in message


def stale_export(rank: int, size: int) -> dict[str, str]:
    """Return what `distenv export` printed for rank `rank` of `size` on one node, less
    DISTENV_SCOPE (0.1.0 printed none; or edited by hand), with an unreachable master."""
    return {"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(size), "MASTER_ADDR": "192.0.2.1", "MASTER_PORT": "29500"}  # fmt: skip


# What a stale export looks like in task 3 of a 4-task step that it matches by chance, its
# LOCAL_* too (a ~/.bashrc written for that task).
MATCHING_STALE = {**STALE, "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4"}


@pytest.mark.parametrize("extra", [STALE, MATCHING_STALE], ids=["kubeflow-set", "full-set"])
@pytest.mark.parametrize("launcher", ["auto", "slurm"])
def test_a_match_whose_master_is_no_host_of_the_job_is_refused(
    launcher: str, extra: dict[str, str]
) -> None:
    """`export RANK=3 WORLD_SIZE=4 MASTER_ADDR=login7 ...` in task 3 of a 4-task step: its
    numbering matches by chance, its MASTER_ADDR names another job's host: refused like on every
    other task (until issue #25 this task used the old job's master)."""
    error = _refused(launcher, {**slurm.SRUN_1N_4T[3], **extra})
    message = str(error)
    assert message.startswith(
        "pytorch: RANK=3 WORLD_SIZE=4 match slurm, which started this process as SLURM_PROCID=3 "
        "SLURM_STEP_NUM_TASKS=4, and were not set by any launcher inside the step (none marked "
        "them as its own: TORCHELASTIC_RUN_ID, DISTENV_RUN_ID, CROSS_RANK CROSS_SIZE LOCAL_SIZE): "
        "MASTER_ADDR='login7' names no host of this job, whose step and job start on vm: a value "
        "from another job."
    ), message
    assert "likely exported by an earlier job or a shell profile" in message
    assert "Hint: unset RANK WORLD_SIZE" in message
    assert "or make the wrapper set MASTER_ADDR to vm: distenv reads slurm's numbering" in message
    assert ("--launcher pytorch if a wrapper inside the step sets them" in message) == (
        "LOCAL_RANK" in extra
    )
    assert (error.source, error.variable, error.value) == ("pytorch", "MASTER_ADDR", "login7")
    assert error.considered[-1] == (
        "pytorch",
        "refused: rank 3 of 4 as slurm's, MASTER_ADDR of another job: left over from another job",
    )


@pytest.mark.parametrize(
    ("envs", "step", "hosts"),
    [
        pytest.param(slurm.SRUN_1N_4T, "SLURM_PROCID={} SLURM_STEP_NUM_TASKS=4", True, id="srun"),
        pytest.param(
            slurm.SRUN_PMIX_4, "SLURM_PROCID={} SLURM_STEP_NUM_TASKS=4", True, id="srun-pmix"
        ),
        pytest.param(
            mpi.OMPI_4, "OMPI_COMM_WORLD_RANK={} OMPI_COMM_WORLD_SIZE=4", False, id="mpirun"
        ),
        pytest.param(mpi.HYDRA_4, "PMI_RANK={} PMI_SIZE=4", False, id="hydra"),
    ],
)
def test_a_stale_export_is_refused_on_every_task_the_step_can_tell(
    envs: tuple[dict[str, str], ...], step: str, hosts: bool
) -> None:
    """A stale one-node `distenv export` of rank r (no DISTENV_SCOPE, an old job's master) in
    every task: each task it contradicts is refused; the one it matches too where the step names
    its hosts (srun). An MPI launch names none: there the matching rank takes it as a
    translation (and meets no rank 0, the others being refused), as it would a wrapper's."""
    for stale in range(4):
        for rank, env in enumerate(envs):
            if rank == stale and not hosts:
                info = detect("auto", {**env, **stale_export(stale, 4)})
                assert (info.rank, info.world_size, info.master_addr) == (rank, 4, "192.0.2.1")
                continue
            message = str(_refused("auto", {**env, **stale_export(stale, 4)}))
            verb = "match" if rank == stale else "contradict"
            assert message.startswith(f"pytorch: RANK={stale} WORLD_SIZE=4 {verb} "), message
            assert f"started this process as {step.format(rank)}," in message


@pytest.mark.parametrize("envs", [slurm.SRUN_1N_4T, mpi.OMPI_4])
def test_explicit_pytorch_takes_a_matching_contract_as_meant(
    envs: tuple[dict[str, str], ...],
) -> None:
    """--launcher pytorch: a wrapper inside the step sets RANK=$SLURM_PROCID ... on purpose."""
    info = detect("pytorch", {**envs[2], **stale_export(2, 4)})
    assert (info.launcher, info.rank, info.world_size) == ("pytorch", 2, 4)
    assert (info.master_addr, info.master_port) == ("192.0.2.1", 29500)


def test_a_kubeflow_v1_pods_own_rank_is_not_a_leftover() -> None:
    """A step whose launcher declares RANK and WORLD_SIZE as its own sets them: Kubeflow v1 sets
    the pod's index as RANK; matching, it is the pod's (contradicting, still refused)."""
    pod = kubeflow.POD_V1_2X1_WORKER0
    assert (pod["RANK"], pod["WORLD_SIZE"]) == ("1", "2")
    info = detect("auto", pod)
    assert (info.launcher, info.rank, info.world_size) == ("kubeflow", 1, 2)
    _refused("auto", {**pod, "RANK": "0"})


@pytest.mark.parametrize(
    "mark",
    [pytest.param(dict.fromkeys(names, "1"), id=who) for who, names in LAUNCH_MARKS],
)
def test_a_launchers_mark_makes_the_contract_a_launch(mark: dict[str, str]) -> None:
    """torchrun, distenv run and DeepSpeed's launcher set RANK/... inside a step on purpose."""
    env = {**slurm.SRUN_1N_4T[1], **FULL_STALE, **mark}
    notes: list[tuple[str, str]] = []
    layers = Layers(env)
    detected = [layers[c] for c in auto_candidates(env) if c.detect(env)]
    refuse_leftovers(None, layers, detected, notes)
    assert notes == []


def test_a_partial_deepspeed_mark_is_no_mark() -> None:
    """DeepSpeed's launcher sets CROSS_RANK, CROSS_SIZE and LOCAL_SIZE together; one is not it."""
    _refused("auto", {**slurm.SRUN_1N_4T[1], **FULL_STALE, "CROSS_RANK": "0"})


@pytest.mark.parametrize("rank", range(4))
def test_distenv_run_ranks_inside_srun_are_marked(rank: int) -> None:
    """`srun ... distenv run`: the ranks' RANK disagrees with SLURM_PROCID; DISTENV_RUN_ID says why.

    The torchrun-in-srun capture without torchrun's own mark stands for distenv run's ranks.
    """
    captured = torchrun.TORCHRUN_IN_SRUN_2N[rank]
    env = {k: v for k, v in captured.items() if not k.startswith("TORCHELASTIC_")}
    _refused("auto", env)
    info = detect("auto", {**env, RUN_ID_VAR: "26.0"})
    assert (info.launcher, info.rank, info.world_size) == ("pytorch", rank, 4)
    assert info.job_id == "26.0"
    assert detect("auto", captured).rank == rank  # torchrun's own mark


def test_explicit_pytorch_takes_the_variables_as_meant() -> None:
    """--launcher pytorch: a launcher inside the step set them on purpose."""
    info = detect("pytorch", {**slurm.SRUN_1N_4T[1], **FULL_STALE})
    assert (info.launcher, info.rank, info.world_size, info.local_rank) == ("pytorch", 3, 4, 1)


@pytest.mark.parametrize(
    ("tag", "refused"),
    [("slurm/3/0", False), ("none/-/-", False), ("pytorch/old-run/-", True)],
)
def test_distenv_export_tag_of_another_launcher_is_not_judged_here(tag: str, refused: bool) -> None:
    """`eval "$(distenv export)"` of a Slurm step is no launch (master rules ignore it); of a
    torchrun job, without torchrun's own mark, it is a leftover like any other."""
    env = {**slurm.SRUN_1N_4T[1], **FULL_STALE, SCOPE_VAR: tag}
    if refused:
        _refused("auto", env)
    else:
        assert detect("auto", env).launcher == "slurm"


@pytest.mark.parametrize(
    "extra",
    [{"RANK": "3"}, {"WORLD_SIZE": "4"}, {"LOCAL_RANK": "3"}, {"RANK": "x", "WORLD_SIZE": "4"}],
    ids=["rank", "world-size", "local-rank", "malformed-rank"],
)
def test_a_lone_or_malformed_leftover_stays_ignored(extra: dict[str, str]) -> None:
    """Without both RANK and WORLD_SIZE as integers there is no numbering to contradict."""
    assert detect("auto", {**slurm.SRUN_1N_4T[1], **extra}).rank == 1


def test_outside_a_step_nothing_changes() -> None:
    """A one-task batch script has no step numbering: the contract is read as before."""
    info = detect("auto", {**slurm.SBATCH_BATCH_1T[0], **STALE})
    assert (info.launcher, info.rank, info.world_size) == ("pytorch", 3, 4)


@pytest.mark.parametrize(
    ("extra", "inner"),
    [
        pytest.param(OMPI_RANK3, "OMPI_COMM_WORLD_RANK=3 OMPI_COMM_WORLD_SIZE=4", id="ompi"),
        pytest.param(HYDRA_RANK3, "PMI_RANK=3 PMI_SIZE=4", id="hydra"),
    ],
)
@pytest.mark.parametrize("rank", range(3))
@pytest.mark.parametrize("launcher", ["auto", "slurm"])
def test_stale_mpi_variables_in_an_srun_step_are_named(
    launcher: str, rank: int, extra: dict[str, str], inner: str
) -> None:
    """An outer mpirun's variables in a step of 4 tasks on one node: both sets, the right cause."""
    error = _refused(launcher, {**slurm.SRUN_1N_4T[rank], **extra})
    message = str(error)
    assert message.startswith(f"mpi: {inner} contradict slurm"), message
    assert f"as SLURM_PROCID={rank} SLURM_STEP_NUM_TASKS=4, one of 4 tasks on this node" in message
    assert "inherited from an outer mpirun or mpiexec" in message
    assert "different MPI library" not in message
    assert "--launcher mpi" in message
    assert error.source == "mpi"
    assert error.value == "3"


def test_stale_mpi_variables_that_agree_are_the_steps_own() -> None:
    """Rank 3 of 4 in both layers: as under srun --mpi=pmix, the step's layout answers."""
    info = detect("auto", {**slurm.SRUN_1N_4T[3], **OMPI_RANK3})
    assert (info.launcher, info.rank, info.local_world_size) == ("slurm", 3, 4)


def test_explicit_mpi_takes_its_variables_as_meant() -> None:
    """--launcher mpi: an MPI launcher inside the step started this process."""
    info = detect("mpi", {**slurm.SRUN_1N_4T[0], **OMPI_RANK3})
    assert (info.launcher, info.rank, info.world_size) == ("mpi", 3, 4)


def test_mpi_variables_in_a_one_task_per_node_step_may_be_a_daemon_step() -> None:
    """One task per node is the shape of mpirun's and Hydra's daemon steps: MPI answers as before.

    The rule's boundary: here an inherited OMPI_* cannot be told from a real mpirun.
    """
    info = detect("auto", {**slurm.SRUN_4N_4T[0], **OMPI_RANK3})
    assert (info.launcher, info.rank, info.world_size) == ("mpi", 3, 4)


@pytest.mark.parametrize(
    "envs", [mpi.OMPI_IN_SALLOC_2N, mpi.HYDRA_IN_SALLOC_2N, mpi.OMPI_IN_SBATCH, mpi.HYDRA_IN_SBATCH]
)
def test_real_mpi_launches_inside_allocations_are_not_leftovers(
    envs: tuple[dict[str, str], ...],
) -> None:
    """Captured mpirun/Hydra ranks under a daemon step disagree with it, and are kept."""
    for rank, env in enumerate(envs):
        assert explain("auto", env).info.rank == rank


def test_distenv_info_explains_the_refusal_in_one_line() -> None:
    """`distenv info` in such a step: exit 1, one line naming both sets and the fix."""
    env = {**scrubbed_environ(), **slurm.SRUN_1N_4T[1], **STALE}
    result = subprocess.run(
        [sys.executable, "-m", "distenv", "info"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("distenv: pytorch: RANK=3 WORLD_SIZE=4 contradict slurm")
    assert "SLURM_PROCID=1 SLURM_STEP_NUM_TASKS=4" in lines[0]


def test_deepspeed_ranks_inside_a_step_are_its_ranks() -> None:
    """`srun ... deepspeed` (its launch.py per node) inside a step: the `pytorch` layout, whole.

    deepspeed/launcher/launch.py sets MASTER_ADDR, MASTER_PORT, WORLD_SIZE, CROSS_RANK, CROSS_SIZE,
    LOCAL_SIZE, RANK and LOCAL_RANK (from its source: no LOCAL_WORLD_SIZE, no TORCHELASTIC_*).
    """
    deepspeed = {
        "MASTER_ADDR": "n1",
        "MASTER_PORT": "29500",
        "WORLD_SIZE": "8",
        "CROSS_RANK": "1",
        "CROSS_SIZE": "2",
        "LOCAL_SIZE": "4",
        "RANK": "6",
        "LOCAL_RANK": "2",
    }
    info = detect("auto", {**slurm.SRUN_2N_4T[1], **deepspeed})
    assert info.launcher == "pytorch"
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (6, 8, 2, 4)
    assert (info.node_rank, info.num_nodes, info.master_addr) == (1, 2, "n1")
