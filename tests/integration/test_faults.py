"""Faults during the bootstrap, under the real launchers: every rank ends, in time, saying who failed.

Each fault of issue #13 (tests/support/integration/faults.py) is injected into a real launch. A test
asserts that (a) every surviving rank ends within DISTENV_TIMEOUT + 10 s of entering init_dist
(+ `EXIT_SLACK_S` to print and exit), and the whole launch within that + `START_SLACK_S`
(interpreter start and ``import torch`` of every rank on 2 cores, before init_dist); (b) the
launcher's exit status and each rank's where the launcher reports it; (c) that the message names
the faulty rank, with its host and how it left where known; (d) that no process of the launch is
in /proc (its marker in argv) once the launcher returned. The launches are independent and start
together (a module fixture), so the file takes about as long as its slowest launch.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from tests.support.integration.faults import (
    EXIT_SLACK_S,
    FAULTS,
    PHASES,
    SIGNAL_BOUND_S,
    START_SLACK_S,
    Outcome,
    signal_in_phase,
)
from tests.support.integration.helpers import Harness

Launches = dict[str, "Future[Outcome | tuple[Outcome, float]]"]


@pytest.fixture(scope="module")
def launches(harness: Harness) -> Iterator[Launches]:
    """Start every fault's launch at once, then the signal launches; each test waits for its own.

    The signal launches come second: a rank's exit after its message (interpreter and torch
    teardown) took 4-5 s on 2 cores while ten launches imported torch, against 1 s alone.
    """
    with ThreadPoolExecutor(len(FAULTS) + len(PHASES)) as pool:
        started: Launches = {name: pool.submit(run, harness) for name, run in FAULTS.items()}
        for future in list(started.values()):
            future.exception()  # wait; the failure itself is reported by the fault's test
        for name in PHASES:
            started[f"phase-{name}"] = pool.submit(signal_in_phase, harness, name)
        yield started


def outcome(launches: Launches, name: str) -> Outcome:
    found = launches[name].result()
    assert isinstance(found, Outcome)
    return found


def stopped_rank_said_nothing_first(o: Outcome, rank: int) -> None:
    """The SIGSTOPped `rank` reported nothing before another rank named the fault.

    Once another rank fails, mpirun sends every rank SIGCONT and SIGTERM: the stopped rank may
    then wake and record how the job's end reached it (SIGTERM, rank 0's store gone) before the
    test SIGKILLs it; never first.
    """
    errors = o.errors()
    if rank in errors:
        others = [e["t"] for r, e in errors.items() if r != rank]
        assert others, o.text()
        assert min(others) <= errors[rank]["t"], o.text()


def named_at_joining(o: Outcome, stopped: int) -> list[int]:
    """Return the ranks that named the SIGSTOPped rank `stopped` with its host, still at joining,
    each within the bound; it said nothing first. mpirun stops the others once one fails: the
    first to fail names it, the rest may be killed by mpirun before they print."""
    stopped_rank_said_nothing_first(o, stopped)
    host = o.first(stopped, "start")["host"]  # type: ignore[index]
    said = f"rank {stopped} on {host!r} (still at joining)"
    named = [r for r, e in o.errors().items() if said in e["message"]]
    assert named, o.text()
    ended_in_time(o, tuple(named))
    return named


def ended_in_time(o: Outcome, ranks: tuple[int, ...]) -> None:
    """(a) and (d): each of `ranks` ended within the bound with an error; nothing survived."""
    errors = o.errors()
    for rank in ranks:
        start = o.first(rank, "start")
        assert start is not None, o.text()
        assert rank in errors, f"rank {rank} printed no error:\n{o.text()}"
        took = errors[rank]["t"] - start["t"]
        assert took <= o.bound + EXIT_SLACK_S, f"rank {rank} took {took:.1f} s:\n{o.text()}"
    assert o.result.returncode is not None, f"the launcher was killed:\n{o.text()}"
    assert o.result.seconds <= o.bound + EXIT_SLACK_S + START_SLACK_S, o.text()
    assert o.survivors == [], o.text()


@pytest.mark.slurm
def test_rank_killed_after_check_in_is_named_under_srun_without_kill_on_bad_exit(
    launches: Launches,
) -> None:
    """Rank 1 dies after checking in while late rank 3 is awaited: ranks 0 and 2 name it by the
    deadline (0.1.0: they waited in init_process_group until Slurm's limit killed them)."""
    o = outcome(launches, "killed-after-checkin")
    ended_in_time(o, (0, 2, 3))
    assert o.result.returncode == 137, o.text()  # srun: the highest, task 1's SIGKILL
    assert o.task_exits() == {0: "exit 1", 1: "killed", 2: "exit 1", 3: "exit 1"}, o.text()
    for rank in (0, 2):
        message = o.errors()[rank]["message"]
        # gloo's connect phase or distenv's own wait, whichever gives up first, names it.
        # Rank 0 holds every check-in, so it names the host too.
        named = r"within 15 s: rank 1( on \S+)? \(checked in, then never got this far: died or"
        assert re.search(named, message), o.text()
        assert (" on " in message.split("rank 1", 1)[1][:40]) == (rank == 0), o.text()
    # Rank 3's deadline is 3 s after rank 0's: rank 0's exit takes the store (docs/faults.md).
    late = o.errors()[3]["message"]
    assert "lost rank 0's store" in late or re.search(r"rank 1( on \S+)? \(checked in", late)


@pytest.mark.slurm
def test_sigterm_to_two_ranks_in_the_roll_call_ends_the_other_two(launches: Launches) -> None:
    """SIGTERM to ranks 1 and 2 in the roll call: they stop at once; rank 0 names both, with host
    and signal (0.1.0: ranks 0 and 3 hung)."""
    o = outcome(launches, "sigterm-two-in-roll-call")
    ended_in_time(o, (0, 1, 2, 3))
    errors = o.errors()
    for rank in (1, 2):
        assert "interrupted by SIGTERM during the roll call" in errors[rank]["message"], o.text()
        assert errors[rank]["t"] - o.fault_t <= SIGNAL_BOUND_S, o.text()
    host = o.first(1, "start")["host"]  # type: ignore[index]
    assert (
        f"rank 1 on {host!r} (stopped by SIGTERM), rank 2 on {host!r} (stopped by SIGTERM)"
        in (errors[0]["message"])
    ), o.text()
    # Rank 3 arrived late, so its deadline is after rank 0's: rank 0's exit takes the store
    # with it, and rank 3 can only say so (docs/faults.md).
    assert "lost rank 0's store" in errors[3]["message"] or "rank 1 on" in errors[3]["message"]
    assert o.result.returncode == 1, o.text()
    assert o.task_exits() == dict.fromkeys(range(4), "exit 1"), o.text()


def test_rank_stopped_after_init_is_named_by_the_group_up_check(launches: Launches) -> None:
    """Rank 2 SIGSTOPped once its init_process_group returned (Open MPI mpirun): the others'
    inits return too, and the group-up check names rank 2 and its host at the deadline."""
    o = outcome(launches, "stopped-after-init")
    errors = o.errors()
    for rank in named_at_joining(o, 2):
        message = errors[rank]["message"]
        assert "the process group did not come up on every rank within 15 s" in message
    assert o.result.returncode not in (0, None), o.text()


def test_rank_stopped_in_its_gloo_connect_is_named_within_the_bound(launches: Launches) -> None:
    """Rank 2 SIGSTOPped right after gloo published its address, before it connected (Open MPI
    mpirun): gloo lets some peers' inits return and holds the others past its own timeout, so no
    returned init proves the group. The first rank to fail names rank 2 and its host (still at
    joining) within the bound, whether its init returned (the group-up check) or not (the
    deadline in init_process_group); no rank passes init_dist."""
    o = outcome(launches, "stopped-after-publish")
    errors = o.errors()
    assert all(o.first(rank, "ok") is None for rank in range(4)), o.text()
    for rank in named_at_joining(o, 2):
        message = errors[rank]["message"]
        assert "within 15 s" in message, o.text()
        assert f"rank {rank} on" not in message, o.text()  # never itself
    assert o.result.returncode not in (0, None), o.text()


def test_forged_group_up_keys_let_no_rank_pass_a_stopped_one(launches: Launches) -> None:
    """Rank 2 writes the "all up" key and 1000 on the up count, then SIGSTOPs itself (Open MPI
    mpirun). 0.2.0 trusted that key: the others passed init_dist and hung in their first
    collective. Now no rank passes; rank 0 reads the ranks' own records at once, names the count
    as a foreign write and rank 2 with its host, well before the deadline."""
    o = outcome(launches, "forged-up-stopped")
    errors = o.errors()
    assert 0 in errors, o.text()
    stopped_rank_said_nothing_first(o, 2)
    assert all(o.first(rank, "ok") is None for rank in range(4)), o.text()
    host = o.first(2, "start")["host"]  # type: ignore[index]
    message = errors[0]["message"]
    assert "the group-up count in the store at 127.0.0.1:" in message, o.text()
    assert "a process outside this job wrote to it" in message, o.text()
    # The ranks not up at that instant: rank 2, and any other rank still on its way (under load).
    assert "; not up yet: " in message, o.text()
    assert f"rank 2 on {host!r} (still at joining)" in message.split("; not up yet: ")[1], o.text()
    assert errors[0]["t"] - o.fault_t < o.bound - 5, o.text()  # not the deadline: at once
    ended_in_time(o, (0,))
    assert o.result.returncode not in (0, None), o.text()


@pytest.mark.slurm
def test_rank0_killed_in_init_is_reported_at_once_under_srun(launches: Launches) -> None:
    """Rank 0 dies in init_process_group, its store with it: ranks 1-3 say so within a second,
    naming rank 0's store, instead of waiting for the deadline."""
    o = outcome(launches, "rank0-killed-in-init")
    ended_in_time(o, (1, 2, 3))
    host = o.first(0, "start")["host"]  # type: ignore[index]
    for rank in (1, 2, 3):
        message = o.errors()[rank]["message"]
        # In init_process_group, or still reading the verdict when rank 0 died: both say so.
        assert "lost rank 0's store" in message, o.text()
        assert f"{host}:" in message, o.text()
    assert o.measured() <= 5.0, o.text()
    assert o.result.returncode == 137, o.text()
    assert o.task_exits() == {0: "killed", 1: "exit 1", 2: "exit 1", 3: "exit 1"}, o.text()


def test_rank_killed_in_init_under_torchrun_stops_the_others_with_a_message(
    launches: Launches,
) -> None:
    """torchrun keeps its agent's store when rank 1 dies in init and SIGTERMs the others: each
    ends at once with distenv's message; torchrun names rank 1's SIGKILL."""
    o = outcome(launches, "killed-in-init-torchrun")
    ended_in_time(o, (0, 2, 3))
    for rank in (0, 2, 3):
        assert "interrupted by SIGTERM during init_process_group" in o.errors()[rank]["message"]
    assert o.result.returncode == 1, o.text()
    assert o.task_exits()[1] == "signal 9", o.text()
    assert o.measured() <= 10.0, o.text()  # torchrun's monitor interval, then its SIGTERM


def test_master_port_held_by_a_silent_service_is_named_within_the_timeout(
    launches: Launches,
) -> None:
    """A listener on MASTER_PORT that accepts but never answers: ranks 2 and 3 (node 1 of a
    `distenv run`) say so within the rendezvous timeout (0.1.0: 67 s with a 10 s timeout)."""
    o = outcome(launches, "silent-master-port")
    port = o.notes[0].split()[1]
    ended_in_time(o, (2, 3))
    for rank in (2, 3):
        error = o.errors()[rank]
        took = error["t"] - o.first(rank, "start")["t"]  # type: ignore[index]
        assert took <= o.timeout + EXIT_SLACK_S, o.text()
        assert (
            f"127.0.0.1:{port} accepts connections but is not answering as a torch store "
            "(another service, or rank 0 stopped?) within 5 s" in error["message"]
        ) or "interrupted by SIGTERM during the connection" in error["message"], o.text()
    assert any("not answering as a torch store" in e["message"] for e in o.errors().values())
    assert o.result.returncode == 1, o.text()


@pytest.mark.parametrize("name", list(PHASES))
def test_a_signal_in_each_phase_ends_the_rank_within_2_s(launches: Launches, name: str) -> None:
    """SIGINT or SIGTERM to a rank held in a phase (a peer kept away or held): it prints the
    phase's message within 2 s, and its process is gone soon after."""
    found = launches[f"phase-{name}"].result()
    assert isinstance(found, tuple)
    o, exited = found
    phase = PHASES[name]
    error = o.errors().get(phase.target)
    assert error is not None, o.text()
    assert f"interrupted by {phase.signal.name} during {phase.what}" in error["message"], o.text()
    assert error["t"] - o.fault_t <= SIGNAL_BOUND_S, o.text()
    # The process itself: the message's 2 s + the interpreter's and torch's teardown.
    assert exited <= SIGNAL_BOUND_S + EXIT_SLACK_S, f"exited {exited:.2f} s after:\n{o.text()}"
    assert o.result.returncode not in (0, None), o.text()
    assert o.survivors == [], o.text()
