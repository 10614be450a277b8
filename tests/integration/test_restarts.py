"""``distenv run --max-restarts``: the whole job restarts together, attempts are counted once.

Two node agents on this machine (``distenv run --nnodes 2`` on 127.0.0.1) and two under the real
srun of the simulated two-node cluster; the ranks are tests/support/scripts/restart_rank.py, which
fails as its plan says and logs every attempt it starts.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from distenv.local.attempts import AGENT_SILENCE_S
from distenv.master import free_port
from tests.support.envs.kubeflow import TRAINJOB_2X1_NODE1, two_pods
from tests.support.integration.faults import survivors
from tests.support.integration.helpers import DISTENV_RUN, JOB_NAME, REPO, Harness, Launch, Result
from tests.support.nodes import node_options

RANK = str(REPO / "tests" / "support" / "scripts" / "restart_rank.py")
#: A failed attempt's end to the next attempt's ranks in init_dist, on a loaded 2-core machine:
#: the stop, the agents' agreement, four fresh `import torch`.
ATTEMPT_S = 30.0


class Job:
    """One launch of restart_rank.py ranks, its event file and its marker."""

    def __init__(self, harness: Harness, label: str) -> None:
        self.out = harness.outdir(label)
        self.tag = f"restart-{uuid.uuid4().hex[:12]}"

    def rank_argv(self, plan: str = "", mode: str = "normal") -> list[str]:
        return [RANK, "--out", str(self.out), "--tag", self.tag, "--plan", plan, "--mode", mode]

    def events(self, event: str | None = None) -> list[dict[str, Any]]:
        path = self.out / "events.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        records = [json.loads(line) for line in lines]
        return [r for r in records if event is None or r["event"] == event]

    def attempts(self) -> dict[int, list[int]]:
        """Return the ranks that reached init_dist at each attempt, by attempt."""
        found: dict[int, list[int]] = {}
        for record in self.events("start"):
            found.setdefault(record["attempt"], []).append(record["rank"])
        return {attempt: sorted(ranks) for attempt, ranks in sorted(found.items())}

    def wait_for(self, event: str, count: int, limit: float) -> None:
        deadline = time.monotonic() + limit
        while len(self.events(event)) < count:
            assert time.monotonic() < deadline, (
                f"{count} {event!r} events not seen: {self.events()}"
            )
            time.sleep(0.1)


def two_agents(harness: Harness, job: Job, rank_argv: Sequence[str], *options: str) -> list[Launch]:
    """Start two node agents of one rank each on 127.0.0.1 (docs/start/local.md's recipe)."""
    env = harness.env(extra={"DISTENV_TIMEOUT": "10"})
    return [
        harness.start([*DISTENV_RUN, *node, *options, *rank_argv], env=env)
        for node in node_options(2, run_id=job.tag)
    ]


def holding_agents(harness: Harness, job: Job) -> list[Launch]:
    """Start two agents whose ranks train until killed; return once both ranks train."""
    launches = two_agents(harness, job, job.rank_argv(mode="hold"), "--max-restarts", "3")
    training(job, launches)
    return launches


def finished(launches: Sequence[Launch]) -> list[Result]:
    return [launch.wait() for launch in launches]


def training(job: Job, launches: Sequence[Launch]) -> None:
    """Return once both ranks of the job are past their first all_reduce (else kill, fail)."""
    try:
        job.wait_for("up", 2, ATTEMPT_S * 2)
    except AssertionError:
        for launch in launches:
            launch.proc.kill()
        raise


def assert_passed_at_attempt_2(job: Job, ranks: list[int]) -> None:
    """Every rank started at attempts 0, 1 and 2, and finished at 2 with restart_count 2."""
    assert job.attempts() == {0: ranks, 1: ranks, 2: ranks}
    oks = job.events("ok")
    assert sorted(r["rank"] for r in oks) == ranks
    assert {(r["attempt"], r["restart_count"]) for r in oks} == {(2, 2)}
    assert {r["sum"] for r in job.events("up") if r["attempt"] == 2} == {float(len(ranks))}
    assert survivors(job.tag) == []


def test_two_agents_restart_the_whole_job_until_it_passes(harness: Harness) -> None:
    """Rank 1 (node 1) fails at attempts 0 and 1: both nodes' ranks restart each time, and at
    attempt 2 both finish an all_reduce with restart_count 2; both agents exit 0.

    At attempt 0 rank 1 raises but is still exiting when rank 0, whose collective it broke, has
    failed and node 1's agent has seen that: rank 1 is still named, not the rank it broke."""
    job = Job(harness, "restart-passes")
    plan = "0:1:train:slowraise,1:1:start:kill"
    results = finished(two_agents(harness, job, job.rank_argv(plan), "--max-restarts", "3"))
    for result in results:
        assert result.returncode == 0, result.text
        assert "attempt 0 failed: rank 1 on" in result.stderr, result.text
        assert "(RuntimeError: injected failure in train at attempt 0)" in result.stderr
        assert "attempt 1 failed: rank 1 on" in result.stderr, result.text
        assert "was killed by SIGKILL; restarting every rank of the job (restart 2 of 3)" in (
            result.stderr
        ), result.text
    assert_passed_at_attempt_2(job, [0, 1])


def test_a_failure_at_every_attempt_spends_exactly_the_restarts_of_the_whole_job(
    harness: Harness,
) -> None:
    """Both ranks (one per node) exit 7 at every attempt, with --max-restarts 2: three attempts
    in all, not three per node, and the job ends with the failing rank's status."""
    job = Job(harness, "restart-spent")
    plan = "*:0:train:exit7,*:1:train:exit7"
    results = finished(two_agents(harness, job, job.rank_argv(plan), "--max-restarts", "2"))
    for result in results:
        assert result.returncode == 7, result.text
        assert "attempt 2 failed: rank " in result.stderr, result.text
        assert "not restarted: all 2 restarts spent" in result.stderr, result.text
    assert list(job.attempts()) == [0, 1, 2]
    assert survivors(job.tag) == []


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("refuse", "distenv refused the environment or the configuration"),
        ("import", "the script cannot be imported"),
        ("usage", "the script refused its arguments"),
    ],
)
def test_what_a_restart_would_repeat_is_not_retried(harness: Harness, mode: str, why: str) -> None:
    """A distenv refusal, an import error, a usage error: one attempt, the rank's status, and
    the reason named; no second attempt."""
    job = Job(harness, f"restart-{mode}")
    result = harness.run(
        [*DISTENV_RUN, "-n", "2", "--max-restarts", "3", *job.rank_argv(mode=mode)],
        env=harness.env(extra={"DISTENV_TIMEOUT": "10"}),
    )
    assert result.returncode == (2 if mode == "usage" else 1), result.text
    assert "attempt 0 failed: rank " in result.stderr, result.text
    assert f"; not restarted: {why}" in result.stderr, result.text
    assert "restarting" not in result.stderr, result.text
    assert set(job.attempts()) <= {0}
    assert survivors(job.tag) == []


def test_a_stop_signal_ends_the_job_without_restart(harness: Harness) -> None:
    """Kubernetes deleting both pods of a Kubeflow TrainJob (SIGTERM to each pod's `distenv run`,
    node layout and master from PET_*) while the ranks train: every rank stops, nothing restarts,
    both agents exit 143 within the grace period, no process survives."""
    job = Job(harness, "restart-sigterm")
    env = harness.env(extra={"DISTENV_TIMEOUT": "10"})
    launches = [
        harness.start(
            [*DISTENV_RUN, "-n", "1", "--max-restarts", "3", *job.rank_argv(mode="hold")],
            env={**env, **pod},
        )
        for pod in two_pods(TRAINJOB_2X1_NODE1, free_port())
    ]
    training(job, launches)
    sent = time.monotonic()
    for launch in launches:
        launch.proc.send_signal(signal.SIGTERM)
    results = finished(launches)
    assert time.monotonic() - sent < 10
    for result in results:
        assert result.returncode == 128 + signal.SIGTERM, result.text
        assert "received SIGTERM; not restarted" in result.stderr or (
            "not restarted: the job was stopped" in result.stderr
        ), result.text
    assert list(job.attempts()) == [0]
    assert survivors(job.tag) == []


def test_node_0_agent_killed_ends_the_job_and_the_others_say_so(harness: Harness) -> None:
    """SIGKILL to node 0's agent: its ranks die with it (parent-death signal), node 1's agent
    says node 0's agent is gone, stops its ranks and exits 1 without restart."""
    job = Job(harness, "restart-agent0")
    launches = holding_agents(harness, job)
    launches[0].proc.kill()
    sent = time.monotonic()
    node1 = launches[1].wait()
    launches[0].wait()
    assert time.monotonic() - sent < 15
    assert node1.returncode == 1, node1.text
    assert "node 0's agent at 127.0.0.1:" in node1.stderr, node1.text
    assert "the job ends without restart" in node1.stderr, node1.text
    assert list(job.attempts()) == [0]
    assert survivors(job.tag) == []


@pytest.mark.slurm
def test_srun_one_agent_per_node_restarts_the_whole_job(harness: Harness) -> None:
    """`srun -N 2 --ntasks-per-node 1 distenv run -n 2 --max-restarts 3`: rank 1 fails at
    attempts 0 and 1; the step ends 0 with all four ranks through an all_reduce at attempt 2,
    on two nodes, and the step's agents agreed through node 0's store (no shared file)."""
    job = Job(harness, "restart-srun")
    result = harness.run(
        ["srun", "-J", JOB_NAME, "-N", "2", "--ntasks-per-node", "1", *DISTENV_RUN, "-n", "2",
         "--max-restarts", "3", *job.rank_argv("0:1:train:raise,1:1:init:kill")],
        cluster="multi",
    )  # fmt: skip
    assert result.returncode == 0, result.text
    assert result.stderr.count("attempt 0 failed: rank 1 on") == 2, result.text
    assert result.stderr.count("attempt 1 failed: rank 1 on") == 2, result.text
    assert_passed_at_attempt_2(job, [0, 1, 2, 3])
    assert len({r["host"] for r in job.events("ok")}) == 2


def test_another_node_s_agent_killed_is_named_by_node_0_and_ends_the_job(harness: Harness) -> None:
    """SIGKILL to node 1's agent while the ranks train: its rank dies with it (parent-death
    signal); node 0's agent names node 1's agent once silent (10 s), stops its own rank and
    exits 1 without restart; no process survives."""
    job = Job(harness, "restart-agent1")
    launches = holding_agents(harness, job)
    launches[1].proc.kill()
    killed = time.monotonic()
    node0 = launches[0].wait()
    launches[1].wait()
    assert time.monotonic() - killed < AGENT_SILENCE_S + 10, node0.text
    assert node0.returncode == 1, node0.text
    assert "attempt 0 failed: the agent of node 1 on " in node0.stderr, node0.text
    assert "stopped answering; not restarted: a node's agent is gone" in node0.stderr, node0.text
    assert list(job.attempts()) == [0]
    assert survivors(job.tag) == []
