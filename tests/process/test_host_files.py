"""Host files cannot stall init_dist: a FIFO is refused at once, a read that blocks is abandoned.

Real processes. A rank whose $PBS_NODEFILE names a FIFO nobody writes to hung in open() for ever
under 0.1.0 (issue #25: killed at 25 s with DISTENV_TIMEOUT=3). The blocking read of a hung
network file system is stood in for by a real blocking open: a file under a write lease (fcntl(2),
F_SETLEASE) held by another process, the kernel's mechanism behind NFS delegations and Samba's
oplocks. Opening it for reading waits until the holder gives the lease up, or for
/proc/sys/fs/lease-break-time (45 s by default).
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from distenv._hosts import host_files, read_host_file
from distenv.errors import InvalidVariableError
from distenv.timing import GRACE_S
from tests.process.test_run import REPO, launcher_env, wait_for
from tests.process.test_survivors import LEFTOVERS
from tests.support.envs import lsf, pbs

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


def test_a_hung_file_is_given_up_once_per_detection(lease: Lease) -> None:
    """Within one detection (`host_files`) a path is read once: a second read of the hung file
    raises the first one's error at once, stating the one bound both had (#44 item 12)."""
    path = str(lease.path)
    errors = []
    started = time.monotonic()
    with host_files(within=0.5):
        for variable in ("LSB_DJOB_RANKFILE", "LSB_DJOB_RANKFILE"):
            with pytest.raises(InvalidVariableError) as caught:
                read_host_file("lsf", variable, path, "rank file")
            errors.append(str(caught.value))
    assert time.monotonic() - started < 0.5 + 2  # one bound, not two (and the thread's slice)
    assert errors[0] == errors[1]
    assert "expected a rank file that can be read within 0.5 s;" in errors[0], errors[0]


def _opens_of(path: Path) -> Callable[[], int]:
    """Watch `path` with inotify(7); return a function that counts the opens since."""
    libc = ctypes.CDLL(None, use_errno=True)
    in_access, in_open, in_nonblock = 0x1, 0x20, 0o4000  # <sys/inotify.h>
    fd = libc.inotify_init1(in_nonblock | os.O_CLOEXEC)
    assert fd >= 0
    # Reads too: two opens in a row would be queued as one event (inotify(7) merges repeats).
    assert libc.inotify_add_watch(fd, bytes(path), in_open | in_access) >= 0

    def count() -> int:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            data = b""
        finally:
            os.close(fd)
        opens, offset = 0, 0
        while offset < len(data):  # struct inotify_event: wd, mask, cookie, len, name[len]
            _, mask, _, size = struct.unpack_from("iIII", data, offset)
            opens += bool(mask & in_open)
            offset += 16 + size
        return opens

    return count


def test_jsrun_reads_its_rank_file_once(tmp_path: Path) -> None:
    """jsrun's rank 0 of 1 takes its layout and its master from LSB_DJOB_RANKFILE: one detection
    (`distenv info`'s, the pipeline init_dist runs too) opens it once, within one bound
    (0.2.0.dev: twice, each read with its own 10 s; on a slow file system 15 s against
    init_dist's 12 s bound, while its message said "within 2 s") (#44 item 12)."""
    path = tmp_path / "rankfile"
    path.write_text("localhost\n")
    opens = _opens_of(path)
    jsrun = {k: v for k, v in lsf.JSRUN_ARRAY_ELEMENT3.items() if k != "LSB_HOSTS"}
    jsrun.update(JSM_NAMESPACE_SIZE="1", JSM_NAMESPACE_LOCAL_SIZE="1")
    info = subprocess.run(
        [sys.executable, "-m", "distenv", "info", "--json"],
        env=launcher_env(**jsrun, LSB_DJOB_RANKFILE=str(path)), cwd=REPO,
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["master_addr"] == "localhost"
    assert opens() == 1
