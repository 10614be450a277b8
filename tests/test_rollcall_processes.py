"""The roll call inside init_dist, with real processes: nobody waits in silence."""

from __future__ import annotations

import subprocess
import sys
import time

from tests._spawn import REPO, contract_env, free_port

CHILD = r"""
import sys
import distenv
try:
    info = distenv.init_dist(launcher="pytorch", rendezvous_timeout=float(sys.argv[1]))
except distenv.DistEnvError as exc:
    print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
    sys.exit(1)
print(f"OK {info.rank}", flush=True)
"""


def start(env: dict[str, str], timeout_s: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(timeout_s)],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(procs: list[subprocess.Popen[str]], limit: float) -> list[tuple[int, str]]:
    deadline = time.monotonic() + limit
    results = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=max(deadline - time.monotonic(), 0.1))
            results.append((proc.returncode, out))
    finally:
        for proc in procs:
            proc.kill()
    return results


def test_missing_rank_is_named_within_the_timeout() -> None:
    """World size 3, rank 2 never started: ranks 0 and 1 fail within timeout + 10 s, naming it."""
    port = free_port()
    start_time = time.monotonic()
    procs = [start(contract_env(rank, 3, port), 3.0) for rank in (0, 1)]
    results = finish(procs, 3.0 + 30)
    elapsed = time.monotonic() - start_time
    for code, out in results:
        assert code == 1, out
        assert "RendezvousTimeoutError" in out
        assert "1 of 3 ranks did not check in within 3 s: rank 2" in out
    # Interpreter start and `import torch` cost a few seconds on 2 cores; the wait itself is 3 s.
    assert elapsed < 3.0 + 10 + 10


def test_duplicate_rank_fails_every_process() -> None:
    """Two processes claiming rank 1 of 3: everyone stops, the error names both pids."""
    port = free_port()
    procs = [start(contract_env(rank, 3, port), 20.0) for rank in (0, 1, 1)]
    results = finish(procs, 60)
    pids = [str(p.pid) for p in procs[1:]]
    for code, out in results:
        assert code == 1, out
        assert "rank 1 was claimed by 2 processes" in out
        assert all(pid in out for pid in pids), out


def test_master_never_started_names_host_and_port() -> None:
    """Rank 1 alone: it fails within its timeout naming the master's host:port."""
    port = free_port()
    results = finish([start(contract_env(1, 2, port), 2.0)], 30)
    code, out = results[0]
    assert code == 1
    assert f"could not reach rank 0's store at 127.0.0.1:{port} within 2 s" in out
