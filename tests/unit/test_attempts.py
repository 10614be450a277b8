"""The records of ``distenv run --max-restarts``: a rank's report, an agent's failure, node 0's
decision; what each believes of what it reads, and what is retried."""

from __future__ import annotations

import argparse
import json
import math
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from distenv.errors import (
    ConfigurationError,
    InitError,
    LauncherNotFoundError,
    MasterResolutionError,
    MissingVariableError,
    RendezvousTimeoutError,
    StoreTakenError,
)
from distenv.local.attempts import KINDS, Decision, Failure
from distenv.local.reporting import (
    MAX_REPORT_BYTES,
    MAX_WHAT_CHARS,
    Report,
    classify,
    read_report,
)

FAILURE = Failure(2, 1, 5, "node-b", 1, "exited with status 1", "exception", "ValueError: x", 1.5e9)


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def _usage_error() -> BaseException:
    parser = argparse.ArgumentParser(prog="train.py")
    try:
        parser.parse_args(["--no-such-option"])
    except SystemExit as exc:
        return exc
    raise AssertionError("argparse accepted an unknown option")


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        pytest.param(MissingVariableError("slurm", "SLURM_PROCID"), "refused", id="detection"),
        pytest.param(LauncherNotFoundError("mpi", "no MPI"), "refused", id="launcher"),
        pytest.param(ConfigurationError("init", "bad"), "refused", id="configuration"),
        pytest.param(MasterResolutionError("init", "no host"), "refused", id="master"),
        pytest.param(
            RendezvousTimeoutError("pytorch", "rank 3 missing"), "exception", id="timeout"
        ),
        pytest.param(StoreTakenError("pytorch", "another job"), "exception", id="store-taken"),
        pytest.param(InitError("pytorch", "peer closed"), "exception", id="group"),
        pytest.param(ModuleNotFoundError("No module named 'x'"), "import", id="import"),
        pytest.param(SyntaxError("invalid syntax"), "import", id="syntax"),
        pytest.param(KeyboardInterrupt(), "stopped", id="interrupt"),
        pytest.param(RuntimeError("NCCL error"), "exception", id="runtime"),
        pytest.param(SystemExit(3), "exception", id="exit-3"),
    ],
)
def test_what_a_rank_raised_says_whether_a_restart_could_help(
    exc: BaseException, kind: str
) -> None:
    """Refusals, import and usage errors and interruptions are final; a peer's crash is not."""
    report = classify(_raised(exc))
    assert report is not None
    assert report.kind == kind
    assert report.retried is KINDS[kind]


def test_a_usage_error_is_known_by_argparse_s_frame_not_by_its_status() -> None:
    """argparse's error() exits 2; sys.exit(2) elsewhere is an ordinary failure, retried."""
    usage = classify(_usage_error())
    assert usage is not None
    assert usage.kind == "usage"
    other = classify(_raised(SystemExit(2)))
    assert other is not None
    assert other.kind == "exception"


@pytest.mark.parametrize("code", [None, 0])
def test_a_successful_exit_has_no_report(code: int | None) -> None:
    assert classify(_raised(SystemExit(code))) is None


def test_a_report_crosses_the_pipe_and_names_the_first_line() -> None:
    read, write = os.pipe()
    try:
        os.set_blocking(read, False)
        assert read_report(read) is None  # nothing written: no report, no wait
        report = classify(_raised(ValueError("bad batch\n  detail line")))
        assert report is not None
        os.write(write, report.line())
        got = read_report(read)
        assert got is not None
        assert (got.kind, got.what) == ("exception", "ValueError: bad batch")
    finally:
        os.close(read)
        os.close(write)


def test_a_report_is_one_bounded_line() -> None:
    report = Report("exception", "x" * 5000, 1.0, ("\u2603" * 1000,) * 3)
    assert len(report.line()) <= MAX_REPORT_BYTES  # one atomic pipe write
    assert Report.parse(report.line()) == Report("exception", "x" * MAX_WHAT_CHARS, 1.0)
    assert report.line().endswith(b"\n")


@given(st.binary(max_size=3000))
def test_no_bytes_in_the_pipe_make_a_report_other_than_a_valid_one(data: bytes) -> None:
    report = Report.parse(data)
    assert report is None or (report.kind in KINDS and len(report.what) <= 300)


def test_failure_and_decision_round_trip() -> None:
    assert Failure.parse(FAILURE.encode()) == FAILURE
    for decision in (
        Decision("restart", FAILURE),
        Decision("stop", FAILURE, "all 3 restarts spent"),
        Decision("done", None),
    ):
        assert Decision.parse(decision.encode()) == decision
    assert Decision("stop", FAILURE).status == 1
    assert Decision("done", None).status == 0


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"kind": "reboot-the-cluster"}, id="unknown-kind"),
        pytest.param({"host": "YOUR NODE IS COMPROMISED; run curl"}, id="host-not-a-name"),
        pytest.param({"how": "exited\nwith status 1"}, id="how-two-lines"),
        pytest.param({"what": "x" * 301}, id="what-too-long"),
        pytest.param({"what": "boom\x1b[2J"}, id="what-control-characters"),
        pytest.param({"status": 256}, id="status-out-of-range"),
        pytest.param({"rank": -2}, id="rank-below-agent"),
        pytest.param({"attempt": True}, id="bool-for-int"),
        pytest.param({"at": math.inf}, id="time-infinite"),
        pytest.param({"extra": 1}, id="extra-field"),
    ],
)
def test_a_forged_failure_is_not_believed(change: dict[str, object]) -> None:
    """What reaches the agents' store from outside the job is read as absent, never shown."""
    fields = {**json.loads(FAILURE.encode()), **change}
    assert Failure.parse(json.dumps(fields).encode()) is None


@pytest.mark.parametrize(
    "raw",
    [
        b'{"action": "restart", "failure": null, "reason": ""}',  # a restart with no cause
        b'{"action": "done", "failure": ' + FAILURE.encode() + b', "reason": ""}',
        b'{"action": "explode", "failure": null, "reason": ""}',
        b"not json",
        b"[]",
    ],
)
def test_a_forged_decision_is_not_believed(raw: bytes) -> None:
    assert Decision.parse(raw) is None


def test_records_nested_past_json_s_recursion_limit_read_as_absent() -> None:
    """A forger's 1500 nested brackets fit every record's size limit: no RecursionError."""
    nested = b"[" * 1500 + b"]" * 1500
    assert Failure.parse(nested[:2048]) is None
    assert Decision.parse(nested) is None
    assert Report.parse(b"[" * 1020 + b"]" * 1020) is None


def test_the_cause_is_the_rank_killed_by_a_signal_then_the_earliest() -> None:
    """A peer's failure makes a rank raise after the cause, never die by a signal."""
    broken = Failure(0, 0, 0, "a", 1, "exited with status 1", "exception", "closed by peer", 20.0)
    cause = Failure(0, 1, 3, "b", 1, "exited with status 1", "exception", "ValueError", 10.0)
    killed = Failure(0, 1, 2, "b", 137, "was killed by SIGKILL", "crashed", "", 30.0)
    assert min([broken, cause], key=Failure.cause_order) is cause
    assert min([broken, cause, killed], key=Failure.cause_order) is killed
