"""A one-rank script that keeps a log folder and ends as told, for distenv.postmortem.ranklog's tests.

    log_rank.py DIR MODE

Starts the log with ``init_dist("none", backend="gloo", log_dir=DIR)`` (MODE ``raise``) or, to
spare torch's import, with `distenv.postmortem.ranklog.folder` and `distenv.postmortem.ranklog.start` (rank 0) after `ExitStatus.watch`, as
init_dist does. It prints ``out line`` and ``err line`` and then, by MODE: ``raise``
(ValueError in ``fail``), ``exit3``, ``segv`` or ``kill`` (the signal to itself, right after the
output), ``big`` (20 MB of numbered lines), ``mute`` (``card`` written by
`RankLog.write_stderr`, then the console muted and a traceback raised: as a hung job's end does),
``ok``.
"""

from __future__ import annotations

import os
import signal
import sys


def fail() -> None:
    raise ValueError("bad batch at step 3")


def main(folder: str, mode: str) -> None:
    if mode == "raise":
        import distenv

        distenv.init_dist("none", backend="gloo", log_dir=folder)
    else:
        from distenv.exits import ExitStatus
        from distenv.postmortem import ranklog

        ExitStatus.watch()
        found = ranklog.folder(folder, None)
        assert found is not None
        log = ranklog.start(found, 0)
        assert ranklog.current() is log
        assert log.fault_fd is not None
    print("out line", flush=True)
    print("err line", file=sys.stderr, flush=True)
    if mode == "raise":
        fail()
    elif mode == "exit3":
        sys.exit(3)
    elif mode in ("segv", "kill"):
        os.kill(os.getpid(), signal.SIGSEGV if mode == "segv" else signal.SIGKILL)
    elif mode == "mute":
        current = ranklog.current()
        assert current is not None
        current.write_stderr(b"card\n")
        current.mute_console()
        print("muted out", flush=True)
        fail()
    elif mode == "big":
        line = "x" * 90
        for i in range(200_000):
            sys.stdout.write(f"{i:09d} {line}\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
