"""RankInfo: validation, the env contract, JSON shape."""

from __future__ import annotations

import pytest

from distenv import RankInfo
from distenv.errors import InconsistentEnvironmentError, MasterResolutionError

GOOD = {
    "launcher": "slurm",
    "rank": 5,
    "world_size": 8,
    "local_rank": 1,
    "local_world_size": 4,
    "node_rank": 1,
    "num_nodes": 2,
    "master_addr": "node01",
    "master_port": 12345,
    "job_id": "77",
    "restart_count": 0,
}


def test_to_env_is_torchruns_contract() -> None:
    """The exported variables are exactly torchrun's, with string values."""
    assert RankInfo(**GOOD).to_env() == {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_RANK": "5",
        "ROLE_WORLD_SIZE": "8",
        "MASTER_ADDR": "node01",
        "MASTER_PORT": "12345",
    }


def test_to_dict_has_the_stable_json_fields_in_order() -> None:
    """`distenv info --json` keys and types are a published interface."""
    assert RankInfo(**GOOD).to_dict() == GOOD
    assert list(RankInfo(**GOOD).to_dict()) == list(GOOD)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rank": 8}, "rank=8 is outside [0, world_size=8)"),
        ({"rank": -1}, "rank=-1 is outside [0, world_size=8)"),
        ({"local_rank": 4}, "local_rank=4 is outside [0, local_world_size=4)"),
        ({"node_rank": 2}, "node_rank=2 is outside [0, num_nodes=2)"),
        ({"world_size": 0, "rank": 0}, "world_size=0 must be at least 1"),
        ({"local_world_size": 9, "world_size": 8}, "local_world_size=9 exceeds world_size=8"),
        ({"num_nodes": 9, "node_rank": 0}, "num_nodes=9 exceeds world_size=8"),
        ({"master_port": 0}, "master_port=0 is not a port"),
        ({"master_port": 65536}, "master_port=65536 is not a port"),
        ({"master_addr": ""}, "master_addr='' is not a host name"),
        ({"rank": "5"}, "rank='5' is not an int"),
        ({"rank": True}, "rank=True is not an int"),
        ({"restart_count": -1}, "restart_count=-1 is not a non-negative int"),
        ({"restart_count": "1"}, "restart_count='1' is not a non-negative int"),
    ],
)
def test_invalid_fields_are_refused(change: dict[str, object], message: str) -> None:
    """RankInfo checks itself: every inconsistency raises, naming the fields."""
    with pytest.raises(InconsistentEnvironmentError) as caught:
        RankInfo(**{**GOOD, **change})  # type: ignore[arg-type]
    assert message in str(caught.value)
    assert str(caught.value).startswith("slurm: ")


def test_checked_names_the_source_variables() -> None:
    """Errors raised while a launcher builds a RankInfo name the variables the values came from."""
    fields = {k: v for k, v in GOOD.items() if k != "launcher"}
    with pytest.raises(InconsistentEnvironmentError) as caught:
        RankInfo.checked(
            "slurm",
            {"rank": "SLURM_PROCID", "world_size": "SLURM_STEP_NUM_TASKS"},
            **{**fields, "rank": 9},
        )
    assert "rank=9 ($SLURM_PROCID) is outside [0, world_size=8 ($SLURM_STEP_NUM_TASKS))" in str(
        caught.value
    )


def test_frozen_and_keyword_only() -> None:
    """A RankInfo cannot be changed in place nor built positionally."""
    info = RankInfo(**GOOD)
    with pytest.raises(AttributeError):
        info.rank = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        RankInfo("slurm", 0, 1, 0, 1, 0, 1, "h", 1)  # type: ignore[misc]


def test_unresolved_master_cannot_be_exported() -> None:
    """An MPI RankInfo without a master refuses to produce an env contract."""
    info = RankInfo(**{**GOOD, "master_addr": None, "master_port": None})
    assert not info.is_resolved
    with pytest.raises(MasterResolutionError, match="not resolved yet"):
        info.to_env()


def test_single_is_rank_0_of_1() -> None:
    """RankInfo.single describes a one-process world on loopback."""
    info = RankInfo.single("none")
    assert (info.rank, info.world_size, info.num_nodes, info.master_addr) == (0, 1, 1, "127.0.0.1")
    assert info.is_main
