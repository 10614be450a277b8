"""A deadline that needs no GIL: a forked helper that kills this process unless told in time.

Some blocking calls cannot be bounded from Python: MPI_Init waits for every rank while holding the
GIL, so neither a thread nor a signal handler of this interpreter gets a chance. `KillAtDeadline`
forks a small helper *before* such a call. The helper waits on a pipe; when the parent says "done"
(or dies: the pipe reaches EOF, and the parent-death signal kills the helper with it) the helper
exits quietly; when the deadline passes first it writes the parent's one-line message to stderr
and SIGKILLs the parent.

Rules that keep this safe:

- Fork only before MPI (or CUDA) is initialised: MPI libraries forbid fork after MPI_Init.
- The helper makes system calls only (select, write, kill) and leaves with ``os._exit``: it never
  runs atexit handlers, flushes inherited buffers, or returns into the parent's code.
- It closes every inherited descriptor but stderr and its pipe, so it holds no launcher pipe or
  socket open, and the parent reaps it (`KillAtDeadline.stop`).
- ``sys.audit("distenv.kill_at_deadline", pid)`` precedes the fork, so an audit hook can tell this
  fork from a subprocess.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import warnings
from types import TracebackType

from distenv.deadline import Deadline
from distenv.system.processes import parent_death_signal

__all__ = ["KillAtDeadline"]


def _helper(read_fd: int, parent: int, deadline: Deadline, message: bytes) -> None:
    """Run in the forked helper: wait for "done" or EOF until `deadline`, else kill `parent`."""
    import select

    try:
        # Without prctl (not Linux) the pipe's EOF still ends the helper when the parent dies.
        if not parent_death_signal(parent):  # the parent died before prctl took effect
            os._exit(0)
        os.closerange(3, read_fd)
        os.closerange(read_fd + 1, 1 << 16)
        left = deadline.left()
        while left > 0:
            ready, _, _ = select.select([read_fd], [], [], left)
            if ready:  # "done", or EOF: the parent no longer needs us
                os._exit(0)
            left = deadline.left()
        os.write(2, message)
        os.kill(parent, signal.SIGKILL)
    finally:
        os._exit(0)


def _reap(pid: int) -> None:
    """Wait for the helper `pid` to exit, and reap it (in a thread: the GIL is released)."""
    with contextlib.suppress(ChildProcessError):  # reaped by someone else (a SIGCHLD handler)
        os.waitpid(pid, 0)


class KillAtDeadline:
    """Kill this process with a message unless `stop` is called before `deadline`.

    Use it as a context manager around a blocking native call that holds the GIL::

        with KillAtDeadline(deadline, "mpi: rank 1 of 4: ... Hint: ..."):
            from mpi4py import MPI  # MPI_Init

    Args:
        deadline: When the helper acts (`time.monotonic` is one clock for every process of the
            machine, so the forked helper keeps the parent's deadline).
        message: One line the helper writes to stderr (prefixed ``distenv: ``) before the kill.
    """

    def __init__(self, deadline: Deadline, message: str) -> None:
        self.deadline = deadline
        self.message = f"distenv: {message}\n".encode(errors="replace")
        self.pid: int | None = None
        self._write_fd: int | None = None

    def start(self) -> None:
        """Fork the helper. Call it before MPI is initialised, never after."""
        read_fd, write_fd = os.pipe()
        parent = os.getpid()
        sys.audit("distenv.kill_at_deadline", parent)
        with warnings.catch_warnings():
            # Python >= 3.12 warns about any fork of a threaded process; the helper makes system
            # calls only, so it cannot deadlock on a lock another thread held at the fork.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the helper: never returns
            os.close(write_fd)
            _helper(read_fd, parent, self.deadline, self.message)
        os.close(read_fd)
        self.pid, self._write_fd = pid, write_fd

    def stop(self) -> None:
        """Tell the helper we are done; reap it without waiting for it to leave.

        The helper's exit costs as much as tearing down the parent's address space (large after
        ``import torch``), so a thread of its own reaps it.
        """
        pid, write_fd = self.pid, self._write_fd
        if pid is None or write_fd is None:
            return
        self.pid = self._write_fd = None
        with contextlib.suppress(OSError):  # the helper is gone already
            os.write(write_fd, b"done")
        os.close(write_fd)
        # _thread: threading.Thread.start would wait until the thread runs; nothing here needs to.
        _thread.start_new_thread(_reap, (pid,))

    def __enter__(self) -> KillAtDeadline:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
