"""The store's records: nothing read from the store is trusted (distenv.bootstrap.records).

Every value distenv reads back from rank 0's store is parsed against its schema; anything else is a
`ForeignRecordError` naming the key, never a raw exception and never an echo of the value.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distenv.bootstrap.problems import (
    ClaimedTwice,
    Disagreement,
    ForeignCheckIn,
    ForeignCount,
    LocalLayout,
    Missing,
    MixedLayout,
    OtherSize,
    Placement,
    SharedGpu,
    SharedLocalRank,
    SilentNodes,
    foreign_records,
)
from distenv.bootstrap.records import (
    MAX_CANDIDATES,
    MAX_CHECKIN_BYTES,
    MAX_SHOWN,
    CheckIn,
    ForeignRecordError,
    NetRecord,
    parse_checkin,
    parse_claim,
    parse_scope,
)
from distenv.bootstrap.scope import job_scope
from distenv.bootstrap.verdict import Place, Verdict, parse_place, parse_verdict, validate

SCOPE = "slurm/4242/0/n4"


def checkin(rank: int = 1, **change: Any) -> CheckIn:
    base = CheckIn(
        rank=rank,
        world_size=4,
        local_rank=rank % 2,
        local_world_size=2,
        node_rank=rank // 2,
        hostname=f"gpu{rank // 2:03d}",
        pid=4000 + rank,
        launcher="slurm",
        master="gpu000:26269",
        backend="nccl",
        torch_version="2.13.0+cu128",
        device="GPU-8f2c1e4a-6b1d-4c3e-9a7f-2d5e1b0c9a11",
        scope=SCOPE,
    )
    return base._replace(**change)


# ---- strategies: what distenv itself writes ------------------------------------------------------

hosts = st.from_regex(r"[a-z][a-z0-9-]{0,20}(\.[a-z0-9]{1,8}){0,2}", fullmatch=True)
scopes = st.from_regex(r"[a-z]{2,8}/[A-Za-z0-9._-]{1,20}/[0-9-]{1,5}/n[0-9]{1,5}", fullmatch=True)


addresses = st.from_regex(
    r"10\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}|fe80::[0-9a-f]{1,4}%eth[0-9]", fullmatch=True
)


@st.composite
def nets(draw: st.DrawFn) -> NetRecord:
    """What a rank offers to the network probe (distenv.bootstrap.paths)."""
    count = draw(st.integers(1, MAX_CANDIDATES))
    listed = tuple(
        (draw(addresses), draw(st.integers(0, 65535)), draw(st.none() | st.just("eth0")))
        for _ in range(count)
    )
    backends = draw(st.sampled_from([("gloo",), ("nccl",), ("gloo", "nccl")]))
    return NetRecord(
        token=draw(st.from_regex(r"[0-9a-f]{16}", fullmatch=True)),
        addresses=listed,
        defaults=tuple((b, draw(st.integers(0, count - 1))) for b in backends),
        route=draw(st.none() | st.integers(0, count - 1)),
        reached=draw(st.none() | st.integers(0, (1 << MAX_CANDIDATES) - 1)),
    )


@st.composite
def checkins(draw: st.DrawFn) -> CheckIn:
    world = draw(st.integers(1, 1 << 16))
    local = draw(st.none() | st.integers(1, 64))  # None: Flux names no local size
    host = draw(hosts)
    return CheckIn(
        rank=draw(st.integers(0, world - 1)),
        world_size=world,
        local_rank=draw(st.integers(0, (world if local is None else local) - 1)),
        local_world_size=local,
        node_rank=draw(st.integers(0, world - 1)),
        hostname=host,
        pid=draw(st.integers(1, 1 << 22)),
        launcher=draw(st.sampled_from(["slurm", "mpi", "pytorch", "lsf", "none", "pbs"])),
        master=f"{draw(hosts)}:{draw(st.integers(1, 65535))}",
        backend=draw(st.sampled_from(["gloo", "nccl", "cpu:gloo,cuda:nccl", "mpi"])),
        torch_version=draw(st.sampled_from(["2.13.0", "2.13.0+cpu", "2.6.0a0+git1234abc"])),
        device=draw(st.none() | st.just("GPU-5a3e9b1c") | st.just("0000:3b:00")),
        allow_gpu_sharing=draw(st.booleans()),
        scope=draw(scopes),
        net=draw(st.none() | nets()),
    )


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=6)
    ),
    max_leaves=30,
)


def _refusal(parse: Callable[[], object]) -> ForeignRecordError | None:
    """Return the ForeignRecordError `parse` raises, None if it parses (any other error escapes)."""
    try:
        parse()
    except ForeignRecordError as exc:
        return exc
    return None


@settings(max_examples=300, deadline=None)
@given(checkins())
def test_every_record_distenv_writes_parses_back_unchanged(record: CheckIn) -> None:
    """What a rank writes is exactly what rank 0 reads: the schema accepts distenv's own records."""
    assert parse_checkin("checkin/1", record.to_json()) == record


@settings(max_examples=500, deadline=None)
@given(st.one_of(json_values, st.binary(max_size=200)))
def test_any_value_is_a_record_or_a_foreign_record_error(value: object) -> None:
    """Arbitrary JSON or bytes under a check-in or verdict key: parsed, or ForeignRecordError."""
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    for key, parse in (
        ("checkin/3", lambda: parse_checkin("checkin/3", raw)),
        ("verdict", lambda: parse_verdict("verdict", raw, scope=SCOPE, world_size=4)),
        ("distenv/scope/0", lambda: parse_scope("distenv/scope/0", raw)),
        ("distenv/scope/1", lambda: parse_claim("distenv/scope/1", SCOPE.encode() + b"\n" + raw)),
    ):
        refused = _refusal(parse)
        if refused is not None:
            # The reason is one of distenv's own short templates: nothing of the value in it.
            assert refused.key == key
            assert refused.why.isascii()
            assert refused.why.isprintable()
            assert len(refused.why) < 80


@settings(max_examples=300, deadline=None)
@given(checkins(), st.sampled_from(list(CheckIn._fields)), json_values)
def test_any_field_changed_to_another_value_parses_only_if_it_fits(
    record: CheckIn, field: str, value: object
) -> None:
    """One field replaced by any JSON value: either still a valid record, or refused by name."""
    data = {**record._asdict(), field: value}
    refused = _refusal(lambda: parse_checkin("checkin/2", json.dumps(data)))
    if refused is not None:
        assert refused.key == "checkin/2"
        return
    parsed = parse_checkin("checkin/2", json.dumps(data))
    assert getattr(parsed, field) == value
    assert 0 <= parsed.rank < parsed.world_size


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        (json.dumps({**checkin()._asdict(), "evil": 1}), "unexpected or missing fields"),
        (json.dumps({k: v for k, v in checkin()._asdict().items() if k != "pid"}), "missing"),
        (json.dumps({**checkin()._asdict(), "rank": "1"}), "'rank'"),
        (json.dumps({**checkin()._asdict(), "rank": True}), "'rank'"),
        (json.dumps({**checkin()._asdict(), "rank": 4}), "'rank'"),
        (json.dumps({**checkin()._asdict(), "hostname": "gpu1\n\x1b[31mOWNED"}), "'hostname'"),
        (json.dumps({**checkin()._asdict(), "backend": "gloo; rm -rf /"}), "'backend'"),
        (json.dumps({**checkin()._asdict(), "device": "GPU-<script>"}), "'device'"),
        (json.dumps({**checkin()._asdict(), "scope": "x" * 400}), "'scope'"),
        (json.dumps({**checkin()._asdict(), "pid": 0}), "'pid'"),
        ("x" * (MAX_CHECKIN_BYTES + 1), "more than the 4096 allowed"),
    ],
)
def test_malformed_records_are_refused_naming_the_key(text: str, why: str) -> None:
    """Each kind of bad record is a ForeignRecordError with the key, never a TypeError/JSON error."""
    with pytest.raises(ForeignRecordError) as info:
        parse_checkin("checkin/7", text)
    assert info.value.key == "checkin/7"
    assert why in info.value.why
    assert "OWNED" not in str(info.value)
    assert "rm -rf" not in str(info.value)


def _problems() -> list[Any]:
    records = [checkin(r) for r in range(4)]
    records[1] = records[1]._replace(backend="gloo")
    records[3] = records[3]._replace(rank=2, pid=99)
    records.append(checkin(0)._replace(hostname="gpu000", local_rank=0, pid=5))
    return validate(records, 4)


def test_verdicts_round_trip_and_render_the_same_on_every_rank() -> None:
    """A failing verdict published by rank 0 parses back to the same problems and messages."""
    problems = tuple(_problems())
    problems += (
        Missing(2, 4, (2, 3), (("gpu001",), ()), (1, None)),
        Placement(0, ("a", "b")),
        SharedGpu("gpu000", "GPU-5a3e", (0, 1), 2),
        SharedLocalRank("gpu000", 0, 0, 2),
        ForeignCheckIn(("checkin/5", "extra/1"), 9),
        ForeignCount(1002, 2),
        MixedLayout("node_rank", (0, 1), 2, ("gpu000",), (2, 3), 2, ("gpu001",)),
        LocalLayout("gpu001", None, 2, (2, 3), (0, 3), (4,)),
        SilentNodes(1, (2,), (1,), (2,)),
        OtherSize(4, (6,), ("gpu001",)),
    )
    kinds = {type(p) for p in problems}
    assert {Disagreement, ClaimedTwice, Missing, Placement, SharedGpu, ForeignCheckIn} <= kinds
    assert {MixedLayout, LocalLayout, ForeignCount, SilentNodes, OtherSize} <= kinds
    published = Verdict(False, problems, (), SCOPE).to_json()
    parsed, placed = parse_verdict("verdict", published, scope=SCOPE, world_size=4)
    assert not placed
    assert parsed.problems == problems
    assert parsed.describe(30) == Verdict(False, problems).describe(30)
    assert (
        "ranks disagree on backend: 'gloo' on ranks 1; 'nccl' on ranks 0, 0, 2, 2"
        in parsed.describe(30)[0]
    )


@pytest.mark.parametrize(
    ("verdict", "why"),
    [
        (
            {"scope": SCOPE, "ok": False, "problems": ["roll call failed: EVIL TEXT"]},
            "unknown code",
        ),
        (
            {
                "scope": SCOPE,
                "ok": True,
                "problems": [{"code": "foreign", "keys": ["checkin/1"], "total": 1}],
            },
            "contradicts",
        ),
        ({"scope": SCOPE, "ok": False, "problems": []}, "contradicts"),
        ({"scope": "slurm/1/0/n4", "ok": True, "problems": []}, "another scope"),
        (
            {
                "scope": SCOPE,
                "ok": False,
                "problems": [
                    {
                        "code": "disagree",
                        "field": "master",
                        "values": ["EVIL TEXT"],
                        "ranks": [[0]],
                        "totals": [1],
                    }
                ],
            },
            "pattern of master",
        ),
        (
            {
                "scope": SCOPE,
                "ok": False,
                "problems": [
                    {
                        "code": "missing",
                        "total": 1,
                        "world_size": 4,
                        "ranks": [9],
                        "hosts": [[]],
                        "nodes": [None],
                    }
                ],
            },
            "'ranks'",
        ),
    ],
)
def test_forged_verdicts_are_refused(verdict: dict[str, Any], why: str) -> None:
    """Free text, contradictions, another scope, out-of-range ranks: refused, never rendered."""
    with pytest.raises(ForeignRecordError) as info:
        parse_verdict(
            "verdict",
            json.dumps({"placed": False, "release": "", **verdict}),
            scope=SCOPE,
            world_size=4,
        )
    assert why in info.value.why
    assert "EVIL" not in str(info.value)


def test_job_scope_is_pattern_safe_and_names_the_world() -> None:
    """The rendezvous scope holds the launcher's identity and the size; odd ids become a digest."""
    assert job_scope("slurm/4242/0", 8) == "slurm/4242/0/n8"
    assert job_scope("pytorch/-/0", 2) != job_scope("pytorch/-/0", 4)
    odd = job_scope("pytorch/my run; id/0", 2)
    assert odd.startswith("sha256-")
    assert odd == job_scope("pytorch/my run; id/0", 2)
    assert parse_scope("distenv/scope/0", odd.encode()) == odd
    # Hydra exports no identity: rank 0's random token, sent with its master over MPI, is one.
    token = bytes(range(16))
    assert job_scope("mpi/-/4", 4, token) == "mpi/-/4/n4/000102030405060708090a0b0c0d0e0f"
    assert job_scope("mpi/-/4", 4, token) != job_scope("mpi/-/4", 4)


@st.composite
def numbered_nodes(draw: st.DrawFn) -> tuple[int, tuple[str, ...], tuple[int, ...]]:
    """A world, its nodes' distinct host names and the ranks counted on each (`host_sizes`)."""
    nodes = tuple(draw(st.lists(hosts, min_size=1, max_size=12, unique=True)))
    sizes = tuple(draw(st.lists(st.integers(1, 40), min_size=len(nodes), max_size=len(nodes))))
    return sum(sizes), nodes, sizes


@settings(max_examples=200, deadline=None)
@given(numbered_nodes())
def test_each_rank_reads_its_own_place_the_same_size_at_any_scale(
    numbered: tuple[int, tuple[str, ...], tuple[int, ...]],
) -> None:
    """A verdict that numbers nodes publishes the outcome only; each host's place parses back
    to its node, the node count and its rank count, in bytes that do not grow with the world."""
    world, nodes, sizes = numbered
    verdict = Verdict(True, (), (), SCOPE, nodes, sizes)
    published, placed = parse_verdict("verdict", verdict.to_json(), scope=SCOPE, world_size=world)
    assert placed
    assert published.ok
    assert '"nodes"' not in verdict.to_json()
    for index, host in enumerate(nodes):
        place = verdict.place_of(host)
        assert place is not None
        raw = place.to_json(SCOPE)
        assert len(raw) < 200
        assert parse_place("place/0", raw, scope=SCOPE, world_size=world) == Place(
            index, len(nodes), sizes[index]
        )


@settings(max_examples=300, deadline=None)
@given(numbered_nodes(), json_values)
def test_any_size_field_parses_only_if_it_counts_ranks(
    numbered: tuple[int, tuple[str, ...], tuple[int, ...]], value: object
) -> None:
    """A place's `size` replaced by any JSON value: refused by name unless it is a rank count."""
    world, nodes, _ = numbered
    data = {"scope": SCOPE, "node": 0, "nodes": len(nodes), "size": value, "paths": []}
    refused = _refusal(
        lambda: parse_place("place/3", json.dumps(data), scope=SCOPE, world_size=world)
    )
    if refused is not None:
        assert refused.key == "place/3"
        return
    parsed = parse_place("place/3", json.dumps(data), scope=SCOPE, world_size=world)
    assert parsed.size is None or (type(parsed.size) is int and 1 <= parsed.size <= world)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"size": 0}, "'size'"),  # an empty node
        ({"size": 5}, "'size'"),  # more ranks than the world
        ({"size": True}, "'size'"),  # a boolean is not a count
        ({"size": "2"}, "'size'"),
        ({"node": 2}, "'node'"),  # past the node count
        ({"nodes": None}, "without a node count"),
        ({"scope": "slurm/1/0/n4"}, "another scope"),
        ({"paths": [["gloo", "eth0 up"]]}, "'paths'"),
        ({"extra": 1}, "unexpected or missing fields"),
    ],
)
def test_forged_places_are_refused(change: dict[str, Any], why: str) -> None:
    """A place that does not fit the world, its node count or this scope: refused, never used."""
    data = {"scope": SCOPE, "node": 1, "nodes": 2, "size": 2, "paths": [], **change}
    with pytest.raises(ForeignRecordError) as info:
        parse_place("place/3", json.dumps(data), scope=SCOPE, world_size=4)
    assert why in info.value.why


def test_sizes_are_placed_only_where_a_local_size_is_unknown() -> None:
    """Ranks that all know their local size get no counts in their place."""
    from distenv.bootstrap.verdict import host_sizes, node_hosts

    known = [checkin(r, node_rank=None) for r in range(4)]
    nodes = node_hosts(known)
    assert nodes == ("gpu000", "gpu001")
    assert host_sizes(known, nodes) == ()
    assert Verdict(True, (), (), SCOPE, nodes).place_of("gpu001") == Place(1, 2, None)
    flux = [c._replace(local_world_size=None) for c in known]
    assert host_sizes(flux, node_hosts(flux)) == (2, 2)


MIXED = {
    "code": "mixed_layout",
    "field": "node_rank",
    "known": [0, 1],
    "known_total": 2,
    "known_hosts": ["gpu000"],
    "unknown": [2, 3],
    "unknown_total": 2,
    "unknown_hosts": ["gpu001"],
}
LOCAL = {
    "code": "local_layout",
    "host": "gpu001",
    "node": None,
    "total": 2,
    "ranks": [2, 3],
    "local_ranks": [0, 3],
    "sizes": [4],
}


@pytest.mark.parametrize(
    ("problem", "why"),
    [
        ({**MIXED, "field": "EVIL TEXT"}, "names no layout field"),
        ({**MIXED, "known_hosts": ["EVIL TEXT"]}, "'known_hosts'"),
        ({**MIXED, "unknown": [7]}, "'unknown'"),
        ({**MIXED, "known_total": 0}, "'known_total'"),
        ({**LOCAL, "host": "EVIL TEXT"}, "'host'"),
        ({**LOCAL, "local_ranks": [0]}, "differ in length"),
        ({**LOCAL, "sizes": [0]}, "sizes are not local world sizes"),
        ({**LOCAL, "total": 9}, "'total'"),
        ({**LOCAL, "evil": 1}, "unexpected or missing fields"),
    ],
)
def test_forged_layout_problems_are_refused(problem: dict[str, Any], why: str) -> None:
    """The layout cross-checks' problems are validated like the others: never free text."""
    verdict = {"scope": SCOPE, "ok": False, "problems": [problem], "placed": False, "release": ""}
    with pytest.raises(ForeignRecordError) as info:
        parse_verdict("verdict", json.dumps(verdict), scope=SCOPE, world_size=4)
    assert why in info.value.why
    assert "EVIL" not in str(info.value)
    valid = {**verdict, "problems": [MIXED, LOCAL]}
    parsed, _ = parse_verdict("verdict", json.dumps(valid), scope=SCOPE, world_size=4)
    assert [type(p) for p in parsed.problems] == [MixedLayout, LocalLayout]


def test_foreign_records_are_one_short_problem_however_many() -> None:
    """A thousand foreign keys: four named, the rest counted, in one line of bounded length."""
    keys = [f"extra/{n}" for n in range(1, 1001)]
    text = foreign_records(keys).describe(30)
    assert text.startswith(
        "1000 check-in records (under extra/1, extra/2, extra/3, extra/4 and 996 more)"
    )
    assert len(text) < 400
    assert (
        foreign_records(["checkin/2"])
        .describe(30)
        .startswith("the check-in record under checkin/2 was not written by this job's distenv")
    )


def test_host_names_from_the_store_are_quoted_as_data() -> None:
    """A host name is shown quoted, never as part of distenv's own sentence."""
    host = "YOUR-NODE-IS-COMPROMISED.run-curl-evil.example-sh"
    text = Missing(1, 4, (2,), ((host,),), (None,)).describe(30)
    assert f"rank 2 (expected on {host!r})" in text


def _claimed(rank: int, pids: tuple[int, ...]) -> Verdict:
    return Verdict(False, (ClaimedTwice(rank, pids, ("h",) * len(pids)),), (), SCOPE)


def test_a_verdict_that_contradicts_what_a_rank_knows_is_forged() -> None:
    """Missing while holding its key, or claimed twice without its own pid: proof of forgery."""
    me = checkin(1)._replace(pid=4242)
    missing = Verdict(False, (Missing(1, 4, (1,), ((),), (None,)),), (), SCOPE)
    assert "names this rank missing" in str(missing.contradicts(me, holds_key=True))
    # A second claimer's key was taken: rank 0 may well have named rank 1 missing (its record
    # was foreign): no contradiction.
    assert missing.contradicts(me, holds_key=False) is None
    assert "without this one (pid 4242)" in str(_claimed(1, (7, 8)).contradicts(me, holds_key=True))
    assert _claimed(1, (7, 4242)).contradicts(me, holds_key=True) is None
    assert _claimed(2, (7, 8)).contradicts(me, holds_key=True) is None
    # At MAX_SHOWN claimers the list is cut: this one may be beyond it.
    many = tuple(range(100, 100 + MAX_SHOWN))
    assert _claimed(1, many).contradicts(me, holds_key=True) is None


def test_a_verdict_without_problems_is_checked_without_importing_the_problems_module() -> None:
    """Every rank but 0 checks the verdict on its way to init_process_group: the usual verdict,
    with no problem, must not cost that path the import of the problems module (7 ms here)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from distenv.bootstrap.verdict import Verdict\n"
        "assert Verdict(True, ()).contradicts(None, holds_key=True) is None\n"
        "print('distenv.bootstrap.problems' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


KERNEL_NAMES = [
    "gpu001",
    "my node",
    "nœud",
    "",
    "-lead.",
    ".dot",
    "a@b#c\td%25",
    "100%",
    "x" * 64,
    "ü" * 32,
    "bad\udcffbyte",  # a byte that is not UTF-8, as Python decodes it (surrogateescape)
]


@pytest.mark.parametrize("name", KERNEL_NAMES)
def test_any_kernel_host_name_round_trips_through_a_checkin(name: str) -> None:
    """Every host name the kernel accepts is recorded losslessly (#44 item 8): its record form
    matches the schema, survives a check-in's JSON and decodes back to the kernel's name."""
    from urllib.parse import unquote

    from distenv._hosts import record_host

    recorded = record_host(name)
    assert recorded.isascii()
    assert recorded.isprintable()
    assert not set(recorded) & set("@#\t\n ")  # the state records' and messages' separators
    parsed = parse_checkin("checkin/1", checkin(hostname=recorded).to_json())
    assert parsed.hostname == recorded
    assert unquote(recorded, errors="surrogateescape") == name or (name, recorded) == ("", "%")
    assert (recorded == name) == ("%" not in recorded)


@given(st.lists(st.text(max_size=20), min_size=2, max_size=2, unique=True))
def test_distinct_host_names_stay_distinct(names: list[str]) -> None:
    """No host name passes for another once recorded."""
    from distenv._hosts import record_host

    assert record_host(names[0]) != record_host(names[1])


def test_plain_host_names_are_recorded_as_they_are() -> None:
    from distenv._hosts import record_host

    for name in ("gpu001", "node-1.cluster.example", "_x", "A9"):
        assert record_host(name) == name


OTHER = {"code": "other_size", "world_size": 4, "sizes": [6], "hosts": ["gpu001"]}


@pytest.mark.parametrize(
    ("problem", "why"),
    [
        ({**OTHER, "world_size": 5}, "'world_size'"),
        ({**OTHER, "sizes": [0]}, "sizes are not world sizes"),
        ({**OTHER, "sizes": ["EVIL TEXT"]}, "sizes are not world sizes"),
        ({**OTHER, "hosts": ["EVIL TEXT"]}, "'hosts'"),
        ({**OTHER, "hosts": []}, "differ in length"),
    ],
)
def test_forged_size_mismatches_are_refused(problem: dict[str, Any], why: str) -> None:
    """A size mismatch in a verdict names rank 0's own world and valid sizes and hosts only."""
    verdict = {"scope": SCOPE, "ok": False, "problems": [problem], "placed": False, "release": ""}
    with pytest.raises(ForeignRecordError) as info:
        parse_verdict("verdict", json.dumps(verdict), scope=SCOPE, world_size=4)
    assert why in info.value.why
    assert "EVIL" not in str(info.value)
    parsed, _ = parse_verdict(
        "verdict", json.dumps({**verdict, "problems": [OTHER]}), scope=SCOPE, world_size=4
    )
    assert parsed.describe(30) == [
        "a size mismatch: rank 0 was started for a world of 4 ranks, ranks of the same job "
        "identity for 6 on 'gpu001'"
    ]


@pytest.mark.parametrize(
    ("theirs", "ours", "sizes"),
    [
        ("pytorch/exp1/-/n4", "pytorch/exp1/-/n6", (4, 6)),
        ("slurm/42/0/n8", "slurm/42/0/n16", (8, 16)),
        ("pytorch/exp1/-/n4", "pytorch/exp2/-/n6", None),  # another job
        ("pytorch/exp1/-/n4", "pytorch/exp1/-/n4", None),  # the same
        ("mpi/-/n4/" + "ab" * 16, "mpi/-/n6/" + "cd" * 16, None),  # MPI tokens: two jobs
        ("sha256-" + "0" * 40, "pytorch/exp1/-/n6", None),
    ],
)
def test_other_size_tells_one_identity_of_two_sizes(
    theirs: str, ours: str, sizes: tuple[int, int] | None
) -> None:
    """Only scopes that differ in their world size alone are a size mismatch."""
    from distenv.bootstrap.scope import other_size

    assert other_size(theirs, ours) == sizes
