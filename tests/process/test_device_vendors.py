"""AMD's and Intel's visibility variables in a real init_dist on this machine (a CPU build of torch).

Nothing of torch is patched: init_dist runs torch as installed. On a build for neither ROCm nor
XPU, ROCm's and Level Zero's variables are not read, whatever they hold (a node's prolog or
Slurm's gres plug-in may set them for every job), and the rank runs on CPU with gloo.
"""

from __future__ import annotations

import warnings

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # torch warns at import when NumPy is missing
    import torch
    import torch.distributed as dist

import distenv
from distenv.device import torch_platform
from tests.support.spawn import clean_process


@pytest.fixture(autouse=True)
def fresh_process():
    """Give each test a process without a group, distenv state or start method; restore after."""
    with clean_process():
        yield


@pytest.mark.parametrize(
    "variables",
    [
        pytest.param({"ROCR_VISIBLE_DEVICES": "4", "HIP_VISIBLE_DEVICES": "0"}, id="rocm-task"),
        pytest.param({"ROCR_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "-1"}, id="rocm-hidden"),
        pytest.param({"ZE_AFFINITY_MASK": "gpu"}, id="malformed-level-zero-mask"),
    ],
)
def test_init_dist_on_a_cpu_build_ignores_rocm_and_level_zero_variables(monkeypatch, variables):
    """ROCm's variables and even a malformed ZE_AFFINITY_MASK (an XPU build refuses it): init_dist
    on this CPU build picks cpu and gloo and an all_reduce finishes."""
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert torch_platform() == "cuda"
    distenv.init_dist()
    total = torch.ones(1)
    dist.all_reduce(total)
    assert (str(distenv.current_device()), dist.get_backend(), total.item()) == ("cpu", "gloo", 1.0)
