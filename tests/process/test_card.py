"""The first-failure card of ``distenv run``: the rank that failed first, how, where, in few lines.

Real 4-rank jobs of tests/support/scripts/card_rank.py (gloo all_reduce loops) in which one rank
fails at one step: an exception, ``sys.exit(3)``, SIGSEGV, SIGKILL; on one node, on two nodes (two
``distenv run --nnodes 2`` agents on this machine) and under ``--max-restarts``. The scenarios run
concurrently in one module fixture, so that they cost the CI about one job's time.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import scrubbed_environ
from tests.process.test_run import gone
from tests.support.nodes import node_options

REPO = Path(__file__).resolve().parents[2]
RANK = str(REPO / "tests" / "support" / "scripts" / "card_rank.py")
#: A job to its end on a loaded 2-core machine: four `import torch`, the loop, the stop.
TIMEOUT = 150.0
#: From the fault to distenv run's exit: the stop (SIGTERM, in a gloo wait), the card.
STOP_S = 20.0
#: The line budget of a failed 4-rank job: everything distenv run and its ranks print.
BUDGET = 25


@dataclass
class Job:
    """One scenario: its agents (one per node), their output, the fault's time and the ranks."""

    out: Path
    agents: list[subprocess.Popen[str]]
    texts: list[str]
    ended: float = 0.0

    @property
    def text(self) -> str:
        return "".join(self.texts)

    def card(self) -> str:
        """Return the card: the end of the output, from its first line."""
        start = self.text.rindex("distenv run: rank ")
        return self.text[start:]

    def fault_time(self) -> float:
        return float((self.out / "fault").read_text())

    def pids(self) -> list[int]:
        return [int(p.read_text()) for p in self.out.glob("pid*")]


CHILD = str(REPO / "tests" / "support" / "scripts" / "rank_child.py")
SCENARIOS = {
    # name: (the rank's program and arguments after OUT, nodes, ranks per node, more options)
    "raise": ([RANK, "--fail", "2:3:raise"], 1, 4, []),
    "segv": ([RANK, "--fail", "3:2:segv"], 1, 4, []),
    "kill": ([RANK, "--fail", "0:2:kill"], 1, 4, []),
    "nodes": ([RANK, "--fail", "3:3:raise"], 2, 2, []),
    # No torch: what is tested is that the card comes once, after the agents' decision.
    "restarts": (
        [CHILD, "--fail-rank", "1", "--fail-mode", "raise", "--sleep", "60"],
        1,
        2,
        ["--max-restarts", "1"],
    ),
    "restarts-nodes": (
        [CHILD, "--fail-rank", "1", "--fail-mode", "raise", "--sleep", "60"],
        2,
        1,
        ["--max-restarts", "1"],
    ),
}


def _start(tmp: Path, name: str) -> Job:
    (program, *arguments), nnodes, ranks, options = SCENARIOS[name]
    out = tmp / name
    out.mkdir()
    env = scrubbed_environ()
    env.pop("OMP_NUM_THREADS", None)
    env["DISTENV_TIMEOUT"] = "60"
    nodes = node_options(nnodes, ranks=ranks) if nnodes > 1 else [["-n", str(ranks)]]
    agents = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "distenv",
                "run",
                *node,
                *options,
                program,
                str(out),
                *arguments,
            ],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in nodes
    ]
    return Job(out, agents, [])


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Job]]:
    """Run every scenario at once; return each one's output once all its agents exited."""
    tmp = tmp_path_factory.mktemp("card")
    started = {name: _start(tmp, name) for name in SCENARIOS}
    deadline = time.monotonic() + TIMEOUT
    try:
        for job in started.values():
            for agent in job.agents:
                text, _ = agent.communicate(timeout=max(1.0, deadline - time.monotonic()))
                job.texts.append(text)
            job.ended = time.time()
        yield started
    finally:
        for job in started.values():
            for agent in job.agents:
                if agent.poll() is None:
                    agent.kill()
                    agent.communicate()


def _common(job: Job, rank: int, how: str, where: str) -> str:
    """Assert what every single-node card says; return the card."""
    card = job.card()
    assert re.match(rf"distenv run: rank {rank} failed first: {how}", card), job.text
    assert f"local rank {rank} on {socket.gethostname()}" in card, job.text
    assert re.search(rf"where: +card_rank\.py:\d+ in {where}", card), job.text
    # The others: stopped by distenv run, or failed after it (their collective broke).
    assert re.search(r"others: +ranks? [0-9,-]+ (stopped by distenv run|failed within)", card)
    assert len(job.text.splitlines()) <= BUDGET, job.text
    # Every rank was there, and none is left.
    assert len(job.pids()) >= 4, job.text
    assert all(gone(pid) for pid in job.pids()), job.text
    assert job.ended - job.fault_time() < STOP_S, job.text
    return card


@pytest.mark.parametrize(
    ("name", "rank", "status", "how", "where"),
    [
        # It exits 1 by itself, or distenv run's stop reaches it while it still unwinds (its
        # peers' broken collectives end them first on a loaded machine): both say it raised.
        (
            "raise",
            2,
            1,
            r"raised ValueError: bad batch at step 3 \((exit status 1|then was killed by SIGTERM)\)",
            "inject",
        ),
        ("segv", 3, 128 + signal.SIGSEGV, "was killed by SIGSEGV", "inject"),
    ],
)
def test_the_card_names_the_rank_that_failed_first(
    jobs: dict[str, Job], name: str, rank: int, status: int, how: str, where: str
) -> None:
    """The cause, not a survivor whose collective it broke: its rank, how, where, its output."""
    job = jobs[name]
    assert [a.returncode for a in job.agents] == [status], job.text
    card = _common(job, rank, how, where)
    assert f"output:  rank {rank} at step" in card or name == "segv", job.text
    # The survivors' tracebacks are counted, not printed: only the cause's reaches the console.
    assert job.text.count("Traceback (most recent call last)") <= 1, job.text
    log = Path(re.findall(r"log: +(\S+)", card)[0])
    assert log.read_text().count("[rank") > 0


def test_sigkill_of_the_store_s_rank_is_the_cause_and_its_consequences_are_counted(
    jobs: dict[str, Job],
) -> None:
    """Rank 0 (the store's host) SIGKILLed: named, though the others raised before it was reaped."""
    job = jobs["kill"]
    assert [a.returncode for a in job.agents] == [128 + signal.SIGKILL], job.text
    card = job.card()
    assert card.startswith("distenv run: rank 0 failed first: was killed by SIGKILL"), job.text
    assert "where:   not recorded (nothing is written at SIGKILL)" in card, job.text
    assert len(job.text.splitlines()) <= BUDGET, job.text
    assert "Traceback" not in job.text, job.text
    assert all(gone(pid) for pid in job.pids()), job.text
    assert job.ended - job.fault_time() < STOP_S, job.text


def test_under_max_restarts_the_card_ends_the_job(jobs: dict[str, Job]) -> None:
    """--max-restarts 1: both attempts fail at rank 1, and one card, last, names it."""
    job = jobs["restarts"]
    assert [a.returncode for a in job.agents] == [1], job.text
    assert job.text.count("failed first") == 1, job.text
    card = job.card()
    assert card.startswith("distenv run: rank 1 failed first: raised RuntimeError"), job.text
    assert re.search(r"where: +rank_child\.py:\d+ in main", card), job.text
    assert "attempt 1 failed: rank 1 on" in job.text, job.text
    assert all(gone(pid) for pid in job.pids()), job.text


def test_two_nodes_name_the_cause_on_its_node_and_point_to_it_on_the_other(
    jobs: dict[str, Job],
) -> None:
    """--nnodes 2: node 1's card names its rank 3; node 0's ranks are said to be consequences."""
    job = jobs["nodes"]
    node0, node1 = job.texts
    assert [a.returncode for a in job.agents] == [1, 1], job.text
    card = node1[node1.rindex("distenv run: rank ") :]
    assert card.startswith("distenv run: rank 3 failed first: raised ValueError"), job.text
    assert "local rank 1 on" in card
    assert "distenv run: no rank on this node failed first" in node0, job.text
    assert "failed first" not in node0.replace("no rank on this node failed first", ""), job.text
    assert len(job.text.splitlines()) <= BUDGET, job.text
    assert all(gone(pid) for pid in job.pids()), job.text
    assert job.ended - job.fault_time() < STOP_S, job.text


CONSEQUENCE = """
import os, sys, time
from pathlib import Path
out = Path(sys.argv[1])
if os.environ["RANK"] == "1":
    def hook(*exc):  # called once the wrapper has written the report
        (out / "fault").write_text(str(time.time()))
        sys.__excepthook__(*exc)
        time.sleep(1)  # a slow exit: rank 0 fails first without being stopped
    sys.excepthook = hook
    raise ValueError("the cause")
while not (out / "fault").exists():
    time.sleep(0.005)
raise RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:29500")
"""


@pytest.mark.parametrize("debug", ["", "1"])
def test_consequences_are_held_back_unless_debugging(tmp_path: Path, debug: str) -> None:
    """A survivor's stderr after the failure goes to the log, counted; DISTENV_DEBUG=1 prints it."""
    script = tmp_path / "consequence.py"
    script.write_text(CONSEQUENCE)
    env = {**scrubbed_environ(), "DISTENV_DEBUG": debug}
    result = subprocess.run(
        [sys.executable, "-m", "distenv", "run", "-n", "2", str(script), str(tmp_path)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    card = result.stderr[result.stderr.index("distenv run: rank 1 failed first: ") :]
    # Stopped while it lingered: the job's status is still its failure's, 1.
    assert "raised ValueError: the cause (then was killed by SIGTERM)" in card, result.stderr
    assert "others:  rank 0 failed within" in card, result.stderr
    assert "(RuntimeError: Connection closed by peer)" in card, result.stderr
    assert "output:" not in card, result.stderr  # its own traceback is not its last output
    printed = "Connection closed by peer [127.0.0.1]" in result.stderr.replace(card, "")
    assert printed == bool(debug), result.stderr
    if not debug:
        held = r"held back here: \d+ lines of rank 0 \(tracebacks: 1, closed connections: 1\)"
        assert re.search(held, card), result.stderr
    log = Path(re.findall(r"log: +(\S+)", card)[0])
    assert "Connection closed by peer [127.0.0.1]" in log.read_text()


REFUSED = """
import os, distenv
if os.environ["RANK"] == "1":
    os.environ["LOCAL_RANK"] = "0"  # its launcher misstates its place: the roll call refuses
distenv.init_dist()
"""


def test_a_roll_call_refusal_is_printed_whole_named_and_not_restarted(tmp_path: Path) -> None:
    """Two ranks claiming local rank 0: the verdict's refusal, raised alike on both, is printed in
    full once, the card names the rank that raised it first (not "the cause is on another node"),
    and --max-restarts does not repeat a start that cannot succeed."""
    script = tmp_path / "refused.py"
    script.write_text(REFUSED)
    result = subprocess.run(
        [sys.executable, "-m", "distenv", "run", "-n", "2", "--max-restarts", "2", str(script)],
        env={**scrubbed_environ(), "DISTENV_TIMEOUT": "60"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    out = result.stderr
    assert result.returncode == 1, out
    said = (
        "distenv.errors.RollCallError: pytorch: roll call failed: 2 ranks on "
        f"{socket.gethostname()!r} (node 0) share local rank 0. Hint: run `distenv doctor` under "
        "the same launcher for a per-rank table"
    )
    assert re.search(rf"^rank [01]: \S+refused\.py:\d+: {re.escape(said)}", out, re.M), out
    assert "not restarted: distenv refused the environment or the configuration" in out, out
    assert "attempt 1" not in out, out
    assert re.search(r"^distenv run: rank [01] failed first: raised RollCallError", out, re.M), out
    assert "another node" not in out, out
    assert out.count("failed first") == 1, out


def test_a_program_that_is_not_python_is_named_by_its_exit_status(tmp_path: Path) -> None:
    """--no-python: no report, no frames; the card still names the rank and its status."""
    result = subprocess.run(
        [sys.executable, "-m", "distenv", "run", "-n", "2", "--no-python", "false"],
        env=scrubbed_environ(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert re.search(r"distenv run: rank [01] failed first: exited with status 1\n", result.stderr)
    assert "where:   not recorded (it raised nothing)" in result.stderr


def test_two_nodes_under_max_restarts_print_the_agreed_first_failure(jobs: dict[str, Job]) -> None:
    """--nnodes 2 --max-restarts 1: the card of rank 1 on its node; node 0 names it, once."""
    job = jobs["restarts-nodes"]
    node0, node1 = job.texts
    assert [a.returncode for a in job.agents] == [1, 1], job.text
    card = node1[node1.rindex("distenv run: rank ") :]
    assert card.startswith("distenv run: rank 1 failed first: raised RuntimeError"), job.text
    assert re.search(r"where: +rank_child\.py:\d+ in main", card), job.text
    assert "distenv run: no rank on this node failed first; the first failure: rank 1 on" in node0
    assert job.text.count("failed first:") == 1, job.text
    assert all(gone(pid) for pid in job.pids()), job.text
