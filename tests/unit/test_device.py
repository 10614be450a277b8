"""Device selection and backend choice: pure rules, tested as tables."""

from __future__ import annotations

import warnings

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # torch warns at import when NumPy is missing
    import torch

import distenv
from distenv import state
from distenv.device import (
    choose_backend,
    current_device,
    device_identity,
    device_reason,
    rank_backend,
    rank_device,
    select_device,
    visible_device_count,
)
from distenv.errors import ConfigurationError
from distenv.rankinfo import RankInfo


@pytest.mark.parametrize(
    ("local_rank", "local_world_size", "visible", "expected"),
    [
        pytest.param(0, 1, 0, None, id="no-gpu"),
        pytest.param(3, 4, 0, None, id="no-gpu-rank3"),
        pytest.param(0, 1, 1, 0, id="one-rank-one-gpu"),
        pytest.param(0, 4, 4, 0, id="4x4-rank0"),
        pytest.param(3, 4, 4, 3, id="4x4-rank3"),
        pytest.param(2, 4, 8, 2, id="fewer-ranks-than-gpus"),
        pytest.param(1, 4, 1, 0, id="gpus-per-task-1"),
        pytest.param(3, 4, 1, 0, id="gpus-per-task-1-rank3"),
        pytest.param(5, 8, 2, 1, id="gpus-per-task-2-wraps"),
        pytest.param(6, 8, 4, 2, id="more-ranks-than-gpus"),
    ],
)
def test_select_device(local_rank, local_world_size, visible, expected):
    """local_rank when visible, else local_rank % visible, None without devices; never an error."""
    assert select_device(local_rank, local_world_size, visible) == expected


@pytest.mark.parametrize(
    ("local_rank", "local_world_size", "visible"),
    [
        pytest.param(4, 4, 4, id="rank-past-size"),
        pytest.param(-1, 4, 4, id="negative-rank"),
        pytest.param(0, 0, 4, id="empty-node"),
        pytest.param(0, 1, -1, id="negative-visible"),
    ],
)
def test_select_device_rejects_impossible_layouts(local_rank, local_world_size, visible):
    """Numbers that describe no rank are a ConfigurationError quoting them."""
    with pytest.raises(ConfigurationError, match=rf"local_rank={local_rank}, "):
        select_device(local_rank, local_world_size, visible)


@pytest.mark.parametrize(
    ("cuda_available", "has_device", "explicit", "expected"),
    [
        pytest.param(True, True, None, "nccl", id="gpu"),
        pytest.param(True, False, None, "gloo", id="cuda-but-no-device-for-rank"),
        pytest.param(False, False, None, "gloo", id="cpu"),
        pytest.param(False, True, None, "gloo", id="device-but-cuda-unusable"),
        pytest.param(True, True, "gloo", "gloo", id="explicit-gloo-on-gpu"),
        pytest.param(False, False, "nccl", "nccl", id="explicit-nccl-wins"),
        pytest.param(True, True, "cpu:gloo,cuda:nccl", "cpu:gloo,cuda:nccl", id="per-device"),
        pytest.param(False, False, " mpi ", "mpi", id="explicit-stripped"),
    ],
)
def test_choose_backend(cuda_available, has_device, explicit, expected):
    """nccl with CUDA and a device for this rank, else gloo; an explicit backend always wins."""
    chosen = choose_backend(cuda_available=cuda_available, has_device=has_device, explicit=explicit)
    assert chosen == expected


def test_choose_backend_rejects_empty():
    """An empty backend string is a ConfigurationError, not torch's later complaint."""
    with pytest.raises(ConfigurationError, match=r"^init: backend='' is empty\. Hint:"):
        choose_backend(cuda_available=False, has_device=False, explicit="")


def test_visible_count_matches_torch():
    """visible_device_count() is torch's own count (0 without usable CUDA)."""
    expected = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert visible_device_count() == expected


@pytest.mark.parametrize("hidden", ["", " ", "-1", "NoDevFiles"])
def test_a_rank_whose_gpus_are_all_hidden_never_initialises_cuda(monkeypatch, hidden):
    """CUDA_VISIBLE_DEVICES that hides every GPU: no device and gloo, without asking CUDA (whose
    driver initialisation a CPU job on a CUDA build of torch would pay in every rank)."""

    def initialises(*args, **kwargs):
        raise AssertionError("CUDA was asked")

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
    monkeypatch.setattr(torch.cuda, "is_available", initialises)
    monkeypatch.setattr(torch.cuda, "device_count", initialises)
    info = RankInfo(
        launcher="torchrun", rank=1, world_size=2, local_rank=1, local_world_size=2,
        node_rank=0, num_nodes=1, master_addr="127.0.0.1", master_port=29500,
    )  # fmt: skip
    assert visible_device_count() == 0
    assert rank_device(info) is None
    assert rank_backend(None) == "gloo"


def test_a_rank_that_may_see_a_gpu_asks_cuda(monkeypatch):
    """Any other CUDA_VISIBLE_DEVICES (unset, an index, a UUID) is CUDA's to answer."""
    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: asked.append(1) or False)
    for value in (None, "0", "GPU-1234"):
        if value is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
        assert visible_device_count() == 0
    assert len(asked) == 3
    assert rank_backend(0) == "gloo"  # a device: CUDA decides nccl or not
    assert len(asked) == 4


def test_device_identity_rejects_invisible_index():
    """Asking the identity of a device this process cannot see is a ConfigurationError."""
    with pytest.raises(ConfigurationError, match=r"device index 99 is not among the"):
        device_identity(99)


@pytest.mark.parametrize(
    ("device", "local_rank", "visible", "cuda", "env", "expected"),
    [
        pytest.param(1, 1, 4, "12.4", None,
                     "cuda:1: its local rank, among 4 visible device(s) (CUDA_VISIBLE_DEVICES unset)",
                     id="local-rank"),
        pytest.param(0, 3, 1, "12.4", "5",
                     "cuda:0: local rank 3 wrapped, among 1 visible device(s) "
                     "(CUDA_VISIBLE_DEVICES '5')", id="one-per-task"),
        pytest.param(None, 0, 0, None, "0",
                     "cpu: torch 2.13.0 is a CPU-only build (torch.version.cuda is None)",
                     id="cpu-build"),
        pytest.param(None, 0, 0, "12.4", "",
                     "cpu: CUDA_VISIBLE_DEVICES='' hides every GPU", id="hidden"),
        pytest.param(None, 0, 0, "12.4", "NoDevFiles",
                     "cpu: CUDA_VISIBLE_DEVICES='NoDevFiles' hides every GPU", id="slurm-nodev"),
        pytest.param(None, 0, 0, "12.4", None,
                     "cpu: torch 2.13.0 (CUDA 12.4) sees no GPU: no NVIDIA driver or GPU on this "
                     "host, or none of CUDA_VISIBLE_DEVICES (unset) exists", id="no-driver"),
    ],
)  # fmt: skip
def test_device_reason_says_why(
    device: int | None,
    local_rank: int,
    visible: int,
    cuda: str | None,
    env: str | None,
    expected: str,
) -> None:
    """The reason `distenv info --device` and `doctor` print for each way a device is chosen."""
    assert select_device(local_rank, 4, visible) == device
    assert device_reason(device, local_rank=local_rank, visible=visible, torch_version="2.13.0",
                         cuda_build=cuda, cuda_visible_devices=env) == expected  # fmt: skip


@pytest.mark.parametrize("rank", range(4))
def test_a_flux_task_without_a_local_size_gets_its_local_ranks_device(
    rank: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The device follows FLUX_TASK_LOCAL_ID before the roll call has counted the host's tasks."""
    from distenv import detect, device
    from tests.support.envs import flux

    info = detect("auto", flux.FLUX_2X2[rank])
    assert info.local_world_size is None
    monkeypatch.setattr(device, "visible_device_count", lambda: 2)
    assert device.rank_device(info) == rank % 2
    monkeypatch.setattr(device, "visible_device_count", lambda: 1)
    assert device.rank_device(info) == 0


@pytest.mark.parametrize(
    ("chosen", "expected"),
    [
        pytest.param(None, torch.device("cpu"), id="cpu"),
        pytest.param(0, torch.device("cuda", 0), id="gpus-per-task"),
        pytest.param(3, torch.device("cuda", 3), id="local-rank-3"),
    ],
)
def test_current_device_is_the_one_init_dist_chose(
    monkeypatch: pytest.MonkeyPatch, chosen: int | None, expected: torch.device
) -> None:
    """distenv.current_device() answers what init_dist/setup chose (state), as a torch.device:
    cuda:0 for local rank 3 under --gpus-per-task=1 (not its local rank), cpu without a GPU."""
    info = RankInfo(
        launcher="slurm",
        rank=3,
        world_size=4,
        local_rank=3,
        local_world_size=4,
        node_rank=0,
        num_nodes=1,
        master_addr="127.0.0.1",
        master_port=29500,
    )
    monkeypatch.setattr(state, "_state", state.State(info, "slurm/1/0", chosen, False))
    assert distenv.current_device() == current_device() == expected


def test_current_device_before_init_dist_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Asked before init_dist/setup, it says so instead of guessing cpu or cuda:0."""
    monkeypatch.setattr(state, "_state", None)
    with pytest.raises(ConfigurationError, match="called before init_dist") as caught:
        current_device()
    assert caught.value.hint == "call distenv.init_dist() (or distenv.setup()) first"
