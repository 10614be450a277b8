"""The problems' field kinds and their one parser (`distenv.bootstrap.kinds`): each kind refuses
what it must, naming the key, and every problem class is declared and read back whole."""

import json
from typing import Any, NamedTuple

import pytest

from distenv.bootstrap.kinds import Integer, Items, build, declare, length, listed, number, world
from distenv.bootstrap.problems import (
    CODES,
    ClaimedTwice,
    Disagreement,
    ForeignCheckIn,
    ForeignCount,
    LocalLayout,
    Missing,
    MixedLayout,
    OtherSize,
    Placement,
    Problem,
    SharedGpu,
    SharedLocalRank,
    SilentNodes,
    Unreachable,
    parse_problem,
    problem_json,
)
from distenv.bootstrap.records import MAX_SHOWN, Fields, ForeignRecordError

EXAMPLES: list[Problem] = [
    Missing(2, 4, (2, 3), (("gpu001",), ()), (1, None)),
    Disagreement("backend", ("gloo", "nccl"), ((0, 1), (2,)), (2, 1)),
    Disagreement("world_size", (4, 8), ((0,), (1,)), (1, 1)),
    ClaimedTwice(1, (11, 12), ("a", "b")),
    SharedLocalRank("gpu000", None, 0, 2),
    Placement(1, ("gpu000", "gpu001")),
    MixedLayout("node_rank", (0, 1), 2, ("gpu000",), (2, 3), 2, ("gpu001",)),
    LocalLayout("gpu001", 1, 2, (2, 3), (0, 3), (4,)),
    SharedGpu("gpu000", "GPU-0a1b", (0, 1), 2),
    ForeignCheckIn(("extra/1",), 1),
    ForeignCount(5, 4),
    SilentNodes(1, (2,), (1,), (2,)),
    Unreachable("gpu001", 2, "gloo", (("10.0.0.2", "eth0", "refused"),), ("gpu000",)),
    OtherSize(4, (6,), ("gpu001",)),
]


def test_every_problem_class_is_declared_and_read_back_whole() -> None:
    """Each class's JSON, through the store's text, parses to the same problem."""
    assert {type(p) for p in EXAMPLES} == set(CODES)
    for problem in EXAMPLES:
        data = json.loads(json.dumps(problem_json(problem)))
        assert parse_problem("verdict", data, 4) == problem


class _Pair(NamedTuple):
    ranks: tuple[int, ...]
    total: int


_PAIR = declare(
    {
        "ranks": Items(number(0, world()), "field {name!r} is not a list of ranks"),
        "total": Integer(length("ranks", 1), world(1)),
    }
)(_Pair)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        ({"ranks": [0, 4], "total": 2}, "field 'ranks' is not a list of ranks"),
        ({"ranks": [True], "total": 1}, "field 'ranks' is not a list of ranks"),
        ({"ranks": "01", "total": 2}, "field 'ranks' is not a list of at most 16"),
        ({"ranks": list(range(MAX_SHOWN + 1)), "total": 2}, "is not a list of at most 16"),
        ({"ranks": [0, 1], "total": 1}, "field 'total' is not an integer in [2, 5)"),
        ({"ranks": [], "total": 0}, "field 'total' is not an integer in [1, 5)"),
        ({"ranks": [0], "total": 5}, "field 'total' is not an integer in [1, 5)"),
        ({"ranks": [0], "total": 1.0}, "field 'total' is not an integer in [1, 5)"),
    ],
)
def test_a_kind_refuses_what_it_must(data: dict[str, Any], why: str) -> None:
    """Ranks are of the reader's world, lists are capped, a total counts at least its list."""
    with pytest.raises(ForeignRecordError) as info:
        build(_PAIR, Fields("verdict", data, frozenset(_Pair._fields)), 4)
    assert info.value.key == "verdict"
    assert why in info.value.why
    assert build(_PAIR, Fields("verdict", {"ranks": [3], "total": 4}, {"ranks", "total"}), 4) == (
        (3,),
        4,
    )


def test_nested_lists_are_read_as_tuples_and_capped() -> None:
    """A list of lists: each inner list capped and checked, read as a tuple."""
    element = listed(number(0, world()), cap=2)
    assert element([0, 1], 2, {})
    assert not element([0, 1, 1], 2, {})
    assert not element([0, 2], 2, {})
    assert not element("01", 2, {})


def test_a_declaration_must_name_exactly_the_class_fields() -> None:
    """A field left undeclared (or declared but absent) fails when the class is made."""
    with pytest.raises(TypeError, match="_Pair"):
        declare({"ranks": Items(number(0, world()), "x")})(_Pair)
    with pytest.raises(TypeError, match="_Pair"):
        declare({"ranks": Integer(0, 1), "total": Integer(0, 1)}, same=("ranks", "other"))(_Pair)


@pytest.mark.parametrize(
    ("problem", "why"),
    [
        ({"code": "claimed", "rank": 1, "pids": [11, 12], "hosts": ["a"]}, "pids and hosts differ"),
        ({"code": "claimed", "rank": 1, "pids": [0], "hosts": ["a"]}, "pids are not process ids"),
        (
            {
                "code": "disagree",
                "field": "backend",
                "values": ["gloo"],
                "ranks": [[0]],
                "totals": [0],
            },
            "totals are not counts",
        ),
        (
            {
                "code": "disagree",
                "field": "backend",
                "values": ["gloo"],
                "ranks": [[0]],
                "totals": [],
            },
            "values, ranks and totals differ in length",
        ),
        (
            {"code": "silent_nodes", "total": 1, "leaders": [2], "nodes": [1], "sizes": [5]},
            "nodes and sizes do not match the leaders",
        ),
        (
            {"code": "foreign", "keys": [], "total": 1},
            "field 'keys' is not a list of record keys",
        ),
        ({"code": "foreign_count", "records": 4, "counted": 4}, "field 'counted'"),
        (
            {
                "code": "unreachable",
                "host": "h",
                "rank": 0,
                "backend": "gloo",
                "tried": [["10.0.0.2", None, "EVIL"]],
                "missed_by": [],
            },
            "field 'tried' is not a list of probes",
        ),
    ],
)
def test_each_problem_keeps_its_checks(problem: dict[str, Any], why: str) -> None:
    """The declarations keep the hand-written parsers' checks and their words."""
    with pytest.raises(ForeignRecordError) as info:
        parse_problem("verdict", problem, 4)
    assert why in info.value.why
    assert "EVIL" not in str(info.value)


@pytest.mark.parametrize(
    "problem",
    [
        {"code": []},
        {"code": {"missing": 1}},
        {
            "code": "unreachable",
            "host": "h",
            "rank": 0,
            "backend": "gloo",
            "tried": [["10.0.0.2", None, ["refused"]]],
            "missed_by": [],
        },
    ],
)
def test_an_unhashable_value_is_a_foreign_record_not_a_type_error(problem: dict[str, Any]) -> None:
    """A forged code or probe result that is a list or an object is refused like any other
    foreign value (before: an unhashable-type TypeError from the dict lookup)."""
    with pytest.raises(ForeignRecordError) as info:
        parse_problem("verdict", problem, 4)
    assert info.value.key == "verdict"
