"""The hang autopsy's pure parts: faulthandler dumps read, stacks grouped, watchdog lines parsed."""

from __future__ import annotations

import faulthandler
import os
import signal
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

import pytest

from distenv.local.autopsy import describe, group, summary, suspects
from distenv.local.dumps import crash_frames, main_stack
from distenv.local.reporting import Report
from distenv.local.watchdog import parse_stuck, stuck_line

TORCH = os.path.join(sysconfig.get_paths()["purelib"], "torch/distributed/distributed_c10d.py")
ALL_REDUCE = ((TORCH, 3252, "all_reduce"), ("/job/train.py", 88, "train"))
SLEEP = (("/job/train.py", 54, "train"),)


def test_the_main_thread_is_the_last_block_of_a_real_dump(tmp_path: Path) -> None:
    """A real faulthandler dump with a second thread: the main thread's stack is found."""
    started, stop = threading.Event(), threading.Event()

    def other() -> None:
        started.set()
        stop.wait(10)

    thread = threading.Thread(target=other)
    thread.start()
    started.wait(10)
    path = tmp_path / "fault"
    try:
        with path.open("wb") as file:
            faulthandler.dump_traceback(file, all_threads=True)
    finally:
        stop.set()
        thread.join()
    stack = main_stack(path.read_bytes())
    assert stack[0][2] == "test_the_main_thread_is_the_last_block_of_a_real_dump"
    assert stack[0][0] == __file__


def test_a_crash_is_read_past_the_dumps_before_it(tmp_path: Path) -> None:
    """A SIGUSR1 dump earlier in the fault file is not taken for the crash's frames."""
    dump = b'Current thread 0x1 (most recent call first):\n  File "/job/old.py", line 1 in f\n\n'
    crash = b'Current thread 0x1 (most recent call first):\n  File "/job/new.py", line 2 in g\n'
    path = tmp_path / "fault"
    path.write_bytes(dump + crash)
    assert crash_frames(path) == ("old.py:1 in f",)
    assert crash_frames(path, len(dump)) == ("new.py:2 in g",)


def test_the_rank_whose_stack_differs_is_named_and_the_majority_after_it() -> None:
    """Three ranks in all_reduce, one in its own code: it differs; the others are the majority."""
    stacks = {0: ALL_REDUCE, 1: ALL_REDUCE, 2: SLEEP, 3: ALL_REDUCE}
    assert group(stacks) == [([0, 1, 3], ALL_REDUCE), ([2], SLEEP)]
    assert suspects(stacks) == "rank 2's stack differs from the other ranks'"
    assert summary(stacks, [4]) == [
        "  differs: rank 2 at train.py:54 in train",
        "  others:  ranks 0-1,3 waiting in all_reduce at train.py:88 in train",
        "           rank 4: no dump (ended, or not a Python rank)",
    ]


def test_equal_groups_name_no_majority() -> None:
    """Two against two: both stacks are shown, neither is called the majority."""
    stacks = {0: ALL_REDUCE, 1: SLEEP, 2: ALL_REDUCE, 3: SLEEP}
    assert suspects(stacks) == "no stack is the majority's: each group is shown"
    assert suspects({0: SLEEP, 1: SLEEP}) == "every rank's stack is the same (ranks 0-1)"
    lines = summary(stacks, [])
    assert [line.split()[0] for line in lines] == ["stack:", "stack:"]


@pytest.mark.parametrize(
    ("stack", "expected"),
    [
        (ALL_REDUCE, "waiting in all_reduce at train.py:88 in train"),
        (SLEEP, "at train.py:54 in train"),
        (((TORCH, 10**6, "barrier"),), f"in distributed_c10d.py:{10**6} in barrier"),
        ((), "no Python stack was written"),
    ],
)
def test_describe(stack: tuple[tuple[str, int, str], ...], expected: str) -> None:
    """The innermost call and the user's frame that made it."""
    assert describe(stack) == expected


def test_watchdog_lines_share_the_report_pipe() -> None:
    """A stuck line before a report: each is read as itself, the report stays the last line."""
    report = Report("exception", "ValueError: x", 1.5)
    data = stuck_line("train.py:88 in train", 2.5) + report.line()
    assert parse_stuck(data) == ("train.py:88 in train", 2.5)
    assert Report.parse(data) == report
    assert Report.parse(stuck_line("f", 1.0)) is None
    assert parse_stuck(b'{"stuck": 3, "since": 1.0}\n') is None


@pytest.mark.parametrize("install", [False, True])
def test_a_forked_child_keeps_the_script_s_own_sigusr1_handler(
    tmp_path: Path, install: bool
) -> None:
    """arm() then fork: a handler the script installed survives in the child; ours is dropped."""
    code = (
        "import os, signal, sys\n"
        "from distenv.local.watchdog import arm\n"
        "fault = os.open(sys.argv[1] + '/fault', os.O_WRONLY | os.O_CREAT, 0o600)\n"
        "arm(fault, None, None)\n"
        "def mine(*_): pass\n"
        "if sys.argv[2] == '1': signal.signal(signal.SIGUSR1, mine)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.kill(os.getpid(), signal.SIGUSR1)\n"
        "    os._exit(7)\n"
        "print(os.waitpid(pid, 0)[1])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path), "1" if install else "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    # The script's handler ran in the child, which then exited 7; without one, SIGUSR1's default
    # action ended it, as without distenv.
    expected = 7 if install else -signal.SIGUSR1
    assert os.waitstatus_to_exitcode(int(result.stdout)) == expected, result
