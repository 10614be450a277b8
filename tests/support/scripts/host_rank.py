"""A rank that joins its job and all-reduces once: ``HOST <rank> <recorded host name>`` (as the
roll call's records carry it), then ``SUM <rank> <sum>``; a DistEnvError is one ``ERROR`` line.

Used by the host-name tests, which start it with the host named otherwise (a UTS namespace).
"""

from __future__ import annotations

import sys


def main() -> int:
    import torch
    import torch.distributed as dist

    import distenv
    from distenv._hosts import this_host

    try:
        info = distenv.init_dist("pytorch")
    except distenv.DistEnvError as exc:
        print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
        return 1
    print(f"HOST {info.rank} {this_host()}", flush=True)
    value = torch.tensor([1.0])
    dist.all_reduce(value)
    print(f"SUM {info.rank} {value.item():g}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
