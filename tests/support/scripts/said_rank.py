"""A rank of ``distenv run`` that says who it is on both streams, and raises if told (no torch).

    said_rank.py [--raise RANK]

Prints ``out of rank N`` to stdout and ``err of rank N`` to stderr; rank RANK then raises
ValueError("rank RANK gave up") in ``give_up``.
"""

from __future__ import annotations

import os
import sys


def give_up(rank: int) -> None:
    raise ValueError(f"rank {rank} gave up")


def main(argv: list[str]) -> None:
    rank = int(os.environ["RANK"])
    print(f"out of rank {rank}", flush=True)
    print(f"err of rank {rank}", file=sys.stderr, flush=True)
    if argv[:1] == ["--raise"] and int(argv[1]) == rank:
        give_up(rank)


if __name__ == "__main__":
    main(sys.argv[1:])
