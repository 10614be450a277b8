"""Which CUDA device a rank uses, and which process-group backend follows from it.

The rules are pure functions of plain numbers so that a table tests them; `rank_device` and
`rank_backend` apply them to this process (the one rule `init_dist`, `setup` and `distenv doctor`
share), and only they, `visible_device_count` and `device_identity` ask torch (imported lazily:
`import distenv` never loads it), and CUDA only where a device may be visible.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from distenv import state
from distenv.errors import ConfigurationError
from distenv.rankinfo import RankInfo

if TYPE_CHECKING:
    import torch

__all__ = [
    "choose_backend",
    "current_device",
    "device_identity",
    "device_reason",
    "pci_address",
    "rank_backend",
    "rank_device",
    "rank_device_reason",
    "select_device",
    "visible_device_count",
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


def current_device() -> torch.device:
    """Return this rank's device as `init_dist`/`setup` chose it: ``cuda:N``, or ``cpu``.

    The one answer to "which device is mine" under every binding: ``cuda:0`` for each task under
    ``srun --gpus-per-task=1`` (each sees one GPU), ``cuda:<local rank>`` where every rank sees
    the node's GPUs, ``cpu`` without one (`select_device`). It is what replaces torchvision's
    ``args.gpu`` (``info.local_rank`` is wrong under per-task binding, and no device on CPU)::

        device = distenv.current_device()
        model.to(device)
        ddp = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)

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
    return torch.device("cpu") if chosen.device is None else torch.device("cuda", chosen.device)


def choose_backend(*, cuda_available: bool, has_device: bool, explicit: str | None = None) -> str:
    """Return the process-group backend: the explicit one, else ``nccl`` with a GPU, else ``gloo``.

    Args:
        cuda_available: Whether ``torch.cuda.is_available()``.
        has_device: Whether this rank was given a CUDA device (`select_device` returned an index).
        explicit: The user's ``backend=``; any torch spelling (``"gloo"``,
            ``"cpu:gloo,cuda:nccl"``, a registered third-party backend) is passed through as is.

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
    return "nccl" if cuda_available and has_device else "gloo"


#: CUDA_VISIBLE_DEVICES values that hide every device (CUDA's documentation; Slurm's "NoDevFiles").
_HIDE_ALL = ("", "-1", "NoDevFiles")


def _hides_every_device(cuda_visible_devices: str | None) -> bool:
    """Return whether ``$CUDA_VISIBLE_DEVICES`` (None when unset) hides every GPU (`_HIDE_ALL`)."""
    return cuda_visible_devices is not None and cuda_visible_devices.strip() in _HIDE_ALL


def device_reason(
    device: int | None,
    *,
    local_rank: int,
    visible: int,
    torch_version: str,
    cuda_build: str | None,
    cuda_visible_devices: str | None,
) -> str:
    """Return why `select_device` gave `device` (``cuda:N`` or ``cpu``), in one line.

    Args:
        device: What `select_device` returned for these numbers.
        local_rank: The rank's local rank.
        visible: The devices this process sees (`visible_device_count`).
        torch_version: ``torch.__version__``.
        cuda_build: ``torch.version.cuda``: None for a CPU-only build of torch.
        cuda_visible_devices: ``$CUDA_VISIBLE_DEVICES``, None when unset.
    """
    shown = "unset" if cuda_visible_devices is None else repr(cuda_visible_devices)
    if device is not None:
        how = "its local rank" if device == local_rank else f"local rank {local_rank} wrapped"
        return (
            f"cuda:{device}: {how}, among {visible} visible device(s) "
            f"(CUDA_VISIBLE_DEVICES {shown})"
        )
    if cuda_build is None:
        return f"cpu: torch {torch_version} is a CPU-only build (torch.version.cuda is None)"
    if _hides_every_device(cuda_visible_devices):
        return f"cpu: CUDA_VISIBLE_DEVICES={cuda_visible_devices!r} hides every GPU"
    return (
        f"cpu: torch {torch_version} (CUDA {cuda_build}) sees no GPU: no NVIDIA driver or GPU "
        f"on this host, or none of CUDA_VISIBLE_DEVICES ({shown}) exists"
    )


def rank_device_reason(info: RankInfo, cuda_visible_devices: str | None) -> tuple[int | None, str]:
    """Return this rank's device (`rank_device`) and why (`device_reason`); imports torch."""
    import torch

    device = rank_device(info)
    return device, device_reason(
        device,
        local_rank=info.local_rank,
        visible=visible_device_count(),
        torch_version=str(torch.__version__),
        cuda_build=torch.version.cuda,
        cuda_visible_devices=cuda_visible_devices,
    )


def rank_device(info: RankInfo) -> int | None:
    """Return the CUDA device index of this rank (`select_device` over the visible devices).

    The device follows the local rank, which every launcher names; a local world size left
    unknown until the roll call (Flux) only bounds it, so the device is chosen before the roll
    call either way and the roll call compares the ranks' GPUs.
    """
    local_size = info.local_world_size
    if local_size is None:
        local_size = info.local_rank + 1
    return select_device(info.local_rank, local_size, visible_device_count())


def rank_backend(device: int | None, explicit: str | None = None) -> str:
    """Return this rank's process-group backend (`choose_backend` with torch's CUDA state).

    A rank without a device needs no answer from CUDA (`choose_backend` gives it gloo either
    way), so it does not ask: see `visible_device_count`.
    """
    import torch

    return choose_backend(
        cuda_available=device is not None and torch.cuda.is_available(),
        has_device=device is not None,
        explicit=explicit,
    )


def visible_device_count() -> int:
    """Return how many CUDA devices this process can use (0 without CUDA).

    A ``CUDA_VISIBLE_DEVICES`` that hides every device (`_hides_every_device`) is answered
    without torch: asking torch initialises the CUDA driver, which a CPU job on a CUDA build of
    torch (a CPU partition, a node whose GPUs another job holds) would otherwise pay in every
    rank's bootstrap.
    """
    if _hides_every_device(os.environ.get("CUDA_VISIBLE_DEVICES")):
        return 0
    import torch

    # is_available() first: device_count() on a machine without a driver may warn.
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_identity(index: int) -> str:
    """Return a string naming the physical GPU behind device `index` of this process.

    Two ranks whose devices have the same identity share one physical GPU, whatever their
    CUDA_VISIBLE_DEVICES say. It is the device's UUID where torch reports one (torch >= 2.1, the
    same value ``nvidia-smi -L`` prints after ``GPU-``), else its PCI address
    ``domain:bus:device``; both are stable across processes, unlike the index.

    Raises:
        ConfigurationError: If `index` is not a visible device.
    """
    import torch

    count = visible_device_count()
    if not 0 <= index < count:
        raise ConfigurationError(
            "device",
            f"device index {index!r} is not among the {count} visible CUDA devices",
            hint="check CUDA_VISIBLE_DEVICES and the job's GPU request",
        )
    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    if uuid is not None and str(uuid):
        return f"GPU-{uuid}" if not str(uuid).startswith(("GPU-", "MIG-")) else str(uuid)
    # Not in torch's type stubs, but set by every CUDA build.
    domain, bus, dev = (getattr(props, f"pci_{part}_id") for part in ("domain", "bus", "device"))
    return f"{domain:04x}:{bus:02x}:{dev:02x}"


def pci_address(index: int) -> str | None:
    """Return CUDA device `index`'s PCI address as sysfs names it (``0000:1b:00.0``), or None
    where torch does not report it (`distenv.placement` finds the device's NUMA node by it)."""
    import torch

    props = torch.cuda.get_device_properties(index)
    ids = [getattr(props, name, None) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    if not all(isinstance(number, int) for number in ids):
        return None
    return f"{ids[0]:04x}:{ids[1]:02x}:{ids[2]:02x}.0"
