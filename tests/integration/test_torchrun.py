"""torchrun for real: alone on this machine, and one torchrun per node inside an srun step."""

from __future__ import annotations

import pytest

from distenv.master import free_port
from tests.support.integration.helpers import (
    HARNESS,
    JOB_NAME,
    ONE_NODE,
    PYTHON,
    STEPS,
    TORCHRUN,
    TWO_BY_TWO,
    Harness,
    check_world,
    rank_check,
    wait_all,
)


def test_torchrun_alone(harness: Harness) -> None:
    """`torchrun --nproc-per-node 4`, auto and --launcher torchrun: the `pytorch` backend.

    Each gets its own --master-port (the static rendezvous default 29500 is shared machine-wide);
    with it torchrun exports MASTER_ADDR=127.0.0.1 (its --master-addr default), not localhost.
    """
    script = rank_check()[1:]  # torchrun runs the script with its own interpreter
    results = wait_all(
        [
            harness.start(
                [
                    TORCHRUN,
                    "--nproc-per-node",
                    "4",
                    "--master-port",
                    str(free_port()),
                    *script,
                    *args,
                ]
            )
            for args in ((), ("--launcher", "torchrun"))
        ]
    )
    for result in results:
        recs = check_world(result, launcher="pytorch", layouts=ONE_NODE, master="127.0.0.1")
        assert {r["env"]["RANK"] for r in recs} == {"0", "1", "2", "3"}


@pytest.mark.slurm
def test_one_torchrun_per_node_inside_srun(harness: Harness) -> None:
    """One torchrun agent per node (`srun -N 2 --ntasks-per-node 1`), c10d rendezvous at the first node.

    auto and --launcher torchrun read torchrun's variables (rank 0-3, 2 per node), not the agent
    task's SLURM_PROCID; --launcher slurm is refused, naming pytorch.
    """

    def step(port: int, *args: str) -> list[str]:
        return ["srun", "-N", "2", "--ntasks-per-node", "1", PYTHON,
                str(HARNESS / "torchrun_slurm.py"), "--nproc-per-node", "2", "--port", str(port),
                "--", *rank_check(*args)[1:]]  # fmt: skip

    result = harness.run(
        ["salloc", "-J", JOB_NAME, "-N", "2", PYTHON, STEPS,
         *step(29511), ":::", *step(29512, "--launcher", "torchrun"), ":::",
         *step(29513, "--launcher", "slurm")],
        cluster="multi",
    ).ok()  # fmt: skip
    auto, named, wrong = result.steps()
    for s in (auto, named):
        # master: the rendezvous host, the step's first node (n1 on an idle cluster)
        recs = check_world(s, launcher="pytorch", layouts=TWO_BY_TWO)
        hosts = [r["hostname"] for r in recs]
        assert hosts[0] == hosts[1] != hosts[2] == hosts[3], hosts
    assert wrong.returncode != 0, wrong.text
    assert "rank_check: slurm: " in wrong.stderr, wrong.text
    assert "started by pytorch" in wrong.stderr, wrong.text
    assert not wrong.records(), wrong.text
