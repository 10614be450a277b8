"""A rank that trains a little DDP model and exits while gloo's worker threads are starved.

    python exit_race.py MODE ENDING      (torchrun's env contract in the environment)

MODE ``torch`` creates the group with bare ``init_process_group("gloo")``; ``distenv`` with
`distenv.init_dist`. ENDING says how the script ends: ``destroy`` (``destroy_process_group()``
with the DDP wrapper still alive, as most scripts do), ``keep`` (no destroy, the wrapper a
global), ``stuck`` (rank 0 leaves an all-reduce waiting on rank 1, which stops itself, and
exits 3); ``stuck-refused``, ``stuck-hooked`` and ``stuck-thread-exit`` leave it waiting the same way
and then end rank 0 with a public call's uncaught refusal (a `DistEnvError` in one line), with an
uncaught ValueError under a ``sys.excepthook`` installed after `init_dist`, or normally after a
thread called ``sys.exit(5)``. ``stuck-in-thread`` and ``stuck-in-pool`` leave a blocking all-reduce
waiting in a ``threading.Thread`` or a ``ThreadPoolExecutor`` worker (threads Python joins before
any ``atexit`` handler runs) and end rank 0 with an uncaught ValueError.

The race is forced as it happens on a loaded node: the rank runs on one CPU and gloo's worker
threads (``pt_gloo_runloop``, created by init) get the lowest priority (nice 19), so they finish
dropping a collective after the main thread has moved on to the interpreter's exit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import distenv


def _threads() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def _starve(threads: set[str]) -> None:
    for tid in threads:
        with contextlib.suppress(OSError):  # the thread ended meanwhile
            os.setpriority(os.PRIO_PROCESS, int(tid), 19)


mode, ending = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
os.sched_setaffinity(0, {rank % os.cpu_count()})  # threads started from here on inherit it
torch.set_num_threads(1)
before = _threads()
if mode == "torch":
    dist.init_process_group("gloo")
else:
    distenv.init_dist("pytorch")
_starve(_threads() - before)

model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
ddp = DistributedDataParallel(model)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
for _ in range(5):
    optimizer.zero_grad()
    ddp(torch.randn(32, 16)).pow(2).mean().backward()
    optimizer.step()
total = torch.ones(4)
dist.all_reduce(total)

if ending == "destroy":
    dist.destroy_process_group()
elif ending.startswith("stuck"):
    dist.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    if ending in ("stuck-in-thread", "stuck-in-pool"):
        started = threading.Event()

        def blocking() -> None:
            started.set()
            dist.all_reduce(torch.ones(4))

        if ending == "stuck-in-thread":
            threading.Thread(target=blocking, name="user-all-reduce").start()
        else:
            pool = ThreadPoolExecutor(1)  # never shut down: concurrent.futures joins it at exit
            pool.submit(blocking)
        started.wait()
        print("exiting", flush=True)
        raise ValueError("step 3")
    pending = dist.all_reduce(torch.ones(4), async_op=True)
    print("exiting", flush=True)
    if ending == "stuck-refused":
        distenv.watch_preemption(signals=[])  # refused: ConfigurationError, uncaught
    elif ending == "stuck-hooked":
        sys.excepthook = lambda *exc: print("hooked", exc[0].__name__, file=sys.stderr)
        raise ValueError("step 3")
    elif ending == "stuck-thread-exit":
        thread = threading.Thread(target=sys.exit, args=(5,))
        thread.start()
        thread.join()
    else:
        sys.exit(3)
