"""Forged store entries, written by an outsider while a real roll call waits.

Ranks 0 and 1 of a world of 3 run `init_dist` in real processes (rank 2 never comes, so the roll
call waits); the test process connects to rank 0's store as any process on the network can, and
writes under the job's own keys. Whatever it writes, no rank crashes with a raw exception, no rank
prints the forged text, and every rank ends with a DistEnvError within the bootstrap's bound.
"""

from __future__ import annotations

import json
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
        store.set("verdict", json.dumps({"scope": scope, "ok": True, "problems": [], "nodes": []}))

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
