"""`distenv.launch`: per-rank results, large results, failures with tracebacks, the decorator form.

Real spawned workers with a real gloo process group; the functions they run are defined here, at
module level, because spawned workers import them by name. Each launch costs a torch import per
worker, so the worlds are 2 ranks.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from distenv.errors import ConfigurationError, DistEnvError, WorkerFailedError
from distenv.local.spawn import Launched, launch
from tests.process.test_run import gone

BIG = 8 << 20  # 8 MiB per rank: far beyond a pipe's buffer


def report(tag: str, *, big: int = 0) -> dict[str, object]:
    """Return what this rank sees, after an all-reduce over the group."""
    import torch
    import torch.distributed as dist

    total = torch.tensor([dist.get_rank() + 1])
    dist.all_reduce(total)
    return {
        "tag": tag,
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "sum": int(total.item()),
        "env": {k: os.environ.get(k) for k in ("LOCAL_RANK", "OMP_NUM_THREADS", "MASTER_ADDR")},
        "payload": bytes([dist.get_rank() + 1]) * big,
    }


def fail_on_rank_1(out: str, mode: str) -> None:
    """Rank 0 waits (forever); rank 1 fails once rank 0 has written its pid."""
    import torch.distributed as dist

    Path(out, f"pid{dist.get_rank()}").write_text(str(os.getpid()))
    if dist.get_rank() == 0:
        time.sleep(60)
        return
    deadline = time.monotonic() + 20
    while not Path(out, "pid0").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise ValueError("boom on purpose")


@launch(nprocs=2)
def decorated(base: int) -> int:
    """Return `base` plus this rank."""
    import torch.distributed as dist

    return base + dist.get_rank()


def test_results_come_back_in_rank_order_even_when_large() -> None:
    """Each rank's return value comes back intact and in rank order, 8 MiB each included."""
    results = launch(report, 2, args=("t",), kwargs={"big": BIG})
    assert [r["rank"] for r in results] == [0, 1]
    for rank, result in enumerate(results):
        assert result["tag"] == "t"
        assert result["world_size"] == 2
        assert result["sum"] == 3  # the group works: 1 + 2
        assert result["env"] == {
            "LOCAL_RANK": str(rank),
            "OMP_NUM_THREADS": "1",
            "MASTER_ADDR": "127.0.0.1",
        }
        assert result["payload"] == bytes([rank + 1]) * BIG


def test_decorator_runs_the_function_on_every_rank() -> None:
    """``@launch(nprocs=2)`` makes a call run on 2 ranks and return both results."""
    assert isinstance(decorated, Launched)
    assert decorated.__name__ == "decorated"
    assert decorated.__wrapped__ is decorated.fn  # the plain function stays reachable
    assert decorated(10) == [10, 11]


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("raise", "raised ValueError: boom on purpose"), ("kill", "was killed by SIGKILL")],
)
def test_failing_worker_stops_the_others(tmp_path: Path, mode: str, expected: str) -> None:
    """A worker that raises (or dies) stops the other; the error names it, with its traceback."""
    with pytest.raises(WorkerFailedError) as info:
        launch(fail_on_rank_1, 2, args=(str(tmp_path), mode), grace_period=2)
    error = info.value
    assert isinstance(error, DistEnvError)
    assert error.rank == 1
    assert f"rank 1 (pid {Path(tmp_path, 'pid1').read_text()}) {expected}" in str(error)
    assert "stopped the other 1 rank" in str(error)
    if mode == "raise":
        assert error.traceback is not None
        assert "in fail_on_rank_1" in error.traceback
        assert 'raise ValueError("boom on purpose")' in str(error)
    else:
        assert error.exitcode == -signal.SIGKILL
    assert gone(int(Path(tmp_path, "pid0").read_text()))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: launch(lambda: 1, 2), "cannot send"),
        (lambda: launch(report, 0), "nprocs=0"),
        (lambda: launch(report, 2, nnodes=2), "no master_addr"),
        (lambda: launch(report, 2, nnodes=2, node_rank=2, master_addr="h"), "node_rank=2"),
        (lambda: launch(), "nprocs is missing"),  # type: ignore[call-overload]
    ],
    ids=["lambda", "nprocs", "master", "node-rank", "no-nprocs"],
)
def test_bad_arguments_fail_before_any_worker_starts(
    call: Callable[[], object], message: str
) -> None:
    """Arguments launch cannot use are a ConfigurationError raised in the caller, at once."""
    started = time.monotonic()
    with pytest.raises(ConfigurationError, match=message):
        call()
    assert time.monotonic() - started < 1
