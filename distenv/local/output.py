"""The launcher's output: its own lines, and a rank's copied line by line through a gate.

`tell` prints the launcher's own lines; a stderr nobody reads any more (``2>&1 | head -1``, a dead
``tee``) drops them rather than ending the supervision. A rank's output goes through a gate
(`distenv.local.witness.Witness.line`) that logs each line, prefixes it with its rank under
``--prefix-output``, and holds back a survivor's consequences of another rank's failure. Each
line is written with one write, so that the lines of ranks writing at once
never interleave mid-line.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO

__all__ = ["DRAIN_WAIT", "LINE_LIMIT", "Gate", "copy_lines", "copy_output", "drain", "tell"]

#: What decides a line's fate: (its stream's fd, the line or a piece of one) -> what to write.
Gate = Callable[[int, bytes], bytes | None]

#: How long output threads may keep draining pipes after the ranks are gone.
DRAIN_WAIT = 2.0
#: The longest line read at once; a longer one is copied in pieces, the prefix on the first.
LINE_LIMIT = 1 << 16


def tell(line: str) -> None:
    """Print one line of the launcher's own to stderr, or drop it if stderr can no longer be written.

    A write that fails for good (EPIPE: the reader is gone; EIO: the terminal is) points stderr at
    /dev/null, so that the interpreter's last flush cannot fail either (Python's status 120 at
    exit): the launcher goes on stopping its ranks and exits with the job's status.
    """
    try:
        print(line, file=sys.stderr, flush=True)
    except BlockingIOError:  # a full non-blocking stderr: this line only is lost
        pass
    except (OSError, ValueError):  # ValueError: stderr was closed
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stderr.fileno())
            os.close(devnull)
            sys.stderr.flush()  # what the failed write left buffered, into /dev/null


def copy_lines(stream: IO[bytes], fd: int, gate: Gate) -> None:
    """Copy `stream` to `fd` line by line, each line passed through `gate` and written in one write."""
    at_line_start = True
    broken = False
    with stream:
        for chunk in iter(lambda: stream.readline(LINE_LIMIT), b""):
            if broken:  # keep reading so the rank never blocks on a full pipe
                continue
            data = gate(fd, chunk) or b""
            at_line_start = chunk.endswith(b"\n") if data else at_line_start
            try:
                while data:
                    data = data[os.write(fd, data) :]
            except OSError:
                broken = True
    if not at_line_start and not broken:
        with contextlib.suppress(OSError):
            os.write(fd, b"\n")


def copy_output(
    rank: int, stdout: IO[bytes] | None, stderr: IO[bytes] | None, gate: Gate
) -> list[threading.Thread]:
    """Start copying a rank's piped stdout and stderr to ours, each line through `gate`.

    Returns:
        The two copying threads (daemons: a stuck pipe never keeps the launcher alive).
    """
    threads = []
    for stream, fd in ((stdout, 1), (stderr, 2)):
        assert stream is not None
        thread = threading.Thread(
            target=copy_lines, args=(stream, fd, gate), name=f"rank{rank}-fd{fd}"
        )
        thread.daemon = True
        thread.start()
        threads.append(thread)
    return threads


def drain(threads: Sequence[threading.Thread]) -> None:
    """Let the copying `threads` finish what the ranks wrote, for DRAIN_WAIT seconds at most."""
    deadline = time.monotonic() + DRAIN_WAIT
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
