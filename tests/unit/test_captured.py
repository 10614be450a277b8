"""Every rank of every captured real run, through `detect` (auto and explicit names)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from distenv import DistEnvError, detect
from distenv.bootstrap.records import CheckIn
from distenv.bootstrap.rollcall import fill_layout
from distenv.bootstrap.verdict import Verdict, node_hosts, validate
from distenv.errors import LauncherMismatchError, LauncherNotFoundError, NotLaunchedError
from distenv.master import scheduler_port
from tests.support.envs import Layout, layout, make_fixtures, mpi, recorded, slurm, torchrun
from tests.support.verdicts import as_read

CAPTURES = Path(__file__).resolve().parents[1] / "support" / "envs" / "captures"


ONE_NODE = [(r, 4, r, 4, 0, 1) for r in range(4)]
TWO_BY_TWO = [(r, 4, r % 2, 2, r // 2, 2) for r in range(4)]
FOUR_NODES = [(r, 4, 0, 1, r, 4) for r in range(4)]
# Both MPI launchers inside `salloc -N 2 -n 4` put three ranks on the first node, one on the second.
THREE_PLUS_ONE = [(0, 4, 0, 3, 0, 2), (1, 4, 1, 3, 0, 2), (2, 4, 2, 3, 0, 2), (3, 4, 0, 1, 1, 2)]
# MPI with no daemon step spanning the allocation names no node: the roll call numbers the hosts.
TWO_BY_TWO_BY_ROLL_CALL = [(r, 4, r % 2, 2, None, None) for r in range(4)]
# Open MPI 5 (PyPI) `-np 3` on one node: local ranks 0, 2, 1, not in rank order.
OMPI5_LOCAL = [0, 2, 1]
OMPI5_ONE_NODE = [(r, 3, OMPI5_LOCAL[r], 3, 0, 1) for r in range(3)]
# A heterogeneous job whose component 0 (1 task) has the later host name, component 1 3 tasks.
ONE_PLUS_THREE = [(0, 4, 0, 1, 0, 2), (1, 4, 0, 3, 1, 2), (2, 4, 1, 3, 1, 2), (3, 4, 2, 3, 1, 2)]

# (captured run, launcher auto chooses, per-rank layouts, master address)
CASES = [
    ("SRUN_1N_4T", slurm.SRUN_1N_4T, "slurm", ONE_NODE, "vm"),
    ("SRUN_2N_4T", slurm.SRUN_2N_4T, "slurm", TWO_BY_TWO, "n1"),
    ("SRUN_4N_4T", slurm.SRUN_4N_4T, "slurm", FOUR_NODES, "n1"),
    ("SRUN_SUBSET_R2", slurm.SRUN_SUBSET_R2, "slurm", TWO_BY_TWO, "n3"),
    ("SRUN_GPUS_PER_TASK", slurm.SRUN_GPUS_PER_TASK, "slurm", ONE_NODE, "vm"),
    ("SRUN_GPUS_PER_NODE", slurm.SRUN_GPUS_PER_NODE, "slurm", ONE_NODE, "vm"),
    ("SRUN_2N_GPUS_PER_TASK", slurm.SRUN_2N_GPUS_PER_TASK, "slurm", TWO_BY_TWO, "n1"),
    ("SRUN_PMI2_4", slurm.SRUN_PMI2_4, "slurm", ONE_NODE, "vm"),
    ("SRUN_PMIX_4", slurm.SRUN_PMIX_4, "slurm", ONE_NODE, "vm"),
    ("OMPI_4", mpi.OMPI_4, "mpi", ONE_NODE, None),
    ("HYDRA_4", mpi.HYDRA_4, "mpi", ONE_NODE, None),
    ("SRUN_HET_2N_4T", slurm.SRUN_HET_2N_4T, "slurm", TWO_BY_TWO, "n1"),
    ("SRUN_HET_REVERSED", slurm.SRUN_HET_REVERSED, "slurm", ONE_PLUS_THREE, "n2"),
    ("SRUN_HET_DIRECT", slurm.SRUN_HET_DIRECT, "slurm", TWO_BY_TWO, "n2"),
    (
        "SRUN_HET_GROUP1",
        slurm.SRUN_HET_GROUP1,
        "slurm",
        [(r, 2, r, 2, 0, 1) for r in range(2)],
        "n2",
    ),
    ("OMPI_IN_SALLOC_2N", mpi.OMPI_IN_SALLOC_2N, "mpi", THREE_PLUS_ONE, "n1"),
    ("HYDRA_IN_SALLOC_2N", mpi.HYDRA_IN_SALLOC_2N, "mpi", THREE_PLUS_ONE, "n1"),
    ("OMPI_IN_SBATCH", mpi.OMPI_IN_SBATCH, "mpi", TWO_BY_TWO_BY_ROLL_CALL, "n1"),
    ("HYDRA_IN_SBATCH", mpi.HYDRA_IN_SBATCH, "mpi", TWO_BY_TWO, "n1"),
    ("OMPI5_3", mpi.OMPI5_3, "mpi", OMPI5_ONE_NODE, None),
    ("OMPI5_IN_SALLOC_2N", mpi.OMPI5_IN_SALLOC_2N, "mpi", TWO_BY_TWO, "n1"),
    ("OMPI5_IN_SBATCH", mpi.OMPI5_IN_SBATCH, "mpi", TWO_BY_TWO_BY_ROLL_CALL, "n1"),
    ("MPICH5_4", mpi.MPICH5_4, "mpi", ONE_NODE, None),
    ("MPICH5_IN_SALLOC_2N", mpi.MPICH5_IN_SALLOC_2N, "mpi", TWO_BY_TWO, "n1"),
    ("MPICH5_IN_SBATCH", mpi.MPICH5_IN_SBATCH, "mpi", TWO_BY_TWO, "n1"),
    ("TORCHRUN_4", torchrun.TORCHRUN_4, "pytorch", ONE_NODE, "localhost"),
    ("TORCHRUN_IN_SRUN_2N", torchrun.TORCHRUN_IN_SRUN_2N, "pytorch", TWO_BY_TWO, "n1"),
]


def _by_rank() -> list[object]:
    return [
        pytest.param(env, chosen, expected[rank], addr, id=f"{name}-rank{rank}")
        for name, envs, chosen, expected, addr in CASES
        for rank, env in enumerate(envs)
    ]


@pytest.mark.parametrize(("env", "chosen", "expected", "addr"), _by_rank())
def test_auto_detects_every_captured_rank(
    env: Mapping[str, str], chosen: str, expected: Layout, addr: str | None
) -> None:
    """Auto picks the innermost launcher and reproduces the layout the real launcher made."""
    info = detect("auto", env)
    assert info.launcher == chosen
    assert layout(info) == expected
    assert info.master_addr == addr


@pytest.mark.parametrize(("env", "chosen", "expected", "addr"), _by_rank())
def test_explicit_name_of_innermost_launcher_agrees_with_auto(
    env: Mapping[str, str], chosen: str, expected: Layout, addr: str | None
) -> None:
    """Naming the launcher auto found gives the same answer (srun --mpi=* is also `mpi`)."""
    assert detect(chosen, env) == detect("auto", env)


@pytest.mark.parametrize(
    "envs", [slurm.SRUN_PMIX_4, slurm.SRUN_PMI2_4], ids=["srun-mpi-pmix", "srun-mpi-pmi2"]
)
def test_mpi_ranks_that_are_srun_tasks_may_be_named_mpi(envs: tuple[dict[str, str], ...]) -> None:
    """Under srun --mpi=pmix/pmi2, `--launcher mpi` answers with the step's layout, labelled mpi."""
    for rank, env in enumerate(envs):
        info = detect("mpi", env)
        assert info.launcher == "mpi"
        assert layout(info) == ONE_NODE[rank]
        assert info.master_addr == "vm"


def test_all_ranks_of_a_step_agree_on_master() -> None:
    """Every rank computes the same master address and port without talking to the others."""
    for _, envs, _, _, _ in CASES:
        masters = {(detect("auto", e).master_addr, detect("auto", e).master_port) for e in envs}
        assert len(masters) == 1, masters


def test_slurm_port_follows_the_published_formula() -> None:
    """The Slurm master port is PORT_LOW + (job * 9755 + step) % 22751, here job 18 step 0."""
    info = detect("auto", slurm.SRUN_2N_4T[0])
    assert info.job_id == slurm.SRUN_2N_4T[0]["SLURM_JOB_ID"]
    assert info.master_port == scheduler_port(info.job_id or "", "0")
    assert scheduler_port("18", "0") == 10000 + (18 * 9755) % 22751


def test_mpi_inside_an_allocation_uses_the_job_port_on_every_node() -> None:
    """mpirun's own node has no step id, the others do: the port depends on the job alone."""
    ports = {detect("auto", env).master_port for env in mpi.OMPI_IN_SBATCH}
    job = mpi.OMPI_IN_SBATCH[0]["SLURM_JOB_ID"]
    assert ports == {scheduler_port(job, "mpi")}


@pytest.mark.parametrize(
    "env",
    [
        pytest.param(slurm.SBATCH_BATCH_4T[0], id="sbatch-batch-4-tasks"),
        pytest.param(slurm.SALLOC_SHELL_4T[0], id="salloc-shell-4-tasks"),
        pytest.param(slurm.SBATCH_BATCH_GPUS[0], id="sbatch-batch-gpus"),
        pytest.param(slurm.SALLOC_SHELL_GPUS[0], id="salloc-shell-gpus"),
    ],
)
@pytest.mark.parametrize("launcher", ["auto", "slurm"])
def test_batch_script_of_multi_task_job_is_refused(env: dict[str, str], launcher: str) -> None:
    """The batch script of a 4-task job must not become 'rank 0 of 4' and wait forever."""
    with pytest.raises(NotLaunchedError) as caught:
        detect(launcher, env)
    assert caught.value.launcher == "slurm"
    assert caught.value.variable == "SLURM_NTASKS"
    assert caught.value.value == "4"
    assert "srun" in str(caught.value)
    assert "rank 0 of 4" in str(caught.value)


@pytest.mark.parametrize(
    "env",
    [
        pytest.param(slurm.SBATCH_BATCH_1T[0], id="sbatch-batch-1-task"),
        pytest.param(slurm.SALLOC_SHELL_1T[0], id="salloc-shell-1-task"),
    ],
)
def test_batch_script_of_one_task_job_is_rank_0_of_1(
    env: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """A one-task job's batch script runs as a single process, with a one-line notice."""
    info = detect("auto", env)
    assert (info.launcher, layout(info)) == ("slurm", (0, 1, 0, 1, 0, 1))
    assert info.master_addr == "127.0.0.1"
    assert info.job_id == env["SLURM_JOB_ID"]
    assert "rank 0 of 1" in caplog.text


@pytest.mark.parametrize(
    ("env", "named", "inner"),
    [
        pytest.param(mpi.OMPI_IN_SALLOC_2N[1], "slurm", "mpi", id="slurm-under-mpirun"),
        pytest.param(mpi.HYDRA_IN_SALLOC_2N[3], "slurm", "mpi", id="slurm-under-hydra"),
        pytest.param(mpi.OMPI_IN_SBATCH[2], "slurm", "mpi", id="slurm-under-mpirun-in-sbatch"),
        pytest.param(
            torchrun.TORCHRUN_IN_SRUN_2N[1], "slurm", "pytorch", id="slurm-under-torchrun"
        ),
    ],
)
def test_explicit_outer_layer_is_refused_naming_both(
    env: dict[str, str], named: str, inner: str
) -> None:
    """`--launcher slurm` under mpirun/torchrun inside an allocation names both layers."""
    with pytest.raises(LauncherMismatchError) as caught:
        detect(named, env)
    message = str(caught.value)
    assert message.startswith(f"{named}: ")
    assert f"started by {inner}" in message
    assert f"--launcher {inner}" in message
    assert "SLURM_JOB_ID" in message


@pytest.mark.parametrize(
    ("env", "named", "found"),
    [
        pytest.param(torchrun.TORCHRUN_4[0], "slurm", "pytorch", id="slurm-under-plain-torchrun"),
        pytest.param(slurm.SRUN_1N_4T[0], "mpi", "slurm", id="mpi-under-plain-srun"),
        pytest.param(mpi.OMPI_4[0], "torchrun", "mpi", id="torchrun-under-mpirun"),
        pytest.param({}, "lsf", "none", id="lsf-on-a-laptop"),
    ],
)
def test_explicit_name_without_its_variables_says_what_was_detected(
    env: dict[str, str], named: str, found: str
) -> None:
    """An explicit launcher whose variables are absent raises and names what auto finds."""
    with pytest.raises(LauncherNotFoundError) as caught:
        detect(named, env)
    assert f"auto-detection finds {found!r}" in str(caught.value)


def test_every_recorded_environment_detects_without_unexpected_errors() -> None:
    """No recorded environment of any launcher raises anything but a DistEnvError; of the real
    captures (the modules make_fixtures.py writes), only batch scripts and salloc shells do."""
    for where, env in recorded().items():
        module, name = where.split(".", 1)
        try:
            detect("auto", env)
        except DistEnvError:
            if module in make_fixtures.MODULES:
                assert name.startswith(("SBATCH_BATCH", "SALLOC_SHELL")), where


# ---- What the pages state as measured, read from the captures --------------------------------


def test_measured_srun_pmi_layers() -> None:
    """docs/start/slurm.md: pmix sets PMIX_RANK without a size; pmi2 PMI_RANK and PMI_SIZE only."""
    for rank, env in enumerate(slurm.SRUN_PMIX_4):
        assert env["PMIX_RANK"] == str(rank)
        assert "PMIX_SIZE" not in env
        assert env["SLURM_STEP_ID"] == "0"
    for rank, env in enumerate(slurm.SRUN_PMI2_4):
        # Its PMI server's socket (PMI_FD) beside them, but no local rank.
        assert sorted(k for k in env if k.startswith("PMI_")) == ["PMI_FD", "PMI_RANK", "PMI_SIZE"]
        assert (env["PMI_RANK"], env["PMI_SIZE"]) == (str(rank), "4")
        assert env["SLURM_STEP_ID"] == "0"


def test_measured_step_subset_nodelists() -> None:
    """docs/start/slurm.md: in srun_subset_r2 the job's nodelist is n[1-4], the step's n[3-4]."""
    for env in slurm.SRUN_SUBSET_R2:
        assert (env["SLURM_NODELIST"], env["SLURM_STEP_NODELIST"]) == ("n[1-4]", "n[3-4]")


def test_measured_torchrun_master() -> None:
    """docs/start/torchrun.md: torchrun's MASTER_PORT is not 29500, its MASTER_ADDR localhost."""
    for env in torchrun.TORCHRUN_4:
        assert env["MASTER_ADDR"] == "localhost"
        assert env["MASTER_PORT"] != "29500"


def test_measured_mpi_in_allocation_slurm_vars() -> None:
    """docs/start/mpi.md's table: inside an allocation the ranks' SLURM_* describe the daemons."""
    nodeids = {
        name: [env.get("SLURM_NODEID") for env in envs]
        for name, envs in [
            ("ompi_in_salloc_2n", mpi.OMPI_IN_SALLOC_2N),
            ("hydra_in_salloc_2n", mpi.HYDRA_IN_SALLOC_2N),
            ("hydra_in_sbatch", mpi.HYDRA_IN_SBATCH),
        ]
    }
    assert nodeids == {
        "ompi_in_salloc_2n": ["0", "0", "0", "1"],
        "hydra_in_salloc_2n": ["0", "0", "0", "1"],
        "hydra_in_sbatch": ["0", "0", "1", "1"],
    }
    # Open MPI in a batch script: the first node's ranks carry the batch step (no step id), the
    # second node's a daemon step of that node alone (step-relative node id 0).
    steps = [(env.get("SLURM_STEP_ID"), env.get("SLURM_NODEID")) for env in mpi.OMPI_IN_SBATCH]
    assert steps == [(None, "0"), (None, "0"), ("0", "0"), ("0", "0")]
    for envs in (
        mpi.OMPI_IN_SALLOC_2N,
        mpi.HYDRA_IN_SALLOC_2N,
        mpi.OMPI_IN_SBATCH,
        mpi.HYDRA_IN_SBATCH,
    ):
        assert {env["SLURM_PROCID"] for env in envs} <= {"0", "1"}  # daemons, not the 4 ranks


@pytest.mark.parametrize(
    ("named", "start"),
    [
        pytest.param("slurm", "submit it: `sbatch job.sbatch` whose script runs `srun", id="slurm"),
        pytest.param("mpi", "start it with `mpirun -np 4 python train.py ...`", id="mpi"),
        pytest.param("lsf", "submit it: `bsub job.bsub` whose script runs `jsrun", id="lsf"),
        pytest.param("torchrun", "start it with `torchrun --nproc-per-node", id="torchrun"),
    ],
)
def test_explicit_launcher_on_a_login_node_says_how_to_start_the_job(
    named: str, start: str
) -> None:
    """`--launcher NAME` where nothing is detected (a login node): the hint starts the job first.

    Running as a single process is offered after it, not instead of it.
    """
    with pytest.raises(LauncherNotFoundError) as caught:
        detect(named, {})
    hint = caught.value.hint or ""
    assert hint.startswith(start), hint
    assert hint.endswith("; or use --launcher none (or auto) to run here as a single process")


def test_explicit_launcher_beside_another_one_names_both_fixes() -> None:
    """`--launcher lsf` under srun: use the launcher detected, or start the job with LSF's."""
    with pytest.raises(LauncherNotFoundError) as caught:
        detect("lsf", slurm.SRUN_1N_4T[0])
    assert caught.value.hint == (
        "use --launcher slurm (or auto), or submit it: `bsub job.bsub` whose script runs "
        "`jsrun ... python train.py ...` (`distenv template lsf/jsrun.bsub` prints one)"
    )


# Captured runs whose launcher names no node layout, and the layout the real launcher made.
BY_ROLL_CALL = [
    ("ompi_4", mpi.OMPI_4, ONE_NODE),
    ("hydra_4", mpi.HYDRA_4, ONE_NODE),
    ("ompi_in_sbatch", mpi.OMPI_IN_SBATCH, TWO_BY_TWO),
    ("ompi5_3", mpi.OMPI5_3, OMPI5_ONE_NODE),
    ("ompi5_in_sbatch", mpi.OMPI5_IN_SBATCH, TWO_BY_TWO),
    ("mpich5_4", mpi.MPICH5_4, ONE_NODE),
]


@pytest.mark.parametrize(
    ("capture", "envs", "expected"), BY_ROLL_CALL, ids=[c for c, _, _ in BY_ROLL_CALL]
)
def test_roll_call_numbers_the_nodes_of_every_captured_run(
    capture: str, envs: tuple[dict[str, str], ...], expected: list[Layout]
) -> None:
    """Each rank's check-in, with the host it really ran on, gives the real layout back.

    Rank 0 validates the check-ins and numbers the hosts in order of their lowest rank; every
    rank reads the published verdict and takes its host's place.
    """
    hosts = [
        json.loads(line)["hostname"]
        for line in (CAPTURES / f"{capture}.jsonl").read_text().splitlines()
    ]
    infos = [detect("auto", env).replace(master_addr="h", master_port=1) for env in envs]
    checkins = [
        CheckIn(
            rank=i.rank,
            world_size=i.world_size,
            local_rank=i.local_rank,
            local_world_size=i.local_world_size,
            node_rank=i.node_rank,
            hostname=host,
            pid=100 + i.rank,
            launcher=i.launcher,
            master="h:1",
            backend="gloo",
            torch_version="2.13.0",
            scope="mpi/-/4/n4",
        )
        for i, host in zip(infos, hosts, strict=True)
    ]
    assert validate(checkins, len(checkins)) == []
    verdict = Verdict(True, (), tuple(checkins), "mpi/-/4/n4", node_hosts(checkins))
    filled = [fill_layout(i, as_read(verdict, c), c) for i, c in zip(infos, checkins, strict=True)]
    assert [layout(i) for i in filled] == expected
