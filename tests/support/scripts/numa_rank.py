"""One rank of the gpu-marked placement test: torch's own ``node`` binding against distenv's.

Run under torchrun. Before binding, it asks torch/numa/binding.py (what ``torchrun --numa-binding
node`` applies, less numactl) which CPUs this rank's GPU calls for; then ``init_dist(cpu_binding=
"node")`` binds it from sysfs; it all-reduces, and prints one JSON line: both CPU sets, and the
affinity it started with (``torchrun --numa-binding node``'s, when run under it).
"""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    started = sorted(os.sched_getaffinity(0))
    import torch
    import torch.distributed as dist
    from torch.numa import binding

    local_rank = int(os.environ["LOCAL_RANK"])
    torch_cpus = sorted(binding._node_get_logical_cpus_to_bind_to(gpu_index=local_rank))

    import distenv

    info = distenv.init_dist(cpu_binding="node" if "--bind" in sys.argv else None)
    total = torch.ones(1, device=distenv.current_device())
    dist.all_reduce(total)
    record = {
        "rank": info.rank,
        "started": started,
        "torch": torch_cpus,
        "distenv": sorted(os.sched_getaffinity(0)),
        "all_reduce": int(total.item()),
    }
    dist.destroy_process_group()
    os.write(1, (json.dumps(record) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
