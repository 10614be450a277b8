"""Supervising local ranks: one stop policy, signal forwarding, fail fast, no survivors.

`StopPolicy` is the one way both local launchers stop ranks (in the spirit of torch elastic's
``PContext``): the first failure is named with how it ended and how many others were stopped;
the others get SIGTERM (or the stopping signal received), then SIGKILL after the grace period.
`distenv.launch` applies it with `StopPolicy.stop` to its multiprocessing workers; ``distenv run``
hands a `Supervisor` one `Child` per local rank, which applies it to their process groups without
blocking, so that a second stopping signal kills at once. Four mechanisms keep any process
from outliving ``distenv run``:

1. Each child runs in its own session (so its process group id is its pid) and is always signalled
   through its whole group (`os.killpg`), which reaches the grandchildren it started (data loader
   workers, compilers, shells).
2. Each child is started through `PDEATH_WRAPPER`, which asks the kernel for SIGKILL when the
   launcher dies (``prctl(PR_SET_PDEATHSIG)``) and then execs the real command: this holds even when
   the launcher itself is SIGKILLed and runs no more code.
3. A watchdog process (`WATCHDOG`) learns every group id through a pipe. When the pipe closes
   without a final ``done`` (the launcher died, however), it SIGKILLs every group: the grandchildren
   that the kernel's parent-death signal does not reach.
4. The launcher is the child subreaper of its ranks (``prctl(PR_SET_CHILD_SUBREAPER)``, `Adopter`):
   a descendant that left its rank's group and session (a daemon: fork, setsid, fork) is
   re-parented to the launcher when its parent exits, instead of to init. Such orphans get the
   ranks' stop signal when the job stops, SIGTERM once every rank is done, SIGKILL after the grace
   period, and are reaped each by its own pid (never ``waitpid(-1)``, which would take a rank's
   exit status from its `subprocess.Popen`). Exited ones are reaped every `REAP_INTERVAL` meanwhile.

What can survive a SIGKILL of the launcher itself: the ranks die by (2), their process groups by
(3), but (4) dies with the launcher. A daemonized descendant, in a group the watchdog was never
told about, is then re-parented to the nearest subreaper above the launcher, or to init, and keeps
running; so does one whose parent is still alive in it. Under Slurm, srun's step covers it where
``ProctrackType=proctrack/cgroup`` (slurm.conf(5)): every process of the step stays in the step's
cgroup whatever its session or parent, and slurmstepd kills what is left in that cgroup when the
step ends (its task, ``distenv run``, exited or was killed) or is cancelled. proctrack/pgid and
proctrack/linuxproc track by process group or parent, which a daemon escapes.

Linux-only calls fail soft: without prctl or /proc the launcher adopts nothing and relies on (1-3).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import IO, Any, Protocol

__all__ = [
    "Child",
    "StopPolicy",
    "Stoppable",
    "Supervisor",
    "describe_exit",
    "exit_status",
    "set_parent_death_signal",
]

NAME = "distenv run"
#: Seconds between SIGTERM and SIGKILL, when the user does not choose (torchrun's default too).
DEFAULT_GRACE_PERIOD = 5.0

# Executed by `python -I -S -c` before the real command: argv is [parent pid, command...].
# PR_SET_PDEATHSIG (prctl(2)) = 1 survives execve(2). The parent may have died before prctl took
# effect; then our parent pid is no longer the launcher's and nobody would ever signal us.
PDEATH_WRAPPER = r"""
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
except (OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[1]):
    os.kill(os.getpid(), signal.SIGKILL)
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as exc:
    sys.stderr.write("distenv run: cannot execute %r: %s\n" % (sys.argv[2], exc.strerror))
    sys.exit(127)
"""

# Executed by `python -I -S -c` in its own session: reads one process group id per line until
# "done" (a clean end) or EOF (the launcher died), then SIGKILLs every group it was told about.
WATCHDOG = r"""
import os, signal, sys
groups = []
for line in sys.stdin:
    word = line.strip()
    if word == "done":
        sys.exit(0)
    if word.isdigit():
        groups.append(int(word))
for group in groups:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
"""

# Signals that stop the job: forwarded, then the grace period, then SIGKILL (torchrun handles the
# same set). SIGUSR1/SIGUSR2 are only forwarded: schedulers send them as "checkpoint soon" warnings.
STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
FORWARDED_SIGNALS = (*STOPPING_SIGNALS, signal.SIGUSR1, signal.SIGUSR2)
# How long to wait for a process that was sent SIGKILL (it may be stuck in the kernel).
KILL_WAIT = 5.0
# How long output threads may keep draining pipes after the ranks are gone.
DRAIN_WAIT = 2.0
# prctl(2) options (Linux 3.4): make orphaned descendants this process's children, and read it back.
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
# Seconds between reapings of adopted orphans that exited while the ranks run (/proc is read then).
REAP_INTERVAL = 1.0
LINE_LIMIT = 1 << 16


def exit_status(returncode: int) -> int:
    """Return the shell-style exit status of a `Popen.returncode` (128+N for signal N)."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(returncode: int) -> str:
    """Return ``exited with status 3`` or ``was killed by SIGSEGV``."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"was killed by {name}"


class Stoppable(Protocol):
    """A rank as `StopPolicy.stop` sees it (a multiprocessing ``Process`` is one)."""

    def is_alive(self) -> bool: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...


@dataclass(frozen=True)
class StopPolicy:
    """How a local launcher stops its ranks, and how it says so.

    Attributes:
        grace_period: Seconds between SIGTERM (or the stopping signal) and SIGKILL.
    """

    grace_period: float = DEFAULT_GRACE_PERIOD

    @staticmethod
    def stopped(others: int) -> str:
        """Return ``stopped the other 3 ranks`` (or that none was running)."""
        if not others:
            return "no other rank was running"
        return f"stopped the other {others} rank{'s' * (others != 1)}"

    def failure(self, rank: int, pid: int | None, how: str, others: int) -> str:
        """Return the message that names the first failure and whom it stopped."""
        return f"rank {rank} (pid {pid}) {how}; {self.stopped(others)}"

    def killed(self, stragglers: Sequence[str]) -> str:
        """Return the message for ranks still running at the end of the grace period."""
        ranks = "ranks" if len(stragglers) > 1 else "rank"
        return (
            f"{ranks} {', '.join(stragglers)} still running {self.grace_period:g}s after the "
            "stop signal; sent SIGKILL"
        )

    def stop(self, ranks: Sequence[Stoppable]) -> int:
        """Send SIGTERM to the live `ranks`, SIGKILL those alive after the grace period.

        Blocks until every one has exited (or KILL_WAIT more seconds passed after SIGKILL).

        Returns:
            How many were alive.
        """
        alive = [rank for rank in ranks if rank.is_alive()]
        for rank in alive:
            rank.terminate()
        deadline = time.monotonic() + self.grace_period
        for rank in alive:
            rank.join(timeout=max(0.0, deadline - time.monotonic()))
        for rank in alive:
            if rank.is_alive():
                rank.kill()
                rank.join(timeout=KILL_WAIT)
        return len(alive)


def set_parent_death_signal(parent: int) -> None:
    """Ask the kernel to SIGKILL this process when `parent` dies; die now if it already has.

    Used by `distenv.launch` workers, which multiprocessing starts (no exec wrapper possible).
    """
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class ProcessEntry:
    """One process as /proc/PID/stat shows it (proc(5))."""

    pid: int
    state: str
    ppid: int
    pgrp: int

    @property
    def dead(self) -> bool:
        """Whether it has exited (a zombie waiting for its parent, or on its way out)."""
        return self.state in ("Z", "X")


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
        # proc(5): "pid (comm) state ppid pgrp ..."; comm may hold spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2:
            state, ppid, pgrp = fields[0].decode(), int(fields[1]), int(fields[2])
            found.append(ProcessEntry(int(entry), state, ppid, pgrp))
    return found


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


def _prctl(option: int, argument: object) -> int | None:
    """Call prctl(2) with one argument; return its result, or None where there is no prctl."""
    import ctypes

    try:
        result: int = ctypes.CDLL(None, use_errno=True).prctl(option, argument, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux, or no C library to ask
        return None
    return result


class Adopter:
    """Make this process the child subreaper of what it starts; find, end and reap the orphans.

    A process whose parent dies is re-parented to its nearest living ancestor that is a child
    subreaper, else to init (prctl(2), PR_SET_CHILD_SUBREAPER, Linux 3.4). As one, ``distenv run``
    inherits what a rank daemonized (fork, setsid, fork): a process in neither the rank's group nor
    its session, that killpg and the watchdog never reach. Such orphans are found in /proc as
    children this process did not start, and each is reaped by its own pid; ``waitpid(-1)`` would
    also take a rank's exit status before its `subprocess.Popen` saw it (poll() then says 0).
    A child that is never reaped keeps its pid, so signalling an orphan by pid cannot hit a
    stranger.

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
        if _prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(previous)) == 0:
            self._previous = previous.value
        me = os.getpid()
        self._theirs = {p.pid for p in table if p.ppid == me}
        self.adopting = _prctl(PR_SET_CHILD_SUBREAPER, 1) == 0

    def stop(self) -> None:
        """Restore the subreaper setting this process had before `start`."""
        if self.adopting:
            _prctl(PR_SET_CHILD_SUBREAPER, self._previous)
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


@dataclass
class Child:
    """One local rank to start.

    Attributes:
        rank: Its global rank (for messages and output prefixes).
        command: The program and its arguments (no shell).
        env: Its complete environment.
        show_output: Whether its stdout/stderr reach the launcher's; else they go to /dev/null.
        prefix_output: Whether each of its lines is prefixed with ``[rank N] ``.
    """

    rank: int
    command: list[str]
    env: dict[str, str]
    show_output: bool = True
    prefix_output: bool = False
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)


def _pump(stream: IO[bytes], fd: int, prefix: bytes) -> None:
    """Copy `stream` to `fd` line by line, each line prefixed and written in one write."""
    at_line_start = True
    broken = False
    with stream:
        for chunk in iter(lambda: stream.readline(LINE_LIMIT), b""):
            if broken:  # keep reading so the rank never blocks on a full pipe
                continue
            data = (prefix if at_line_start else b"") + chunk
            at_line_start = chunk.endswith(b"\n")
            try:
                while data:
                    data = data[os.write(fd, data) :]
            except OSError:
                broken = True
    if not at_line_start and not broken:
        with contextlib.suppress(OSError):
            os.write(fd, b"\n")


class Supervisor:
    """Run children to completion, torchrun-style: the first failure stops all.

    Args:
        children: The local ranks to start, in rank order.
        policy: How ranks are stopped, and the messages that say so.
        poll_interval: Seconds between checks of the children's state.
    """

    def __init__(
        self, children: Sequence[Child], *, policy: StopPolicy, poll_interval: float = 0.1
    ) -> None:
        self.children = list(children)
        self.policy = policy
        self.poll_interval = poll_interval
        self._signals: list[int] = []
        self._threads: list[threading.Thread] = []
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._deadline: float | None = None
        self._killed = False
        self._stop_signal = signal.SIGTERM
        self._adopter = Adopter()
        self._next_reaping = 0.0
        self.status: int | None = None

    # -- signals -------------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Runs in the main thread between bytecodes, so plain Python is safe here; forwarding at
        # once keeps SIGUSR1 (a checkpoint warning) from waiting for the next poll.
        # Stopping signals are forwarded by the loop, which also starts the grace period.
        self._signals.append(signum)
        if signum not in STOPPING_SIGNALS:
            self._signal_all(signum)

    def _install_handlers(self) -> dict[int, Any]:
        previous: dict[int, Any] = {}
        for signum in FORWARDED_SIGNALS:
            try:
                previous[signum] = signal.signal(signum, self._on_signal)
            except ValueError:  # not the main thread: the caller keeps its own handling
                break
        return previous

    # -- processes -----------------------------------------------------------------------------

    def _groups(self) -> set[int]:
        return {c.process.pid for c in self.children if c.process is not None}

    def _own(self) -> set[int]:
        """Return the pids of the processes this supervisor started (ranks and watchdog)."""
        own = self._groups()
        if self._watchdog is not None:
            own.add(self._watchdog.pid)
        return own

    def _orphans(self) -> tuple[list[int], bool]:
        """Reap exited orphans; return the live ones (sent the current stop signal if stopping)."""
        live, found = self._adopter.orphans(self._own())
        if self._deadline is not None:
            self._adopter.send(live, self._stop_signal)
        return live, found

    def _end_orphans(self) -> None:
        """SIGKILL and reap every adopted orphan, their own orphans too (KILL_WAIT at most)."""
        deadline = time.monotonic() + KILL_WAIT
        while time.monotonic() < deadline:
            live, found = self._adopter.orphans(self._own())
            if not found:
                return
            self._adopter.send(live, signal.SIGKILL)
            time.sleep(0.01)

    def _running(self) -> list[Child]:
        return [c for c in self.children if c.process is not None and c.process.poll() is None]

    def _signal_all(self, signum: int) -> None:
        for group in self._groups():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signum)

    def _start_watchdog(self) -> None:
        self._watchdog = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", WATCHDOG],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # terminal signals meant for the launcher must not reach it
        )

    def _tell_watchdog(self, line: str) -> None:
        if self._watchdog is None or self._watchdog.stdin is None:
            return
        with contextlib.suppress(OSError):
            self._watchdog.stdin.write(line.encode() + b"\n")
            self._watchdog.stdin.flush()

    def _stop_watchdog(self) -> None:
        if self._watchdog is None:
            return
        self._tell_watchdog("done")
        with contextlib.suppress(OSError):
            if self._watchdog.stdin is not None:
                self._watchdog.stdin.close()
        try:
            self._watchdog.wait(timeout=KILL_WAIT)
        except subprocess.TimeoutExpired:
            self._watchdog.kill()
            self._watchdog.wait(timeout=KILL_WAIT)

    def _start(self, child: Child) -> None:
        piped = child.show_output and child.prefix_output
        sink = None if child.show_output else subprocess.DEVNULL
        out = subprocess.PIPE if piped else sink
        child.process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", PDEATH_WRAPPER, str(os.getpid()), *child.command],
            env=child.env,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
        self._tell_watchdog(str(child.process.pid))
        if piped:
            prefix = f"[rank {child.rank}] ".encode()
            for stream, fd in ((child.process.stdout, 1), (child.process.stderr, 2)):
                assert stream is not None
                thread = threading.Thread(
                    target=_pump, args=(stream, fd, prefix), name=f"rank{child.rank}-fd{fd}"
                )
                thread.daemon = True  # never let a stuck pipe keep the launcher alive
                thread.start()
                self._threads.append(thread)

    def _begin_stop(self, signum: int) -> None:
        """Send `signum` to every group and start the grace period (a second stop kills now)."""
        if self._deadline is not None:
            self._kill_all()
            return
        self._signal_all(signum)
        self._stop_signal = signal.Signals(signum)
        self._deadline = time.monotonic() + self.policy.grace_period
        self._orphans()

    def _kill_all(self) -> None:
        stragglers = [f"{c.rank} (pid {c.process.pid})" for c in self._running() if c.process]
        if stragglers:
            self._say(self.policy.killed(stragglers))
        self._signal_all(signal.SIGKILL)
        self._stop_signal = signal.SIGKILL
        orphans, _ = self._orphans()
        if orphans:
            count = f"{len(orphans)} process{'es' * (len(orphans) > 1)}"
            self._say(
                f"{count} the ranks left behind (pid {', '.join(map(str, orphans))}) still running "
                f"{self.policy.grace_period:g}s after the stop signal; sent SIGKILL"
            )
        self._killed = True

    def _say(self, message: str) -> None:
        print(f"{NAME}: {message}", file=sys.stderr, flush=True)

    def _check_signals(self) -> None:
        while self._signals:
            signum = self._signals.pop(0)
            if signum not in STOPPING_SIGNALS:
                continue
            if self.status is None:
                self.status = 128 + signum
                count = len(self._running())
                self._say(
                    f"received {signal.Signals(signum).name}; forwarded it to {count} "
                    f"rank{'s' * (count != 1)}"
                )
            self._begin_stop(signum)

    def _check_children(self) -> None:
        running = self._running()
        for child in self.children:
            process = child.process
            if process is None or process.returncode in (None, 0) or self.status is not None:
                continue
            self.status = exit_status(process.returncode)
            others = sum(c is not child for c in running)
            how = describe_exit(process.returncode)
            self._say(self.policy.failure(child.rank, process.pid, how, others))
            self._begin_stop(signal.SIGTERM)

    def _loop(self) -> None:
        running = self._running()
        while True:
            self._check_signals()
            # Orphans are reaped before the ranks are polled, by pid: were it waitpid(-1), a rank
            # that exited meanwhile would lose its status here (test_rank_status_survives_...).
            # While ranks run, /proc is read only every REAP_INTERVAL.
            now = time.monotonic()
            scan = not running or self._deadline is not None or now >= self._next_reaping
            orphans: tuple[list[int], bool] = ([], False)
            if scan:
                orphans = self._orphans()
                self._next_reaping = now + REAP_INTERVAL
            self._check_children()
            running = self._running()
            if not running:
                # Every rank is done; grandchildren they left behind, in their groups or adopted,
                # get the same treatment.
                if not scan:
                    orphans = self._orphans()
                left = live_groups(self._groups()) or orphans[1]
                if self._deadline is None:
                    if not left:
                        return
                    self._begin_stop(signal.SIGTERM)
                elif not left:
                    return
            if self._deadline is not None and time.monotonic() >= self._deadline:
                if not self._killed:
                    self._kill_all()
                if not self._running():
                    return
                # A process that survives SIGKILL is stuck in the kernel: wait, but not forever.
                if time.monotonic() >= self._deadline + KILL_WAIT:
                    return
            time.sleep(self.poll_interval)

    def run(self) -> int:
        """Start every child, supervise them to the end, and return the exit status.

        Returns:
            0 when every rank succeeded; else the first failure's status (128+N for signal N), or
            128+N when the launcher itself received stopping signal N.
        """
        previous = self._install_handlers()
        try:
            self._adopter.start()
            self._start_watchdog()
            for child in self.children:
                try:
                    self._start(child)
                except OSError as exc:  # fork refused (EAGAIN, ENOMEM): stop the ones started
                    self._say(f"cannot start rank {child.rank}: {exc}")
                    self.status = 1
                    self._begin_stop(signal.SIGTERM)
                    break
                self._check_signals()
                if self._deadline is not None:
                    break
            self._loop()
        finally:
            if self._running() or live_groups(self._groups()):
                self._signal_all(signal.SIGKILL)
            for child in self.children:
                if child.process is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        child.process.wait(timeout=KILL_WAIT)
            self._end_orphans()
            self._adopter.stop()
            self._stop_watchdog()
            deadline = time.monotonic() + DRAIN_WAIT
            for thread in self._threads:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
            for signum, handler in previous.items():
                if handler is not None:  # None: installed outside Python, nothing to restore
                    signal.signal(signum, handler)
        return self.status or 0
