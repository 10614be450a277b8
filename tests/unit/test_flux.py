"""Flux (recorded environments: tests/support/envs/flux.py)."""

from __future__ import annotations

import pytest

from distenv import detect, explain, resolve
from distenv.cli import build_parser
from distenv.errors import (
    DistEnvError,
    InconsistentEnvironmentError,
    InvalidVariableError,
    MissingVariableError,
)
from distenv.launchers.flux import job_number
from distenv.launchers.registry import FLUX
from distenv.local.run import build_children
from distenv.master import scheduler_port
from tests.support.envs import flux, layout


@pytest.mark.parametrize(
    ("text", "number"),
    [
        # flux-core src/common/libutil/test/fluid.c: the F58 test vectors, both prefixes.
        ("ƒ1", 0),
        ("f2", 1),
        ("ƒz", 57),
        ("ƒ211", 3364),
        ("fxyzzy", 633528662),
        ("ƒuZZybuNNy", 6731191091817518),
        ("ƒjpXCZedGfVQ", 2**64 - 1),
        ("1234", 1234),
    ],
)
def test_f58_job_ids_decode(text: str, number: int) -> None:
    assert job_number(text) == number


@pytest.mark.parametrize("text", ["ƒ", "ƒ0", "ƒl", "gxyzzy", "ƒjpXCZedGfVR", "ƒ" + "z" * 13, ""])
def test_malformed_job_ids_are_none(text: str) -> None:
    """No digit 0, O, I or l in base 58; nothing past 2**64 - 1; a prefix is required."""
    assert job_number(text) is None


@pytest.mark.parametrize("rank", range(2))
def test_one_task_per_node(rank: int) -> None:
    """`flux run -N2 --tasks-per-node=1`: node index = rank, local size 1, job id verbatim."""
    detection = explain("auto", flux.FLUX_2X1[rank])
    info = detection.info
    assert info.launcher == "flux"
    layout = (info.rank, info.world_size, info.local_rank, info.local_world_size)
    assert (*layout, info.node_rank, info.num_nodes) == flux.FLUX_2X1_ANSWERS[rank]
    assert info.job_id == "ƒuZZybuNNy"
    assert detection.scope == f"flux/{flux.JOB_NUMBER}/-"
    assert info.master_port == scheduler_port(str(flux.JOB_NUMBER), "0")
    assert info.master_addr is None  # no host in a task's environment: MPI exchanges it


@pytest.mark.parametrize("rank", range(4))
def test_one_node(rank: int) -> None:
    """`flux run -N1 -n4`: every task on this node."""
    info = detect("auto", flux.FLUX_1X4[rank])
    layout = (info.rank, info.world_size, info.local_rank, info.local_world_size)
    assert (*layout, info.node_rank, info.num_nodes) == flux.FLUX_1X4_ANSWERS[rank]


def test_ascii_prefix_gives_the_same_scope_and_port() -> None:
    """A node whose shell wrote "fuZZybuNNy" is in the same job as one that wrote "ƒuZZybuNNy"."""
    ascii_node = explain("auto", flux.FLUX_2X1_ASCII_NODE)
    utf8_node = explain("auto", flux.FLUX_2X1[0])
    assert ascii_node.scope == utf8_node.scope
    assert ascii_node.info.master_port == utf8_node.info.master_port


@pytest.mark.parametrize("rank", range(4))
def test_two_nodes_two_tasks_leave_the_node_layout_to_the_roll_call(rank: int) -> None:
    """2 nodes x 2 tasks: Flux names no node index or local size; left unknown, never guessed.

    The local rank is FLUX_TASK_LOCAL_ID; init_dist's roll call fills the rest (test_rollcall's
    Flux tests, and tests/integration/test_slurm.py's run of these variables on real hosts).
    """
    info = detect("auto", flux.FLUX_2X2[rank])
    assert layout(info) == flux.FLUX_2X2_DETECTED[rank]
    assert not info.layout_known
    exported = info.replace(master_addr="n1", master_port=29500).to_env()
    assert "LOCAL_WORLD_SIZE" not in exported
    assert "GROUP_RANK" not in exported
    assert exported["LOCAL_RANK"] == str(rank % 2)


def test_distenv_run_under_several_tasks_per_flux_node_is_refused_with_the_fix() -> None:
    """`distenv run` started as 2 tasks on each of 2 nodes: it needs one task per node."""
    args = build_parser().parse_args(["run", "-n", "2", "train.py"])
    with pytest.raises(DistEnvError, match="flux started 4 tasks on 2 nodes") as caught:
        build_children(args, flux.FLUX_2X2[0])
    assert "one task per node" in str(caught.value)


def test_initial_program_is_rank_0_of_1() -> None:
    """flux batch's script sees FLUX_URI only: no launch, rank 0 of 1 on 127.0.0.1."""
    info = detect("auto", flux.FLUX_BATCH_SCRIPT)
    assert (info.launcher, info.world_size, info.master_addr) == ("flux", 1, "127.0.0.1")
    assert info.job_id is None
    assert info.master_port is None  # no job id to derive one: a free port at init, like `none`
    assert resolve(info, env=flux.FLUX_BATCH_SCRIPT).master_port is not None


def test_pmi_without_local_rank_is_fluxs() -> None:
    """PMI_RANK/PMI_SIZE from Flux's pmi plug-in, no MPI_LOCALRANKID: no Hydra, Flux answers."""
    detection = explain("auto", flux.FLUX_2X1[1])
    assert detection.info.launcher == "flux"
    assert (
        "flux",
        "agrees with mpi (rank 1 of 2): its layout and hosts used",
    ) in detection.considered


@pytest.mark.parametrize("rank", range(2))
def test_cray_pals_under_flux_is_fluxs(rank: int) -> None:
    """-o pmi=cray-pals: PALS_RANKID agrees with FLUX_TASK_RANK, Flux's layout answers."""
    info = detect("auto", flux.FLUX_PALS_2X1[rank])
    assert (info.launcher, info.rank, info.node_rank, info.num_nodes) == ("flux", rank, rank, 2)
    named = detect("mpi", flux.FLUX_PALS_2X1[rank])  # the scheduler's layout, labelled as asked
    assert (named.launcher, named.node_rank) == ("mpi", rank)


def test_malformed_values_are_refused() -> None:
    """A bad job id, or more nodes than tasks, is refused naming the variable."""
    with pytest.raises(InvalidVariableError, match="FLUX_JOB_ID"):
        detect("auto", {**flux.FLUX_2X1[0], "FLUX_JOB_ID": "job-12"})
    with pytest.raises(InconsistentEnvironmentError, match="FLUX_JOB_NNODES=3"):
        detect("auto", {**flux.FLUX_2X1[0], "FLUX_JOB_NNODES": "3"})
    assert FLUX.scope({"FLUX_JOB_ID": "job-12"}) == "flux/-/-"


def test_user_master_wins() -> None:
    """MASTER_ADDR and MASTER_PORT set by the user are used for Flux tasks."""
    env = {**flux.FLUX_2X1[1], "MASTER_ADDR": "tioga12", "MASTER_PORT": "29500"}
    info = detect("auto", env)
    assert (info.master_addr, info.master_port) == ("tioga12", 29500)


@pytest.mark.parametrize("node", range(2))
def test_distenv_run_per_flux_node_takes_the_nodes(node: int) -> None:
    """docs/start/flux.md's recipe: one task per node running `distenv run -n 4 --master-addr`."""
    args = build_parser().parse_args(["run", "-n", "4", "--master-addr", "tioga1", "train.py"])
    children = build_children(args, flux.FLUX_2X1[node])
    assert [c.rank for c in children] == [4 * node + i for i in range(4)]
    for child in children:
        assert (child.env["GROUP_RANK"], child.env["WORLD_SIZE"]) == (str(node), "8")
        assert child.env["MASTER_ADDR"] == "tioga1"
        assert detect("auto", child.env).launcher == "pytorch"
    bare = build_parser().parse_args(["run", "-n", "4", "train.py"])
    with pytest.raises(DistEnvError, match="--master-addr"):
        build_children(bare, flux.FLUX_2X1[node])


def test_pmi_rank_and_size_alone_are_no_hydra_launch() -> None:
    """PMI_RANK/PMI_SIZE without MPI_LOCALRANKID outside any scheduler: refused, saying why."""
    with pytest.raises(MissingVariableError, match="MPI_LOCALRANKID") as caught:
        detect("auto", {"PMI_RANK": "1", "PMI_SIZE": "2"})
    assert "no MPICH/Intel MPI launch" in str(caught.value)
    assert "Flux" in str(caught.value)
