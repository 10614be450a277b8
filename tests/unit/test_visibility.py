"""The vendors' visibility variables: which devices a process sees, from the environment alone.

Values from the vendors' documentation (cited in distenv/visibility.py): ROCm's "GPU isolation
techniques", the CUDA programming guide, the Level Zero specification's affinity mask.
"""

from __future__ import annotations

import pytest

from distenv.errors import ConfigurationError
from distenv.visibility import hides_every_device, level_zero_visible, rocm_visible


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param({}, None, id="nothing-set"),
        pytest.param({"ROCR_VISIBLE_DEVICES": "0,GPU-DEADBEEFDEADBEEF"},
                     ("0", "GPU-DEADBEEFDEADBEEF"), id="rocm-doc-index-and-uuid"),
        pytest.param({"HIP_VISIBLE_DEVICES": "0,2"}, ("0", "2"), id="rocm-doc-hip"),
        pytest.param({"CUDA_VISIBLE_DEVICES": "0,2"}, ("0", "2"), id="hip-honours-cuda"),
        pytest.param({"ROCR_VISIBLE_DEVICES": "4"}, ("4",), id="frontier-closest-rank0"),
        pytest.param({"ROCR_VISIBLE_DEVICES": "4", "HIP_VISIBLE_DEVICES": "0"}, ("4",),
                     id="hip-indexes-what-rocr-left"),
        pytest.param({"ROCR_VISIBLE_DEVICES": "1,2,3", "HIP_VISIBLE_DEVICES": "0"}, ("1",),
                     id="torch-test-rocr-then-hip"),
        pytest.param({"ROCR_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "1,0"}, ("3", "2"),
                     id="hip-reorders"),
        pytest.param({"ROCR_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "0,5,1"}, ("2",),
                     id="index-past-what-is-left-ends-the-list"),
        pytest.param({"ROCR_VISIBLE_DEVICES": "2,3", "CUDA_VISIBLE_DEVICES": "1"}, ("3",),
                     id="cuda-indexes-what-rocr-left"),
        pytest.param({"HIP_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "0"}, ("1",),
                     id="hip-before-cuda"),
        pytest.param({"HIP_VISIBLE_DEVICES": " 1 , 0 "}, ("1", "0"), id="spaces"),
        pytest.param({"ROCR_VISIBLE_DEVICES": ""}, (), id="rocr-empty-hides"),
        pytest.param({"ROCR_VISIBLE_DEVICES": "-1"}, (), id="rocr-minus-one-hides"),
        pytest.param({"ROCR_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": ""}, (),
                     id="hip-empty-hides"),
        pytest.param({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, (), id="slurm-no-devices"),
        pytest.param({"HIP_VISIBLE_DEVICES": "1,-1,0"}, ("1",), id="negative-index-ends-the-list"),
        pytest.param({"HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": ""}, ("0",),
                     id="hip-wins-over-a-hiding-cuda"),
    ],
)  # fmt: skip
def test_rocm_visible(env, expected):
    """ROCR_VISIBLE_DEVICES first; HIP_VISIBLE_DEVICES (else CUDA_VISIBLE_DEVICES) indexes into
    what it left; empty or -1 hides every device; each device named by the value that picks it."""
    assert rocm_visible(env) == expected


@pytest.mark.parametrize(
    ("mask", "expected"),
    [
        pytest.param(None, None, id="unset"),
        pytest.param("0,1", ("0", "1"), id="devices"),
        pytest.param("1.0", ("1.0",), id="one-tile-is-a-device"),
        pytest.param("0.0,0.1", ("0.0+0.1",), id="two-tiles-are-their-device"),
        pytest.param("1.3,1.0,2", ("1.3+1.0", "2"), id="spec-example-order-kept"),
        pytest.param("0,0.1", ("0",), id="whole-device-and-its-tile"),
        pytest.param("3,3", ("3",), id="repeated-once"),
        pytest.param("", (), id="empty-hides"),
        pytest.param("-1", (), id="minus-one-hides"),
        pytest.param(" 5 ", ("5",), id="spaces"),
    ],
)
def test_level_zero_visible(mask, expected):
    """ZE_AFFINITY_MASK: devices and device.tile pairs; one tile alone is a device of its own,
    two tiles of one device are that device (Level Zero specification, affinity mask)."""
    env = {} if mask is None else {"ZE_AFFINITY_MASK": mask}
    assert level_zero_visible(env) == expected


@pytest.mark.parametrize("mask", ["gpu", "0.0.1", "0,,1", "1.a"])
def test_a_malformed_affinity_mask_is_named(mask):
    """An entry that is neither N nor N.M is a ConfigurationError naming the variable and value."""
    with pytest.raises(ConfigurationError) as caught:
        level_zero_visible({"ZE_AFFINITY_MASK": mask})
    assert caught.value.variable == "ZE_AFFINITY_MASK"
    assert caught.value.value == mask
    assert str(caught.value).startswith(f"device: $ZE_AFFINITY_MASK is {mask!r}: ")
    assert "Hint: write ZE_AFFINITY_MASK as indices and device.tile pairs" in str(caught.value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, False), ("", True), (" ", True), ("-1", True), ("NoDevFiles", True), ("0", False),
     ("GPU-1234", False), ("-1,0", False)],
)  # fmt: skip
def test_hides_every_device(value, expected):
    """Empty, -1 and Slurm's NoDevFiles hide every device; unset hides nothing."""
    assert hides_every_device(value) is expected
