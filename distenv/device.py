"""Which accelerator a rank uses, and which process-group backend follows from it.

NVIDIA (CUDA), AMD (ROCm: torch's ``cuda`` devices are HIP devices there) and Intel (XPU) builds
of torch follow one rule. The rules are pure functions of plain values so that a table tests
them; `rank_device` and `rank_backend` apply them to this process (the one rule `init_dist`,
`setup` and `distenv doctor` share), and only they, `visible_device_count`, `device_identity`
and the functions that name or set the device ask torch (imported lazily: `import distenv` never
loads it), and the device runtime only where a device may be visible (`distenv.visibility`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from distenv import state
from distenv.errors import ConfigurationError
from distenv.rankinfo import RankInfo
from distenv.visibility import (
    VARIABLES,
    Platform,
    check_rocm_indices,
    hides_every_device,
    identity_of,
    level_zero_visible,
    rocm_visible,
)

if TYPE_CHECKING:
    import torch

#: The variables that choose each platform's visible devices, in the order the runtime applies them.
VISIBILITY_VARIABLES = VARIABLES

#: The AMD and Intel variables among them: `distenv info` shows those that are set.
VENDOR_VISIBILITY_VARIABLES = tuple(
    dict.fromkeys(
        name
        for names in VISIBILITY_VARIABLES.values()
        for name in names
        if name != "CUDA_VISIBLE_DEVICES"
    )
)

#: The first torch whose XPU builds carry the xccl backend as a default for ``xpu`` devices.
XCCL_SINCE = (2, 8)

__all__ = [
    "VENDOR_VISIBILITY_VARIABLES",
    "VISIBILITY_VARIABLES",
    "Platform",
    "build_platform",
    "choose_backend",
    "current_device",
    "device_identity",
    "device_name",
    "device_reason",
    "hides_all",
    "identity_of",
    "pci_address",
    "rank_backend",
    "rank_device",
    "rank_device_reason",
    "select_device",
    "set_current_device",
    "torch_platform",
    "visible_device_count",
    "xccl_usable",
]


def select_device(local_rank: int, local_world_size: int, visible: int) -> int | None:
    """Return the CUDA device index this rank should use, or None when it sees no device.

    The index is `local_rank` when that device is visible, else ``local_rank % visible``. The
    second case is the usual one under Slurm's ``--gpus-per-task=1`` (or ``--gpu-bind``): each
    task sees exactly one device, index 0, whatever its local rank. More ranks than visible devices
    is not an error here; two ranks on the same physical GPU is, and is caught by comparing
    `device_identity` across ranks, because only the physical identity can tell.

    Args:
        local_rank: Rank among the processes on this node.
        local_world_size: Number of processes on this node.
        visible: ``torch.cuda.device_count()``: devices this process can see. Never computed by
            parsing CUDA_VISIBLE_DEVICES, which may hold indices, UUIDs or MIG ids.

    Raises:
        ConfigurationError: If the numbers contradict each other.
    """
    if local_world_size < 1 or not 0 <= local_rank < local_world_size or visible < 0:
        raise ConfigurationError(
            "device",
            f"local_rank={local_rank!r}, local_world_size={local_world_size!r}, "
            f"visible={visible!r} do not describe a rank on a node",
            hint="pass 0 <= local_rank < local_world_size and visible >= 0",
        )
    # local_rank itself when visible, else wrapped: both are local_rank % visible.
    return local_rank % visible if visible else None


def build_platform(*, hip: str | None, xpu: str | None) -> Platform:
    """Return the device runtime of a torch build from ``torch.version.hip`` and ``.xpu``.

    ``rocm`` where torch was built for HIP (its ``torch.cuda`` is HIP, its ``nccl`` is RCCL),
    ``xpu`` on an XPU build, else ``cuda`` (CPU-only builds included).
    """
    if hip:
        return "rocm"
    return "xpu" if xpu else "cuda"


def torch_platform() -> Platform:
    """Return the device runtime of the torch this process imports (`build_platform`)."""
    import torch

    return build_platform(hip=torch.version.hip, xpu=getattr(torch.version, "xpu", None))


def hides_all(platform: Platform, env: Mapping[str, str]) -> bool:
    """Return whether `env`'s visibility variables hide every device of `platform`.

    CUDA_VISIBLE_DEVICES for CUDA; ROCR_VISIBLE_DEVICES, then HIP_VISIBLE_DEVICES or
    CUDA_VISIBLE_DEVICES for ROCm; ZE_AFFINITY_MASK for XPU (`distenv.visibility`).
    """
    if platform == "rocm":
        # By value only: an index past what ROCR left is the runtime's to judge (torch's count),
        # then `check_rocm_indices`'s to explain.
        index = env.get("HIP_VISIBLE_DEVICES", env.get("CUDA_VISIBLE_DEVICES"))
        return hides_every_device(env.get("ROCR_VISIBLE_DEVICES")) or hides_every_device(index)
    if platform == "xpu":
        return level_zero_visible(env) == ()
    return hides_every_device(env.get("CUDA_VISIBLE_DEVICES"))


def _device_type(platform: Platform) -> str:
    # torch names HIP devices "cuda" on ROCm builds.
    return "xpu" if platform == "xpu" else "cuda"


def current_device() -> torch.device:
    """Return this rank's device as `init_dist`/`setup` chose it: ``cuda:N``, ``xpu:N`` or ``cpu``.

    The one answer to "which device is mine" under every binding: ``cuda:0`` for each task under
    ``srun --gpus-per-task=1`` (each sees one GPU), ``cuda:<local rank>`` where every rank sees
    the node's GPUs, ``cpu`` without one (`select_device`); AMD GPUs are ``cuda`` devices on
    ROCm builds of torch, Intel GPUs ``xpu`` devices. It is what replaces torchvision's
    ``args.gpu`` (``info.local_rank`` is wrong under per-task binding, and no device on CPU)::

        device = distenv.current_device()
        model.to(device)
        ddp = DistributedDataParallel(model, device_ids=[device] if device.type != "cpu" else None)

    Raises:
        ConfigurationError: If neither `init_dist` nor `setup` ran in this process.
    """
    import torch

    chosen = state.current()
    if chosen is None:
        raise ConfigurationError(
            "device",
            "no device was chosen yet: distenv.current_device() was called before init_dist",
            hint="call distenv.init_dist() (or distenv.setup()) first",
        )
    if chosen.device is None:
        return torch.device("cpu")
    return torch.device(_device_type(torch_platform()), chosen.device)


def device_name(index: int | None) -> str:
    """Return how torch names device `index` of this process: ``cuda:N``, ``xpu:N``, or ``cpu``."""
    if index is None:
        return "cpu"
    return f"{_device_type(torch_platform())}:{index}"


def set_current_device(index: int) -> None:
    """Make device `index` this thread's current device, on the runtime torch was built for."""
    import torch

    if torch_platform() == "xpu":
        torch.xpu.set_device(index)
    else:
        torch.cuda.set_device(index)


def xccl_usable(torch_version: str, available: bool) -> bool:
    """Return whether XPU ranks default to xccl: torch >= 2.8 (`XCCL_SINCE`) that carries it.

    Args:
        torch_version: ``torch.__version__`` (``"2.8.0+xpu"``).
        available: ``torch.distributed.is_xccl_available()`` (False where torch lacks it).
    """
    release = torch_version.split("+")[0].split(".")
    try:
        major_minor = (int(release[0]), int(release[1]))
    except (IndexError, ValueError):
        return False
    return available and major_minor >= XCCL_SINCE


def choose_backend(
    *,
    cuda_available: bool,
    has_device: bool,
    explicit: str | None = None,
    platform: Platform = "cuda",
    xccl: bool = False,
) -> str:
    """Return the process-group backend: the explicit one, else the device's, else ``gloo``.

    With a device, ``nccl`` on CUDA and ROCm (where torch's nccl is RCCL), ``xccl`` on XPU
    where `xccl_usable`; ``gloo`` otherwise, and without a device.

    Args:
        cuda_available: Whether the platform's runtime is usable (``torch.cuda.is_available()``,
            ``torch.xpu.is_available()`` on XPU builds).
        has_device: Whether this rank was given a device (`select_device` returned an index).
        explicit: The user's ``backend=``; any torch spelling (``"gloo"``,
            ``"cpu:gloo,cuda:nccl"``, a registered third-party backend) is passed through as is.
        platform: The device runtime of torch's build (`build_platform`).
        xccl: Whether this torch's xccl may be the default (`xccl_usable`).

    Raises:
        ConfigurationError: If `explicit` is an empty string.
    """
    if explicit is not None:
        if not explicit.strip():
            raise ConfigurationError(
                "init",
                f"backend={explicit!r} is empty",
                hint="pass backend=None to choose automatically, or 'nccl', 'gloo', 'mpi'",
            )
        return explicit.strip()
    if not (cuda_available and has_device):
        return "gloo"
    if platform == "xpu":
        return "xccl" if xccl else "gloo"
    return "nccl"


def _shown(platform: Platform, env: Mapping[str, str]) -> str:
    """Return the platform's visibility variables as `device_reason` quotes them."""
    return ", ".join(
        f"{name} {'unset' if env.get(name) is None else repr(env[name])}"
        for name in VISIBILITY_VARIABLES[platform]
    )


def device_reason(
    device: int | None,
    *,
    local_rank: int,
    visible: int,
    torch_version: str,
    cuda_build: str | None,
    cuda_visible_devices: str | None,
    platform: Platform = "cuda",
    env: Mapping[str, str] | None = None,
) -> str:
    """Return why `select_device` gave `device` (``cuda:N``, ``xpu:N`` or ``cpu``), in one line.

    Args:
        device: What `select_device` returned for these numbers.
        local_rank: The rank's local rank.
        visible: The devices this process sees (`visible_device_count`).
        torch_version: ``torch.__version__``.
        cuda_build: The build's device runtime version (``torch.version.cuda``, ``.hip`` or
            ``.xpu``): None for a CPU-only build of torch.
        cuda_visible_devices: ``$CUDA_VISIBLE_DEVICES``, None when unset.
        platform: The device runtime of torch's build (`build_platform`).
        env: The environment whose visibility variables are quoted; only CUDA_VISIBLE_DEVICES
            (`cuda_visible_devices`) when None.
    """
    seen = dict(env or {})
    seen.pop("CUDA_VISIBLE_DEVICES", None)
    if cuda_visible_devices is not None:
        seen["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    shown = _shown(platform, seen)
    if device is not None:
        how = "its local rank" if device == local_rank else f"local rank {local_rank} wrapped"
        name = f"{_device_type(platform)}:{device}"
        return f"{name}: {how}, among {visible} visible device(s) ({shown})"
    if cuda_build is None:
        return f"cpu: torch {torch_version} is a CPU-only build (torch.version.cuda is None)"
    if hides_all(platform, seen):
        hiding = ", ".join(
            f"{name}={seen[name]!r}" for name in VISIBILITY_VARIABLES[platform] if name in seen
        )
        return f"cpu: {hiding} hides every {'device' if platform == 'xpu' else 'GPU'}"
    if platform == "cuda":
        value = "unset" if cuda_visible_devices is None else repr(cuda_visible_devices)
        return (
            f"cpu: torch {torch_version} (CUDA {cuda_build}) sees no GPU: no NVIDIA driver or GPU "
            f"on this host, or none of CUDA_VISIBLE_DEVICES ({value}) exists"
        )
    runtime = "ROCm" if platform == "rocm" else "XPU"
    return (
        f"cpu: torch {torch_version} ({runtime} {cuda_build}) sees no device: no {runtime} "
        f"driver or device on this host, or none of the visible devices ({shown}) exists"
    )


def rank_device_reason(info: RankInfo, cuda_visible_devices: str | None) -> tuple[int | None, str]:
    """Return this rank's device (`rank_device`) and why (`device_reason`); imports torch."""
    import torch

    platform = torch_platform()
    build = {
        "cuda": torch.version.cuda,
        "rocm": torch.version.hip,
        "xpu": getattr(torch.version, "xpu", None),
    }[platform]
    device = rank_device(info)
    return device, device_reason(
        device,
        local_rank=info.local_rank,
        visible=visible_device_count(),
        torch_version=str(torch.__version__),
        cuda_build=build,
        cuda_visible_devices=cuda_visible_devices,
        platform=platform,
        env=os.environ,
    )


def rank_device(info: RankInfo) -> int | None:
    """Return the device index of this rank (`select_device` over the visible devices).

    The device follows the local rank, which every launcher names; a local world size left
    unknown until the roll call (Flux) only bounds it, so the device is chosen before the roll
    call either way and the roll call compares the ranks' devices.

    Raises:
        ConfigurationError: A ROCm rank sees no device because its visibility variables
            contradict each other (`check_rocm_indices`): refused rather than left on CPU.
    """
    local_size = info.local_world_size
    if local_size is None:
        local_size = info.local_rank + 1
    visible = visible_device_count()
    if not visible:
        check_rocm_indices(torch_platform(), os.environ)
    return select_device(info.local_rank, local_size, visible)


def rank_backend(device: int | None, explicit: str | None = None) -> str:
    """Return this rank's process-group backend (`choose_backend` with torch's device state).

    A rank without a device needs no answer from the device runtime (`choose_backend` gives it
    gloo either way), so it does not ask: see `visible_device_count`.
    """
    import torch

    platform = torch_platform()
    if device is None:
        usable = False
    elif platform == "xpu":
        usable = torch.xpu.is_available()
    else:
        usable = torch.cuda.is_available()
    xccl = platform == "xpu" and xccl_usable(
        str(torch.__version__), getattr(torch.distributed, "is_xccl_available", lambda: False)()
    )
    return choose_backend(
        cuda_available=usable,
        has_device=device is not None,
        explicit=explicit,
        platform=platform,
        xccl=xccl,
    )


def visible_device_count() -> int:
    """Return how many devices this process can use (0 without a device runtime).

    Visibility variables that hide every device (`hides_all`: CUDA_VISIBLE_DEVICES, ROCm's
    ROCR_/HIP_VISIBLE_DEVICES, Level Zero's ZE_AFFINITY_MASK) are answered without asking the
    runtime: asking initialises the driver, which a CPU job on a GPU build of torch (a CPU
    partition, a node whose GPUs another job holds) would otherwise pay in every rank's bootstrap.
    """
    import torch

    platform = torch_platform()
    if hides_all(platform, os.environ):
        return 0
    # is_available() first: device_count() on a machine without a driver may warn.
    if platform == "xpu":
        return torch.xpu.device_count() if torch.xpu.is_available() else 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_identity(index: int) -> str:
    """Return a string naming the physical device behind device `index` of this process.

    Two ranks whose devices have the same identity share one physical device, whatever their
    visibility variables say (`identity_of`). The UUID is torch's (torch >= 2.1 on CUDA, the
    value ``nvidia-smi -L`` prints after ``GPU-``; ROCm and XPU builds report theirs), else the
    PCI address; both are stable across processes, unlike the index.

    Raises:
        ConfigurationError: If `index` is not a visible device.
    """
    import torch

    count = visible_device_count()
    if not 0 <= index < count:
        raise ConfigurationError(
            "device",
            f"device index {index!r} is not among the {count} visible devices",
            hint="check CUDA_VISIBLE_DEVICES (ROCR_VISIBLE_DEVICES, ZE_AFFINITY_MASK) and the "
            "job's GPU request",
        )
    platform = torch_platform()
    runtime = torch.xpu if platform == "xpu" else torch.cuda
    props = runtime.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    if isinstance(uuid, (bytes, bytearray, list, tuple)):  # XPU builds: 16 raw bytes
        uuid = bytes(uuid).hex()
    # Not in torch's type stubs, but set by every CUDA and ROCm build.
    parts = [getattr(props, f"pci_{part}_id", None) for part in ("domain", "bus", "device")]
    pci = None if None in parts else (int(parts[0]), int(parts[1]), int(parts[2]))  # type: ignore[arg-type]
    visible = {"cuda": None, "rocm": rocm_visible, "xpu": level_zero_visible}[platform]
    return identity_of(
        platform,
        index,
        uuid=None if uuid is None or not str(uuid) else str(uuid),
        pci=pci,
        visible=None if visible is None else visible(os.environ),
    )


def pci_address(index: int) -> str | None:
    """Return device `index`'s PCI address as sysfs names it (``0000:1b:00.0``), or None where
    torch does not report it (`distenv.placement` finds the device's NUMA node by it)."""
    import torch

    runtime = torch.xpu if torch_platform() == "xpu" else torch.cuda
    props = runtime.get_device_properties(index)
    ids = [getattr(props, name, None) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    if not all(isinstance(number, int) for number in ids):
        return None
    return f"{ids[0]:04x}:{ids[1]:02x}:{ids[2]:02x}.0"
