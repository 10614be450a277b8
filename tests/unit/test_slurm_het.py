"""Slurm heterogeneous jobs and job arrays, from environments captured on the real test cluster.

The layouts of every captured rank are in tests/unit/test_captured.py (CASES); this file pins what the
docs state as measured about het steps and arrays, and the refusals where a het layout cannot be
resolved.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distenv import DistEnvError, detect
from distenv.errors import InconsistentEnvironmentError, MissingVariableError
from distenv.launchers.registry import BUILTIN
from tests.support.envs import slurm

SLURM = BUILTIN["slurm"]
CAPTURES = Path(__file__).resolve().parents[1] / "support" / "envs" / "captures"


def _captured(name: str) -> list[dict[str, str]]:
    """Every variable capture_env.py recorded for each rank of a scenario (not only declared ones)."""
    lines = (CAPTURES / f"{name}.jsonl").read_text().splitlines()
    return [json.loads(line)["env"] for line in lines]


# ---- What docs/start/slurm.md states as measured --------------------------------------------


def test_measured_het_step_lists_follow_host_names_not_ranks() -> None:
    """`salloc -w n2 -n1 : -w n1 -n3 srun --het-group=0,1`: rank 0 on n2 with SLURM_NODEID 0,
    while the step's node list is n[1-2] and its tasks per node 3,1 (host-name order)."""
    envs = slurm.SRUN_HET_REVERSED
    assert [e["SLURM_PROCID"] for e in envs] == ["0", "1", "2", "3"]  # global across components
    assert [e["SLURMD_NODENAME"] for e in envs] == ["n2", "n1", "n1", "n1"]
    assert [e["SLURM_NODEID"] for e in envs] == ["0", "1", "1", "1"]  # component offset + index
    for env in envs:
        assert env["SLURM_STEP_NODELIST"] == "n[1-2]"
        assert env["SLURM_STEP_TASKS_PER_NODE"] == "3,1"
        assert env["SLURM_HET_SIZE"] == "2"
        assert env["SLURM_JOB_NODELIST_HET_GROUP_0"] == "n2"
        assert env["SLURM_JOB_ID"] == envs[0]["SLURM_JOB_ID"]  # the leader's, on every task


def test_measured_no_variable_names_the_component() -> None:
    """Every component-describing variable (…_HET_GROUP_<n>, …_PACK_GROUP_<n>, SLURM_HET_SIZE) has
    the same value on the task of component 0 and the tasks of component 1."""
    for name in ("srun_het_reversed", "srun_het_2n_4t", "srun_het_direct"):
        envs = _captured(name)
        het = {k for env in envs for k in env if "_GROUP_" in k or k in ("SLURM_HET_SIZE",)}
        assert "SLURM_HET_SIZE" in het, name
        for key in het:
            assert len({env.get(key) for env in envs}) == 1, (name, key)


def test_measured_srun_made_het_job_has_only_the_pack_spelling() -> None:
    """`srun -w n2 -n2 : -w n1 -n2` (a het job srun creates) sets SLURM_JOB_NODELIST_PACK_GROUP_0
    but no _HET_GROUP_ node list; distenv takes the master from the PACK spelling."""
    for env in _captured("srun_het_direct"):
        assert env["SLURM_JOB_NODELIST_PACK_GROUP_0"] == "n2"
        assert not any(k.startswith("SLURM_JOB_NODELIST_HET_GROUP") for k in env)
    assert {detect("auto", e).master_addr for e in slurm.SRUN_HET_DIRECT} == {"n2"}


def test_measured_array_elements_have_their_own_job_ids() -> None:
    """`sbatch --array=0-1 -n2` on one node: each element has its own SLURM_JOB_ID and shares
    SLURM_ARRAY_JOB_ID, which equals one element's job id; scopes and ports differ."""
    envs = slurm.SBATCH_ARRAY_2X2T
    elements = {e["SLURM_ARRAY_TASK_ID"]: e for e in envs}
    assert sorted(elements) == ["0", "1"]
    assert len({e["SLURM_ARRAY_JOB_ID"] for e in envs}) == 1
    job_ids = {e["SLURM_JOB_ID"] for e in elements.values()}
    assert len(job_ids) == 2
    assert envs[0]["SLURM_ARRAY_JOB_ID"] in job_ids
    infos = [detect("auto", e) for e in envs]
    scopes = {e["SLURM_ARRAY_TASK_ID"]: SLURM.scope(e) for e in envs}
    ports = {e["SLURM_ARRAY_TASK_ID"]: i.master_port for e, i in zip(envs, infos, strict=True)}
    assert scopes["0"] != scopes["1"]
    assert ports["0"] != ports["1"]
    for env, info in zip(envs, infos, strict=True):
        assert scopes[env["SLURM_ARRAY_TASK_ID"]] == f"slurm/{env['SLURM_JOB_ID']}/0"
        assert info.job_id == env["SLURM_JOB_ID"]
        assert SLURM.requeue_command(env) == [
            "scontrol",
            "requeue",
            f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}",
        ]


# ---- The job scope is the leader's for every component ----------------------------------------


@pytest.mark.parametrize("name", ["SRUN_HET_2N_4T", "SRUN_HET_REVERSED", "SRUN_HET_DIRECT"])
def test_every_component_shares_one_scope_and_port(name: str) -> None:
    """Scope and port come from the leader's SLURM_JOB_ID and the step: never the component."""
    envs = getattr(slurm, name)
    scopes = {SLURM.scope(e) for e in envs}
    assert scopes == {f"slurm/{envs[0]['SLURM_JOB_ID']}/0"}
    assert len({detect("auto", e).master_port for e in envs}) == 1


# ---- Refusals where a het layout cannot be resolved --------------------------------------------


def _reversed(rank: int, **changes: str | None) -> dict[str, str]:
    env = dict(slurm.SRUN_HET_REVERSED[rank])
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def test_step_without_component_0_of_three_needs_master_addr() -> None:
    """A step of components 1 and 2 of a 3-component job: rank 0's host is unknown; the error
    names the variables, their values and both fixes, and MASTER_ADDR resolves it."""
    env = _reversed(0, SLURM_HET_SIZE="3", SLURM_JOB_NODELIST_HET_GROUP_0="n9")
    with pytest.raises(MissingVariableError) as caught:
        detect("auto", env)
    text = str(caught.value)
    assert text.startswith("slurm: $MASTER_ADDR is not set"), text
    assert (
        "no host of $SLURM_JOB_NODELIST_HET_GROUP_0='n9' is in $SLURM_STEP_NODELIST='n[1-2]'"
        in text
    )
    assert "export MASTER_ADDR" in text
    assert "srun --het-group=0," in text
    info = detect("auto", {**env, "MASTER_ADDR": "n2"})
    assert (info.master_addr, info.local_world_size) == ("n2", 1)


def test_het_step_without_component_lists_needs_master_addr() -> None:
    """SLURM_HET_SIZE without component 0's node list in either spelling: refused, not guessed."""
    env = _reversed(1, SLURM_JOB_NODELIST_HET_GROUP_0=None, SLURM_JOB_NODELIST_PACK_GROUP_0=None)
    with pytest.raises(MissingVariableError, match=r"SLURM_JOB_NODELIST_HET_GROUP_0 is not set"):
        detect("auto", env)


def test_het_step_without_node_name_is_refused() -> None:
    """The local size needs SLURMD_NODENAME in a het step; its absence is named with the fix."""
    with pytest.raises(MissingVariableError) as caught:
        detect("auto", _reversed(2, SLURMD_NODENAME=None))
    assert "SLURMD_NODENAME" in str(caught.value)
    assert "srun --het-group=0,1" in str(caught.value)


def test_het_step_node_name_outside_the_step_list_is_refused() -> None:
    """A SLURMD_NODENAME that the step's node list does not hold: launcher, variable, value."""
    with pytest.raises(InconsistentEnvironmentError) as caught:
        detect("auto", _reversed(2, SLURMD_NODENAME="n7"))
    text = str(caught.value)
    assert "slurm: $SLURMD_NODENAME='n7' is not in $SLURM_STEP_NODELIST='n[1-2]'" in text
    assert "Hint:" in text


def test_plain_step_ignores_the_node_name() -> None:
    """Outside het jobs the layout stays SLURM_NODEID's (no new variable is needed)."""
    env = {k: v for k, v in slurm.SRUN_2N_4T[2].items() if k != "SLURMD_NODENAME"}
    info = detect("auto", env)
    assert (info.local_world_size, info.node_rank, info.master_addr) == (2, 1, "n1")


def test_every_het_refusal_is_a_distenv_error() -> None:
    """Corrupt het values are DistEnvErrors (named variable), never a raw exception."""
    for changes in (
        {"SLURM_HET_SIZE": "two"},
        {"SLURM_JOB_NODELIST_HET_GROUP_0": "n[2"},
    ):
        with pytest.raises(DistEnvError) as caught:
            detect("auto", _reversed(0, **changes))
        assert next(iter(changes)) in str(caught.value)
