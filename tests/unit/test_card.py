"""The card's pieces without processes: rank ranges, how a rank ended, frames, OOM evidence."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from distenv.errors import InitError, RendezvousError, RollCallError
from distenv.local import reporting
from distenv.local.card import how, rank_ranges
from distenv.local.dumps import crash_frames
from distenv.local.ends import End
from distenv.local.reporting import (
    REPORT_FD_VAR,
    RETRIED,
    Report,
    classify,
    read_report,
    user_frames,
)
from distenv.system.processes import oom_killed_by_kernel_log, oom_kills


@pytest.mark.parametrize(
    ("ranks", "text"),
    [([0, 1, 3], "0-1,3"), ([2], "2"), ([5, 4, 0, 1, 2], "0-2,4-5"), ([7, 9, 11], "7,9,11")],
)
def test_rank_ranges(ranks: list[int], text: str) -> None:
    assert rank_ranges(ranks) == text


def _end(returncode: int, report: Report | None = None, oom: bool = False) -> End:
    return End(2, 2, 100, returncode, 1.0, report, oom=oom)


@pytest.mark.parametrize(
    ("end", "said"),
    [
        (
            _end(1, Report("exception", "ValueError: bad\x1b[31m", 1.0)),
            "raised ValueError: bad\\x1b[31m (exit status 1)",
        ),
        (
            _end(3, Report("exception", "SystemExit: 3", 1.0)),
            "exited with status 3 (SystemExit: 3)",
        ),
        (_end(-signal.SIGSEGV), "was killed by SIGSEGV (a crash in native code)"),
        (
            _end(-signal.SIGKILL, oom=True),
            "was killed by SIGKILL: killed by the kernel's OOM killer",
        ),
        (
            _end(-signal.SIGKILL),
            "was killed by SIGKILL, sent from outside distenv run (the OOM killer was not seen)",
        ),
        (_end(7), "exited with status 7"),
    ],
    ids=["raise", "exit", "segv", "oom", "kill", "status"],
)
def test_how_a_rank_failed_in_words(end: End, said: str) -> None:
    """Exception, exit status, signal, OOM; unprintable text from the rank is escaped."""
    assert how(end) == said


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_a_report_carries_the_user_frames_and_whether_a_peer_broke_it() -> None:
    """The frames are this file's (not pytest's or Python's); gloo's words mark a consequence."""
    exc = _raised(RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:1234"))
    report = classify(exc)
    assert report is not None
    assert report.peer
    assert report.frames
    assert all(f.startswith("test_card.py:") for f in report.frames)
    assert Report.parse(report.line()) == report
    own = classify(_raised(ValueError("bad batch")))
    assert own is not None
    assert not own.peer
    assert user_frames(None) == ()


def test_a_negative_verdict_is_a_refusal_and_a_foreign_record_a_consequence() -> None:
    """RollCallError, raised alike on every rank, is the job's own refusal (not retried); another
    RendezvousError (a record this job did not write) is counted as a consequence, as an InitError
    is unless its raise site says it is a refusal."""
    refused = classify(_raised(RollCallError("slurm", "roll call failed: 2 ranks share rank 0")))
    assert refused is not None
    assert (refused.kind, refused.peer, RETRIED[refused.kind]) == ("refused", False, False)
    foreign = classify(_raised(RendezvousError("slurm", "the verdict was not written by it")))
    assert foreign is not None
    assert (foreign.kind, foreign.peer) == ("exception", True)
    # A raise site may say otherwise than its class: a build without torch.distributed.
    own = classify(_raised(InitError("init", "no torch.distributed", consequence=False)))
    assert own is not None
    assert (own.kind, own.peer) == ("refused", False)
    lost = classify(_raised(InitError("slurm", "init_process_group failed: closed by peer")))
    assert lost is not None
    assert (lost.kind, lost.peer) == ("exception", True)


def test_fault_frames_are_the_crashing_thread_s_user_frames(tmp_path: Path) -> None:
    """faulthandler's dump: the current thread's frames in the user's code, innermost last."""
    script = tmp_path / "train.py"
    script.write_text("def f():\n    crash()\n\nf()\n")
    dump = tmp_path / "rank-1.fault"
    dump.write_text(
        "Fatal Python error: Segmentation fault\n\n"
        'Thread 0x01 (most recent call first):\n  File "/other.py", line 9 in idle\n\n'
        "Current thread 0x02 (most recent call first):\n"
        f'  File "{script}", line 2 in f\n'
        f'  File "{script}", line 4 in <module>\n\n'
        "Extension modules: numpy (total: 1)\n"
    )
    assert crash_frames(dump) == ("train.py:4 in <module>: f()", "train.py:2 in f: crash()")


def test_oom_kills_are_read_from_the_cgroup_s_memory_events(tmp_path: Path) -> None:
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "cgroup").write_text("0::/job/step\n")
    events = tmp_path / "sys" / "fs" / "cgroup" / "job" / "step"
    events.mkdir(parents=True)
    (events / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n")
    assert oom_kills(str(tmp_path / "proc"), str(tmp_path / "sys")) == 2
    assert oom_kills(str(tmp_path / "none"), str(tmp_path / "sys")) is None


def test_the_kernel_log_names_the_oom_killed_pid(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("3,1,2,-;Out of memory: Killed process 4242 (python) total-vm:1kB\n")
    assert oom_killed_by_kernel_log(4242, str(kmsg))
    assert not oom_killed_by_kernel_log(424, str(kmsg))
    assert not oom_killed_by_kernel_log(4242, str(tmp_path / "unreadable"))


def test_a_forked_child_s_exception_is_not_reported_as_the_rank_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A process the rank forked holds the report pipe too; only the rank's own report counts."""
    read, write = os.pipe()
    try:
        os.set_blocking(read, False)
        monkeypatch.setenv(REPORT_FD_VAR, str(write))
        child = os.fork()
        if child == 0:  # pragma: no cover - the child
            reporting._report(_raised(ValueError("the child's")))
            os._exit(0)
        os.waitpid(child, 0)
        assert read_report(read) is None
        reporting._report(_raised(ValueError("the rank's")))
        report = read_report(read)
        assert report is not None
        assert report.what == "ValueError: the rank's"
    finally:
        os.close(read)
        os.close(write)


@pytest.mark.parametrize(
    ("exc", "status"),
    [(SystemExit(7), 7), (SystemExit(256 + 3), 3), (SystemExit("bye"), 1), (ValueError("x"), 1)],
)
def test_a_rank_stopped_while_it_unwinds_keeps_pythons_status(
    exc: BaseException, status: int
) -> None:
    """The status Python was ending the rank with travels in its report (through the pipe's
    JSON line) and is the job's where distenv run's SIGTERM reaches the rank as it unwinds."""
    report = classify(exc)
    assert report is not None
    sent = Report.parse(report.line())
    assert sent is not None
    assert sent.status == status
    assert _end(-signal.SIGTERM, sent).status == status
    assert _end(-signal.SIGSEGV).status == 128 + signal.SIGSEGV  # a crash: no report


def test_a_report_s_status_out_of_range_reads_as_a_failure() -> None:
    """A status that is no exit status (0, out of range, not an int) reads as 1: a failure."""
    for value in (0, 256, -1, "7", 7.0, True):
        line = json.dumps({"kind": "exception", "what": "x", "at": 1.0, "status": value})
        parsed = Report.parse(line.encode())
        assert parsed is not None, value
        assert parsed.status == 1, value
