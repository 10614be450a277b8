"""A rank of ``distenv run`` that says who it is on both streams, and raises if told (no torch).

    said_rank.py [--raise RANK | --kill RANK]

Prints ``out of rank N`` to stdout and ``err of rank N`` to stderr; rank RANK then raises
ValueError("rank RANK gave up") in ``give_up`` 2 s later, once the others have ended, or SIGKILLs
itself while the others sleep.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def give_up(rank: int) -> None:
    raise ValueError(f"rank {rank} gave up")


def main(argv: list[str]) -> None:
    rank = int(os.environ["RANK"])
    print(f"out of rank {rank}", flush=True)
    print(f"err of rank {rank}", file=sys.stderr, flush=True)
    if argv[:1] == ["--raise"] and int(argv[1]) == rank:
        time.sleep(2.0)  # the others have ended by then: finished, not stopped
        give_up(rank)
    if argv[:1] == ["--kill"]:
        if int(argv[1]) == rank:
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # until distenv run stops it


if __name__ == "__main__":
    main(sys.argv[1:])
