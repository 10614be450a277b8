"""Host files cannot stall init_dist: a FIFO is refused at once, a read that blocks is abandoned.

Real processes. A rank whose $PBS_NODEFILE names a FIFO nobody writes to hung in open() for ever
under 0.1.0 (issue #25: killed at 25 s with DISTENV_TIMEOUT=3). The blocking read of a hung
network file system is stood in for by a real blocking open: a file under a write lease (fcntl(2),
F_SETLEASE) held by another process, the kernel's mechanism behind NFS delegations and Samba's
oplocks. Opening it for reading waits until the holder gives the lease up, or for
/proc/sys/fs/lease-break-time (45 s by default).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from distenv._hosts import read_host_file
from distenv.errors import InvalidVariableError
from distenv.timing import GRACE_S
from tests.process.test_run import REPO, launcher_env, wait_for
from tests.process.test_survivors import LEFTOVERS
from tests.support.envs import pbs

# Takes a write lease on argv[1], says so, and holds it until killed. The lease breaker's signal
# (SIGIO by default, whose default action ends the process) is ignored: the lease stays until
# lease-break-time, so the reader's open blocks that long.
HOLD_LEASE = """
import fcntl, os, signal, sys, time
signal.signal(signal.SIGIO, signal.SIG_IGN)
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
print("held", flush=True)
time.sleep(120)
"""


class Lease(NamedTuple):
    """A file and the process that holds a write lease on it."""

    path: Path
    holder: subprocess.Popen[str]


@pytest.fixture
def lease(tmp_path: Path) -> Iterator[Lease]:
    """A node file under a write lease held by another process, at most for the test's duration."""
    path = tmp_path / "nodefile"
    path.write_text("x1\n")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LEASE, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        yield Lease(path, holder)
    finally:
        holder.kill()
        holder.communicate()


def _readers() -> list[threading.Thread]:
    """Return the threads `distenv.deadline.bounded` runs calls in."""
    return [t for t in threading.enumerate() if t.name == "distenv-bootstrap"]


def test_a_read_that_blocks_is_abandoned_at_the_bound(lease: Lease) -> None:
    """The open blocks (the lease), and the read gives up at its bound naming the variable, the
    path and the likely cause; once the file answers again, the abandoned thread ends too."""
    path = str(lease.path)
    before = set(_readers())  # threads earlier tests abandoned may still be blocked
    with pytest.raises(InvalidVariableError) as caught:
        read_host_file("pbs", "PBS_NODEFILE", path, "node file", within=0.5)
    error = caught.value
    assert (error.variable, error.value) == ("PBS_NODEFILE", path)
    assert str(error).startswith(
        f"pbs: $PBS_NODEFILE is {path!r}, expected a node file that can be read within 0.5 s; "
        "reading it did not return, as on a hung network file system. Hint: check the file "
        "system that holds it on this node (a `stat` of the path hangs too when its server does "
        "not answer), or point $PBS_NODEFILE at a copy on a local disk"
    ), error
    (reader,) = set(_readers()) - before  # still blocked in open(): the lease lasts 45 s
    lease.holder.kill()  # the lease goes with its holder: the open returns, the thread ends
    wait_for(lambda: not reader.is_alive())


def test_a_fifo_node_file_ends_init_dist_at_once(tmp_path: Path) -> None:
    """init_dist in a PBS job script whose PBS_NODEFILE names a FIFO with no writer: exit 1
    within the bootstrap's deadline, naming the variable, and no process left behind."""
    fifo = tmp_path / "nodefile"
    os.mkfifo(fifo)
    report = tmp_path / "leftovers.json"
    env = launcher_env(
        PBS_JOBID=pbs.PBS_SCRIPT["PBS_JOBID"], PBS_NODEFILE=str(fifo), DISTENV_TIMEOUT="3"
    )
    started = time.monotonic()
    rank = subprocess.run(
        [sys.executable, LEFTOVERS, str(report), sys.executable, "-c",
         "import distenv; distenv.init_dist()"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    found = json.loads(report.read_text())
    assert found["status"] == 1, rank.stderr
    assert found["ended"] - started < 3 + GRACE_S, rank.stderr  # the deadline; 0.1.0: never
    assert found["left"] == [], found
    # One line, from where the script called init_dist (distenv.exits).
    (line,) = rank.stderr.strip().splitlines()
    assert line.startswith(
        f"<string>:1: distenv.errors.InvalidVariableError: pbs: $PBS_NODEFILE is {str(fifo)!r}, "
        "expected a node file: a regular file, one host per slot, not a FIFO (named pipe)"
    ), rank.stderr
