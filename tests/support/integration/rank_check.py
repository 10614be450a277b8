#!/usr/bin/env python3
"""One rank of an integration test: bootstrap with distenv, finish a collective, report.

Run it as every rank of a launch (srun, mpirun, mpiexec.hydra, torchrun, a batch script):

    python tests/support/integration/rank_check.py [--launcher NAME] [--mpi] [--meet DIR N]

It installs an audit hook *before* importing distenv, calls ``distenv.init_dist``, all-reduces a
tensor ``[rank + 1]`` (the sum over ranks must be ``world * (world + 1) / 2``) and prints ONE JSON
line in a single ``os.write`` (Hydra interleaves ranks' output mid-line when a line takes two
writes); ``--mpi`` adds mpi4py's COMM_WORLD rank and size. ``--meet DIR N`` keeps the process group
(and rank 0's store) up after the all_reduce until N processes, of this launch or of others, have
checked in under DIR (60 s at most): launches that meet there provably ran at the same time. A
`DistEnvError` is reported as one line on stderr, with exit status 1.

The audit hook records the Python-level process-creation events raised while distenv bootstraps
(import, detection, resolution, init_dist). MPI libraries (Open MPI's singleton init, PMIx) may
fork inside C code; those raise no audit event and do not count; nor does the one fork announced
by a ``distenv.kill_at_deadline`` audit event (the helper that bounds MPI_Init, which never execs): what
is pinned is that distenv itself runs no subprocess (no ``scontrol``, no shell) on any rank.
"""

from __future__ import annotations

import sys

# Audit events of process creation (sys.audit table: "subprocess.Popen", "os.system", "os.exec",
# "os.spawn", "os.posix_spawn", "os.fork", "os.forkpty").
WATCHED = frozenset(
    {
        "subprocess.Popen",
        "os.system",
        "os.exec",
        "os.spawn",
        "os.posix_spawn",
        "os.fork",
        "os.forkpty",
    }
)
EVENTS: list[str] = []
# A distenv.kill_at_deadline audit event allows the one os.fork that follows.
ANNOUNCED: list[bool] = [False]


def _audit(event: str, args: tuple[object, ...]) -> None:
    if event == "distenv.kill_at_deadline":
        ANNOUNCED[0] = True
    elif event == "os.fork" and ANNOUNCED[0]:
        ANNOUNCED[0] = False
    elif event in WATCHED:
        EVENTS.append(f"{event} {args!r}"[:300])


sys.addaudithook(_audit)  # first, before distenv (or anything it may import) is loaded

import argparse  # noqa: E402  (after the audit hook on purpose)
import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402

MARKER = "rank_check"
MEET_S = 60.0
REPORTED = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "DISTENV_SCOPE",
            "GLOO_SOCKET_IFNAME",
            "SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID",
            "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ZE_AFFINITY_MASK")  # fmt: skip


def visible_count(value: str | None) -> int:
    """Stand-in for torch.cuda.device_count() on a machine with fake GPUs: entries in the list."""
    return len([v for v in (value or "").split(",") if v.strip()])


def meet(folder: str, count: int) -> int:
    """Check in under `folder` and wait until `count` processes have; return how many did."""
    open(os.path.join(folder, f"{socket.gethostname()}-{os.getpid()}"), "x").close()
    deadline = time.monotonic() + MEET_S
    while (present := len(os.listdir(folder))) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return present


def main(argv: list[str] | None = None) -> int:
    """Bootstrap, all-reduce and report; exit 1 with one stderr line on a DistEnvError."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launcher", default="auto", help="distenv launcher name (default auto)")
    parser.add_argument(
        "--mpi", action="store_true", help="also report MPI.COMM_WORLD's rank and size (mpi4py)"
    )
    parser.add_argument(
        "--meet", nargs=2, metavar=("DIR", "N"), help="wait for N check-ins under DIR at the end"
    )
    args = parser.parse_args(argv)

    import distenv

    try:
        info = distenv.init_dist(launcher=args.launcher)
    except distenv.DistEnvError as exc:
        os.write(2, f"rank_check: {exc}\n".encode())
        return 1
    bootstrap_events = list(EVENTS)

    import torch
    import torch.distributed as dist

    from distenv.device import select_device

    tensor = torch.tensor([info.rank + 1], dtype=torch.int64)
    dist.all_reduce(tensor)
    met = meet(args.meet[0], int(args.meet[1])) if args.meet else None
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    record = {
        MARKER: 1,
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "launcher_arg": args.launcher,
        "info": info.to_dict(),
        "dist": {
            "rank": dist.get_rank(),
            "world_size": dist.get_world_size(),
            "backend": str(dist.get_backend()),
        },
        "all_reduce": int(tensor.item()),
        "cuda_available": torch.cuda.is_available(),
        "cuda_visible_devices": cvd,
        "device": select_device(info.local_rank, info.local_world_size, visible_count(cvd)),
        "audit": bootstrap_events,
        "affinity": sorted(os.sched_getaffinity(0)),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "env": {k: os.environ.get(k) for k in REPORTED},
    }
    if met is not None:
        record["met"] = met
    if args.mpi:
        from mpi4py import MPI  # after the bootstrap: MPI's own view of the same world

        record["mpi"] = {"rank": MPI.COMM_WORLD.Get_rank(), "size": MPI.COMM_WORLD.Get_size()}
    dist.destroy_process_group()
    os.write(1, (json.dumps(record, sort_keys=True) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
