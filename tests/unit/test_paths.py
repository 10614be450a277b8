"""The network probe's decisions (distenv.bootstrap.paths) and what carries them through the store.

Rank 0 decides per node and backend from the probe's results: keep the default where it was
reached, move to the interface toward the master where only that was reached, refuse where
neither was. Every rank of a node applies its node's switch, in each backend's own syntax, and
never over a variable the user set. Records, claims and verdicts that carry all this are parsed
like every other value read from the store.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from distenv.bootstrap.paths import judge, targets
from distenv.bootstrap.problems import Unreachable
from distenv.bootstrap.records import (
    CheckIn,
    ForeignRecordError,
    NetRecord,
    Switch,
    claim,
    parse_checkin,
    parse_claim,
)
from distenv.bootstrap.rollcall import network_exports, probed_backends
from distenv.bootstrap.verdict import Place, Verdict, parse_place, parse_verdict
from distenv.rankinfo import RankInfo
from distenv.system.netpath import backends_to_probe, export
from tests.support.verdicts import as_read

SCOPE = "pytorch/none/n3"
TOKEN = "0123456789abcdef"  # noqa: S105 (the probe's answer, not a secret)


def net(*addresses: tuple[str, str | None], defaults: Any = (("gloo", 0),), route: int | None = 1,
        reached: int | None = None) -> NetRecord:  # fmt: skip
    return NetRecord(
        TOKEN, tuple((a, 40000 + i, nic) for i, (a, nic) in enumerate(addresses)),
        tuple(defaults), route, reached,
    )  # fmt: skip


def checkin(rank: int, host: str, record: NetRecord | None) -> CheckIn:
    return CheckIn(
        rank=rank, world_size=3, local_rank=0, local_world_size=1, node_rank=rank,
        hostname=host, pid=100 + rank, launcher="pytorch", master="node0:29500",
        backend="gloo", torch_version="2.13.0", scope=SCOPE, net=record,
    )  # fmt: skip


DEBIAN = (("127.0.1.1", None), ("10.213.1.11", "eth0"))  # host name on 127.0.1.1; eth0 works


def test_a_default_that_was_reached_is_kept() -> None:
    """The control: rank 0 reached node1's default address, so nothing changes there."""
    own = checkin(0, "node0", net(("10.213.1.10", "eth0"), route=0))
    node1 = checkin(1, "node1", net(("10.213.1.11", "eth0"), route=0, reached=0b1))
    assert judge([own, node1], own, [(node1, [None])]) == ([], [])


def test_a_default_that_failed_moves_to_the_interface_toward_the_master() -> None:
    """Debian's 127.0.1.1: rank 0 was refused there and reached eth0's address: node1 switches."""
    own = checkin(0, "node0", net(("10.213.1.10", "eth0"), route=0))
    node1 = checkin(1, "node1", net(*DEBIAN, reached=0b1))
    switches, problems = judge([own, node1], own, [(node1, ["refused", None])])
    assert (switches, problems) == ([Switch("node1", "gloo", "eth0")], [])


def test_a_node_whose_addresses_all_failed_is_refused_with_what_was_tried() -> None:
    own = checkin(0, "node0", net(("10.213.1.10", "eth0"), route=0))
    node2 = checkin(2, "node2", net(*DEBIAN, reached=0b1))
    switches, problems = judge([own, node2], own, [(node2, ["refused", "timeout"])])
    assert switches == []
    assert problems == [
        Unreachable(
            "node2", 2, "gloo",
            (("127.0.1.1", None, "refused"), ("10.213.1.11", "eth0", "timeout")), ("node0",),
        )
    ]  # fmt: skip
    text = problems[0].describe(10)
    assert "gloo on 'node2' (rank 2's node)" in text
    assert "127.0.1.1: connection refused; 10.213.1.11 on eth0: no answer" in text
    assert "from 'node0'" in text
    assert "GLOO_SOCKET_IFNAME=" in text
    assert "DISTENV_MASTER_ADDR_FORMAT" in text


def test_an_address_class_never_decides() -> None:
    """A loopback default that the probe reached (nodes sharing one network stack, as the project's
    own test cluster on 127.0.1.x over lo) is kept."""
    own = checkin(0, "node0", net(("127.0.1.1", None), route=None))
    node1 = checkin(1, "node1", net(("127.0.1.2", None), route=None, reached=0b1))
    assert judge([own, node1], own, [(node1, [None])]) == ([], [])


def test_rank_0s_node_is_judged_by_what_every_other_node_reached() -> None:
    """Rank 0's node offers its default and every interface; node1 reached both, node2 only eth0:
    rank 0's node moves to eth0. Had no node reached eth0 either, the problem names who missed."""
    offered = net(("127.0.1.1", None), ("10.213.1.10", "eth0"), ("192.168.5.1", "eth1"))
    own = checkin(0, "node0", offered)
    node1 = checkin(1, "node1", net(*DEBIAN, reached=0b011))
    node2 = checkin(2, "node2", net(*DEBIAN, reached=0b010))
    assert judge([own, node1, node2], own, []) == ([Switch("node0", "gloo", "eth0")], [])

    node2 = checkin(2, "node2", net(*DEBIAN, reached=0b001))
    node1 = checkin(1, "node1", net(*DEBIAN, reached=0b100))
    switches, problems = judge([own, node1, node2], own, [])
    assert switches == []
    [problem] = problems
    assert isinstance(problem, Unreachable)
    assert (problem.host, problem.rank, problem.missed_by) == ("node0", 0, ("node1",))
    assert [why for _, _, why in problem.tried] == ["unreached"] * 3


def test_each_backend_is_decided_on_its_own() -> None:
    """``cpu:gloo,cuda:nccl``: gloo's default (the host name's 127.0.1.1) failed, NCCL's (eth0,
    the first interface that is neither docker nor loopback) passed: only gloo moves."""
    record = net(*DEBIAN, defaults=(("gloo", 0), ("nccl", 1)), route=1)
    own = checkin(0, "node0", net(("10.213.1.10", "eth0"), route=0))
    node1 = checkin(1, "node1", record)
    switches, _ = judge([own, node1], own, [(node1, ["refused", None])])
    assert switches == [Switch("node1", "gloo", "eth0")]


def test_rank_0_dials_the_first_listening_rank_of_each_other_host() -> None:
    own = checkin(0, "node0", net(("10.213.1.10", "eth0")))
    a, b = checkin(1, "node1", None), checkin(2, "node1", net(*DEBIAN))
    c = checkin(3, "node2", net(*DEBIAN))
    assert targets([own, a, b, c], "node0") == [b, c]


def test_records_claims_and_verdicts_carry_the_probe_and_parse_back() -> None:
    record = net(("fe80::1%eth0", "eth0"), ("10.213.1.11", "eth0"), reached=0b10)
    assert parse_checkin("checkin/1", checkin(1, "node1", record).to_json()).net == record
    assert parse_claim("distenv/scope/0", claim(SCOPE)) == (SCOPE, None, None)
    assert parse_claim("distenv/scope/0", claim(SCOPE, "node0", record)) == (SCOPE, "node0", record)
    problem = Unreachable("node2", 2, "nccl", (("10.0.0.2", "ib0", "foreign"),), ("node0",))
    ok = Verdict(True, (), scope=SCOPE, paths=(Switch("node1", "gloo", "eth0"),))
    assert as_read(ok, checkin(1, "node1", None)).place == Place(paths=(("gloo", "eth0"),))
    assert as_read(ok, checkin(2, "node2", None)).place == Place()
    failed = Verdict(False, (problem,), scope=SCOPE)
    assert parse_verdict("verdict", failed.to_json(), scope=SCOPE, world_size=3) == (failed, False)
    assert "another process answered there" in problem.describe(10)
    assert "NCCL_SOCKET_IFNAME=" in problem.describe(10)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"addresses": [["10.0.0.1; rm -rf /", 1, None]]}, "addresses"),
        ({"addresses": [["10.0.0.1", 70000, None]]}, "addresses"),
        ({"addresses": [["10.0.0.1", 1, "eth0 up"]]}, "addresses"),
        ({"defaults": [["mpi", 0]]}, "defaults"),
        ({"defaults": [["gloo", 5]]}, "defaults"),
        ({"token": "not-hex"}, "token"),
        ({"reached": 1 << 9}, "reached"),
        ({"route": 3}, "route"),
        ({"extra": 1}, "fields"),
    ],
)
def test_forged_network_records_are_refused(change: dict[str, Any], why: str) -> None:
    record = json.loads(checkin(1, "node1", net(*DEBIAN)).to_json())
    record["net"].update(change)
    with pytest.raises(ForeignRecordError) as info:
        parse_checkin("checkin/1", json.dumps(record))
    assert why in info.value.why
    with pytest.raises(ForeignRecordError):
        parse_claim(
            "distenv/scope/0", SCOPE + "\n" + json.dumps({"hostname": "n", "net": record["net"]})
        )


@pytest.mark.parametrize(
    "paths",
    [
        [["gloo", "eth0 && curl"]],
        [["tensorpipe", "eth0"]],
        [["gloo"]],
    ],
)
def test_forged_switches_are_refused(paths: list[list[str]]) -> None:
    published = {"scope": SCOPE, "node": None, "nodes": None, "size": None, "paths": paths}
    with pytest.raises(ForeignRecordError, match="paths"):
        parse_place("place/1", json.dumps(published), scope=SCOPE, world_size=3)


def test_a_rank_applies_its_own_nodes_switch_in_each_backends_syntax(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    for name in ("NCCL_SOCKET_IFNAME", "NCCL_COMM_ID", "NCCL_SOCKET_FAMILY"):
        monkeypatch.delenv(name, raising=False)
    verdict = Verdict(True, (), scope=SCOPE, paths=(
        Switch("node1", "gloo", "ens5"), Switch("node1", "nccl", "ens5"),
        Switch("node2", "gloo", "enp1s0"),
    ))  # fmt: skip
    mine = checkin(1, "node1", None)._replace(backend="cpu:gloo,cuda:nccl")
    assert network_exports(verdict, mine) == {
        "GLOO_SOCKET_IFNAME": "ens5",
        "NCCL_SOCKET_IFNAME": "=ens5",
    }
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "ib0")  # the user's choice is never overwritten
    assert network_exports(verdict, mine) == {"NCCL_SOCKET_IFNAME": "=ens5"}
    assert network_exports(verdict, checkin(1, "node9", None)) == {}


def test_the_variables_that_count_as_the_users_choice() -> None:
    assert backends_to_probe("gloo", {}) == ("gloo",)
    assert backends_to_probe("cpu:gloo,cuda:nccl", {}) == ("gloo", "nccl")
    assert backends_to_probe("cpu:gloo,cuda:nccl", {"NCCL_COMM_ID": "10.0.0.1:5000"}) == ("gloo",)
    assert backends_to_probe("nccl", {"NCCL_SOCKET_FAMILY": "AF_INET6"}) == ()
    assert backends_to_probe("gloo", {"GLOO_SOCKET_IFNAME": "eth0"}) == ()
    assert backends_to_probe("gloo", {"TP_SOCKET_IFNAME": "eth0"}) == ("gloo",)
    assert backends_to_probe("mpi", {}) == ()
    assert export("gloo", "eth1") == ("GLOO_SOCKET_IFNAME", "eth1")
    assert export("nccl", "eth1") == ("NCCL_SOCKET_IFNAME", "=eth1")  # not a prefix of eth10


def info(rank: int, *, local_rank: int = 0, nodes: int | None = 2, world: int = 4) -> RankInfo:
    return RankInfo(
        rank=rank, world_size=world, local_rank=local_rank,
        local_world_size=None if nodes is None else world // nodes,
        node_rank=None if nodes is None else rank // (world // nodes),
        num_nodes=nodes, master_addr="node0", master_port=29500, launcher="pytorch",
    )  # fmt: skip


def test_who_takes_part_in_the_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 and each node's first rank, where the job may span hosts; every rank where the
    launcher names no layout; nobody in a one-node job, a one-rank job, or for a chosen path."""
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    assert probed_backends(info(0), "gloo") == ("gloo",)
    assert probed_backends(info(2), "gloo") == ("gloo",)
    assert probed_backends(info(3, local_rank=1), "gloo") == ()
    assert probed_backends(info(3, local_rank=1, nodes=None), "gloo") == ("gloo",)
    assert probed_backends(info(0, nodes=1), "gloo") == ()
    assert probed_backends(info(0, nodes=1, world=1), "gloo") == ()
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")
    assert probed_backends(info(0), "gloo") == ()


def test_a_node_blind_to_ipv6_moves_the_others_off_it() -> None:
    """node2 reached none of rank 0's IPv6 addresses: node1's IPv6 default, which rank 0 reached,
    is taken as unreachable from node2 (the probe never dials node1 from node2) and node1 moves
    to its IPv4 route; rank 0's node does the same by the masks."""
    own = checkin(0, "node0", net(("fd13:6::10", "eth1"), ("10.213.1.10", "eth0")))
    node1 = checkin(1, "node1", net(("fd13:6::11", "eth1"), ("10.213.1.11", "eth0"), reached=0b11))
    node2 = checkin(2, "node2", net(("10.213.1.12", "eth0"), route=0, reached=0b10))
    switches, problems = judge([own, node1, node2], own, [(node1, [None, None]), (node2, [None])])
    assert problems == []
    assert switches == [Switch("node1", "gloo", "eth0"), Switch("node0", "gloo", "eth0")]


def test_gloo_gets_one_address_family_on_every_node() -> None:
    """Every address was reached, but node1's default is IPv6 among IPv4 nodes: gloo would refuse
    to connect the two families, so node1 moves to its IPv4 route; without one, it is refused with
    its reached address named as of the other family."""
    own = checkin(0, "node0", net(("10.213.1.10", "eth0"), route=0))
    node1 = checkin(1, "node1", net(("fd13:6::11", "eth1"), ("10.213.1.11", "eth0"), reached=0b1))
    assert judge([own, node1], own, [(node1, [None, None])]) == (
        [Switch("node1", "gloo", "eth0")],
        [],
    )
    alone = checkin(1, "node1", net(("fd13:6::11", "eth1"), route=None, reached=0b1))
    switches, problems = judge([own, alone], own, [(alone, [None])])
    assert switches == []
    [problem] = problems
    assert problem.tried == (("fd13:6::11", "eth1", "family"),)
    assert "of another address family than the other nodes'" in problem.describe(10)


def test_a_claim_of_this_jobs_scope_that_rank_0_did_not_write_is_named_so() -> None:
    """A forger copies the job's scope into the claim key first (with an address list of its
    own): rank 0 refuses the store, naming the claim as another process's under this job's scope,
    not as "another job's" scope that reads the same as its own."""
    from distenv.bootstrap.scope import claim_scope
    from distenv.errors import StoreTakenError

    class Store:
        value = SCOPE + "\n" + json.dumps({"hostname": "evil", "net": net(*DEBIAN).to_dict()})

        def compare_set(self, key: str, expected: str, desired: str) -> bytes:
            return self.value.encode()

    rank0 = info(0)
    with pytest.raises(StoreTakenError) as caught:
        claim_scope(Store(), rank0, SCOPE, "distenv/scope/0", "node0", net(*DEBIAN))
    assert (
        "is claimed under this job's scope by another process (a second rank 0, or one outside "
        "the job)"
    ) in str(caught.value)
    assert "another job's" not in str(caught.value)
