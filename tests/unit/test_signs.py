"""``auto`` never answers "rank 0 of 1" where the environment says the process is one of several.

The rule covers every launcher's declared variables (enumerated here, so a launcher added later
is checked too) and the variables of launchers distenv has no module for yet (`UNREAD`).
"""

from __future__ import annotations

import pytest

from distenv.detection.pipeline import detect
from distenv.detection.signs import RANKS, SIZES, UNREAD, Unread, multi_process_signs
from distenv.errors import DistEnvError, InconsistentEnvironmentError
from distenv.launchers import BUILTIN
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


@pytest.mark.parametrize("unread", UNREAD, ids=[u.name for u in UNREAD])
def test_a_launcher_distenv_does_not_read_yet_is_refused_not_run_alone(unread: Unread) -> None:
    """A launcher without a module yet (UNREAD): one of N nodes is refused, naming the
    variable, its value and the vendor, with the way to start the ranks or to run alone."""
    name, vendor, field = unread.name, unread.launcher, unread.field
    env = {name: "3" if field in SIZES else "2", "PE_HOSTFILE": "/var/spool/sge/pe_hostfile"}
    with pytest.raises(InconsistentEnvironmentError) as caught:
        detect("auto", env)
    error = caught.value
    assert (error.source, error.variable, error.value) == ("auto", name, env[name])
    assert f"{name}='{env[name]}' ({vendor})" in str(error)
    assert "rank 0 of 1" in str(error)
    assert "--launcher none" in (error.hint or "")


def test_grid_engine_slots_count_only_in_a_parallel_environment() -> None:
    """Grid Engine sets NSLOTS in every job: without PE_HOSTFILE it says nothing."""
    assert detect("auto", {"NSLOTS": "8"}).world_size == 1
    with pytest.raises(InconsistentEnvironmentError):
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
