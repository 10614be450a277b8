"""``distenv why`` over hand-made log folders, torchrun's stream specs, the record's new fields."""

from __future__ import annotations

import argparse
import faulthandler
import time
from pathlib import Path

import pytest

from distenv.cli.why import why
from distenv.errors import ConfigurationError
from distenv.local.streams import hidden, local_rank_list, streams
from distenv.postmortem.failure import Report
from distenv.postmortem.ranklog import identity, read_identity


def _dump_waiting(path: Path) -> None:
    with path.open("ab") as file:
        faulthandler.dump_traceback(file, all_threads=False)


def _dump_sleeping(path: Path) -> None:
    with path.open("ab") as file:
        faulthandler.dump_traceback(file, all_threads=False)


def _rank(folder: Path, rank: int, record: bytes | None, dump: object = None) -> None:
    (folder / f"rank-{rank}.log").write_text(f"step 1 of rank {rank}\n")
    (folder / f"rank-{rank}.fault").write_text(identity(rank, rank, 1.5e9, 100 + rank))
    if dump is not None:
        dump(folder / f"rank-{rank}.fault")  # type: ignore[operator]
    if record is not None:
        (folder / f"rank-{rank}.report").write_bytes(record)


def test_the_first_own_failure_is_the_cause(tmp_path: Path) -> None:
    """Rank 2 raised first; ranks 0, 1 broke after it (peer); rank 3 left no record."""
    raised = Report("exception", "ValueError: bad", 1.5e9 + 5, ("train.py:9 in step: x",),
                    host="n2", pid=42, local_rank=0, started=1.5e9)  # fmt: skip
    broke = Report("exception", "RuntimeError: Connection closed by peer", 1.5e9 + 6, peer=True)
    for rank in (0, 1):
        _rank(tmp_path, rank, broke.line())
    _rank(tmp_path, 2, raised.line())
    _rank(tmp_path, 3, None)
    card = why(tmp_path)
    assert card[0] == "distenv why: rank 2 failed first: raised ValueError: bad (exit status 1)"
    assert card[1].startswith("  rank:    2 of 4, local rank 0 on n2, pid 42, at "), card
    assert card[1].endswith(", 5.0 s after the start"), card
    assert card[2] == "  where:   train.py:9 in step: x"
    assert card[3] == "  output:  step 1 of rank 2"
    assert card[4] == (
        "  others:  ranks 0-1 failed within 1.0 s after it (RuntimeError: Connection closed by "
        "peer); rank 3 stopped by the launcher or killed (no record) after rank 2 failed"
    )


def test_the_last_dumps_are_grouped(tmp_path: Path) -> None:
    """No record but stack dumps: the rank whose stack differs is named."""
    for rank in (0, 1, 3):
        _rank(tmp_path, rank, None, _dump_waiting)
    _rank(tmp_path, 2, None, _dump_sleeping)
    card = why(tmp_path)
    assert card[0] == "distenv why: no rank recorded a failure"
    assert card[1].startswith("  silent:  ranks 0-3 left no record"), card
    assert card[2] == "  stacks:  the last dump: rank 2's stack differs from the other ranks'"
    assert card[3].startswith("  differs: rank 2 at test_why.py:"), card
    assert "in _dump_sleeping" in card[3], card
    assert card[4].startswith("  others:  ranks 0-1,3 at test_why.py:"), card


def test_a_folder_without_logs_is_refused(tmp_path: Path) -> None:
    """A folder no rank wrote to: one line naming it and where the logs come from."""
    with pytest.raises(ConfigurationError, match=r"holds no rank-N\.log.*Hint: pass the folder"):
        why(tmp_path)


def test_identity_reads_back() -> None:
    """The fault file's first line gives the rank's local rank, pid, host and start."""
    started = time.time()
    found = read_identity(identity(3, 1, started, 77).encode())
    assert found is not None
    assert found[:2] == (1, 77)
    assert found[3] == started
    assert read_identity(b"Fatal Python error: Segmentation fault\n") is None


@pytest.mark.parametrize(
    ("redirects", "tee", "local_rank", "expected"),
    [
        pytest.param("3", None, 0, {1, 2}, id="both"),
        pytest.param("0:1,1:2", None, 1, {2}, id="per-rank"),
        pytest.param("0:1,1:2", None, 2, set(), id="unnamed"),
        pytest.param("3", "0:2", 0, {1}, id="teed-back"),
        pytest.param("0", None, 0, set(), id="none"),
    ],
)
def test_torchrun_stream_specs(
    redirects: str, tee: str | None, local_rank: int, expected: set[int]
) -> None:
    """--redirects/--tee read as torchrun's Std.from_str: a number, or local_rank:number pairs."""
    assert hidden(streams(redirects), None if tee is None else streams(tee), local_rank) == expected


@pytest.mark.parametrize("bad", ["4", "x", "0:", "a:1", "0:1,,1:2"])
def test_bad_stream_specs(bad: str) -> None:
    """A spec torchrun would refuse is a usage error naming the part."""
    with pytest.raises(argparse.ArgumentTypeError):
        streams(bad)


def test_local_ranks_filter() -> None:
    """--local-ranks-filter 0,2 names local ranks."""
    assert local_rank_list("0, 2") == {0, 2}
    with pytest.raises(argparse.ArgumentTypeError, match="is not a local rank"):
        local_rank_list("0,-1")


def test_record_fields_are_checked() -> None:
    """A record's host, pid, local rank and start are read back only when they are sound."""
    line = Report("exception", "E", 1.0, host="n1", pid=5, local_rank=2, started=0.5).line()
    assert Report.parse(line) == Report("exception", "E", 1.0, host="n1", pid=5, local_rank=2,
                                        started=0.5)  # fmt: skip
    bad = b'{"kind": "exception", "what": "E", "at": 1.0, "pid": -3, "local_rank": "2", "host": 7}'
    parsed = Report.parse(bad)
    assert parsed is not None
    assert (parsed.host, parsed.pid, parsed.local_rank, parsed.started) == ("", 0, -1, 0.0)
