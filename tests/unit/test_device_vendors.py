"""AMD (ROCm) and Intel (XPU) in the device rules: platform, backend, device per local rank, identity.

No AMD or Intel device and no ROCm or XPU build of torch is here (this torch is a CPU build): the
rules are tested as functions of explicit inputs, recorded from the vendors' documentation
(tests/support/envs/gpu_bind.py, distenv/visibility.py); the checks that need torch use the real
one, unpatched.
"""

from __future__ import annotations

import warnings

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # torch warns at import when NumPy is missing

from distenv import detect
from distenv.bootstrap.findings import shared_gpus
from distenv.bootstrap.problems import SharedGpu
from distenv.bootstrap.records import CheckIn, matches
from distenv.device import (
    build_platform,
    choose_backend,
    device_reason,
    hides_all,
    identity_of,
    rank_backend,
    select_device,
    torch_platform,
    visible_device_count,
    xccl_usable,
)
from distenv.errors import ConfigurationError
from distenv.visibility import check_rocm_indices, level_zero_visible, rocm_visible
from tests.support.envs import gpu_bind


@pytest.mark.parametrize(
    ("hip", "xpu", "expected"),
    [
        pytest.param("6.2.41133", None, "rocm", id="rocm-build"),
        pytest.param(None, "20250101", "xpu", id="xpu-build"),
        pytest.param(None, None, "cuda", id="cuda-or-cpu-build"),
    ],
)
def test_build_platform(hip, xpu, expected):
    """torch.version.hip makes a ROCm build (torch.cuda is HIP), torch.version.xpu an XPU one."""
    assert build_platform(hip=hip, xpu=xpu) == expected


def test_this_torch_is_a_cuda_platform_that_never_reads_the_other_vendors_variables(monkeypatch):
    """This CPU build follows CUDA's rules: Level Zero's and ROCm's variables, even malformed or
    hiding, are not read; it sees no device and defaults to gloo (real torch, nothing patched)."""
    assert torch_platform() == "cuda"
    monkeypatch.setenv("ZE_AFFINITY_MASK", "gpu")  # malformed: read, it would raise
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_device_count() == 0
    assert rank_backend(None) == "gloo"


@pytest.mark.parametrize(
    ("platform", "env", "expected"),
    [
        pytest.param("rocm", {"ROCR_VISIBLE_DEVICES": ""}, True, id="rocm-rocr-empty"),
        pytest.param("rocm", {"ROCR_VISIBLE_DEVICES": "-1"}, True, id="rocm-rocr-minus-one"),
        pytest.param("rocm", {"HIP_VISIBLE_DEVICES": "-1"}, True, id="rocm-hip-minus-one"),
        pytest.param("rocm", {"CUDA_VISIBLE_DEVICES": ""}, True, id="rocm-honours-cuda"),
        pytest.param("rocm", {"HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": ""}, False,
                     id="rocm-hip-before-cuda"),
        pytest.param("rocm", {"ROCR_VISIBLE_DEVICES": "4"}, False, id="rocm-frontier-task"),
        pytest.param("rocm", {"ROCR_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "1"}, False,
                     id="rocm-index-past-rocr-is-the-runtimes-to-judge"),
        pytest.param("xpu", {"ZE_AFFINITY_MASK": ""}, True, id="xpu-empty"),
        pytest.param("xpu", {"ZE_AFFINITY_MASK": "-1"}, True, id="xpu-minus-one"),
        pytest.param("xpu", {"CUDA_VISIBLE_DEVICES": ""}, False, id="xpu-ignores-cuda"),
        pytest.param("xpu", {"ZE_AFFINITY_MASK": "0.1"}, False, id="xpu-one-tile"),
        pytest.param("cuda", {"ROCR_VISIBLE_DEVICES": ""}, False, id="cuda-ignores-rocr"),
        pytest.param("cuda", {"CUDA_VISIBLE_DEVICES": "-1"}, True, id="cuda-minus-one"),
    ],
)  # fmt: skip
def test_hides_all(platform, env, expected):
    """An empty or -1 value hides every device of the platform whose runtime reads it; an index
    past what ROCR left is not taken as hiding (torch's count decides, `check_rocm_indices`
    explains)."""
    assert hides_all(platform, env) is expected


@pytest.mark.parametrize(
    ("platform", "available", "has_device", "xccl", "explicit", "expected"),
    [
        pytest.param("rocm", True, True, False, None, "nccl", id="rocm-rccl"),
        pytest.param("rocm", True, False, False, None, "gloo", id="rocm-no-device"),
        pytest.param("xpu", True, True, True, None, "xccl", id="xpu-xccl"),
        pytest.param("xpu", True, True, False, None, "gloo", id="xpu-without-xccl"),
        pytest.param("xpu", True, False, True, None, "gloo", id="xpu-no-device"),
        pytest.param("xpu", False, True, True, None, "gloo", id="xpu-runtime-unusable"),
        pytest.param("xpu", True, True, True, "gloo", "gloo", id="explicit-wins"),
        pytest.param("cuda", True, True, True, None, "nccl", id="cuda-ignores-xccl"),
    ],
)
def test_choose_backend_per_platform(platform, available, has_device, xccl, explicit, expected):
    """nccl on CUDA and ROCm (RCCL), xccl on XPU where usable, gloo without a device."""
    chosen = choose_backend(
        cuda_available=available,
        has_device=has_device,
        explicit=explicit,
        platform=platform,
        xccl=xccl,
    )
    assert chosen == expected


@pytest.mark.parametrize(
    ("version", "available", "expected"),
    [
        pytest.param("2.8.0+xpu", True, True, id="2.8"),
        pytest.param("2.10.0a0+git1234", True, True, id="2.10-nightly"),
        pytest.param("2.7.1+xpu", True, False, id="2.7-too-old"),
        pytest.param("2.8.0+xpu", False, False, id="built-without-xccl"),
        pytest.param("nightly", True, False, id="unreadable-version"),
    ],
)
def test_xccl_usable(version, available, expected):
    """xccl is the XPU default from torch 2.8, and only where this torch carries it."""
    assert xccl_usable(version, available) is expected


def _checkin(rank: int, host: str, device: str) -> CheckIn:
    return CheckIn(
        rank=rank, world_size=16, local_rank=rank % 8, local_world_size=8, node_rank=rank // 8,
        hostname=host, pid=100 + rank, launcher="slurm", master=f"{host}:29500",
        backend="nccl", torch_version="2.8.0+rocm6.4", device=device,
    )  # fmt: skip


@pytest.mark.parametrize("rank", range(16))
def test_frontier_gpu_bind_closest_gives_each_local_rank_its_gcd(rank):
    """Frontier, srun --gpus-per-task=1 --gpu-bind=closest (OLCF's hello_jobstep): every task
    sees one device, so each local rank uses cuda:0, which is GCD 4, 5, 2, 3, 6, 7, 0, 1 of its
    node by local rank; its identity is the bus the docs print."""
    env = gpu_bind.FRONTIER_2N_16T_CLOSEST[rank]
    info = detect("auto", env)
    assert (info.launcher, info.local_rank, info.local_world_size) == ("slurm", rank % 8, 8)
    visible = rocm_visible(env)
    assert visible == (gpu_bind.FRONTIER_CLOSEST_GCD[rank % 8],)
    assert select_device(info.local_rank, 8, len(visible)) == 0
    bus = int(gpu_bind.FRONTIER_CLOSEST_BUS[rank % 8], 16)
    identity = identity_of("rocm", 0, uuid=None, pci=(0, bus, 0), visible=visible)
    assert identity == f"0000:{gpu_bind.FRONTIER_CLOSEST_BUS[rank % 8]}:00"
    assert matches("device", identity)


def _identities(envs, buses):
    found = []
    for env, bus in zip(envs, buses, strict=True):
        pci = None if bus is None else (0, int(bus, 16), 0)
        found.append(identity_of("rocm", 0, uuid=None, pci=pci, visible=rocm_visible(env)))
    return found


def test_frontier_closest_shares_no_gcd():
    """The 16 tasks drive 8 distinct GCDs per node: the roll call's sharing check finds none,
    by bus and, where no bus were reported, by the ROCR_VISIBLE_DEVICES value."""
    envs = gpu_bind.FRONTIER_2N_16T_CLOSEST
    hosts = [env["SLURMD_NODENAME"] for env in envs]
    for buses in (gpu_bind.FRONTIER_CLOSEST_BUS * 2, (None,) * 16):
        ids = _identities(envs, buses)
        assert len(set(zip(hosts, ids, strict=True))) == 16
        assert all(matches("device", i) for i in ids)
        assert shared_gpus([_checkin(r, hosts[r], ids[r]) for r in range(16)]) == []


def test_setonix_closest_numbers_every_task_0_so_the_bus_names_the_gcd():
    """Setonix (the MI250X node LUMI-G has), --gpu-bind=closest: a task-level cgroup leaves each
    task one device and ROCR_VISIBLE_DEVICES=0 in all three. The bus tells the three GCDs apart;
    the visible value alone would call them one, which is why it comes last."""
    envs = gpu_bind.SETONIX_1N_3T_CLOSEST
    assert [rocm_visible(env) for env in envs] == [("0",)] * 3
    assert [select_device(r, 3, 1) for r in range(3)] == [0, 0, 0]
    host = envs[0]["SLURMD_NODENAME"]
    by_bus = _identities(envs, gpu_bind.SETONIX_CLOSEST_BUS)
    assert by_bus == ["0000:d1:00", "0000:d6:00", "0000:c9:00"]
    assert shared_gpus([_checkin(r, host, by_bus[r]) for r in range(3)]) == []
    by_value = _identities(envs, (None,) * 3)
    assert by_value == ["rocm:0"] * 3
    (problem,) = shared_gpus([_checkin(r, host, by_value[r]) for r in range(3)])
    assert isinstance(problem, SharedGpu)


@pytest.mark.parametrize(
    ("platform", "index", "uuid", "pci", "visible", "expected"),
    [
        pytest.param("cuda", 0, "58f3a5c1-2b7e-4c1d-9f0e-8a6b5c4d3e2f", None, None,
                     "GPU-58f3a5c1-2b7e-4c1d-9f0e-8a6b5c4d3e2f", id="cuda-uuid"),
        pytest.param("cuda", 0, "MIG-0c9d", None, None, "MIG-0c9d", id="mig-kept"),
        pytest.param("rocm", 0, "GPU-4b2c1a9f", (0, 0xD1, 0), ("4",), "GPU-4b2c1a9f",
                     id="rocm-uuid-first"),
        pytest.param("rocm", 0, None, (0, 0xC1, 0), ("0",), "0000:c1:00", id="rocm-bus"),
        pytest.param("rocm", 1, None, None, ("2", "GPU-DEADBEEF"), "rocm:GPU-DEADBEEF",
                     id="rocm-uuid-from-rocr"),
        pytest.param("xpu", 0, "00008086020b", None, ("1.0",), "XPU-00008086020b",
                     id="xpu-uuid"),
        pytest.param("xpu", 0, None, None, ("1.0",), "xpu:1.0", id="xpu-tile"),
        pytest.param("xpu", 0, None, None, ("0.0+0.1",), "xpu:0.0+0.1", id="xpu-both-tiles"),
        pytest.param("cuda", 3, None, None, None, "cuda:3", id="unrestricted-index"),
    ],
)  # fmt: skip
def test_identity_of(platform, index, uuid, pci, visible, expected):
    """The UUID, else the PCI address, else the visible value that picked the device; every
    answer passes the roll call's record check."""
    found = identity_of(platform, index, uuid=uuid, pci=pci, visible=visible)
    assert found == expected
    assert matches("device", found)


@pytest.mark.parametrize("local_rank", range(12))
def test_aurora_one_tile_per_rank(local_rank):
    """Aurora-like PVC nodes, 6 GPUs of 2 tiles, one rank per tile (ALCF's gpu_tile_compact.sh
    sets ZE_AFFINITY_MASK=<gpu>.<tile>): each rank sees one device, xpu:0, a tile of its own."""
    mask = f"{local_rank // 2}.{local_rank % 2}"
    visible = level_zero_visible({"ZE_AFFINITY_MASK": mask})
    assert visible == (mask,)
    assert select_device(local_rank, 12, len(visible)) == 0
    assert identity_of("xpu", 0, uuid=None, pci=None, visible=visible) == f"xpu:{mask}"


@pytest.mark.parametrize(
    ("device", "platform", "build", "env", "expected"),
    [
        pytest.param(0, "rocm", "6.2", {"ROCR_VISIBLE_DEVICES": "4"},
                     "cuda:0: local rank 3 wrapped, among 1 visible device(s) "
                     "(ROCR_VISIBLE_DEVICES '4', HIP_VISIBLE_DEVICES unset, "
                     "CUDA_VISIBLE_DEVICES unset)", id="rocm-frontier"),
        pytest.param(None, "rocm", "6.2", {"ROCR_VISIBLE_DEVICES": "-1"},
                     "cpu: ROCR_VISIBLE_DEVICES='-1' hides every GPU", id="rocm-hidden"),
        pytest.param(None, "rocm", "6.2", {},
                     "cpu: torch 2.8.0 (ROCm 6.2) sees no device: no ROCm driver or device on "
                     "this host, or none of the visible devices (ROCR_VISIBLE_DEVICES unset, "
                     "HIP_VISIBLE_DEVICES unset, CUDA_VISIBLE_DEVICES unset) exists",
                     id="rocm-no-driver"),
        pytest.param(0, "xpu", "20250101", {"ZE_AFFINITY_MASK": "1.1"},
                     "xpu:0: local rank 3 wrapped, among 1 visible device(s) "
                     "(ZE_AFFINITY_MASK '1.1')", id="xpu-tile"),
        pytest.param(None, "xpu", "20250101", {"ZE_AFFINITY_MASK": ""},
                     "cpu: ZE_AFFINITY_MASK='' hides every device", id="xpu-hidden"),
    ],
)  # fmt: skip
def test_device_reason_names_the_vendors_variables(device, platform, build, env, expected):
    """distenv info --device and doctor quote the variables the platform's runtime reads."""
    reason = device_reason(
        device,
        local_rank=3,
        visible=0 if device is None else 1,
        torch_version="2.8.0",
        cuda_build=build,
        cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
        platform=platform,
        env=env,
    )
    assert reason == expected


def test_slurm_s_default_gres_variables_leave_a_rocm_task_past_the_first_without_a_gpu():
    """Slurm (gres.conf without Flags=amd_gpu_env) writes task 1's index 1 into both
    ROCR_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES (measured here): HIP's index 1 into ROCR's one
    device names none, so a ROCm rank 1 is refused, naming both values and the fix; task 0 and
    a CUDA build are fine."""
    first, second = gpu_bind.SRUN_DEFAULT_GRES_FLAGS_2T
    assert rocm_visible(first) == ("0",)
    check_rocm_indices("rocm", first)
    assert rocm_visible(second) == ()
    check_rocm_indices("cuda", second)
    check_rocm_indices("xpu", second)
    with pytest.raises(ConfigurationError) as caught:
        check_rocm_indices("rocm", second)
    assert (caught.value.variable, caught.value.value) == ("CUDA_VISIBLE_DEVICES", "1")
    assert str(caught.value) == (
        "device: $CUDA_VISIBLE_DEVICES is '1', which names none of the devices "
        "ROCR_VISIBLE_DEVICES='1' left: HIP indexes CUDA_VISIBLE_DEVICES into what "
        "ROCR_VISIBLE_DEVICES exposes, so this rank sees no GPU. Hint: unset "
        "CUDA_VISIBLE_DEVICES and let ROCR_VISIBLE_DEVICES choose (Slurm sets both unless "
        "gres.conf says Flags=amd_gpu_env), or give it indices into ROCR's list (0 for the first)"
    )


@pytest.mark.parametrize(
    ("env", "named"),
    [
        pytest.param({"ROCR_VISIBLE_DEVICES": "3", "HIP_VISIBLE_DEVICES": "3"},
                     "HIP_VISIBLE_DEVICES", id="hip-past-rocr"),
        pytest.param({"ROCR_VISIBLE_DEVICES": "3", "HIP_VISIBLE_DEVICES": "0",
                      "CUDA_VISIBLE_DEVICES": "3"}, None, id="hip-before-cuda"),
        pytest.param({"ROCR_VISIBLE_DEVICES": "", "CUDA_VISIBLE_DEVICES": "3"}, None,
                     id="hidden-on-purpose"),
        pytest.param({"ROCR_VISIBLE_DEVICES": "2,3", "CUDA_VISIBLE_DEVICES": "-1"}, None,
                     id="cuda-hides-on-purpose"),
        pytest.param({"CUDA_VISIBLE_DEVICES": "3"}, None, id="no-rocr"),
        pytest.param({"ROCR_VISIBLE_DEVICES": "2,3", "CUDA_VISIBLE_DEVICES": "1"}, None,
                     id="index-into-rocr"),
    ],
)  # fmt: skip
def test_check_rocm_indices(env, named):
    """Only an index variable that names none of ROCR's devices is refused, never a value that
    hides every device on purpose."""
    if named is None:
        check_rocm_indices("rocm", env)
        return
    with pytest.raises(ConfigurationError) as caught:
        check_rocm_indices("rocm", env)
    assert caught.value.variable == named


@pytest.mark.parametrize("rank", range(16))
def test_frontier_tasks_pass_the_rocm_index_check(rank):
    """ROCR_VISIBLE_DEVICES alone, as --gpu-bind=closest sets it on Frontier, is never refused."""
    check_rocm_indices("rocm", gpu_bind.FRONTIER_2N_16T_CLOSEST[rank])
