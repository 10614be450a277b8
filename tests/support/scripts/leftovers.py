"""Run a command as the only child of a child subreaper; report what it left behind.

Usage::

    leftovers.py REPORT COMMAND...

It makes itself a child subreaper (prctl(2), PR_SET_CHILD_SUBREAPER), so that every process the
command leaves behind, alive or a zombie nobody reaped, is re-parented to it instead of to init
(which, in some containers, never reaps). It writes the command's pid to REPORT.pid, waits for the
command (60 s at most), then writes REPORT as JSON::

    {"status": N, "ended": T, "left": [{"pid": P, "state": "S", "argv": [...]}, ...]}

(T: `time.monotonic()` when the command was seen to end). Whatever was left is then SIGKILLed and
reaped, so that a failing test leaves no process behind either.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def children() -> list[dict[str, object]]:
    """Return this process's children but the ones it is waiting for, as /proc shows them."""
    found: list[dict[str, object]] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")[:-1]
        except OSError:
            continue
        # proc(5): "pid (comm) state ppid ..."; comm may hold spaces and parentheses.
        state, ppid = stat[stat.rfind(b")") + 2 :].split()[:2]
        if int(ppid) == os.getpid():
            found.append(
                {"pid": int(entry), "state": state.decode(), "argv": [a.decode() for a in argv]}
            )
    return found


def main() -> int:
    report = Path(sys.argv[1])
    if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    command = subprocess.Popen(sys.argv[2:])
    tmp = report.with_name(f".{report.name}.tmp")
    tmp.write_text(str(command.pid))
    tmp.replace(report.with_suffix(".pid"))
    try:
        status = command.wait(timeout=60)
    except subprocess.TimeoutExpired:
        command.kill()
        status = command.wait()
    ended = time.monotonic()
    left = children()
    tmp.write_text(json.dumps({"status": status, "ended": ended, "left": left}))
    tmp.replace(report)
    deadline = time.monotonic() + 10
    while left and time.monotonic() < deadline:
        for child in left:
            with contextlib.suppress(OSError):
                os.kill(int(str(child["pid"])), signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(int(str(child["pid"])), os.WNOHANG)
        time.sleep(0.05)
        left = children()
    return 0


if __name__ == "__main__":
    sys.exit(main())
