"""Reading what `faulthandler` writes: a crash's frames, and the main thread's stack of a dump.

A rank's fault file (`distenv.local.witness.RunDir`) receives faulthandler's output: at a fatal
signal, and at each dump asked for (`distenv.local.watchdog`). Each thread's block reads::

    Current thread 0x00007f5c8c8f1740 (most recent call first):
      File "/work/train.py", line 88 in train
      File "/work/train.py", line 120 in <module>

the innermost frame first, blocks separated by a blank line, the main thread's last (CPython
lists the threads newest first). Nothing read is trusted: reads are bounded, names decoded
with replacement.
"""

from __future__ import annotations

import linecache
import os
import re
from pathlib import Path

from distenv.failure import MAX_FRAMES, users_file

__all__ = ["Frame", "crash_frames", "main_stack", "shown"]

#: A frame: (file, line, function).
Frame = tuple[str, int, str]
#: The most bytes of a fatal signal's dump read.
CRASH_LIMIT = 64 << 10
_FRAME = re.compile(rb'^\s+File "(.+)", line (\d+) in (.+)$')


def _frames(block: bytes) -> tuple[Frame, ...]:
    found = []
    for line in block.splitlines():
        match = _FRAME.match(line)
        if match:
            name = match[1].decode("utf-8", "replace")
            found.append((name, int(match[2]), match[3].decode("utf-8", "replace").strip()))
    return tuple(found)


def shown(frame: Frame) -> str:
    """Return ``train.py:88 in train: dist.all_reduce(x)`` (the source line when readable)."""
    name, number, function = frame
    source = linecache.getline(name, number).strip()
    where = f"{os.path.basename(name)}:{number} in {function}"
    return f"{where}: {source}" if source else where


def main_stack(dump: bytes) -> tuple[Frame, ...]:
    """Return the main thread's frames, innermost first, of a dump (its last thread's block)."""
    blocks = [b for b in re.split(rb"\n\s*\n", dump) if b"(most recent call first)" in b]
    return _frames(blocks[-1]) if blocks else ()


def crash_frames(path: Path, offset: int = 0) -> tuple[str, ...]:
    """Return the crashing thread's innermost frames of the user's code, innermost last.

    Args:
        path: The fault file.
        offset: Where the fatal signal's dump begins (past the dumps already read).
    """
    with path.open("rb") as file:
        file.seek(offset)
        text = file.read(CRASH_LIMIT)
    section = text.split(b"Current thread", 1)[-1].split(b"\n\n", 1)[0]
    frames = [shown(frame) for frame in _frames(section) if users_file(frame[0])]
    return tuple(reversed(frames[:MAX_FRAMES]))
