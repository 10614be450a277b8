"""Whether a rank still progresses: the watchdog thread that both hang autopsies start.

One daemon thread samples the rank every quarter of the hang timeout. The rank progresses when,
since the last sample, the main thread's innermost frame or line changed (`sys._current_frames`),
or the default process group issued a collective (its sequence number, read only once
torch.distributed is initialized), or the process used more than `CPU_PROGRESS` of the period on
the CPU apart from this thread (a long matmul). So a loop whose every sample lands on the same
line (a long collective or a blocking synchronize each step) still progresses, while a rank that
waits in a collective or sleeps uses next to none (gloo's threads included: tests/process/
test_hang.py relies on it). A rank that busy-waits (a CUDA synchronize that spins) counts as
progressing: the job's hang is then found on the rank that waits. The watch begins once
torch.distributed is initialized: before, the rendezvous's own timeout names the ranks that did
not arrive. When the rank has not progressed for the timeout, the thread calls its `on_stuck`
once, and again only after the main thread moved on and got stuck anew. While training runs the
cost is one sample per period: no tracing, no extra process.

Who is told differs: ``distenv run``'s rank wrapper writes a line to its agent's pipe
(`distenv.local.watchdog`); ``init_dist(hang_timeout=)`` posts to the job's store
(`distenv.bootstrap.hang`). One process has one watchdog (`watching`): under ``distenv run
--hang-timeout`` the wrapper's, and init_dist does not start another.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

from distenv.postmortem.stacks import users_file

__all__ = ["CPU_PROGRESS", "MAX_PERIOD", "MIN_PERIOD", "Stuck", "start", "watching"]

#: The share of a period the process must spend on the CPU (this thread's own time apart) for
#: the period to count as progress.
CPU_PROGRESS = 0.01
#: The shortest and longest period between two samples.
MIN_PERIOD, MAX_PERIOD = 0.05, 15.0
#: What the watchdog calls when the rank is stuck: with where (``file:line in function``) and
#: since when (``time.time()``) it made no progress.
Stuck = Callable[[str, float], None]

_started: list[threading.Thread] = []
_lock = threading.Lock()


def watching() -> bool:
    """Return whether this process's watchdog runs already (`start` was called)."""
    return bool(_started)


def where(frame: FrameType | None) -> str:
    """Return ``file:line in function`` of the innermost frame of the user's code from `frame` on."""
    inner = frame
    while frame is not None and not users_file(frame.f_code.co_filename):
        frame = frame.f_back
    frame = frame or inner
    if frame is None:
        return "?"
    code = frame.f_code
    return f"{os.path.basename(code.co_filename)}:{frame.f_lineno} in {code.co_name}"


def _watch(timeout: float, main: int, on_stuck: Stuck) -> None:
    """Sample the main thread forever; call `on_stuck` when it made no progress for `timeout`."""
    period = min(MAX_PERIOD, max(MIN_PERIOD, timeout / 4))
    last: tuple[int, int, int] | None = None
    cpu = time.process_time() - time.thread_time()
    moved = time.time()
    told = False
    while True:
        time.sleep(period)
        frame = sys._current_frames().get(main)
        if frame is None:  # the main thread has ended: the interpreter is exiting
            return
        collectives = _collectives()
        here = (id(frame.f_code), frame.f_lineno or 0, collectives)
        now_cpu = time.process_time() - time.thread_time()
        # Before the rank joined its group, waiting (for the slowest rank's import torch) is no
        # hang: the rendezvous has its own timeout, which names the ranks that did not arrive.
        if here != last or now_cpu - cpu >= CPU_PROGRESS * period or collectives < 0:
            last, moved, told = here, time.time(), False
        cpu = now_cpu
        if not told and time.time() - moved >= timeout:
            told = True
            on_stuck(where(frame), moved)
        del frame


def _collectives() -> int:
    """Return the default process group's sequence number (collectives issued), -1 if none."""
    dist = sys.modules.get("torch.distributed")  # never imported here: only if the script did
    with contextlib.suppress(Exception):  # any torch version, any backend: no number, no signal
        if dist is not None and dist.is_initialized():
            group = dist.distributed_c10d._get_default_group()
            return int(group._get_sequence_number_for_group())
    return -1


def start(timeout: float, on_stuck: Stuck) -> bool:
    """Start this process's watchdog over its main thread; False if one runs already.

    Args:
        timeout: Seconds without progress after which `on_stuck` is called (from the thread).
        on_stuck: Told where and since when the main thread is stuck; its errors end the watch.
    """
    main = threading.main_thread().ident
    assert main is not None
    with _lock:
        if _started:
            return False
        thread = threading.Thread(
            target=_watch, args=(timeout, main, on_stuck), name="distenv-watchdog", daemon=True
        )
        _started.append(thread)
    thread.start()
    return True
