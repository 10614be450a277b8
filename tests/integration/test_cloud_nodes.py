"""SkyPilot tasks and AWS Batch multi-node parallel jobs on this machine: real `distenv run` per node.

Neither service can run here, so each "node" is a process given the environment the service gives
a node (recorded in tests/support/envs/skypilot.py and awsbatch.py from the vendors' documentation
and source), with the master's address replaced by one of this machine's: 127.0.0.1 for
SkyPilot's first IP (its second node becomes 127.0.0.2), this machine's private IPv4 for AWS
Batch's main node (which learns its own address from its interfaces, and must name it as the
child does). The command is the docs page's recipe, read from the page: the task's `run:` line
and the job definition's container command. What runs is real: `distenv run` reading the
vendor's variables on each "node", starting its ranks, all of them finishing an all_reduce.
"""

from __future__ import annotations

import json
import shlex
import socket
import uuid
from collections.abc import Mapping
from typing import Any

import pytest
import yaml

from distenv.launchers.awsbatch import this_address
from distenv.master import scheduler_port
from tests.support import docblocks
from tests.support.envs import awsbatch, skypilot
from tests.support.integration.helpers import PYTHON, RANK_CHECK, Harness, wait_all

HERE = "tests/integration/test_cloud_nodes.py::"


@pytest.fixture
def harness(tmp_path_factory: pytest.TempPathFactory) -> Harness:
    """Launches on this machine only: the "nodes" need no Slurm cluster and no MPI."""
    return Harness.local(tmp_path_factory.mktemp("cloud-nodes"))


def _job_with_free_port(step: str) -> str:
    """Return a fresh job id whose derived port (`scheduler_port`) is free here now: the port
    every node derives alike is what runs, not one the test picks for them."""
    while True:
        job = uuid.uuid4().hex
        with socket.socket() as sock:
            try:
                sock.bind(("", scheduler_port(job, step)))
            except OSError:
                continue
        return job


def _argv(command: list[str], env: Mapping[str, str]) -> list[str]:
    """Return the recipe's command as this machine runs it: `distenv` is the venv's, train.py
    the rank program, and ``$NAME`` expanded from the node's environment (no shell)."""
    assert command[:2] == ["distenv", "run"], command
    words = [env[w[1:]] if w.startswith("$") else w for w in command[2:]]
    return [
        PYTHON,
        "-m",
        "distenv",
        "run",
        *[str(RANK_CHECK) if w == "train.py" else w for w in words],
    ]


def _records(results: list[Any]) -> list[dict[str, Any]]:
    return sorted(
        [rec for result in results for rec in result.ok().records()],
        key=lambda r: r["info"]["rank"],
    )


def _check(records: list[dict[str, Any]], nodes: int, per_node: int) -> None:
    world = nodes * per_node
    assert [r["info"]["rank"] for r in records] == list(range(world))
    for rec in records:
        info = rec["info"]
        assert info["launcher"] == "pytorch", rec
        assert (info["world_size"], info["local_world_size"], info["num_nodes"]) == (
            world,
            per_node,
            nodes,
        )
        assert info["node_rank"] == info["rank"] // per_node, rec
        assert rec["all_reduce"] == world * (world + 1) // 2, rec
    assert len({r["info"]["job_id"] for r in records}) == 1, records


def test_skypilot_task_runs_one_job_across_its_nodes(harness: Harness) -> None:
    """The page's task YAML: its `run:` line on each of its `num_nodes` nodes, with SkyPilot's
    variables for `accelerators: A100:2`, starts 2 ranks per node of one job."""
    (block,) = docblocks.recipe(HERE + "test_skypilot_task_runs_one_job_across_its_nodes", "yaml")
    task = yaml.safe_load(block.code)
    gpus = int(str(task["resources"]["accelerators"]).rpartition(":")[2])
    assert task["num_nodes"] == 2
    # distenv is not on PyPI: setup installs the wheel `python -m build --wheel` writes to dist/.
    [(target, source)] = task["file_mounts"].items()
    assert (source, task["setup"]) == ("./dist", f"pip install {target}/distenv-*.whl")
    recorded = {
        **skypilot.SKY_2N_NODE0,
        "SKYPILOT_NUM_GPUS_PER_NODE": str(gpus),
        "SKYPILOT_TASK_ID": _job_with_free_port("0"),
    }
    nodes = skypilot.two_nodes(recorded)
    launches = [
        harness.start(
            _argv(shlex.split(task["run"]), node),
            env=harness.env(extra={**node, "DISTENV_TIMEOUT": "20"}),
        )
        for node in nodes
    ]
    records = _records(wait_all(launches))
    _check(records, 2, gpus)
    assert {r["info"]["master_addr"] for r in records} == {"127.0.0.1"}


def test_aws_batch_job_runs_one_job_across_its_nodes(harness: Harness) -> None:
    """The page's job definition: its container command on the main node (told no address: it
    takes its interface's) and on the child (told the main node's address: this machine's) starts
    2 ranks per node of one job, every rank naming one master, on the port both derive from the
    job id without '#N'."""
    (block,) = docblocks.recipe(HERE + "test_aws_batch_job_runs_one_job_across_its_nodes", "json")
    definition = json.loads(block.code)["nodeProperties"]
    assert (definition["numNodes"], definition["mainNode"]) == (2, 0)
    command = definition["nodeRangeProperties"][0]["container"]["command"]
    main = this_address()
    assert main is not None, "this machine has no private IPv4 address to be the main node's"
    nodes = awsbatch.two_nodes(_job_with_free_port("1"), main)
    launches = [
        harness.start(
            _argv(command, node), env=harness.env(extra={**node, "DISTENV_TIMEOUT": "20"})
        )
        for node in nodes
    ]
    records = _records(wait_all(launches))
    _check(records, 2, int(command[command.index("--nproc-per-node") + 1]))
    assert {(r["info"]["master_addr"], r["info"]["master_port"]) for r in records} == {
        (main, scheduler_port(nodes[0]["AWS_BATCH_JOB_ID"].partition("#")[0], "1"))
    }
