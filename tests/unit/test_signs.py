"""``auto`` never answers "rank 0 of 1" where the environment says the process is one of several.

The rule covers every launcher's declared variables (enumerated here, so a launcher added later
is checked too).
"""

from __future__ import annotations

import pytest

from distenv.detection.pipeline import detect
from distenv.detection.signs import RANKS, SIZES, multi_process_signs
from distenv.errors import DistEnvError, InconsistentEnvironmentError
from distenv.launchers.registry import BUILTIN
from distenv.local.plan import scheduler_layout

DECLARED = sorted(
    {
        (var.name, var.field)
        for launcher in BUILTIN.values()
        for var in launcher.variables
        if var.field in SIZES | RANKS
    }
)


@pytest.mark.parametrize(("name", "field"), DECLARED, ids=[name for name, _ in DECLARED])
def test_no_declared_variable_saying_several_leaves_a_single_process(name: str, field: str) -> None:
    """A world size, node count or local size of 2, or a rank of 1, alone in the environment:
    auto refuses (this rule, or the launcher that reads it), never rank 0 of 1."""
    with pytest.raises(DistEnvError) as caught:
        detect("auto", {name: "2" if field in SIZES else "1"})
    assert name in str(caught.value) or caught.value.variable is not None


@pytest.mark.parametrize(("name", "field"), DECLARED, ids=[name for name, _ in DECLARED])
def test_a_value_that_says_one_process_is_no_sign(name: str, field: str) -> None:
    """A size of 1 or a rank of 0 is what a single process has: no sign of several."""
    env = {name: "1" if field in SIZES else "0"}
    assert multi_process_signs(BUILTIN.values(), env) == []


def test_grid_engine_slots_above_one_are_a_sign_where_no_job_is_detected() -> None:
    """Grid Engine's NSLOTS is 1 in a serial job and above 1 only in a parallel environment's
    (submit(1)): 1 says nothing; 8 with no Grid Engine job detected is refused, naming `sge`."""
    assert detect("auto", {"NSLOTS": "1"}).world_size == 1
    with pytest.raises(InconsistentEnvironmentError, match=r"NSLOTS='8' \(sge\)"):
        detect("auto", {"NSLOTS": "8", "PE_HOSTFILE": "/tmp/pe"})


def test_launcher_none_runs_alone_on_purpose() -> None:
    """--launcher none is the way out: the signs are not read."""
    info = detect("none", {"SKYPILOT_NUM_NODES": "4", "SKYPILOT_NODE_RANK": "2"})
    assert (info.launcher, info.rank, info.world_size) == ("none", 0, 1)


def test_a_value_that_is_no_number_is_no_sign() -> None:
    """A world size that is no number, read by no detected launcher, says nothing."""
    assert multi_process_signs(BUILTIN.values(), {"WORLD_SIZE": "two"}) == []
    assert detect("auto", {"WORLD_SIZE": "two"}).world_size == 1


def test_a_launcher_that_reads_the_value_refuses_it_malformed() -> None:
    """SkyPilot's node count that is no number: skypilot detects it and names it (issue #29)."""
    with pytest.raises(DistEnvError) as caught:
        detect("auto", {"SKYPILOT_NUM_NODES": "two"})
    assert (caught.value.source, caught.value.variable) == ("skypilot", "SKYPILOT_NUM_NODES")


def test_distenv_run_on_one_node_of_such_a_job_is_refused_not_run_as_a_whole_job() -> None:
    """`distenv run -n 8` on each node of a job no launcher claims (a lone WORLD_SIZE), without
    --nnodes: each would be a job of its own; it is refused, and the message says how to run one
    node on purpose."""
    with pytest.raises(InconsistentEnvironmentError) as caught:
        scheduler_layout("run", {"WORLD_SIZE": "2"})
    assert "--standalone" in (caught.value.hint or "")
