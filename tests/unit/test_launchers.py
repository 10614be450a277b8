"""Launcher backends, case by case: public bug-report cases, LSF from its docs, and every
required variable missing in turn."""

from __future__ import annotations

from pathlib import Path

import pytest

from distenv import RankInfo, detect, explain
from distenv.errors import (
    ConfigurationError,
    InconsistentEnvironmentError,
    InvalidVariableError,
    MissingVariableError,
    NotLaunchedError,
)
from distenv.launchers.registry import get_launcher
from distenv.master import SCOPE_VAR, scheduler_port
from tests.support.envs import lsf, mpi, pbs, slurm, torchrun

SRUN_STEP = {
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "6",
    "SLURM_STEP_NUM_TASKS": "7",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "3",
    "SLURM_STEP_NUM_NODES": "4",
    "SLURM_STEP_TASKS_PER_NODE": "2(x3),1",
    "SLURM_STEP_NODELIST": "node[001-003,005]",
}


def test_slurm_uneven_tasks_per_node() -> None:
    """`2(x3),1`: the last node holds one task; master is the step's first host, zero-padded."""
    info = detect("slurm", SRUN_STEP)
    assert (info.rank, info.world_size, info.local_world_size) == (6, 7, 1)
    assert (info.node_rank, info.num_nodes) == (3, 4)
    assert info.master_addr == "node001"
    assert info.master_port == scheduler_port("4242", "0")


def test_slurm_job_level_twins_are_a_fallback() -> None:
    """Old Slurm without step-level variables: SLURM_NTASKS/SLURM_TASKS_PER_NODE/... are used."""
    env = {
        "SLURM_JOB_ID": "1",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "1",
        "SLURM_NTASKS": "2",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "0",
        "SLURM_NNODES": "1",
        "SLURM_TASKS_PER_NODE": "2",
        "SLURM_NODELIST": "linux[1,2]",
    }
    with pytest.raises(InconsistentEnvironmentError, match="names 2 hosts"):
        detect("slurm", env)
    info = detect("slurm", {**env, "SLURM_NODELIST": "linux1"})
    assert (info.rank, info.world_size, info.master_addr) == (1, 2, "linux1")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"SLURM_STEP_NUM_TASKS": "8"}, "lists 7 tasks on 4 nodes"),
        ({"SLURM_STEP_TASKS_PER_NODE": "2(x4)"}, "lists 8 tasks on 4 nodes"),
        ({"SLURM_STEP_NUM_NODES": "5", "SLURM_STEP_TASKS_PER_NODE": "2(x3),1"}, "on 4 nodes"),
        ({"SLURM_STEP_NODELIST": "node[1-3]"}, "names 3 hosts"),
        ({"SLURM_PROCID": "7"}, r"rank=7 \(\$SLURM_PROCID\) is outside"),
        ({"SLURM_NODEID": "4"}, r"node_rank=4 \(\$SLURM_NODEID\) is outside"),
        ({"SLURM_LOCALID": "1"}, r"local_rank=1 \(\$SLURM_LOCALID\) is outside"),
    ],
)
def test_slurm_contradictions_are_named(change: dict[str, str], match: str) -> None:
    """ntasks vs tasks-per-node vs nodelist mismatches raise, naming the variables."""
    with pytest.raises(InconsistentEnvironmentError, match=match):
        detect("slurm", {**SRUN_STEP, **change})


@pytest.mark.parametrize("distribution", ["arbitrary", "plane=4", "plane,Pack"])
def test_slurm_arbitrary_distribution_needs_master_addr(distribution: str) -> None:
    """With arbitrary/plane distributions rank 0's host is unknown: MASTER_ADDR is required."""
    env = {**SRUN_STEP, "SLURM_DISTRIBUTION": distribution}
    with pytest.raises(MissingVariableError) as caught:
        detect("slurm", env)
    assert caught.value.variable == "MASTER_ADDR"
    assert "export MASTER_ADDR" in str(caught.value)
    assert detect("slurm", {**env, "MASTER_ADDR": "node003"}).master_addr == "node003"


def test_slurm_interactive_step_is_a_one_task_step() -> None:
    """salloc's interactive step (id 0xfffffffa, use_interactive_step) is rank 0 of 1."""
    env = {
        "SLURM_JOB_ID": "9",
        "SLURM_JOB_NAME": "interactive",
        "SLURM_STEP_ID": "4294967290",
        "SLURM_PROCID": "0",
        "SLURM_STEP_NUM_TASKS": "1",
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_STEP_NUM_NODES": "1",
        "SLURM_STEP_TASKS_PER_NODE": "1",
        "SLURM_STEP_NODELIST": "gpu01",
    }
    info = detect("auto", env)
    assert (info.launcher, info.rank, info.world_size, info.master_addr) == ("slurm", 0, 1, "gpu01")


def test_slurm_batch_step_id_is_not_an_srun_step() -> None:
    """SLURM_STEP_ID=batch (0xfffffffb) in a 4-task job is the batch script: refused."""
    env = {"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "4294967291", "SLURM_NTASKS": "4"}
    with pytest.raises(NotLaunchedError):
        detect("auto", env)


def test_explicit_master_wins_and_stale_distenv_export_is_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """User MASTER_* win; MASTER_* that distenv exported for another job/step are ignored."""
    user = detect("slurm", {**SRUN_STEP, "MASTER_ADDR": "login7", "MASTER_PORT": "29500"})
    assert (user.master_addr, user.master_port) == ("login7", 29500)
    stale = {**SRUN_STEP, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "4000"}
    stale[SCOPE_VAR] = "none/-/-"
    info = detect("slurm", stale)
    assert (info.master_addr, info.master_port) == ("node001", scheduler_port("4242", "0"))
    assert "ignoring MASTER_ADDR=127.0.0.1" in caplog.text
    own = {**stale, SCOPE_VAR: "slurm/4242/0"}
    assert detect("slurm", own).master_port == 4000


def test_stale_rank_exports_do_not_hijack_an_srun_step() -> None:
    """`eval "$(distenv export)"` on a login node, then srun: the step's variables win."""
    env = {
        **SRUN_STEP,
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "4000",
        SCOPE_VAR: "none/-/-",
    }
    info = detect("auto", env)
    assert (info.launcher, info.rank, info.world_size) == ("slurm", 6, 7)


def test_master_addr_format_maps_the_default_host() -> None:
    """DISTENV_MASTER_ADDR_FORMAT maps the first host to the fast network's name."""
    info = detect("slurm", {**SRUN_STEP, "DISTENV_MASTER_ADDR_FORMAT": "{host}-ib"})
    assert info.master_addr == "node001-ib"
    with pytest.raises(ConfigurationError, match=r"containing '\{host\}'"):
        detect("slurm", {**SRUN_STEP, "DISTENV_MASTER_ADDR_FORMAT": "ib0"})
    with pytest.raises(InvalidVariableError):
        detect("slurm", {**SRUN_STEP, "DISTENV_MASTER_ADDR_FORMAT": "{host};reboot"})


def test_torchrun_capture_keeps_its_master_and_run_id() -> None:
    """torchrun's own MASTER_* and run id come through verbatim (never DNS-resolved)."""
    env = torchrun.TORCHRUN_4[2]
    info = detect("torchrun", env)
    assert info.launcher == "pytorch"
    assert (info.master_addr, info.master_port) == ("localhost", int(env["MASTER_PORT"]))
    assert info.job_id == torchrun.TORCHRUN_4[2]["TORCHELASTIC_RUN_ID"]


def test_kubeflow_style_is_one_process_per_node() -> None:
    """RANK/WORLD_SIZE/MASTER_* without LOCAL_RANK: one process per pod (Kubeflow)."""
    env = {"RANK": "2", "WORLD_SIZE": "4", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456"}
    info = detect("auto", env)
    assert info == RankInfo(
        launcher="pytorch",
        rank=2,
        world_size=4,
        local_rank=0,
        local_world_size=1,
        node_rank=2,
        num_nodes=4,
        master_addr="job-master-0",
        master_port=23456,
    )


def test_kubeflow_style_is_not_detected_inside_a_scheduler_step() -> None:
    """Kubeflow's set inside an srun step never wins over the step: refused where it contradicts
    the step (a leftover `export RANK=0 WORLD_SIZE=1`), and where it matches it (issue #25)."""
    env = {**SRUN_STEP, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    with pytest.raises(InconsistentEnvironmentError, match="RANK=0 WORLD_SIZE=1 contradict slurm"):
        detect("auto", env)
    with pytest.raises(InconsistentEnvironmentError, match="RANK=6 WORLD_SIZE=7 match slurm"):
        detect("auto", {**env, "RANK": "6", "WORLD_SIZE": "7"})


def test_torchrun_ipv6_master() -> None:
    """IPv6 MASTER_ADDR is accepted, brackets stripped (torch builds the URL)."""
    env = {**torchrun.TORCHRUN_4[0], "MASTER_ADDR": "[fe80::1]"}
    assert detect("pytorch", env).master_addr == "fe80::1"


def test_lsf_coral_drops_the_launch_node() -> None:
    """Under jsrun, `batch2 1 h22n07 42 ...`: the one-slot launch node owns no rank."""
    info = detect("auto", lsf.JSRUN_CORAL_RANK7)
    assert info.launcher == "lsf"
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (7, 12, 1, 6)
    assert (info.node_rank, info.num_nodes) == (1, 2)
    assert info.master_addr == "h22n07"
    assert info.job_id == "1032931"


def test_lsf_plain_first_host_runs_ranks() -> None:
    """On ordinary LSF the first host of LSB_MCPU_HOSTS holds rank 0."""
    info = detect("lsf", lsf.JSRUN_PLAIN_RANK5)
    assert (info.node_rank, info.num_nodes, info.master_addr) == (1, 2, "hostA")


def test_lsf_batch_script_is_refused_and_one_slot_runs() -> None:
    """A multi-slot job's batch script is refused with the jsrun hint; a one-slot job runs."""
    with pytest.raises(NotLaunchedError, match="jsrun"):
        detect("auto", lsf.BSUB_BATCH_CORAL)
    info = detect("auto", lsf.BSUB_ONE_SLOT)
    assert (info.launcher, info.world_size, info.master_addr) == ("lsf", 1, "127.0.0.1")


def test_lsf_array_elements_get_distinct_ports() -> None:
    """Elements of a job array share LSB_JOBID; LSB_JOBINDEX keeps their ports apart."""
    info = detect("lsf", lsf.JSRUN_ARRAY_ELEMENT3)
    assert info.master_port == scheduler_port("5150", "3")
    assert info.master_port != scheduler_port("5150", "0")
    assert info.master_addr == "hostA"


def test_lsf_rank_file(tmp_path: Path) -> None:
    """LSB_DJOB_RANKFILE (one host per slot) is preferred over LSB_MCPU_HOSTS."""
    rankfile = tmp_path / "rankfile"
    rankfile.write_text("launch1\nc01\nc01\nc02\nc02\n")
    env = {**lsf.JSRUN_PLAIN_RANK5, "LSB_DJOB_RANKFILE": str(rankfile)}
    env.update(JSM_NAMESPACE_SIZE="4", JSM_NAMESPACE_RANK="3", JSM_NAMESPACE_LOCAL_SIZE="2")
    info = detect("lsf", env)
    assert (info.master_addr, info.node_rank) == ("c01", 1)
    with pytest.raises(InvalidVariableError, match="readable rank file"):
        detect("lsf", {**env, "LSB_DJOB_RANKFILE": str(tmp_path / "missing")})


def test_mpi_without_a_step_leaves_the_node_layout_to_the_roll_call() -> None:
    """No daemon step: no MPI variable names the node, so it is unknown, never guessed.

    Uneven nodes (5 ranks, 2 here) are fine: the roll call counts the hosts. Open MPI's
    OMPI_COMM_WORLD_NODE_RANK is a local rank, not a node index: it changes nothing.
    """
    env = {
        "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_SIZE": "5",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "OMPI_COMM_WORLD_NODE_RANK": "1",
    }
    info = detect("mpi", env)
    assert (info.node_rank, info.num_nodes, info.layout_known) == (None, None, False)
    assert (info.rank, info.world_size, info.local_world_size) == (3, 5, 2)
    assert "GROUP_RANK" not in info.replace(master_addr="h", master_port=1).to_env()


@pytest.mark.parametrize(
    ("env", "node"),
    [
        pytest.param(
            {
                "MV2_COMM_WORLD_RANK": "5",
                "MV2_COMM_WORLD_SIZE": "8",
                "MV2_COMM_WORLD_LOCAL_RANK": "1",
                "MV2_COMM_WORLD_LOCAL_SIZE": "4",
            },
            None,
            id="mvapich2",
        ),
        pytest.param(
            {
                "PALS_RANKID": "5",
                "PMI_RANK": "5",
                "PMI_SIZE": "8",
                "PALS_LOCAL_RANKID": "1",
                "PALS_LOCAL_SIZE": "4",
                "PALS_NODEID": "1",
            },
            1,
            id="cray-pals",
        ),
        pytest.param(
            {"PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4"},
            None,
            id="intel-mpi-hydra",
        ),
    ],
)
def test_other_mpi_libraries(env: dict[str, str], node: int | None) -> None:
    """MVAPICH2, Cray PALS and Intel MPI's Hydra describe rank 5 of 8; PALS names node 1.

    The others name no node: the roll call numbers the hosts (None until then).
    """
    info = detect("auto", env)
    assert (info.launcher, info.rank, info.world_size, info.local_rank) == ("mpi", 5, 8, 1)
    assert info.node_rank == node
    assert info.master_addr is None


def test_bare_pmix_rank_is_not_enough() -> None:
    """PMIX_RANK alone (no srun step around it) carries no world size: a clear error."""
    with pytest.raises(MissingVariableError, match="carries no world size"):
        detect("auto", {"PMIX_RANK": "0"})


# One "missing variable" case per required variable of each backend.
REQUIRED = (
    [
        ("slurm", slurm.SRUN_2N_4T[3], name)
        for name in (
            "SLURM_PROCID",
            "SLURM_LOCALID",
            "SLURM_NODEID",
        )
    ]
    + [
        ("pytorch", torchrun.TORCHRUN_IN_SRUN_2N[3], name)
        for name in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
        )
    ]
    + [
        (
            "mpi",
            {
                "OMPI_COMM_WORLD_RANK": "1",
                "OMPI_COMM_WORLD_SIZE": "4",
                "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
            },
            name,
        )
        for name in (
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        )
    ]
    + [
        ("lsf", lsf.JSRUN_PLAIN_RANK5, name)
        for name in ("JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_LOCAL_SIZE")
    ]
)


@pytest.mark.parametrize(("launcher", "env", "missing"), REQUIRED, ids=[r[2] for r in REQUIRED])
@pytest.mark.parametrize("how", ["unset", "empty"])
def test_missing_required_variable(
    launcher: str, env: dict[str, str], missing: str, how: str
) -> None:
    """Each required variable, unset or empty, raises MissingVariableError naming it."""
    broken = {k: v for k, v in env.items() if k != missing}
    if how == "empty":
        broken[missing] = ""
    with pytest.raises(MissingVariableError) as caught:
        detect(launcher, broken)
    assert caught.value.launcher == launcher
    assert caught.value.variable == missing
    assert str(caught.value).startswith(f"{launcher}: ${missing} is not set. Hint: ")


@pytest.mark.parametrize("step_var", ["SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST"])
def test_slurm_step_variable_missing_with_no_twin(step_var: str) -> None:
    """A step-level variable and all its job-level twins missing names the step-level one."""
    twins = {
        "SLURM_STEP_NUM_TASKS": ("SLURM_NTASKS", "SLURM_NPROCS"),
        "SLURM_STEP_NODELIST": ("SLURM_NODELIST", "SLURM_JOB_NODELIST"),
    }[step_var]
    env = {k: v for k, v in slurm.SRUN_2N_4T[0].items() if k not in (step_var, *twins)}
    with pytest.raises(MissingVariableError) as caught:
        detect("slurm", env)
    assert caught.value.variable == step_var


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SLURM_PROCID", "x"),
        ("SLURM_PROCID", "-1"),
        ("SLURM_PROCID", "1.5"),
        ("SLURM_PROCID", "+1"),
        ("SLURM_PROCID", "1_0"),
        ("SLURM_PROCID", "٣"),
        ("SLURM_STEP_NUM_TASKS", "0"),
        ("SLURM_STEP_NUM_TASKS", "99999999999999999999"),
        ("SLURM_NODEID", " "),
    ],
)
def test_slurm_non_integers_are_refused(variable: str, value: str) -> None:
    """Non-integers, negatives and absurd numbers raise InvalidVariableError with the value."""
    env = {**slurm.SRUN_2N_4T[0], variable: value}
    with pytest.raises(InvalidVariableError) as caught:
        detect("slurm", env)
    assert caught.value.variable == variable
    assert caught.value.value == value
    assert f"${variable} is {value!r}, expected" in str(caught.value)


def test_master_addr_format_argument_overrides_the_env_setting() -> None:
    """detect(master_addr_format=...) wins over $DISTENV_MASTER_ADDR_FORMAT; MASTER_ADDR over both."""
    env = {**SRUN_STEP, "DISTENV_MASTER_ADDR_FORMAT": "{host}-eth"}
    assert detect("slurm", env, master_addr_format="{host}i").master_addr == "node001i"
    env["MASTER_ADDR"] = "login1"
    assert detect("slurm", env, master_addr_format="{host}i").master_addr == "login1"


def test_every_launcher_names_its_launch_in_the_scope() -> None:
    """The scope (the job's identity in the rendezvous) from each launcher's own variables."""
    # Open MPI: PMIX_NAMESPACE, the same on every rank of one mpirun (the value of
    # tests/support/envs/captures/ompi_4.jsonl; the fixtures predate its declaration).
    ranks = [{**env, "PMIX_NAMESPACE": "1596325889"} for env in mpi.OMPI_4]
    assert {explain("mpi", env).scope for env in ranks} == {"mpi/1596325889/4"}
    # Hydra exports no identity: the world size only (its token comes from the MPI exchange).
    assert explain("mpi", mpi.HYDRA_4[0]).scope == "mpi/-/4"
    # LSF: the job, its array element, and jsrun's PMIx namespace where it sets one.
    assert explain("lsf", lsf.JSRUN_ARRAY_ELEMENT3).scope.startswith("lsf/")
    element = explain("lsf", lsf.JSRUN_ARRAY_ELEMENT3).scope
    plain = explain("lsf", {**lsf.JSRUN_ARRAY_ELEMENT3, "LSB_JOBINDEX": "4"}).scope
    assert element != plain
    step = explain("lsf", {**lsf.JSRUN_ARRAY_ELEMENT3, "PMIX_NAMESPACE": "jsm.1"}).scope
    assert step.endswith("/jsm.1")
    assert step != element
    # torchrun: run id and restart count; a restarted attempt is another scope.
    env = {"TORCHELASTIC_RUN_ID": "exp", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"}  # fmt: skip
    assert explain("pytorch", env).scope == "pytorch/exp/-"
    restarted = {**env, "TORCHELASTIC_RESTART_COUNT": "1"}
    assert explain("pytorch", restarted).scope == "pytorch/exp/1"


@pytest.mark.parametrize(
    ("launcher", "env", "match"),
    [
        pytest.param(
            "lsf",
            {**lsf.JSRUN_PLAIN_RANK5, "JSM_NAMESPACE_RANK": "4", "JSM_NAMESPACE_SIZE": "4"},
            r"rank=4 \(\$JSM_NAMESPACE_RANK\) is outside \[0, world_size=4 "
            r"\(\$JSM_NAMESPACE_SIZE\)\)",
            id="jsrun-rank-4-of-4",
        ),
        pytest.param(
            "lsf",
            {**lsf.JSRUN_PLAIN_RANK5, "JSM_NAMESPACE_RANK": "8"},
            r"rank=8 \(\$JSM_NAMESPACE_RANK\) is outside",
            id="jsrun-rank-8-of-8",
        ),
        pytest.param(
            "pytorch",
            {**torchrun.TORCHRUN_4[1], "RANK": "4"},
            r"rank=4 \(\$RANK\) is outside",
            id="torchrun-rank-4-of-4",
        ),
    ],
)
def test_a_rank_past_the_world_names_its_variable(
    launcher: str, env: dict[str, str], match: str
) -> None:
    """A rank past the world is reported as such, naming the variable, not as a derived node
    index out of range (issue #25: jsrun's 'rank 4 of 4' named no variable)."""
    with pytest.raises(InconsistentEnvironmentError, match=match):
        detect(launcher, env)


@pytest.mark.parametrize(
    ("launcher", "hook", "env", "variable"),
    [
        pytest.param(
            "slurm",
            "default_master",
            {**SRUN_STEP, "SLURM_DISTRIBUTION": "blocky"},
            "SLURM_DISTRIBUTION",
            id="slurm-distribution",
        ),
        pytest.param(
            "slurm",
            "requeue_command",
            {**SRUN_STEP, "SLURM_ARRAY_JOB_ID": "--all", "SLURM_ARRAY_TASK_ID": "1"},
            "SLURM_ARRAY_JOB_ID",
            id="slurm-array-id-option",
        ),
        pytest.param(
            "slurm",
            "requeue_command",
            {**SRUN_STEP, "SLURM_JOB_ID": "-h"},
            "SLURM_JOB_ID",
            id="slurm-job-id-option",
        ),
        pytest.param(
            "lsf",
            "restart_count",
            {**lsf.JSRUN_PLAIN_RANK5, "LSB_RESTART": "yes"},
            "LSB_RESTART",
            id="lsf-restart-flag",
        ),
        pytest.param(
            "lsf",
            "scope",
            {**lsf.JSRUN_PLAIN_RANK5, "LSB_JOBINDEX": "x"},
            "LSB_JOBINDEX",
            id="lsf-job-index",
        ),
        pytest.param(
            "lsf",
            "requeue_command",
            {**lsf.JSRUN_PLAIN_RANK5, "LSB_JOBID": "-h"},
            "LSB_JOBID",
            id="lsf-job-id-option",
        ),
        pytest.param(
            "lsf",
            "rank_info",
            {**lsf.BLAUNCH_2X2[0], "LSB_DJOB_HOSTFILE": "", "LSB_MCPU_HOSTS": "c01 9999999 c02 9"},
            "LSB_MCPU_HOSTS",
            id="lsf-slots-past-the-limit",
        ),
        pytest.param(
            "slurm",
            "rank_info",
            {**SRUN_STEP, "SLURM_JOB_ID": "4242\nx"},
            "SLURM_JOB_ID",
            id="slurm-job-id-newline",
        ),
        pytest.param(
            "lsf",
            "rank_info",
            {**lsf.JSRUN_PLAIN_RANK5, "LSB_JOBID": "4242 x"},
            "LSB_JOBID",
            id="lsf-job-id-space",
        ),
        pytest.param(
            "pbs",
            "scope",
            {**pbs.PBS_SCRIPT, "PBS_JOBID": "7.srv;id"},
            "PBS_JOBID",
            id="pbs-job-id",
        ),
        pytest.param(
            "pytorch",
            "scope",
            {**torchrun.TORCHRUN_4[1], "DISTENV_RUN_ID": "a run"},
            "DISTENV_RUN_ID",
            id="distenv-run-id",
        ),
    ],
)
def test_present_but_malformed_values_are_refused(
    launcher: str, hook: str, env: dict[str, str], variable: str
) -> None:
    """A value a launcher read and silently ignored (or passed on) is refused, naming it."""
    with pytest.raises(InvalidVariableError) as caught:
        getattr(get_launcher(launcher), hook)(env)
    assert (caught.value.source, caught.value.variable) == (launcher, variable)
    assert caught.value.value == env[variable]


@pytest.mark.parametrize(
    "distribution",
    ["block", "cyclic", "cyclic:block", "block:cyclic:fcyclic,Pack", "*:*", "plane=4"],
)
def test_slurm_distributions_srun_writes_are_accepted(distribution: str) -> None:
    """Every form of srun(1)'s --distribution is accepted; only arbitrary/plane need MASTER_ADDR."""
    env = {**SRUN_STEP, "SLURM_DISTRIBUTION": distribution, "MASTER_ADDR": "node001"}
    assert detect("slurm", env).rank == 6
