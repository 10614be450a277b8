"""The in-process hang autopsy's pure parts: its store records, the stack it posts, its card."""

from __future__ import annotations

import json
import os
import sys
import sysconfig
import threading

import pytest

from distenv.bootstrap.hang import Hung, _answered, _post, card
from distenv.bootstrap.records import ForeignRecordError
from distenv.errors import ConfigurationError
from distenv.postmortem.stacks import MAX_STACK_FRAMES, main_stack, thread_text
from distenv.settings import Settings, seconds

TORCH = os.path.join(sysconfig.get_paths()["purelib"], "torch/distributed/distributed_c10d.py")
ALL_REDUCE = ((TORCH, 3252, "all_reduce"), ("/job/t.py", 88, "train"))
SLEEP = (("/job/t.py", 54, "train"),)


def test_a_hung_record_round_trips_and_a_foreign_one_is_refused() -> None:
    """Hung's JSON reads back as written; extra fields, wrong types or a bad host are refused."""
    hung = Hung(2, "n2", "train.py:54 in train", 1795809000.5)
    assert Hung.parse(hung.encode().encode()) == hung
    good = json.loads(hung.encode())
    for bad in (
        {**good, "extra": 1},
        {**good, "since": "yesterday"},
        {**good, "since": float("nan")},
        {**good, "since": 1e300},
        {**good, "rank": -1},
        {**good, "host": "n2; rm -rf /"},
        {**good, "where": 5},
    ):
        with pytest.raises(ForeignRecordError):
            Hung.parse(json.dumps(bad).encode())
    with pytest.raises(ForeignRecordError):
        Hung.parse(b"x" * 5000)


def test_the_posted_stack_is_the_main_thread_s_in_faulthandler_s_format() -> None:
    """thread_text of the main thread, read back by main_stack: this test's frame is innermost."""
    main = threading.main_thread().ident or 0
    text = thread_text(main, sys._current_frames()[main])
    assert text.startswith(f"Current thread 0x{main:016x} (most recent call first):\n")
    host, stack = _post(json.dumps({"host": "n1", "stack": text}).encode(), "stack/0")
    assert host == "n1"
    assert stack[0] == (
        __file__,
        stack[0][1],
        "test_the_posted_stack_is_the_main_thread_s_in_faulthandler_s_format",
    )


def test_a_deep_stack_is_cut_at_faulthandler_s_limit() -> None:
    """A recursion 300 deep posts at most MAX_STACK_FRAMES frames, and says it cut."""
    found: list[str] = []

    def down(depth: int) -> None:
        if depth:
            down(depth - 1)
        else:
            found.append(thread_text(1, sys._getframe()))

    down(300)
    assert len(main_stack(found[0].encode())) == MAX_STACK_FRAMES
    assert found[0].endswith("  ...\n")


def test_a_foreign_stack_post_is_refused() -> None:
    """A stack key holding anything but distenv's record is refused, never parsed as a stack."""
    for raw in (b"not json", b'{"host": "n1"}', b'{"host": "n1", "stack": 3}', b"[" * 70000):
        with pytest.raises(ForeignRecordError):
            _post(raw, "stack/1")


def test_the_card_names_the_rank_whose_stack_differs_and_those_that_did_not_answer() -> None:
    """Rank 2 sleeps, 0-1 wait in all_reduce, 3 never answered: each is said, in one card."""
    hung = Hung(1, "n1", "t.py:88 in train", 0.0)
    text = card(hung, 3.0, {0: ALL_REDUCE, 1: ALL_REDUCE, 2: SLEEP}, [3], "/logs")
    lines = text.splitlines()
    assert lines[0] == "distenv: the job hung: rank 2's stack differs from the other ranks'"
    assert lines[1].startswith("  first:   rank 1 on n1 made no progress for 3 s, since ")
    assert lines[2] == "  differs: rank 2 at t.py:54 in train"
    assert lines[3] == "  others:  ranks 0-1 waiting in all_reduce at t.py:88 in train"
    assert lines[4] == "           rank 3: no dump (ended, or not a Python rank)"
    assert lines[5] == "  stacks:  /logs/rank-N.fault hold every thread's stack"
    assert (
        lines[6] == "  stopped: every rank that answered ends itself with status 124, as timeout(1)"
    )
    assert len(lines) == 7


def test_a_bad_hang_timeout_is_refused_naming_init_dist_s_setting() -> None:
    """$DISTENV_HANG_TIMEOUT read by init_dist, and hang_timeout=, are refused with their fix."""
    with pytest.raises(ConfigurationError) as caught:
        Settings.read({"DISTENV_HANG_TIMEOUT": "soon"}).hang_seconds(None, who="init")
    message = str(caught.value)
    assert message.startswith("init: $DISTENV_HANG_TIMEOUT is 'soon', expected a positive")
    assert "Hint: export DISTENV_HANG_TIMEOUT=300" in message
    with pytest.raises(ConfigurationError, match=r"hang_timeout=-1 is invalid"):
        seconds(-1, "hang_timeout")


@pytest.mark.parametrize(
    ("printed", "answered"),
    [(b"0 4", 4), (b"3 2", 2), (None, 0), (b"", 0), (b"0", 0), (b"0 x", 0), (b"-1 4", 0)],
)
def test_the_card_record_says_how_many_ranks_end_together(
    printed: bytes | None, answered: int
) -> None:
    """The card record is "<collector> <answered>"; anything else waits for nobody."""
    assert _answered(printed) == answered
