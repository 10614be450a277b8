"""Linux process plumbing: parent-death signal, child subreaper, the process and thread tables,
the ancestry, the process behind an inherited socket.

The one owner of the prctl(2) calls and the /proc reading that the local launchers and the forked
MPI deadline helper need, and of the reading of this process's ancestors and cgroup that detection
asks for (who started a process whose environment a container stripped). Everything fails soft
where Linux is missing: without prctl nothing is asked of the kernel, without /proc the table is
None, nothing is adopted and no ancestor is found.

Importable before MPI is initialised and in a freshly forked helper: standard library only, and
ctypes imported by the calls that need it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import NamedTuple

__all__ = [
    "PDEATH_WRAPPER",
    "PROC",
    "PR_GET_CHILD_SUBREAPER",
    "PR_SET_CHILD_SUBREAPER",
    "PR_SET_PDEATHSIG",
    "Adopter",
    "Ancestor",
    "ProcessEntry",
    "ThreadEntry",
    "ancestors",
    "cgroup",
    "live_groups",
    "oom_killed_by_kernel_log",
    "oom_kills",
    "parent_death_signal",
    "prctl",
    "processes",
    "socket_peer",
    "threads",
    "with_parent_death",
]

# prctl(2) options (linux/prctl.h). PR_SET_PDEATHSIG survives execve(2); the subreaper pair needs
# Linux 3.4.
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37

# Executed by `python -I -S -c` before a rank's real command, so it cannot import distenv: the
# prctl number is put in from PR_SET_PDEATHSIG above. argv is [who, parent pid, command...]. The
# parent may have died before prctl took effect; then our parent pid is no longer the launcher's
# and nobody would ever signal us.
PDEATH_WRAPPER = f"""
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl({PR_SET_PDEATHSIG}, signal.SIGKILL, 0, 0, 0)
except (OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[2]):
    os.kill(os.getpid(), signal.SIGKILL)
try:
    os.execvp(sys.argv[3], sys.argv[3:])
except OSError as exc:
    sys.stderr.write("%s: cannot execute %r: %s\\n" % (sys.argv[1], sys.argv[3], exc.strerror))
    sys.exit(127)
"""


def prctl(option: int, argument: object) -> int | None:
    """Call prctl(2) with one argument; return its result, or None where there is no prctl."""
    import ctypes

    try:
        result: int = ctypes.CDLL(None, use_errno=True).prctl(option, argument, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux, or no C library to ask
        return None
    return result


def socket_peer(fd: int) -> int | None:
    """Return the pid of the process at the other end of the Unix socket `fd` (SO_PEERCRED).

    The socket is inspected through a duplicate, so `fd` is neither read, written nor closed.
    None where `fd` is no open Unix socket, or the system has no SO_PEERCRED.
    """
    import socket
    import struct

    option = getattr(socket, "SO_PEERCRED", None)
    if option is None or fd < 0:
        return None
    creds = struct.Struct("3i")  # struct ucred: pid, uid, gid
    try:
        copy = os.dup(fd)
    except OSError:  # not an open descriptor
        return None
    try:
        sock = socket.socket(fileno=copy)
    except OSError:  # not a socket
        os.close(copy)
        return None
    try:
        with sock:
            raw = sock.getsockopt(socket.SOL_SOCKET, option, creds.size)
    except OSError:  # not a Unix socket
        return None
    pid: int = creds.unpack(raw)[0]
    return pid if pid > 0 else None


def parent_death_signal(parent: int) -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux only).

    Args:
        parent: The pid the caller's parent had when it started this process.

    Returns:
        Whether `parent` is still this process's parent. False means it died before the request
        took effect, so no signal will ever come: the caller must end itself.
    """
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    return os.getppid() == parent


def with_parent_death(command: Sequence[str], parent: int, who: str) -> list[str]:
    """Return the argv that runs `command` so that it gets SIGKILL when `parent` dies.

    The wrapper asks for the parent-death signal, then execs `command`; this holds even when the
    parent is SIGKILLed and runs no more code. If `command` cannot be executed, the wrapper says
    so on stderr as `who` and exits with status 127, as a shell does.
    """
    return [sys.executable, "-I", "-S", "-c", PDEATH_WRAPPER, who, str(parent), *command]


class ProcessEntry(NamedTuple):
    """One process as /proc/PID/stat shows it (proc(5))."""

    pid: int
    state: str
    ppid: int
    pgrp: int

    @property
    def dead(self) -> bool:
        """Whether it has exited (a zombie waiting for its parent, or on its way out)."""
        return self.state in ("Z", "X")


class ThreadEntry(NamedTuple):
    """One thread of this process as /proc/self/task/TID shows it (proc(5)).

    Attributes:
        name: Its name (``comm``), as set with ``pthread_setname_np``.
        state: Its state letter: ``R`` running or runnable, ``S`` asleep, ...
        syscall: ``/proc/self/task/TID/syscall``: the system call it is blocked in and its
            arguments, in hex (empty where it cannot be read).
    """

    name: bytes
    state: str
    syscall: bytes


def _stat_fields(stat: bytes) -> tuple[bytes, list[bytes]]:
    """Split a ``stat`` line into its ``comm`` and the fields after it, from ``state`` on."""
    # proc(5): "pid (comm) state ppid pgrp ..."; comm may hold spaces and parentheses.
    end = stat.rfind(b")")
    return stat[stat.find(b"(") + 1 : end], stat[end + 2 :].split()


def threads() -> list[ThreadEntry] | None:
    """Return every thread of this process, or None where /proc cannot be read (not Linux)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    found = []
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/stat", "rb") as file:
                name, fields = _stat_fields(file.read(512))
        except OSError:  # the thread ended meanwhile
            continue
        try:
            with open(f"/proc/self/task/{task}/syscall", "rb") as file:
                syscall = file.read(256)
        except OSError:
            syscall = b""
        if fields:
            found.append(ThreadEntry(name, fields[0].decode(), syscall))
    return found


def processes() -> list[ProcessEntry] | None:
    """Return every process on this machine, or None where /proc cannot be read (not Linux)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    found = []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as file:
                stat = file.read()
        except OSError:
            continue
        _, fields = _stat_fields(stat)
        if len(fields) > 2:
            state, ppid, pgrp = fields[0].decode(), int(fields[1]), int(fields[2])
            found.append(ProcessEntry(int(entry), state, ppid, pgrp))
    return found


#: Where the kernel shows processes (proc(5)); tests pass a recorded tree instead.
PROC = "/proc"
#: How far up `ancestors` looks: a launcher's daemon is a few generations up (a container
#: runtime, a shell, a wrapper between), never dozens.
ANCESTRY_LIMIT = 24
# Bounds of each read: a stat line is under 1 KiB; a command line is cut (only its start is
# shown); a cgroup file has one line per hierarchy (about a dozen under cgroup v1).
_STAT_BYTES = 1024
_COMMAND_BYTES = 256
_CGROUP_BYTES = 4096


class Ancestor(NamedTuple):
    """One process above this one: its pid, its name (``comm``), and the start of its argv where
    the caller asked for it ("" otherwise: a command line may hold secrets)."""

    pid: int
    name: str
    command: str = ""


def _read(path: str, limit: int) -> bytes | None:
    try:
        with open(path, "rb") as file:
            return file.read(limit)
    except OSError:
        return None


def ancestors(
    proc: str = PROC, limit: int = ANCESTRY_LIMIT, commands_of: frozenset[str] = frozenset()
) -> list[Ancestor]:
    """Return this process's ancestors, its parent first, up to `limit` generations.

    Read from ``PROC/self/stat`` and each ancestor's ``stat``, each read bounded, no subprocess.
    The walk ends at pid 1, at the edge of this process's pid namespace (parent pid 0: a
    container with its own pid namespace hides what started it) or where /proc cannot be read
    (not Linux): an empty list then.

    Args:
        proc: The /proc to read: a recorded tree in tests (``self/stat``, ``PID/stat`` and
            ``PID/cmdline`` files).
        limit: How many generations to look at.
        commands_of: The names whose command line (``PID/cmdline``, its start) is read too.
    """
    stat = _read(f"{proc}/self/stat", _STAT_BYTES)
    found: list[Ancestor] = []
    while stat is not None and len(found) < limit:
        _, fields = _stat_fields(stat)
        if len(fields) < 2 or not fields[1].isdigit() or int(fields[1]) <= 0:
            break
        pid = int(fields[1])
        stat = _read(f"{proc}/{pid}/stat", _STAT_BYTES)
        if stat is None:
            break
        name = _stat_fields(stat)[0].decode(errors="replace")
        command = ""
        if name in commands_of:
            argv = _read(f"{proc}/{pid}/cmdline", _COMMAND_BYTES) or b""
            command = argv.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
        found.append(Ancestor(pid, name, command))
        if pid == 1:
            break
    return found


def cgroup(proc: str = PROC) -> str:
    """Return ``PROC/self/cgroup`` (bounded), or "" where it cannot be read."""
    return (_read(f"{proc}/self/cgroup", _CGROUP_BYTES) or b"").decode(errors="replace")


#: The most of the kernel log read (records, bytes).
KMSG_RECORDS = 4096
KMSG_BYTES = 1 << 20


def oom_kills(proc_root: str = "/proc", sys_root: str = "/sys") -> int | None:
    """Return the OOM kills counted in this process's cgroup (v2 ``memory.events``), None if unknown.

    The ranks of ``distenv run`` share its cgroup unless something moved them: a rise of this
    count while they run means the kernel's OOM killer ended one (cgroup-v2.rst, memory.events).
    """
    try:
        lines = cgroup(proc_root).splitlines()
        path = next(line[3:] for line in lines if line.startswith("0::"))
        found = _read(f"{sys_root}/fs/cgroup{path.rstrip('/')}/memory.events", _CGROUP_BYTES)
        events = (found or b"").decode("ascii", "replace").split()
        return int(events[events.index("oom_kill") + 1])
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def oom_killed_by_kernel_log(pid: int, kmsg: str = "/dev/kmsg") -> bool:
    """Return whether the kernel log says its OOM killer killed `pid` (bounded, non-blocking read).

    The kernel writes ``Out of memory: Killed process PID (...)`` or ``oom-kill:...,pid=PID,``;
    /dev/kmsg is often unreadable in a container, which reads as "not said".
    """
    marks = (f"Killed process {pid} ".encode(), f",pid={pid},".encode())
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    read = 0
    try:
        for _ in range(KMSG_RECORDS):
            try:
                record = os.read(fd, 8192)  # one record per read (kernel.org, dev-kmsg)
            except BlockingIOError:
                return False
            except OSError:  # EPIPE: a record was overwritten meanwhile; go on
                continue
            read += len(record)
            if not record or read > KMSG_BYTES:
                return False
            if any(mark in record for mark in marks):
                return True
    finally:
        os.close(fd)
    return False


def live_groups(groups: set[int]) -> set[int]:
    """Return the process groups in `groups` that hold a process that is not a zombie.

    ``killpg(group, 0)`` alone also counts zombies, which never go away under an init that does not
    reap (as in some containers), so /proc is read instead where it exists.
    """
    table = processes()
    if table is None:
        found = set()
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, 0)
                found.add(group)
        return found
    return {p.pgrp for p in table if not p.dead and p.pgrp in groups}


class Adopter:
    """Make this process the child subreaper of what it starts; find, end and reap the orphans.

    A process whose parent dies is re-parented to its nearest living ancestor that is a child
    subreaper, else to init (prctl(2), PR_SET_CHILD_SUBREAPER). As one, a launcher inherits what
    its ranks daemonized (fork, setsid, fork): processes in neither a rank's group nor its session,
    which killpg never reaches. Such orphans are found in /proc as children this process did not
    start, and each is reaped by its own pid; ``waitpid(-1)`` would also take a rank's exit status
    before its `subprocess.Popen` saw it (poll() then says 0). A child that is never reaped keeps
    its pid, so signalling an orphan by pid cannot hit a stranger.

    Where there is no prctl or no /proc (not Linux), it adopts nothing and finds nothing.
    """

    def __init__(self) -> None:
        self.adopting = False
        self._previous = 0
        self._theirs: set[int] = set()  # children this process had before: not ours to end
        self._sent: dict[int, int] = {}  # orphan pid -> last signal sent

    def start(self) -> None:
        """Become a child subreaper (if /proc lets orphans be found), remembering the old setting."""
        table = processes()
        if table is None:
            return
        import ctypes

        previous = ctypes.c_int(0)
        if prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(previous)) == 0:
            self._previous = previous.value
        me = os.getpid()
        self._theirs = {p.pid for p in table if p.ppid == me}
        self.adopting = prctl(PR_SET_CHILD_SUBREAPER, 1) == 0

    def stop(self) -> None:
        """Restore the subreaper setting this process had before `start`."""
        if self.adopting:
            prctl(PR_SET_CHILD_SUBREAPER, self._previous)
            self.adopting = False

    def orphans(self, own: set[int]) -> tuple[list[int], bool]:
        """Reap the adopted orphans that have exited and return the live ones.

        Args:
            own: The pids of the children this process started (never touched here).

        Returns:
            The live orphans' pids, and whether any orphan (live or reaped) was found: a reaped
            one's own children may have been re-parented here after /proc was read.
        """
        table = processes() if self.adopting else None
        if table is None:
            return [], False
        me = os.getpid()
        adopted = [p for p in table if p.ppid == me and p.pid not in own | self._theirs]
        for entry in adopted:
            if entry.dead:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(entry.pid, os.WNOHANG)
                self._sent.pop(entry.pid, None)
        return [p.pid for p in adopted if not p.dead], bool(adopted)

    def send(self, pids: Sequence[int], signum: int) -> None:
        """Send `signum` to each of `pids` (orphans found by `orphans`) that has not had it yet."""
        for pid in pids:
            if self._sent.get(pid) == signum:
                continue
            self._sent[pid] = signum
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
