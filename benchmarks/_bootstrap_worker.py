"""One rank of the bootstrap benchmark: time one way of reaching a first finished all_reduce.

Started by bench_bootstrap.py / bench_scaling.py under ``srun``, ``torchrun`` or ``distenv run``;
``--method`` picks the bootstrap:

  distenv   ``distenv.init_dist()`` (launcher auto, backend default: gloo on CPU, NCCL with
            ``device_id=`` where a GPU is visible)
  bare      a hand-written shim (Slurm variables -> env://, nodelist via hostlist, port from the
            job id) then ``init_process_group("gloo", init_method="env://")``; under torchrun and
            distenv run the launcher's contract is used as is. With ``BENCH_BACKEND=nccl``:
            ``torch.cuda.set_device(local rank)`` and ``init_process_group("nccl",
            device_id=...)``, NCCL's eager initialisation, as distenv does on a GPU
  mmengine  ``mmengine.dist.init_dist("slurm" | "pytorch", backend="gloo")``

Every library is imported, and every rank has imported torch, before the clock starts: a file
barrier in $BENCH_SYNC_DIR lines the ranks up, so that one rank's slow ``import torch`` is not
counted as another rank's bootstrap. The clock stops when the first all_reduce returns (of a CUDA
tensor under ``BENCH_BACKEND=nccl``); each rank also reports the CPU time its process (every
thread) spent in between, and the CPU time its import of the library under test took (after
torch's: distenv's is ``import distenv; distenv.init_dist``, which loads the bootstrap's
modules). An audit hook counts the processes started in between. With
``$BENCH_TRACE_DIR`` each rank also times its bootstrap's phases (_trace_probes.py) and writes them
there; with ``$BENCH_CPU_DIR`` it measures where its CPU goes instead, per phase (_cpu_probes.py).
Rank 0 gathers every rank's numbers and prints one JSON line prefixed with ``BENCH``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

EVENTS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.fork", "os.spawn")
counting = False
events: list[str] = []


def _audit(event: str, args: tuple[object, ...]) -> None:
    if counting and event.startswith(EVENTS):
        detail = ""
        if event == "subprocess.Popen" and len(args) > 1:
            detail = f" {args[1]!r}"[:120]
        events.append(event + detail)


sys.addaudithook(_audit)

import _cpu_probes  # noqa: E402
import _trace_probes  # noqa: E402
import torch  # noqa: E402 - after the hook, so the hook sees everything that follows
import torch.distributed as dist  # noqa: E402
from _trace_probes import TRACE_VAR  # noqa: E402


def _rank_and_size() -> tuple[int, int]:
    """This rank's place, read directly from the launcher (benchmark plumbing, not timed)."""
    env = os.environ
    if "RANK" in env:
        return int(env["RANK"]), int(env["WORLD_SIZE"])
    return int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])


def _line_up(rank: int, size: int) -> None:
    """Wait until every rank of this launch has imported torch (files in $BENCH_SYNC_DIR)."""
    sync = Path(os.environ["BENCH_SYNC_DIR"])
    sync.mkdir(parents=True, exist_ok=True)
    (sync / str(rank)).touch()
    deadline = time.monotonic() + 300
    while sum(1 for _ in sync.iterdir()) < size:
        if time.monotonic() > deadline:
            raise SystemExit(f"rank {rank}: the other ranks never imported torch")
        time.sleep(0.001)


NCCL = os.environ.get("BENCH_BACKEND") == "nccl"


def _bare_shim() -> None:
    """The minimal hand-written Slurm -> env:// translation a user would write."""
    env = os.environ
    if "RANK" not in env:  # under srun; torchrun and distenv run set the contract themselves
        import hostlist

        env["RANK"] = env["SLURM_PROCID"]
        env["WORLD_SIZE"] = env["SLURM_NTASKS"]
        env["LOCAL_RANK"] = env["SLURM_LOCALID"]
        env["MASTER_ADDR"] = hostlist.expand_hostlist(env["SLURM_STEP_NODELIST"])[0]
        env["MASTER_PORT"] = str(15000 + int(env["SLURM_JOB_ID"]) % 20000)
    if NCCL:
        device = torch.device("cuda", int(env["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", init_method="env://", device_id=device)
    else:
        dist.init_process_group("gloo", init_method="env://")


def main() -> int:
    global counting
    method = sys.argv[sys.argv.index("--method") + 1]
    rank, size = _rank_and_size()
    # The library's import, after torch's and before the start line: its CPU is reported apart.
    import_cpu = time.process_time()
    if method == "distenv":
        import distenv

        bootstrap = distenv.init_dist
    elif method == "bare":
        import hostlist  # noqa: F401 - imported before the clock, like the others

        bootstrap = _bare_shim
    elif method == "mmengine":
        import mmengine.dist

        if not torch.cuda.is_available():
            # mmengine calls torch.cuda.set_device(local_rank) unconditionally, which a CPU-only
            # torch cannot do (AttributeError: torch._C has no _cuda_setDevice): neutralise it.
            torch.cuda.set_device = lambda device: None
        launcher = "pytorch" if "RANK" in os.environ else "slurm"
        # A port per job, as the shim does: mmengine's default (29500) collides between jobs.
        port = None if launcher == "pytorch" else 15000 + int(os.environ["SLURM_JOB_ID"]) % 20000

        def bootstrap() -> None:
            if port is None:
                mmengine.dist.init_dist(launcher, backend="gloo")
            else:
                mmengine.dist.init_dist(launcher, backend="gloo", port=port)

    else:
        raise SystemExit(f"unknown --method {method!r}")
    import_cpu = time.process_time() - import_cpu

    if TRACE_VAR in os.environ:
        bootstrap = _trace_probes.install(rank, Path(os.environ[TRACE_VAR]))(bootstrap)
    meter_on, meter_off = (
        _cpu_probes.install(rank, Path(os.environ[_cpu_probes.CPU_VAR]))
        if _cpu_probes.CPU_VAR in os.environ
        else (lambda: None, lambda: None)
    )
    _line_up(rank, size)
    counting = True
    meter_on()
    start, cpu_start = time.perf_counter(), time.process_time()
    bootstrap()
    dist.all_reduce(torch.ones(1, device="cuda" if NCCL else "cpu"))
    if NCCL:
        torch.cuda.synchronize()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    meter_off()
    counting = False

    mine = torch.tensor([elapsed, float(len(events)), cpu, import_cpu], dtype=torch.float64)
    if NCCL:
        mine = mine.cuda()
    gathered = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    if dist.get_rank() == 0:
        gathered = [t.cpu() for t in gathered]
        times = [float(t[0]) for t in gathered]
        record = {
            "method": method,
            "world_size": dist.get_world_size(),
            "max_s": max(times),
            "per_rank_s": times,
            "events_per_rank": [int(t[1]) for t in gathered],
            "cpu_per_rank_s": [float(t[2]) for t in gathered],
            "import_cpu_per_rank_s": [float(t[3]) for t in gathered],
            "rank0_events": events,
            "backend": dist.get_backend(),
        }
        os.write(1, ("BENCH " + json.dumps(record) + "\n").encode())
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
