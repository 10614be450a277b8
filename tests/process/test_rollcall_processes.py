"""The roll call inside init_dist, with real processes: nobody waits in silence."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distenv.bootstrap.scope import job_scope, prefix
from distenv.bootstrap.store import listen_address
from distenv.detection.pipeline import explain
from distenv.settings import Settings
from tests.conftest import scrubbed_environ
from tests.support.envs import flux
from tests.support.spawn import REPO, contract_env, free_port

# The rank starts as a command a shell runs in the foreground does, whatever this test process
# inherited: SIGINT raises KeyboardInterrupt and is not blocked (a process started with SIGINT
# ignored keeps it ignored, and Python then installs no KeyboardInterrupt for it). What it
# inherited is printed for the failure message.
CHILD = r"""
import signal, sys
inherited = (signal.getsignal(signal.SIGINT), signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
print(f"INHERITED SIGINT handler={inherited[0]!r} blocked={inherited[1]}", file=sys.stderr, flush=True)
import torch
import distenv
print("READY", flush=True)
launcher = sys.argv[2] if len(sys.argv) > 2 else "pytorch"
try:
    info = distenv.init_dist(launcher=launcher, rendezvous_timeout=float(sys.argv[1]))
except distenv.DistEnvError as exc:
    print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
    sys.exit(1)
print(f"OK {info.rank}", flush=True)
"""


def start(
    env: dict[str, str], timeout_s: float, launcher: str = "pytorch"
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(timeout_s), launcher],
        # A rank that hangs is sent SIGABRT by `finish`: faulthandler then prints every thread.
        env={**env, "PYTHONFAULTHANDLER": "1"},
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def ready(procs: list[subprocess.Popen[str]], limit: float = 120) -> float:
    """Wait until every process printed READY (torch and distenv imported); return that time.

    Bounds are measured from here: importing torch takes seconds on a busy 2-core machine, and it
    happens before init_dist, outside distenv's deadline.
    """
    deadline = time.monotonic() + limit
    for proc in procs:
        assert proc.stdout is not None
        while proc.stdout.readline() != "READY\n":
            assert time.monotonic() < deadline, "a rank never got ready"
            assert proc.poll() is None, "a rank exited before it got ready"
    return time.monotonic()


def _signal_masks(pid: int) -> str:
    """Return each thread's pending, blocked, ignored and caught signal masks (/proc)."""
    lines = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        with contextlib.suppress(OSError):
            status = (task / "status").read_text().splitlines()
            wanted = ("Name", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
            lines.append(
                " ".join(line.replace("\t", "=") for line in status if line.startswith(wanted))
            )
    return "\n".join(lines)


def finish(procs: list[subprocess.Popen[str]], limit: float) -> list[tuple[int, str]]:
    """Return each process's status and output; past `limit`, fail with the hung one's stacks.

    Every process is reaped (and its pipes closed) before this returns or raises, so that none
    outlives its test.
    """
    deadline = time.monotonic() + limit
    results = []
    try:
        for proc in procs:
            try:
                out, _ = proc.communicate(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                masks = _signal_masks(proc.pid)
                proc.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
                out, err = proc.communicate(timeout=30)
                raise AssertionError(
                    f"pid {proc.pid} still ran {limit:g} s on; its output:\n{out}\n"
                    f"its threads' signal masks:\n{masks}\nits threads at SIGABRT:\n{err}"
                ) from None
            results.append((proc.returncode, out))
    finally:
        for proc in procs:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired, ValueError):
                proc.communicate(timeout=30)
    return results


def test_missing_rank_is_named_within_the_timeout() -> None:
    """World size 3, rank 2 never started: ranks 0 and 1 fail within timeout + 10 s, naming it."""
    port = free_port()
    procs = [start(contract_env(rank, 3, port), 3.0) for rank in (0, 1)]
    start_time = ready(procs)
    results = finish(procs, 3.0 + 30)
    elapsed = time.monotonic() - start_time
    for code, out in results:
        assert code == 1, out
        assert "RendezvousTimeoutError" in out
        assert "1 of 3 ranks did not check in within 3 s: rank 2" in out
    # From the ranks' start of init_dist: the 3 s wait, well within the deadline (3 + 10 s).
    assert elapsed < 3.0 + 10


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


def test_flux_tasks_whose_local_ranks_contradict_their_host_fail_every_process() -> None:
    """Three Flux tasks on this one host, two of them with FLUX_TASK_LOCAL_ID 0 (the variables of
    two nodes' tasks): the roll call counts the tasks per host, every task stops, naming the host.
    """
    port, host = free_port(), socket.gethostname()
    master = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    size = {"FLUX_JOB_SIZE": "3", "PMI_SIZE": "3"}  # the pmi plug-in numbers the same tasks
    envs = [{**scrubbed_environ(), **flux.FLUX_2X2[rank], **master, **size} for rank in range(3)]
    procs = [start(env, 20.0, "flux") for env in envs]
    results = finish(procs, 60)
    for code, out in results:
        assert code == 1, out
        assert f"flux: roll call failed: 2 ranks on {host!r} share local rank 0" in out, out


def test_master_never_started_names_host_and_port() -> None:
    """Rank 1 alone: it fails within its timeout naming the master's host:port."""
    port = free_port()
    results = finish([start(contract_env(1, 2, port), 2.0)], 30)
    code, out = results[0]
    assert code == 1
    assert f"could not reach rank 0's store at 127.0.0.1:{port} within 2 s" in out


def _wait_listening(port: int, limit: float) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.05)
    raise AssertionError(f"nothing listened on {port} within {limit} s")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_during_roll_call_exits_promptly_and_frees_the_port(sig: signal.Signals) -> None:
    """Rank 0 waiting for a rank that never comes: a signal ends it at once, and its store no
    longer listens: the next store binds the port at once (as torch's does, with SO_REUSEADDR,
    which a connection of the old store's left in TIME_WAIT does not hold up, and a listener
    does)."""
    port = free_port()
    proc = start(contract_env(0, 2, port), 120.0)
    try:
        _wait_listening(port, 60)
    except AssertionError:
        finish([proc], 0)  # reaps it
        raise
    time.sleep(0.3)  # past the store's creation, into the roll call's wait
    sent = time.monotonic()
    proc.send_signal(sig)
    ((code, out),) = finish([proc], 20)
    assert time.monotonic() - sent < 5
    assert code == 1, out
    assert f"interrupted by {sig.name} during the roll call" in out
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))  # would raise EADDRINUSE if the store still listened


def test_sigterm_while_reaching_the_master_exits_with_a_message() -> None:
    """Rank 1 polling for a master that never starts: SIGTERM ends it promptly, with a message."""
    proc = start(contract_env(1, 2, free_port()), 120.0)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "READY\n"
    time.sleep(0.5)  # detection takes milliseconds; then it polls for the master
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    ((code, out),) = finish([proc], 20)
    assert time.monotonic() - sent < 5
    assert code == 1, out
    assert "interrupted by SIGTERM during the connection to rank 0's store" in out


def test_unresolvable_master_is_named_at_once() -> None:
    """MASTER_ADDR that does not resolve: every rank fails at once naming it, no timeout wait."""
    port = free_port()
    began = time.monotonic()
    procs = [
        start(contract_env(rank, 2, port, addr="no-such-host.invalid"), 120.0) for rank in (0, 1)
    ]
    for code, out in finish(procs, 60):
        assert code == 1, out
        assert "MasterResolutionError" in out
        assert "cannot resolve the master address 'no-such-host.invalid'" in out
    assert time.monotonic() - began < 60


def test_store_listens_only_on_the_master_address() -> None:
    """MASTER_ADDR=127.0.0.2 (a literal address): rank 0's store is reachable there, not on .1."""
    port = free_port()
    proc = start(contract_env(0, 2, port, addr="127.0.0.2"), 60.0)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.2", port), 0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "rank 0 never listened on 127.0.0.2"
                time.sleep(0.05)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), 2).close()
    finally:
        proc.kill()
        proc.communicate()


@pytest.mark.parametrize(
    ("host", "resolved", "expected"),
    [
        ("10.1.2.3", "10.1.2.3", "10.1.2.3"),  # a routable address: only there
        ("gpu017", "10.1.2.3", ""),  # a name: the others may resolve it elsewhere
        ("127.0.0.1", "127.0.0.1", "127.0.0.1"),  # literal loopback: a one-node job
        ("vm", "127.0.1.1", ""),  # Debian maps its own name to 127.0.1.1: every interface
        ("localhost", "::1", ""),
        ("::1", "::1", "::1"),
        ("[::1]", "::1", "::1"),
    ],
)
def test_listen_address_rule(host: str, resolved: str, expected: str) -> None:
    """The store binds to the master's address given literally, to every interface for a name."""
    family = socket.AF_INET6 if ":" in resolved else socket.AF_INET
    addresses = [(family, socket.SOCK_STREAM, 6, "", (resolved, 1))]
    assert listen_address(host, addresses) == (family, expected)


def test_a_store_not_started_by_distenv_is_named() -> None:
    """A torch store that no distenv rank 0 claimed: rank 1 says so at its timeout, joins nothing,
    and wrote nothing outside its own job's keys."""
    import datetime

    from torch.distributed import TCPStore

    # Port 0: the server binds the port the kernel picks (no window for another to take it).
    other = TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30))
    port = other.port
    proc = start(contract_env(1, 2, port), 3.0)
    began = ready([proc])
    ((code, out),) = finish([proc], 60)
    assert code == 1, out
    assert "it is a store not started by distenv, or rank 0 stalled before claiming it" in out
    assert time.monotonic() - began < 3.0 + 10
    assert not other.check(["distenv/scope/0"])
    # What the rank wrote lies under its own job's prefix, which no other job reads: its check-in
    # and its count (the store's own count key besides).
    ours = prefix(
        job_scope(explain("pytorch", contract_env(1, 2, port)).scope, 2),
        "rollcall",
        Settings().restart,
    )
    assert other.check([f"{ours}/checkin/1", f"{ours}/written"])
    assert other.num_keys() <= 3
