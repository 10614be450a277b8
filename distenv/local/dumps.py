"""Reading what `faulthandler` writes: a crash's frames, and the main thread's stack of a dump.

A rank's fault file (`distenv.local.witness.RunDir`) receives faulthandler's output: at a fatal
signal, and at each dump asked for (`distenv.local.watchdog`); ``init_dist(hang_timeout=)``
writes the same format into ``$DISTENV_LOG_DIR/rank-N.fault`` (`distenv.bootstrap.hang`). The
format and its parser live in `distenv.postmortem.stacks`; this module adds the crash's frames. Nothing
read is trusted: reads are bounded, names decoded with replacement.
"""

from __future__ import annotations

from pathlib import Path

from distenv.postmortem.failure import MAX_FRAMES
from distenv.postmortem.stacks import Frame, frames_of, main_stack, shown, users_file

__all__ = ["Frame", "crash_frames", "main_stack", "shown"]

#: The most bytes of a fatal signal's dump read.
CRASH_LIMIT = 64 << 10


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
    frames = [shown(frame) for frame in frames_of(section) if users_file(frame[0])]
    return tuple(reversed(frames[:MAX_FRAMES]))
