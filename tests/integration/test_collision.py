"""Two jobs, one port: the intruding ranks stop at once, naming the other job; it trains on.

Job A trains (all-reduces for several seconds) while job B's ranks are started on the same port of
the same node. B's ranks find A's scope in the store before they write anything: each stops with
`StoreTakenError` within seconds, and A finishes normally. Under real srun (a forced MASTER_PORT),
`distenv run` (0.1.0 let B's ranks pass init_dist inside A's store) and torchrun (A's agent store).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from distenv.master import free_port
from tests.support.integration.helpers import (
    JOB_NAME,
    PYTHON,
    REPO,
    TORCHRUN,
    Harness,
    Launch,
    Result,
)
from tests.support.nodes import node_options

COLLIDER = str(REPO / "tests" / "support" / "scripts" / "collider.py")
QUICK = {"DISTENV_TIMEOUT": "5"}
DISTENV = str(REPO / ".venv" / "bin" / "distenv")
# Job A trains until the test has seen B fail (its stop file), at most this long.
TRAIN_S = 90.0
# B's bound: interpreter start and `import torch` (seconds on 2 cores), then one store read.
INTRUDER_S = 25.0


def _training(victim: Launch, stop: Path, world: int = 2, limit: float = 60.0) -> None:
    """Return once every rank of job A passed init_dist (collider.py's ``init-<rank>`` files)."""
    deadline = time.monotonic() + limit
    while len(list(stop.parent.glob("init-*"))) < world:
        assert victim.proc.poll() is None, f"job A ended before it trained: {victim.argv}"
        assert time.monotonic() < deadline, f"job A's ranks not all past init_dist: {victim.argv}"
        time.sleep(0.1)


def _victim(harness: Harness, argv: list[str], **kw: Any) -> tuple[Launch, Path]:
    """Start job A: `argv` + the collider, training until its stop file appears."""
    stop = harness.outdir("stop") / "stop"
    argv = [*argv, COLLIDER, "--seconds", str(TRAIN_S), "--stop-file", str(stop)]
    return harness.start(argv, **kw), stop


def _collide(
    harness: Harness, victim: Launch, stop: Path, intruder: list[str], **kw: Any
) -> tuple[Result, Result]:
    """Once A's ranks train, run B to its end, then let A finish."""
    _training(victim, stop)
    b = harness.run(intruder, timeout=60, **kw)
    stop.touch()
    return victim.wait(), b


def _intruder(port: int) -> list[str]:
    """Job B: the second node of a `distenv run` whose master is A's port."""
    _, node1 = node_options(2, ranks=2, run_id="job-b", port=port)
    return [DISTENV, "run", *node1, COLLIDER]


def _victim_trained(a: Result, world: int) -> None:
    assert a.returncode == 0, a.text
    total = world * (world + 1) // 2
    for rank in range(world):
        assert f"DONE {rank} {total}" in a.stdout, a.text
    assert "ERROR" not in a.stdout, a.text


def _intruder_refused(b: Result, ranks: int, victim_scope: str) -> None:
    """B failed fast, at least one of its `ranks` ranks naming A's store, and none passed init.

    Launchers that stop every rank when one fails (distenv run, torchrun) may stop a sibling
    before it reaches the store, so not every rank need print the refusal.
    """
    assert b.returncode != 0, b.text
    assert b.seconds < INTRUDER_S, b.text
    assert 1 <= b.stdout.count("ERROR StoreTakenError") <= ranks, b.text
    assert f"is another job's: {victim_scope}" in b.stdout, b.text
    assert "It did not join, and wrote nothing there" in b.stdout, b.text
    assert "INIT" not in b.stdout, b.text


def test_distenv_run_rank_of_another_run_is_refused(harness: Harness) -> None:
    """`distenv run` A trains on port P; B's node-1 ranks reach P: refused, A unaffected."""
    port = free_port()
    victim, stop = _victim(
        harness,
        [DISTENV, "run", "-n", "2", "--master-port", str(port), "--run-id", "job-a"],
    )
    a, b = _collide(harness, victim, stop, _intruder(port), env=harness.env(extra=QUICK))
    _victim_trained(a, 2)
    _intruder_refused(b, 2, "pytorch/job-a/-/n2")


def test_torchrun_job_is_not_joined_by_another_job(harness: Harness) -> None:
    """torchrun A (its agent's store on P) trains; ranks of a `distenv run` on P are refused."""
    port = free_port()
    victim, stop = _victim(
        harness,
        [TORCHRUN, "--nnodes", "1", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
         "--master-port", str(port), "--rdzv-id", "job-a"],
    )  # fmt: skip
    a, b = _collide(harness, victim, stop, _intruder(port), env=harness.env(extra=QUICK))
    _victim_trained(a, 2)
    _intruder_refused(b, 2, "pytorch/job-a/0/n2")


@pytest.mark.slurm
def test_two_slurm_jobs_forced_onto_one_port(harness: Harness) -> None:
    """Two srun jobs on one node, both with MASTER_PORT=P: B's rank 0 finds the port taken, B's
    rank 1 finds A's store and stops, naming A's job and step; A trains to the end."""
    port = free_port()
    env = harness.env("one", extra={"MASTER_PORT": str(port)})
    victim, stop = _victim(harness, ["srun", "-J", JOB_NAME, "-n", "2", PYTHON], env=env)
    a, b = _collide(
        harness,
        victim,
        stop,
        ["srun", "-J", JOB_NAME, "-n", "2", PYTHON, COLLIDER],
        env={**env, **QUICK},
    )
    _victim_trained(a, 2)
    assert b.returncode != 0, b.text
    assert b.seconds < INTRUDER_S, b.text
    assert "rank 0 cannot listen on port" in b.stdout, b.text
    assert b.stdout.count("ERROR StoreTakenError") == 1, b.text
    assert "is another job's: slurm/" in b.stdout, b.text
    assert "/0/n2; this job is slurm/" in b.stdout, b.text
    assert "INIT" not in b.stdout, b.text
