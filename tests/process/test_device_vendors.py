"""AMD's and Intel's visibility variables in init_dist and `distenv info` on this machine.

This torch is a CPU build, and nothing of it is patched: init_dist runs torch as installed. On a
build for neither ROCm nor XPU, ROCm's and Level Zero's variables are not read, whatever they hold
(a node's prolog or Slurm's gres plug-in may set them for every job), and the rank runs on CPU
with gloo; `distenv info` shows those that are set, without torch.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # torch warns at import when NumPy is missing
    import torch
    import torch.distributed as dist

import distenv
from distenv.device import torch_platform
from tests.conftest import scrubbed_environ
from tests.support.envs import gpu_bind
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


def test_info_shows_the_vendors_variables_that_are_set_without_loading_torch():
    """`distenv info` in a Frontier task (--gpu-bind=closest, local rank 2) shows its
    ROCR_VISIBLE_DEVICES, and ZE_AFFINITY_MASK where set, in text and JSON; torch stays unloaded,
    and the variables that are not set add nothing."""
    code = (
        "import sys; from distenv.cli import main; main(['info']); main(['info', '--json']); "
        "print('torch loaded:', 'torch' in sys.modules)"
    )
    env = {**scrubbed_environ(), **gpu_bind.FRONTIER_2N_16T_CLOSEST[2], "ZE_AFFINITY_MASK": "0.1"}
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert re.search(r"^rocr_visible_devices +'2'$", result.stdout, re.M), result.stdout
    assert re.search(r"^ze_affinity_mask +'0.1'$", result.stdout, re.M), result.stdout
    assert "hip_visible_devices" not in result.stdout
    data = json.loads(result.stdout.splitlines()[-2])
    assert (data["rocr_visible_devices"], data["ze_affinity_mask"]) == ("2", "0.1")
    assert (data["launcher"], data["local_rank"], data["cuda_visible_devices"]) == (
        "slurm",
        2,
        None,
    )
    assert "hip_visible_devices" not in data
    assert result.stdout.endswith("torch loaded: False\n")
