"""Start real process groups for tests: N worker processes under torchrun's env contract.

Each worker runs one scenario of `tests/support/workers.py` and prints one ``RESULT <json>`` line. No shell:
every child gets an explicit environment built from `scrubbed_environ()`, and every wait has a
timeout after which all the children are killed.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from distenv.master import free_port as free_port  # re-exported for the tests
from tests.conftest import scrubbed_environ

WORKERS = Path(__file__).with_name("workers.py")
REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def clean_process() -> Iterator[None]:
    """Run the body in a process without a group, distenv state or start method; restore after.

    For tests that call init_dist/setup in the pytest process itself.
    """
    import torch.distributed as dist

    import distenv.comm
    import distenv.state

    environ = dict(os.environ)
    method = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method(None, force=True)
    distenv.state.remember(None)
    distenv.comm._local_group = None
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        distenv.state.remember(None)
        distenv.comm._local_group = None
        multiprocessing.set_start_method(method, force=True)
        os.environ.clear()
        os.environ.update(environ)


def ipv6_loopback() -> bool:
    """Return whether this machine can listen on ::1."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


def contract_env(
    rank: int,
    world_size: int,
    port: int,
    *,
    addr: str = "127.0.0.1",
    node_of: Sequence[int] | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Return a child environment with torchrun's contract for `rank`.

    Args:
        rank: Global rank.
        world_size: Number of ranks.
        port: MASTER_PORT.
        addr: MASTER_ADDR.
        node_of: The node id of every rank (simulated nodes on one machine); one node by default.
        extra: More variables.
    """
    nodes = list(node_of) if node_of is not None else [0] * world_size
    node = nodes[rank]
    on_node = [r for r, n in enumerate(nodes) if n == node]
    env = scrubbed_environ()
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(on_node.index(rank)),
        LOCAL_WORLD_SIZE=str(len(on_node)),
        GROUP_RANK=str(node),
        GROUP_WORLD_SIZE=str(len(set(nodes))),
        MASTER_ADDR=addr,
        MASTER_PORT=str(port),
        # Two ranks per core: torch's default thread pools would only fight over them.
        OMP_NUM_THREADS="1",
        **(extra or {}),
    )
    return env


def run_workers(
    scenario: str, envs: Sequence[Mapping[str, str]], *, timeout: float = 60
) -> list[dict[str, Any]]:
    """Run `scenario` in one process per environment; return each rank's RESULT, in rank order.

    Raises:
        AssertionError: If a worker fails, prints no result, or the group outlives `timeout`
            (all workers are then killed), with every worker's stderr tail.
    """
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKERS), scenario],
            env=dict(env),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for env in envs
    ]
    outputs: list[tuple[str, str]] = []
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=max(deadline - time.monotonic(), 0.1)))
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        tails = [(p.communicate()[1] or "")[-2000:] for p in procs]
        raise AssertionError(
            f"{scenario}: workers still running after {timeout} s:\n" + "\n---\n".join(tails)
        ) from None
    results = []
    for rank, (proc, (out, err)) in enumerate(zip(procs, outputs, strict=True)):
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            raise AssertionError(
                f"{scenario}: rank {rank} exited {proc.returncode}\n{out[-2000:]}\n{err[-4000:]}"
            )
        results.append(json.loads(lines[-1].removeprefix("RESULT ")))
    return results
