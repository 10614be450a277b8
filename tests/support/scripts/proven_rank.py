"""A rank whose backend's init is taken to prove the group: it all-reduces its rank count.

NCCL's eager init (``device_id=``) is the backend whose return proves the group
(`distenv.bootstrap.proof`); this machine has no GPU, so this rank patches
`distenv.bootstrap.group.proves_group` to say yes for gloo too, and the release path of
`distenv.bootstrap.group.join_group` (rank 0's release, the others' one wait) runs under a real
launcher. It prints ``PATH release`` or ``PATH groupup`` (which check ran), then ``SUM <rank>
<sum>`` after an all_reduce of ones, or ``ERROR <class>: <message>`` (one line, exit status 1).

``PROVEN_FAULT=stop-rank0-before-release``: rank 0 SIGSTOPs itself once its init returned, before
it releases the group (the test SIGKILLs it).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any


def main() -> int:
    import torch
    import torch.distributed as dist

    import distenv
    import distenv.bootstrap.group as group

    rank = int(os.environ.get("RANK", "0"))
    release, group_up = group.release_group, group.group_up

    def traced_release(*args: Any, **kwargs: Any) -> Any:
        print("PATH release", flush=True)
        if rank == 0 and os.environ.get("PROVEN_FAULT") == "stop-rank0-before-release":
            print(f"STOPPING {os.getpid()}", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        return release(*args, **kwargs)

    def traced_group_up(*args: Any, **kwargs: Any) -> Any:
        print("PATH groupup", flush=True)
        return group_up(*args, **kwargs)

    group.proves_group = lambda *args, **kwargs: True
    group.release_group = traced_release
    group.group_up = traced_group_up
    try:
        info = distenv.init_dist()
    except distenv.DistEnvError as exc:
        print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
        return 1
    total = torch.ones(1)
    dist.all_reduce(total)
    print(f"SUM {info.rank} {total.item():g}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
