"""A rank of one of two jobs that share one identity: joins a job once per line on stdin.

Each line is ``GO <port> <value>``: the rank runs `init_dist` with that MASTER_PORT and, if it
joins, all-reduces `value` and prints ``SUM <sum>``; a DistEnvError prints ``ERROR <class>:
<message>`` (one line). Each round is a fresh `init_dist` in the same process (a failed one
leaves nothing behind). Used by the collision test: a sum that mixes two jobs' values shows.
"""

from __future__ import annotations

import os
import sys


def main() -> int:
    import torch
    import torch.distributed as dist

    import distenv

    print("READY", flush=True)
    for line in sys.stdin:
        _, port, value = line.split()
        os.environ["MASTER_PORT"] = port
        os.environ.pop("DISTENV_SCOPE", None)  # a fresh launch, not the last round's export
        try:
            distenv.init_dist("pytorch", rendezvous_timeout=30)
        except distenv.DistEnvError as exc:
            print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
            continue
        total = torch.tensor([float(value)])
        dist.all_reduce(total)
        print(f"SUM {total.item():g}", flush=True)
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
