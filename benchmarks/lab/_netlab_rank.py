"""One rank of benchmarks/lab/network_matrix.py: a gloo all_reduce, with bare torch or through distenv.

    python benchmarks/lab/_netlab_rank.py bare|distenv

Reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, as a user would set them on each node.
``bare`` calls ``init_process_group("gloo", init_method="env://")`` with a 15 s timeout;
``distenv`` calls ``distenv.init_dist(launcher="pytorch")`` (its deadline: DISTENV_TIMEOUT).
Then it all-reduces ``[rank + 1]`` and prints one JSON line: ``ok``, the ``sum``, ``init_s`` (from
after torch's import to the end of the all_reduce), or on failure the ``error``'s first line; it
exits 1 on failure.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time

BARE_TIMEOUT = datetime.timedelta(seconds=15)


def report(record: dict[str, object]) -> None:
    os.write(1, (json.dumps(record, sort_keys=True) + "\n").encode())


def main() -> int:
    mode = sys.argv[1]
    import torch
    import torch.distributed as dist

    began = time.monotonic()
    try:
        if mode == "bare":
            dist.init_process_group("gloo", init_method="env://", timeout=BARE_TIMEOUT)
        else:
            import distenv

            distenv.init_dist(launcher="pytorch")
        tensor = torch.tensor([int(os.environ["RANK"]) + 1])
        dist.all_reduce(tensor)
    except Exception as exc:  # the matrix records every failure, whatever raised it
        lines = str(exc).strip().splitlines() or [""]
        report(
            {
                "ok": False,
                "init_s": round(time.monotonic() - began, 3),
                "error": f"{type(exc).__name__}: {lines[0]}"[:400],
            }
        )
        return 1
    report({"ok": True, "init_s": round(time.monotonic() - began, 3), "sum": int(tensor.item())})
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
