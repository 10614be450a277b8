"""Forged store entries, written by an outsider while a real roll call waits.

Ranks 0 and 1 of a world of 3 run `init_dist` in real processes (rank 2 never comes, so the roll
call waits); the test process connects to rank 0's store as any process on the network can, and
writes under the job's own keys. Whatever it writes, no rank crashes with a raw exception, no rank
prints the forged text, and every rank ends with a DistEnvError within the bootstrap's bound.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from distenv.bootstrap.records import CheckIn
from distenv.bootstrap.scope import job_scope, prefix
from distenv.detection.pipeline import explain
from distenv.settings import Settings
from distenv.timing import GRACE_S
from tests.process.test_rollcall_processes import _wait_listening, finish, ready, start
from tests.support.spawn import contract_env, free_port

TIMEOUT = 4.0
EVIL = "EVIL-TEXT-FROM-AN-OUTSIDER"
# Measured from the ranks' READY (torch imported): the bound, plus the ranks' own exit.
SLACK = 3.0


def _job(port: int) -> tuple[list[dict[str, str]], str]:
    envs = [contract_env(r, 3, port, extra={"DISTENV_RUN_ID": "victim"}) for r in range(3)]
    scope = job_scope(explain("pytorch", envs[0]).scope, 3)
    return envs, scope


def _outsider(port: int, scope: str) -> Any:
    """Return a store client on the job's roll-call prefix, as an outsider would make."""
    import datetime

    from torch.distributed import PrefixStore, TCPStore

    _wait_listening(port, 60)
    client = TCPStore("127.0.0.1", port, 3, False, timeout=datetime.timedelta(seconds=30))
    return PrefixStore(prefix(scope, "rollcall", Settings().restart), client)


def _checked_in(store: Any, count: int) -> None:
    deadline = time.monotonic() + 60
    while int(store.add("written", 0)) < count:
        assert time.monotonic() < deadline, "the ranks never checked in"
        time.sleep(0.05)


def _forge_record(store: Any, value: str | bytes) -> str:
    """Claim the absent rank 2's key, as its check-in would, and count it written."""
    key = "checkin/2"
    store.compare_set(key, "", value)
    store.add("written", 1)
    return key


def _run(forge: Any) -> tuple[list[tuple[int, str]], float]:
    port = free_port()
    envs, scope = _job(port)
    procs = [start(envs[rank], TIMEOUT) for rank in (0, 1)]
    began = ready(procs)
    try:
        forge(_outsider(port, scope), scope)
    except Exception:
        for proc in procs:
            proc.kill()
        raise
    results = finish(procs, TIMEOUT + GRACE_S + SLACK + 10)
    return results, time.monotonic() - began


def _no_forged_text(results: list[tuple[int, str]]) -> None:
    for code, out in results:
        assert code == 1, out
        assert out.count("ERROR ") == 1, out
        assert EVIL not in out, out
        for raw in ("TypeError", "JSONDecodeError", "KeyError", "Traceback"):
            assert raw not in out, out


def test_forged_failure_verdict_is_refused_not_printed() -> None:
    """0.1.0 printed a forged verdict's text as its own error; now both ranks refuse it."""

    def forge(store: Any, scope: str) -> None:
        _checked_in(store, 2)
        store.set("verdict", json.dumps({"ok": False, "problems": [EVIL], "checkins": []}))

    results, elapsed = _run(forge)
    _no_forged_text(results)
    (_, rank0), (_, rank1) = results
    assert "a process outside this job wrote this job's roll-call verdict" in rank0
    assert "the roll-call verdict in the store at 127.0.0.1:" in rank1
    assert "was not written by this job's distenv (unexpected or missing fields)" in rank1
    assert elapsed < TIMEOUT + GRACE_S + SLACK


def test_forged_ok_verdict_fails_within_the_bound() -> None:
    """A well-formed forged OK skips the missing-rank check on rank 1 only: it still ends, bounded."""

    def forge(store: Any, scope: str) -> None:
        _checked_in(store, 2)
        store.set(
            "verdict",
            json.dumps(
                {
                    "scope": scope,
                    "ok": True,
                    "problems": [],
                    "placed": False,
                    "release": "0123456789abcdef",
                }
            ),
        )

    results, elapsed = _run(forge)
    _no_forged_text(results)
    (_, rank0), (_, rank1) = results
    assert "a process outside this job wrote this job's roll-call verdict" in rank0
    assert "RendezvousTimeoutError" in rank1 or "lost rank 0's store" in rank1, rank1
    assert elapsed < TIMEOUT + GRACE_S + SLACK


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("{" + EVIL, id="not-json"),
        pytest.param(json.dumps({"rank": 2, "evil": EVIL}), id="wrong-fields"),
        pytest.param("[" + "1," * 60_000 + "1]", id="oversized"),
        pytest.param(
            json.dumps(
                CheckIn(
                    2, 3, 0, 1, 0, "h", 7, "pytorch", "h:1", "gloo", "2.13.0", scope="x/y/z"
                )._asdict()
            ),
            id="another-scope",
        ),
    ],
)
def test_forged_record_is_named_never_parsed(value: str) -> None:
    """A forged check-in makes the count complete; rank 0 names it as foreign and rank 2 as missing."""
    keys: list[str] = []

    def forge(store: Any, scope: str) -> None:
        keys.append(_forge_record(store, value))

    results, elapsed = _run(forge)
    _no_forged_text(results)
    for _, out in results:
        assert "RendezvousTimeoutError" in out, out
        assert f"the check-in record under {keys[0]} was not written by this job's distenv" in out
        assert "did not check in" in out
        assert "rank 2" in out
    assert elapsed < TIMEOUT + GRACE_S + SLACK


def _missing_verdict(scope: str, rank: int, host: str) -> str:
    """Return a well-formed failing verdict that names `rank` missing, expected on `host`."""
    from distenv.bootstrap.problems import Missing, problem_json

    problem = problem_json(Missing(1, 3, (rank,), ((host,),), (None,)))
    return json.dumps(
        {"scope": scope, "ok": False, "problems": [problem], "placed": False, "release": ""}
    )


def test_a_verdict_naming_a_rank_that_checked_in_missing_is_named_as_forged() -> None:
    """Issue #25: a forged verdict made rank 1 report itself missing, "expected on" a host name
    the forger chose. Now rank 1 knows it holds its key and calls the verdict forged, and rank 0
    names the rank really missing (2), not the forger's."""
    host = "YOUR-NODE-IS-COMPROMISED.run-curl-evil.example-sh"

    def forge(store: Any, scope: str) -> None:
        _checked_in(store, 2)
        store.set("verdict", _missing_verdict(scope, 1, host))

    results, elapsed = _run(forge)
    _no_forged_text(results)
    (_, rank0), (_, rank1) = results
    assert host not in rank0 + rank1
    assert "rank 0's own verdict: 1 of 3 ranks did not check in within 4 s: rank 2" in rank0
    assert (
        "was not written by this job's distenv (it names this rank missing, but this rank "
        "checked in under its own key)" in rank1
    ), rank1
    assert elapsed < TIMEOUT + GRACE_S + SLACK


def test_a_verdict_listing_other_claimers_of_a_rank_is_named_as_forged() -> None:
    """A forged "rank 1 was claimed by 2 processes" that does not list rank 1's own pid."""
    from distenv.bootstrap.problems import ClaimedTwice, problem_json

    def forge(store: Any, scope: str) -> None:
        _checked_in(store, 2)
        problem = problem_json(ClaimedTwice(1, (11, 12), ("a", "b")))
        verdict = {
            "scope": scope,
            "ok": False,
            "problems": [problem],
            "placed": False,
            "release": "",
        }
        store.set("verdict", json.dumps(verdict))

    results, _ = _run(forge)
    _no_forged_text(results)
    rank1 = results[1][1]
    assert "it lists the processes that claimed rank 1 without this one (pid " in rank1, rank1


def test_a_forged_check_in_count_blames_no_rank() -> None:
    """Issue #25: one ``add(written, 1000)`` ended a job's roll call at once, blaming rank 2,
    which had not had time to start. Now the records decide: rank 0 waits for rank 2's record
    (the forger's add wrote no word: rank 2's count does), and every rank, rank 2 included,
    names the count as a foreign write, long before the deadline."""
    port = free_port()
    envs, scope = _job(port)
    procs = [start(envs[rank], 30.0) for rank in (0, 1)]
    ready(procs)
    try:
        store = _outsider(port, scope)
        _checked_in(store, 2)
        store.add("written", 1000)
        time.sleep(1.0)  # rank 0 has seen the count by now: 0.2.0 gave up here
        procs.append(start(envs[2], 30.0))
        began = ready(procs[2:])
    except Exception:
        for proc in procs:
            proc.kill()
        raise
    results = finish(procs, 60)
    elapsed = time.monotonic() - began
    for code, out in results:
        assert code == 1, out
        # 1002 if rank 0 first looked after the forger's add, 1003 once rank 2's count woke it.
        assert re.search(
            r"the check-in count in rank 0's store read (1002 while 2|1003 while 3) check-in records",
            out,
        ), out
        assert "did not check in" not in out, out
    assert elapsed < 20, elapsed  # rank 2's check-in ends it, not the 30 s wait (10.7 s loaded)


def test_many_foreign_records_are_summarised_in_one_short_line() -> None:
    """64 forged extra claims and a forged record for rank 2: one problem names four keys and
    counts the rest (0.2.0: a 13 721-character line on every rank)."""

    def forge(store: Any, scope: str) -> None:
        for n in range(1, 65):
            store.set(f"extra/{n}", "{" + EVIL)
        store.add("extras", 64)
        _forge_record(store, "{" + EVIL)
        store.add("written", 64)

    results, _ = _run(forge)
    _no_forged_text(results)
    for _, out in results:
        line = next(line for line in out.splitlines() if line.startswith("ERROR "))
        assert (
            "65 check-in records (under checkin/2, extra/1, extra/2, extra/3 and 61 more)" in line
        )
        assert len(line) < 1000, len(line)
