"""Open MPI 5 (PRRTE) and MPICH 5 (Hydra) from PyPI, from the environments they really set.

The fixtures are captured by tests/harness/capture_all.py (scenarios ``ompi5_*``, ``mpich5_*``;
commands and versions in tests/support/envs/captures/README.md); the real launches are
tests/integration/test_mpi_pypi.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distenv import detect, explain
from distenv.bootstrap.records import matches
from distenv.bootstrap.scope import job_scope
from distenv.launchers.registry import BUILTIN
from distenv.master import scheduler_port
from tests.support.envs import mpi

CAPTURES = Path(__file__).resolve().parents[1] / "support" / "envs" / "captures"
OMPI5 = {
    "ompi5_3": mpi.OMPI5_3,
    "ompi5_in_salloc_2n": mpi.OMPI5_IN_SALLOC_2N,
    "ompi5_in_sbatch": mpi.OMPI5_IN_SBATCH,
}


def _captured(name: str) -> list[dict[str, str]]:
    lines = (CAPTURES / f"{name}.jsonl").read_text().splitlines()
    return [json.loads(line)["env"] for line in lines]


@pytest.mark.parametrize("name", sorted(OMPI5))
def test_open_mpi_5_names_no_node_layout(name: str) -> None:
    """No OMPI_MCA_orte_* (no node count, no host list) in any rank Open MPI 5 started."""
    for env in _captured(name):
        assert "OMPI_COMM_WORLD_RANK" in env
        assert not [k for k in env if k.startswith("OMPI_MCA_orte")], env


@pytest.mark.parametrize("name", sorted(OMPI5))
def test_open_mpi_5_scope_is_its_pmix_namespace(name: str) -> None:
    """Every rank of one launch has one scope, holding PRRTE's namespace (prterun-<host>-<pid>@1).

    It fits the record schema as it is (no digest), and another launch's namespace is another
    scope: two Open MPI 5 jobs of the same size on one store are told apart.
    """
    ranks = OMPI5[name]
    namespaces = {env["PMIX_NAMESPACE"] for env in ranks}
    assert len(namespaces) == 1
    (namespace,) = namespaces
    assert namespace.startswith("prterun-")
    assert namespace.endswith("@1")
    scopes = {explain("auto", env).scope for env in ranks}
    assert scopes == {f"mpi/{namespace}/{len(ranks)}"}, scopes
    (scope,) = scopes
    assert job_scope(scope, len(ranks)) == f"{scope}/n{len(ranks)}"
    assert matches("scope", job_scope(scope, len(ranks)))
    other = {**ranks[0], "PMIX_NAMESPACE": namespace.replace("@1", "@2")}
    assert explain("auto", other).scope != scope


def test_mpich_5_scope_names_only_the_size() -> None:
    """Hydra exports no identity: the scope is the size (rank 0's MPI token tells jobs apart)."""
    assert {explain("auto", env).scope for env in mpi.MPICH5_4} == {"mpi/-/4"}


def test_open_mpi_5_local_ranks_need_not_follow_rank_order() -> None:
    """`-np 3` on one node gave local ranks 0, 2, 1: taken as given, never rank % local size."""
    infos = [detect("auto", env) for env in mpi.OMPI5_3]
    assert [(i.rank, i.local_rank, i.local_world_size) for i in infos] == [
        (0, 0, 3),
        (1, 2, 3),
        (2, 1, 3),
    ]
    # The local size is the world size: one node, known without the roll call.
    assert {(i.node_rank, i.num_nodes) for i in infos} == {(0, 1)}


def test_open_mpi_5_node_rank_variable_is_not_a_node_index() -> None:
    """OMPI_COMM_WORLD_NODE_RANK (a local rank across jobs) is not read, whatever it says."""
    declared = {v.name for v in BUILTIN["mpi"].variables}
    assert "OMPI_COMM_WORLD_NODE_RANK" not in declared
    for env in mpi.OMPI5_IN_SBATCH:
        with_it = {**env, "OMPI_COMM_WORLD_NODE_RANK": "1"}
        assert detect("auto", with_it) == detect("auto", env)


def test_open_mpi_5_inside_sbatch_leaves_the_layout_to_the_roll_call() -> None:
    """mpirun in the batch script: its node's ranks see no step, the other node's a 1-node step.

    Neither numbers the nodes of the job, so both leave the layout unknown; the master is the
    allocation's first host and one port on every rank.
    """
    infos = [detect("auto", env) for env in mpi.OMPI5_IN_SBATCH]
    assert "SLURM_STEP_ID" not in mpi.OMPI5_IN_SBATCH[0]
    assert mpi.OMPI5_IN_SBATCH[2]["SLURM_STEP_NUM_NODES"] == "1"
    assert [(i.launcher, i.rank, i.local_rank, i.node_rank, i.num_nodes) for i in infos] == [
        ("mpi", r, r % 2, None, None) for r in range(4)
    ]
    job = mpi.OMPI5_IN_SBATCH[0]["SLURM_JOB_ID"]
    assert {(i.master_addr, i.master_port) for i in infos} == {("n1", scheduler_port(job, "mpi"))}


@pytest.mark.parametrize("envs", [mpi.OMPI5_IN_SALLOC_2N, mpi.MPICH5_IN_SALLOC_2N])
def test_pypi_engines_inside_salloc_take_the_daemon_steps_node_index(
    envs: tuple[dict[str, str], ...],
) -> None:
    """From the submit host, both start one daemon per node in one step spanning the allocation."""
    infos = [detect("auto", env) for env in envs]
    assert [(i.launcher, i.node_rank, i.num_nodes) for i in infos] == [
        ("mpi", r // 2, 2) for r in range(4)
    ]
    assert {i.master_addr for i in infos} == {"n1"}
