"""Node leaders' records and roles: batches parse back to the check-ins they carry, anything else
is counted foreign, and every rank of a job decides alike who leads."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distenv.bootstrap.batches import (
    SHARD_RANKS,
    Batch,
    UpBatch,
    parse_batches,
    parse_up_batches,
    shard_key,
    shard_keys,
)
from distenv.bootstrap.leaders import MIN_WORLD, Link, Role, private_dir
from distenv.bootstrap.records import CheckIn, NetRecord
from distenv.deadline import Deadline
from distenv.errors import ConfigurationError, RendezvousError
from distenv.rankinfo import RankInfo

SCOPE = "slurm/4242/0/n16"
NET = NetRecord("0123456789abcdef", (("10.0.0.2", 4000, "eth0"),), (("gloo", 0),), 0, 1)


def node(first: int, size: int = 4, world: int = 16, **change: object) -> tuple[CheckIn, ...]:
    """The check-ins of the node whose ranks start at `first`."""
    return tuple(
        CheckIn(
            rank=first + i,
            world_size=world,
            local_rank=i,
            local_world_size=size,
            node_rank=first // size,
            hostname=f"gpu{first // size:03d}",
            pid=1000 + first + i,
            launcher="slurm",
            master="gpu000:29500",
            backend="nccl",
            torch_version="2.13.0",
            device=f"GPU-{first + i:04x}",
            scope=SCOPE,
        )._replace(**change)  # type: ignore[arg-type]
        for i in range(size)
    )


def test_a_batch_parses_back_to_its_check_ins_with_odd_ones_whole() -> None:
    """Rows carry what differs; a rank whose shared fields differ (another torch) or that offers
    addresses to the probe travels whole: all parse back to the same check-ins."""
    checkins = list(node(4))
    checkins[0] = checkins[0]._replace(net=NET)
    checkins[2] = checkins[2]._replace(torch_version="2.12.0")
    line = Batch(4, tuple(checkins)).to_line()
    assert line.endswith("\n")
    assert line.count("\n") == 1
    (batch,), foreign = parse_batches("batches/0", line.encode(), scope=SCOPE, world_size=16)
    assert foreign == 0
    assert sorted(batch.checkins) == sorted(checkins)
    assert len(line) < 200 * len(checkins) + 600


def test_a_fragment_without_newline_spoils_the_line_it_joins_and_is_counted() -> None:
    """A forger's fragment appended without a newline joins the next leader's line: both count as
    foreign, the other nodes' batches still parse."""
    good = Batch(0, node(0)).to_line() + Batch(4, node(4)).to_line()
    raw = (good + '{"leader": 0, "EVIL TEXT"' + Batch(8, node(8)).to_line()).encode()
    batches, foreign = parse_batches("batches/0", raw, scope=SCOPE, world_size=16)
    assert [b.leader for b in batches] == [0, 4]
    assert foreign == 1
    tail = parse_batches("batches/0", good.encode() + b"xx", scope=SCOPE, world_size=16)
    assert tail == (parse_batches("batches/0", good.encode(), scope=SCOPE, world_size=16)[0], 1)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"scope": "slurm/1/0/n16"}, "another scope"),
        ({"leader": 3}, "leader"),
        ({"ranks": [[99, 0, 1, None, False]]}, "range"),
        ({"ranks": [[4, 0, 0, None, False]]}, "range"),  # pid 0
        ({"ranks": [[4, 0, 1, "GPU-<script>", False]]}, "range"),
        ({"ranks": [[4, 0, 1, None]]}, "five"),
        ({"extra": 1}, "fields"),
    ],
)
def test_forged_batches_are_foreign(change: dict[str, object], why: str) -> None:
    """Another scope, a leader not among its ranks, a row out of range: foreign, never believed."""
    data = json.loads(Batch(4, node(4)).to_line())
    if "scope" in change:
        data["common"]["scope"] = change.pop("scope")
    data.update(change)
    raw = (json.dumps(data) + "\n").encode()
    assert parse_batches("batches/0", raw, scope=SCOPE, world_size=16) == ([], 1), why


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_in_a_shard_parse_or_count_as_foreign(raw: bytes) -> None:
    """Whatever a shard holds, parsing returns batches and a count; it never raises."""
    batches, foreign = parse_batches("batches/0", raw, scope=SCOPE, world_size=16)
    assert foreign >= 0
    assert all(isinstance(b, Batch) for b in batches)
    ups, bad = parse_up_batches("up/batches/0", raw, world_size=16)
    assert bad >= 0
    assert all(isinstance(u, UpBatch) for u in ups)


def test_up_reports_round_trip_and_echo_in_rank_order() -> None:
    up = UpBatch(4, ((6, "b" * 16), (4, "a" * 16)), gone=(5,), late=(7,))
    (parsed,), foreign = parse_up_batches("up/batches/0", up.to_line().encode(), world_size=16)
    assert (parsed, foreign) == (up, 0)
    assert parsed.ranks == 4
    assert parsed.echo() == f"4:{'a' * 16},6:{'b' * 16}"
    forged = up.to_line().replace("a" * 16, "A" * 16).encode()
    assert parse_up_batches("up/batches/0", forged, world_size=16) == ([], 1)


def test_shards_hold_a_block_of_ranks_each() -> None:
    assert shard_key(0) == shard_key(SHARD_RANKS - 8) == "batches/0"
    assert shard_key(SHARD_RANKS) == "batches/1"
    assert shard_keys(131072) == [f"batches/{n}" for n in range(32)]
    assert shard_keys(8) == ["batches/0"]


def info(rank: int, world: int, local: int | None, local_rank: int = 0) -> RankInfo:
    return RankInfo(
        launcher="slurm", rank=rank, world_size=world, local_rank=local_rank,
        local_world_size=local, node_rank=None if local is None else rank // local,
        num_nodes=None, master_addr="h", master_port=1,
    )  # fmt: skip


def test_who_leads_depends_only_on_what_every_rank_knows() -> None:
    """Batched where ranks share a node: from MIN_WORLD ranks (auto) or always (on); a node of
    one rank, an uncounted node, or off: flat."""
    big = MIN_WORLD * 2
    leader = Role.of(info(8, big, 8), "auto", SCOPE, "0", "gpu001")
    member = Role.of(info(9, big, 8, local_rank=1), "auto", SCOPE, "0", "gpu001")
    assert leader is not None
    assert leader.leader
    assert member is not None
    assert not member.leader
    assert leader.path == member.path  # one node, one socket
    assert Role.of(info(9, MIN_WORLD - 8, 8, 1), "auto", SCOPE, "0", "gpu001") is None
    assert Role.of(info(9, 16, 8, 1), "on", SCOPE, "0", "gpu001") is not None
    assert Role.of(info(9, big, 8, 1), "off", SCOPE, "0", "gpu001") is None
    assert Role.of(info(9, big, 1), "on", SCOPE, "0", "gpu001") is None
    assert Role.of(info(9, big, None), "on", SCOPE, "0", "gpu001") is None
    # Another job, attempt, host or node never shares the socket.
    paths = {
        Role.of(info(8, big, 8), "on", scope, restart, host).path  # type: ignore[union-attr]
        for scope, restart, host in [(SCOPE, "0", "a"), ("x/1/0/n512", "0", "a"),
                                     (SCOPE, "1", "a"), (SCOPE, "0", "b")]
    }  # fmt: skip
    assert len(paths) == 4


def test_a_bad_mode_and_a_rank_0_that_does_not_lead_are_refused_by_name() -> None:
    with pytest.raises(ConfigurationError, match="DISTENV_NODE_LEADERS is 'yes'"):
        Role.of(info(1, 16, 8, 1), "yes", SCOPE, "0", "h")
    with pytest.raises(ConfigurationError, match="rank 0 is local rank 3"):
        Role.of(info(0, 16, 8, local_rank=3), "on", SCOPE, "0", "h")


def test_the_socket_directory_is_refused_unless_private(tmp_path: Path) -> None:
    """The directory is created 0700; one opened to others, or a link, is refused with the fix."""
    path = Path(private_dir("slurm", "auto", str(tmp_path)))
    st_mode = path.stat().st_mode
    assert stat.S_IMODE(st_mode) == 0o700
    assert path.stat().st_uid == os.getuid()
    try:
        path.chmod(0o777)
        with pytest.raises(ConfigurationError, match="is not a private directory"):
            private_dir("slurm", "auto", str(tmp_path))
    finally:
        path.chmod(0o700)
    other = tmp_path / "other"
    other.mkdir()
    (other / f"distenv-{os.getuid()}").symlink_to(path)
    with pytest.raises(ConfigurationError, match="is not a private directory"):
        private_dir("slurm", "auto", str(other))


def test_a_socket_directory_that_cannot_be_made_is_refused_with_the_fix(tmp_path: Path) -> None:
    """The error names the launcher, the setting and its value, and the way to the flat path."""
    with pytest.raises(ConfigurationError, match="cannot create their socket directory") as info:
        private_dir("slurm", "on", str(tmp_path / "absent"))
    assert "DISTENV_NODE_LEADERS=off" in str(info.value)
    assert "(it is 'on' here)" in str(info.value)
    assert (info.value.source, info.value.variable, info.value.value) == (
        "slurm",
        "DISTENV_NODE_LEADERS",
        "on",
    )


def test_a_node_socket_that_cannot_be_connected_to_is_named_with_the_setting(
    tmp_path: Path,
) -> None:
    """Any error but "not there yet" ends the member's wait at once, in a DistEnvError that names
    the socket, the cause, the setting and its value (not a bare OSError)."""
    (tmp_path / "file").write_text("")
    role = Role(False, str(tmp_path / "file" / "node.sock"), "on")  # ENOTDIR
    with pytest.raises(RendezvousError, match="cannot connect to its node's socket") as caught:
        Link.connect(role, info(1, 16, 8, local_rank=1), Deadline.after(5))
    assert "Not a directory" in str(caught.value)
    assert "(it is 'on' here)" in str(caught.value)
    assert (caught.value.variable, caught.value.value) == ("DISTENV_NODE_LEADERS", "on")
