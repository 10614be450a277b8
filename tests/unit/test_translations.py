"""torchrun's variables that translate a step's numbering (a wrapper script, enroot's PyTorch hook):
accepted with the step's layout and the user's master; a value that disagrees is refused.

The environments are tests/support/envs/wrappers.py: captured srun and mpirun launches with the
variables each documented formula derives, task by task.
"""

from __future__ import annotations

import pytest

from distenv import detect, explain
from distenv.errors import InconsistentEnvironmentError
from tests.support.envs import Layout, azureml, layout, mpi, slurm, wrappers

# (translated environments, the captured launch they were built on, the launcher that answers)
TRANSLATIONS = [
    pytest.param(wrappers.ENROOT_HOOK_2N_4T, slurm.SRUN_2N_4T, "slurm", id="hook-2n-4t"),
    pytest.param(wrappers.ENROOT_HOOK_SUBSET_R2, slurm.SRUN_SUBSET_R2, "slurm", id="hook-subset"),
    pytest.param(wrappers.ENROOT_HOOK_PMIX_4, slurm.SRUN_PMIX_4, "slurm", id="hook-pmix"),
    pytest.param(wrappers.SRUN_WRAPPER_2N_4T, slurm.SRUN_2N_4T, "slurm", id="wrapper-2n-4t"),
    pytest.param(wrappers.SRUN_WRAPPER_1N_4T, slurm.SRUN_1N_4T, "slurm", id="wrapper-1n-4t"),
    pytest.param(wrappers.MPIRUN_WRAPPER_4, mpi.OMPI_4, "mpi", id="mpirun-wrapper"),
]


def _layouts(envs: tuple[dict[str, str], ...], launcher: str = "auto") -> list[Layout]:
    return [layout(detect(launcher, env)) for env in envs]


@pytest.mark.parametrize(("envs", "captured", "answers"), TRANSLATIONS)
@pytest.mark.parametrize("launcher", ["auto", "named"])
def test_a_translation_is_the_steps_layout_with_the_users_master(
    envs: tuple[dict[str, str], ...],
    captured: tuple[dict[str, str], ...],
    answers: str,
    launcher: str,
) -> None:
    """Every task: the step's own layout (as without the wrapper), MASTER_ADDR/MASTER_PORT as set,
    and `distenv info`'s reasons say the translation was accepted."""
    name = answers if launcher == "named" else "auto"
    assert _layouts(envs, name) == _layouts(captured, name)
    for env in envs:
        detection = explain(name, env)
        assert detection.info.launcher == answers
        assert (detection.info.master_addr, detection.info.master_port) == (
            env["MASTER_ADDR"],
            int(env["MASTER_PORT"]),
        )
        assert detection.master_from == "MASTER_ADDR"
        reasons = [why for who, why in detection.considered if who == "pytorch"]
        assert reasons[-1].startswith(
            f"accepted: RANK={env['RANK']} WORLD_SIZE={env['WORLD_SIZE']} "
            f"LOCAL_RANK={env['LOCAL_RANK']} translate {answers}'s numbering of this task"
        ), detection.considered


@pytest.mark.parametrize(
    ("variable", "value", "step_var"),
    [
        ("RANK", "next", "SLURM_PROCID={rank}"),  # the next task's rank
        ("WORLD_SIZE", "8", "SLURM_STEP_NUM_TASKS=4"),
        ("LOCAL_RANK", "5", "SLURM_LOCALID={local}"),
        ("LOCAL_WORLD_SIZE", "4", "2 (SLURM_STEP_TASKS_PER_NODE=2(x2))"),
        ("GROUP_RANK", "3", "SLURM_NODEID={node}"),
        ("GROUP_WORLD_SIZE", "3", "SLURM_STEP_NUM_NODES=2"),
    ],
)
def test_a_value_that_disagrees_is_refused_on_every_task(
    variable: str, value: str, step_var: str
) -> None:
    """The hook's environment with one variable changed: every task refused, naming the variable,
    both values and where such exports come from."""
    for env in wrappers.ENROOT_HOOK_2N_4T:
        if variable == "RANK":
            value = str((int(env["SLURM_PROCID"]) + 1) % 4)
        with pytest.raises(InconsistentEnvironmentError) as caught:
            detect("auto", {**env, variable: value})
        error, message = caught.value, str(caught.value)
        expected = step_var.format(
            rank=env["SLURM_PROCID"], local=env["SLURM_LOCALID"], node=env["SLURM_NODEID"]
        )
        assert f"{variable}={value!r} where slurm has {expected}" in message, message
        assert (
            "exported by an earlier job or a shell profile, or set by a wrapper script or "
            in message
        )
        assert "container hook (enroot's 50-slurm-pytorch.sh)" in message
        assert (error.source, error.variable, error.value) == ("pytorch", variable, value)


def test_the_hooks_world_size_in_a_subset_step_is_the_steps() -> None:
    """`srun -n 2` in an allocation of 4: SLURM_NTASKS is the step's 2 (measured on Slurm 22.05,
    salloc and sbatch), so the hook is right; were it the allocation's 4, both numbers are named."""
    subset = {**slurm.SRUN_2N_4T[1], "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2"}
    subset.update(SLURM_NPROCS="2", SLURM_STEP_TASKS_PER_NODE="1(x2)", SLURM_PROCID="1")
    subset.update(SLURM_LOCALID="0", SLURM_NODEID="1", SLURM_TASKS_PER_NODE="1(x2)")
    info = detect("auto", wrappers.enroot_hook(subset))
    assert (info.launcher, info.rank, info.world_size) == ("slurm", 1, 2)
    with pytest.raises(InconsistentEnvironmentError) as caught:
        detect("auto", wrappers.enroot_hook({**subset, "SLURM_NTASKS": "4"}))
    assert "WORLD_SIZE='4' where slurm has SLURM_STEP_NUM_TASKS=2" in str(caught.value)


@pytest.mark.parametrize(
    ("addr", "accepted"),
    [
        ("n1", True),
        ("N1.cluster.example", True),  # the same host, fully qualified
        ("192.0.2.1", False),  # an address: no host of this job's list
        ("login7", False),
        ("127.0.0.1", False),  # loopback on two nodes: task 2 would dial itself
    ],
)
def test_master_addr_must_name_the_steps_or_jobs_first_host(addr: str, accepted: bool) -> None:
    """MASTER_ADDR is the user's, where it names a host rank 0 may be on; another is another
    job's, refused naming it and the host it should be."""
    for env in wrappers.SRUN_WRAPPER_2N_4T:
        changed = {**env, "MASTER_ADDR": addr}
        if accepted:
            assert detect("auto", changed).master_addr == addr
            continue
        with pytest.raises(InconsistentEnvironmentError) as caught:
            detect("auto", changed)
        message = str(caught.value)
        assert caught.value.variable == "MASTER_ADDR"
        if env["SLURM_PROCID"] in ("0", "1") or addr != "127.0.0.1":
            assert f"MASTER_ADDR={addr!r} names no host of this job" in message, message


def test_master_addr_may_be_the_first_host_mapped_by_the_format() -> None:
    """A wrapper that names rank 0's InfiniBand name (DISTENV_MASTER_ADDR_FORMAT='{host}-ib')."""
    env = {**wrappers.SRUN_WRAPPER_2N_4T[2], "MASTER_ADDR": "n1-ib"}
    with pytest.raises(InconsistentEnvironmentError):
        detect("auto", env)
    assert detect("auto", {**env, "DISTENV_MASTER_ADDR_FORMAT": "{host}-ib"}).master_addr == "n1-ib"


@pytest.mark.parametrize("addr", ["127.0.0.1", "localhost"])
def test_loopback_is_a_master_on_one_node(addr: str) -> None:
    """A one-node wrapper's MASTER_ADDR=127.0.0.1 (or localhost) is rank 0's host too."""
    for env in wrappers.SRUN_WRAPPER_1N_4T:
        assert detect("auto", {**env, "MASTER_ADDR": addr}).master_addr == addr


def test_the_hooks_variables_in_a_batch_script_are_refused() -> None:
    """The hook's variables in the batch script of a 4-task job (set with no step) are refused
    with the batch script's own fix, as before `--launcher pytorch` deferred LOCAL_WORLD_SIZE."""
    hook = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "vm"}
    env = {**slurm.SBATCH_BATCH_4T[0], **hook, "MASTER_PORT": "61234"}
    for launcher in ("auto", "slurm"):
        with pytest.raises(InconsistentEnvironmentError) as caught:
            detect(launcher, env)
        message = str(caught.value)
        assert message.startswith("pytorch: RANK=1 WORLD_SIZE=4 were set with no step"), message
        assert "Hint: start one task per GPU with `srun" in message


def test_launcher_pytorch_without_local_world_size_defers_the_local_layout() -> None:
    """`--launcher pytorch` under a wrapper (no LOCAL_WORLD_SIZE): the local size and the node
    numbering are left to init_dist's roll call, as for MPI, instead of refused."""
    for env in wrappers.SRUN_WRAPPER_2N_4T:
        info = detect("pytorch", env)
        assert info.launcher == "pytorch"
        assert (info.rank, info.world_size, info.local_rank) == (
            int(env["RANK"]),
            4,
            int(env["LOCAL_RANK"]),
        )
        assert (info.local_world_size, info.node_rank, info.num_nodes) == (None, None, None)
        assert not info.layout_known
    # GROUP_RANK/GROUP_WORLD_SIZE, where set, still number the node.
    env = {**wrappers.SRUN_WRAPPER_2N_4T[3], "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2"}
    assert layout(detect("pytorch", env)) == (3, 4, 1, None, 1, 2)


def test_launcher_pytorch_in_azure_mls_pytorch_distribution() -> None:
    """Azure ML's PyTorch distribution (no LOCAL_WORLD_SIZE, no AZUREML_NODE_COUNT): auto reads it
    as `azureml`; `--launcher pytorch` takes torchrun's names and leaves the local layout to the
    roll call, where it used to say that none of its variables were set."""
    env = azureml.AML_PYTORCH_2X2_RANK3
    assert detect("auto", env).launcher == "azureml"
    info = detect("pytorch", env)
    assert (info.launcher, info.master_addr, info.master_port) == ("pytorch", "10.0.0.4", 6105)
    assert layout(info) == (3, 4, 1, None, None, None)


def test_a_torch_distributed_launch_rank_defers_the_local_layout() -> None:
    """What `python -m torch.distributed.launch --use_env --nproc_per_node 2` (torch < 1.9) set:
    no LOCAL_WORLD_SIZE, no TORCHELASTIC_RUN_ID; auto and --launcher pytorch detect it."""
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29500", "OMP_NUM_THREADS": "1"}  # fmt: skip
    for launcher in ("auto", "pytorch"):
        assert layout(detect(launcher, env)) == (1, 2, 1, None, None, None)
