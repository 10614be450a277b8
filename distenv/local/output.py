"""A rank's output copied to the launcher's, line by line, through a gate that may hold it back.

Used by ``distenv run``: the gate (`distenv.local.witness.Witness.line`) logs each line, prefixes
it with its rank under ``--prefix-output``, and holds back a survivor's consequences of another
rank's failure. Each line is written with one write, so that the lines of ranks writing at once
never interleave mid-line.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO

__all__ = ["DRAIN_WAIT", "LINE_LIMIT", "Gate", "copy_lines", "copy_output", "drain"]

#: What decides a line's fate: (its stream's fd, the line or a piece of one) -> what to write.
Gate = Callable[[int, bytes], bytes | None]

#: How long output threads may keep draining pipes after the ranks are gone.
DRAIN_WAIT = 2.0
#: The longest line read at once; a longer one is copied in pieces, the prefix on the first.
LINE_LIMIT = 1 << 16


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
