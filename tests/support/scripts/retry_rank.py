"""A rank whose first `init_dist` fails and which retries it in the same process.

Rank 0 (world 2) starts alone: its first call gives up after `--first` seconds (rank 1 is not
there) and prints ``FIRST <error class>``; still inside its ``except`` clause (so the failed
attempt's exception, and its traceback, are alive), it retries with a long timeout. The test
starts rank 1 once it reads ``FIRST``. Every rank prints ``SUM <rank> <sum>`` after an all_reduce;
a DistEnvError on the retry is one ``ERROR <class>: <message>`` line and exit status 1.
"""

from __future__ import annotations

import argparse
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--first", type=float, default=2.0)
    args = parser.parse_args()
    import torch
    import torch.distributed as dist

    import distenv

    def join() -> int:
        try:
            info = distenv.init_dist("pytorch", rendezvous_timeout=60)
        except distenv.DistEnvError as exc:
            print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
            return 1
        value = torch.tensor([1.0])
        dist.all_reduce(value)
        print(f"SUM {info.rank} {value.item():g}", flush=True)
        dist.destroy_process_group()
        return 0

    if distenv.detect().rank != 0:
        return join()
    try:
        distenv.init_dist("pytorch", rendezvous_timeout=args.first)
    except distenv.DistEnvError as exc:
        print(f"FIRST {type(exc).__name__}", flush=True)
        return join()
    print("UNEXPECTED the first attempt succeeded", flush=True)
    return 3


if __name__ == "__main__":
    sys.exit(main())
