"""Node leaders under real launchers: the batched roll call and group-up check, and their faults.

Each launch runs tests/support/scripts/faulty_rank.py with ``DISTENV_NODE_LEADERS=on`` (the default
batches only in worlds of 256 ranks or more): srun with two tasks on each of the simulated
cluster's two nodes (ranks 0 and 2 lead), Open MPI's mpirun, whose layout only the roll call
numbers, and torchrun, whose agent hosts the store. Faults: a leader killed or stopped (SIGSTOP)
before it reports its node, a member killed after joining the group, a leader that starts after rank 0 stopped waiting,
a forged line among the batches. Each
test asserts the time bound (`ended_in_time`: DISTENV_TIMEOUT + 10 s, plus the slack to print and
exit), the exits, the rank or node named, and that no process of the launch survived. The
launches start together (a module fixture).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from distenv.master import free_port
from tests.integration.test_faults import ended_in_time
from tests.support.integration.faults import (
    SRUN_2N,
    Outcome,
    Run,
    _env,
    _fault_time,
    _finish,
)
from tests.support.integration.helpers import OMPI, TORCHRUN, Harness

TIMEOUT_S = 5.0
LEADERS = {"DISTENV_NODE_LEADERS": "on"}
NODE_1_SILENT = "1 node(s) sent no report within 5 s: node 1 (its leader, rank 2, and 1 more rank)"
#: How the stopped leader may end once the step's end continues it: the signal; rank 0's store
#: already closed (`Session.lost`); or its own roll-call deadline, long past, firing first.
STOPPED_LEADER_ENDS = (
    "interrupted by SIGTERM during the roll call",
    "lost rank 0's store",
    "stopped answering during the roll call",
)


def _srun(
    harness: Harness,
    label: str,
    *faults: str,
    timed: int | None = None,
    srun_options: tuple[str, ...] = (),
) -> Outcome:
    run = Run(harness, label)
    launch = harness.start(
        [*SRUN_2N, *srun_options, *run.rank_argv(*faults)],
        env=_env(run, TIMEOUT_S, "multi", **LEADERS),
        timeout=150,
    )
    fault_t = _fault_time(run, timed) if timed is not None else 0.0
    return _finish(run, launch, label, "srun -N 2 -n 4", TIMEOUT_S, fault_t)


def leaders_ok(harness: Harness) -> Outcome:
    return _srun(harness, "leaders-ok")


def leader_killed(harness: Harness) -> Outcome:
    return _srun(harness, "leader-killed", "2:kill-before-batch", timed=2)


def leader_stopped(harness: Harness) -> Outcome:
    # A stopped task never exits: as docs/slurm.md recommends, srun ends the step when one fails.
    return _srun(
        harness,
        "leader-stopped",
        "2:stop-before-batch",
        timed=2,
        srun_options=("--kill-on-bad-exit=1",),
    )


def member_killed(harness: Harness) -> Outcome:
    return _srun(harness, "member-killed", "3:kill-after-init", timed=3)


def late_leader(harness: Harness) -> Outcome:
    return _srun(harness, "late-leader", f"2:late:{TIMEOUT_S + 6:g}")


def forged_batch(harness: Harness) -> Outcome:
    return _srun(harness, "forged-batch", "2:forge-batch", timed=2)


def mpirun_from_roll_call(harness: Harness) -> Outcome:
    run = Run(harness, "leaders-mpirun")
    port = str(free_port())
    env = _env(run, TIMEOUT_S, **LEADERS, MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    launch = harness.start(
        [*OMPI, "-np", "4", "--oversubscribe", *run.rank_argv()], env=env, timeout=150
    )
    return _finish(run, launch, "leaders-mpirun", "mpirun -np 4", TIMEOUT_S, 0.0)


def torchrun_agent_store(harness: Harness) -> Outcome:
    run = Run(harness, "leaders-torchrun")
    port = str(free_port())
    argv = [TORCHRUN, "--nnodes", "1", "--nproc-per-node", "4", "--master-addr", "127.0.0.1",
            "--master-port", port, *run.rank_argv()[1:]]  # fmt: skip
    launch = harness.start(argv, env=_env(run, TIMEOUT_S, **LEADERS), timeout=150)
    return _finish(run, launch, "leaders-torchrun", "torchrun --nproc-per-node 4", TIMEOUT_S, 0.0)


SCENARIOS: dict[str, Callable[[Harness], Outcome]] = {
    "ok": leaders_ok,
    "leader-killed": leader_killed,
    "leader-stopped": leader_stopped,
    "member-killed": member_killed,
    "late-leader": late_leader,
    "forged-batch": forged_batch,
    "mpirun": mpirun_from_roll_call,
    "torchrun": torchrun_agent_store,
}


@pytest.fixture(scope="module")
def launches(harness: Harness) -> Iterator[dict[str, Future[Outcome]]]:
    with ThreadPoolExecutor(len(SCENARIOS)) as pool:
        yield {name: pool.submit(run, harness) for name, run in SCENARIOS.items()}


def phases(o: Outcome, rank: int) -> list[str]:
    return [e["phase"] for e in o.events.get(rank, []) if e["event"] == "phase"]


@pytest.mark.slurm
def test_members_check_in_through_their_leader_and_the_job_comes_up(
    launches: dict[str, Future[Outcome]],
) -> None:
    """srun, two tasks per node: every rank comes up, and only the leaders (ranks 0 and 2) reach
    rank 0's store during the roll call (a member connects for the process group only)."""
    o = launches["ok"].result()
    assert o.result.returncode == 0, o.text()
    assert all(o.first(rank, "ok") for rank in range(4)), o.text()
    for leader in (0, 2):
        assert phases(o, leader)[:2] == ["connecting", "init"], o.text()
    for member in (1, 3):
        assert "connecting" not in phases(o, member), o.text()
        assert "rollcall" not in phases(o, member), o.text()
    assert o.survivors == [], o.text()


@pytest.mark.slurm
def test_a_leader_killed_before_it_reports_is_named_with_its_node(
    launches: dict[str, Future[Outcome]],
) -> None:
    """Rank 2 (node 1's leader) dies holding its node's check-ins: its member says at once that
    its leader closed the connection; rank 0 names node 1 by its leader at its deadline."""
    o = launches["leader-killed"].result()
    ended_in_time(o, (0, 1, 3))
    errors = o.errors()
    assert "its node's leader (local rank 0, pid" in errors[3]["message"], o.text()
    assert "closed its connection" in errors[3]["message"], o.text()
    assert errors[3]["t"] - o.fault_t < 3.0, o.text()
    assert NODE_1_SILENT in errors[0]["message"], o.text()
    assert o.task_exits()[2] == "killed", o.text()
    assert o.survivors == [], o.text()


@pytest.mark.slurm
def test_a_leader_stopped_before_it_reports_is_named_with_its_node(
    launches: dict[str, Future[Outcome]],
) -> None:
    """Rank 2 (node 1's leader) is stopped (SIGSTOP) holding its node's check-ins: rank 0 names
    node 1 by its leader at its deadline, node 0's member learns it from rank 0's verdict, and the
    step ends (srun --kill-on-bad-exit) with no process left, the stopped one included."""
    o = launches["leader-stopped"].result()
    ended_in_time(o, (0, 1))
    errors = o.errors()
    for rank in (0, 1):
        assert NODE_1_SILENT in errors[rank]["message"], o.text()
        assert errors[rank]["t"] - o.fault_t < TIMEOUT_S + 3.0, o.text()
    # Rank 3 waits on its stopped leader's socket until srun ends the step: a signal, or its own
    # message naming the leader if it came first.
    if 3 in errors:
        assert (
            "interrupted by SIG" in errors[3]["message"]
            or "received no verdict" in errors[3]["message"]
        ), o.text()
    # The step's end reaches the stopped leader too, whichever way comes first: Slurm continues it
    # to deliver SIGTERM, and the continued leader either takes the signal or first finds rank 0's
    # store closed (rank 0 gave up and exited while it was stopped); or Slurm kills it. Either
    # message is an orderly end of the roll call; srun does not always report which.
    if 2 in errors:
        assert any(end in errors[2]["message"] for end in STOPPED_LEADER_ENDS), o.text()
    assert o.task_exits().get(2) in (None, "killed", "terminated", "exit 1"), o.text()
    assert o.survivors == [], o.text()


@pytest.mark.slurm
def test_a_member_killed_after_joining_is_named_by_its_leader_before_the_deadline(
    launches: dict[str, Future[Outcome]],
) -> None:
    """Rank 3 dies after init_process_group returned: its leader sees its connection close and
    reports it, and rank 0 names rank 3 as gone well before the group-up deadline."""
    o = launches["member-killed"].result()
    ended_in_time(o, (0,))
    message = o.errors()[0]["message"]
    assert re.search(
        r"rank 3 on \S+ \(its connection to its node's leader closed before it came up", message
    ), o.text()
    assert o.errors()[0]["t"] - o.fault_t < TIMEOUT_S, o.text()
    assert o.task_exits()[3] == "killed", o.text()
    assert o.survivors == [], o.text()


@pytest.mark.slurm
def test_a_leader_that_starts_after_the_cut_is_told_and_its_node_is_named(
    launches: dict[str, Future[Outcome]],
) -> None:
    """Rank 2 starts 11 s late (timeout 5 s): rank 0 names node 1 by its leader; rank 3 names its
    leader that never opened the node's socket; rank 2 ends too, saying it came late, that rank
    0's store is gone, or (where it reached the store in the seconds a failed rank 0 keeps it for
    the others' last reads) that it lost the store."""
    o = launches["late-leader"].result()
    ended_in_time(o, (0, 1, 2, 3))
    errors = o.errors()
    assert NODE_1_SILENT in errors[0]["message"], o.text()
    assert "did not open the node's socket" in errors[3]["message"], o.text()
    late = errors[2]["message"]
    said = ("reached the roll call", "could not reach rank 0's store", "lost rank 0's store")
    assert any(words in late for words in said), o.text()
    assert o.survivors == [], o.text()


@pytest.mark.slurm
def test_a_forged_batch_line_refuses_the_job_on_every_rank(
    launches: dict[str, Future[Outcome]],
) -> None:
    """A line of garbage appended to the batches: rank 0 counts it as a foreign record and the
    verdict refuses the job; the members learn it from their leaders; nothing of it is echoed."""
    o = launches["forged-batch"].result()
    ended_in_time(o, (0, 1, 2, 3))
    for rank, error in o.errors().items():
        assert "batches/0" in error["message"], (rank, o.text())
        assert "EVIL" not in error["message"], o.text()
    assert o.survivors == [], o.text()


def test_mpi_ranks_whose_layout_comes_from_the_roll_call_are_placed_through_their_leader(
    launches: dict[str, Future[Outcome]],
) -> None:
    """Open MPI's mpirun -np 4 (no node index): the leader forwards the verdict and its node's
    place, and every rank comes up."""
    o = launches["mpirun"].result()
    assert o.result.returncode == 0, o.text()
    assert all(o.first(rank, "ok") for rank in range(4)), o.text()
    for member in (1, 2, 3):
        assert "connecting" not in phases(o, member), o.text()
    assert o.survivors == [], o.text()


def test_torchrun_ranks_lead_through_its_agent_store(launches: dict[str, Future[Outcome]]) -> None:
    """torchrun --nproc-per-node 4: its agent hosts the store and rank 0 is one of its clients,
    leading its node like any leader; every rank comes up."""
    o = launches["torchrun"].result()
    assert o.result.returncode == 0, o.text()
    assert all(o.first(rank, "ok") for rank in range(4)), o.text()
    for member in (1, 2, 3):
        assert "connecting" not in phases(o, member), o.text()
    assert o.survivors == [], o.text()
