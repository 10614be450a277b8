"""The group killer: a process that SIGKILLs the ranks' process groups if the launcher dies.

The kernel's parent-death signal (`distenv.system.processes.PDEATH_WRAPPER`) ends a rank when
``distenv run`` dies, even by SIGKILL, but not what the rank started in its process group (data
loader workers, compilers, shells). This separate process, in its own session, learns every rank's
group id through a pipe; when the pipe closes without a final ``done`` (the launcher died,
however), it SIGKILLs every group it was told about.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys

from distenv.local.stopping import KILL_WAIT

__all__ = ["GROUP_KILLER", "GroupKiller"]

# Executed by `python -I -S -c` in its own session: reads one process group id per line until
# "done" (a clean end) or EOF (the launcher died), then SIGKILLs every group it was told about.
GROUP_KILLER = r"""
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


class GroupKiller:
    """Start the group killer, tell it each rank's process group, and dismiss it at a clean end."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The group killer's pid, once started."""
        return None if self.process is None else self.process.pid

    def start(self) -> None:
        """Start the group killer in a session of its own."""
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", GROUP_KILLER],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # terminal signals meant for the launcher must not reach it
        )

    def watch(self, group: int) -> None:
        """Tell the group killer to SIGKILL process group `group` if the launcher dies."""
        self._tell(str(group))

    def _tell(self, line: str) -> None:
        if self.process is None or self.process.stdin is None:
            return
        with contextlib.suppress(OSError):
            self.process.stdin.write(line.encode() + b"\n")
            self.process.stdin.flush()

    def stop(self) -> None:
        """Tell the group killer that the launcher ended cleanly, and reap it."""
        if self.process is None:
            return
        self._tell("done")
        with contextlib.suppress(OSError):
            if self.process.stdin is not None:
                self.process.stdin.close()
        try:
            self.process.wait(timeout=KILL_WAIT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=KILL_WAIT)
