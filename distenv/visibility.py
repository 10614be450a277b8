"""Which accelerators a process may see, read from the vendors' visibility variables alone.

Pure functions of a mapping, so that tables of recorded values test them and nothing here asks a
driver (or imports torch). Each answer is the visible devices in the order the runtime numbers
them, every one named by the value that picks it (an index of the node's devices, a UUID, a
Level Zero ``device.subdevice``), or None where no variable narrows what the runtime finds.
`identity_of` turns what the runtime reports of one device, and these values, into the name of
the physical device that the roll call compares across ranks.

Sources:
  [cuda]  CUDA C Programming Guide, "CUDA Environment Variables": CUDA_VISIBLE_DEVICES is a
          list of indices or UUIDs; an invalid index hides it and every entry after it; ``-1``
          or an empty value hides every device. Slurm writes ``NoDevFiles`` when a step has no GPU.
  [rocm]  ROCm docs, "GPU isolation techniques" (rocm.docs.amd.com, conceptual/gpu-isolation):
          ROCR_VISIBLE_DEVICES (indices or UUIDs) is applied by the ROCm runtime first;
          HIP_VISIBLE_DEVICES, or CUDA_VISIBLE_DEVICES which HIP also honours, then picks by
          index among the devices ROCR left. torch's ``torch.cuda._parse_visible_devices`` on
          ROCm builds prefers HIP_VISIBLE_DEVICES to CUDA_VISIBLE_DEVICES when both are set.
  [ze]    oneAPI Level Zero specification, "Affinity Mask" (spec.oneapi.io/level-zero, core/
          PROG): ZE_AFFINITY_MASK is a list of ``device`` or ``device.subdevice`` (a tile);
          two or more tiles of one device are exposed as that device, one tile alone as a
          device of its own (oneapi-src/level-zero#86).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal

from distenv.errors import ConfigurationError

__all__ = [
    "HIDE_ALL",
    "VARIABLES",
    "Platform",
    "check_rocm_indices",
    "cuda_visible",
    "hides_every_device",
    "identity_of",
    "level_zero_visible",
    "rocm_visible",
    "visible_devices",
]

#: The device runtimes of torch's builds that the rules tell apart. A CPU-only build follows
#: CUDA's rules: it sees no device either way.
Platform = Literal["cuda", "rocm", "xpu"]

#: The variables that choose each platform's visible devices, in the order the runtime applies them.
VARIABLES: dict[Platform, tuple[str, ...]] = {
    "cuda": ("CUDA_VISIBLE_DEVICES",),
    "rocm": ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"),
    "xpu": ("ZE_AFFINITY_MASK",),
}

#: Values that hide every device: CUDA's ``-1`` and empty value [cuda], Slurm's ``NoDevFiles``.
#: The same spellings are taken for ROCm's and Level Zero's variables (issue #41: as for CUDA).
HIDE_ALL = ("", "-1", "NoDevFiles")

_INDEX = re.compile(r"\d+")
_TILE = re.compile(r"(\d+)\.(\d+)")


def hides_every_device(value: str | None) -> bool:
    """Return whether a visibility variable's value (None when unset) hides every device."""
    return value is not None and value.strip() in HIDE_ALL


def _entries(value: str) -> list[str]:
    return [entry.strip() for entry in value.split(",")]


def cuda_visible(env: Mapping[str, str]) -> tuple[str, ...] | None:
    """Return the devices a CUDA process sees (indices of the node's devices or UUIDs), or None
    when CUDA_VISIBLE_DEVICES is unset; an empty or negative entry ends the list [cuda]."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    if hides_every_device(value):
        return ()
    seen: list[str] = []
    for entry in _entries(value):
        if not entry or entry.startswith("-"):
            break
        seen.append(entry)
    return tuple(seen)


def visible_devices(platform: Platform, env: Mapping[str, str]) -> tuple[str, ...] | None:
    """Return the devices a process of `platform` sees, each named by the value that picks it,
    or None when no variable narrows them (`cuda_visible`, `rocm_visible`, `level_zero_visible`).

    Raises:
        ConfigurationError: If ZE_AFFINITY_MASK is malformed (`level_zero_visible`).
    """
    readers = {"cuda": cuda_visible, "rocm": rocm_visible, "xpu": level_zero_visible}
    return readers[platform](env)


def rocm_visible(env: Mapping[str, str]) -> tuple[str, ...] | None:
    """Return the devices a HIP (ROCm) process sees, in HIP's order, or None when unrestricted.

    ROCR_VISIBLE_DEVICES narrows the node's devices first; HIP_VISIBLE_DEVICES (else
    CUDA_VISIBLE_DEVICES) then indexes into what ROCR left [rocm]. Each device is named by the
    ROCR entry (an index of the node's devices or a UUID) it comes from, or by the HIP entry
    where ROCR is unset. As CUDA documents for its variable [cuda], an index past what is left
    ends the list. ``ROCR_VISIBLE_DEVICES=4`` with ``HIP_VISIBLE_DEVICES=0`` is device ``4``.
    """
    rocr = env.get("ROCR_VISIBLE_DEVICES")
    hip = env.get("HIP_VISIBLE_DEVICES")
    if hip is None:
        hip = env.get("CUDA_VISIBLE_DEVICES")
    if hides_every_device(rocr) or hides_every_device(hip):
        return ()
    left = None if rocr is None else _entries(rocr)
    if hip is None:
        return None if left is None else tuple(left)
    seen: list[str] = []
    for entry in _entries(hip):
        if entry.startswith("-") or (
            left is not None and _INDEX.fullmatch(entry) and int(entry) >= len(left)
        ):
            break  # an invalid index: it and every entry after it are hidden [cuda]
        if left is None or not _INDEX.fullmatch(entry):
            seen.append(entry)  # the node's own index, or a UUID naming the device itself
        else:
            seen.append(left[int(entry)])
    return tuple(seen)


def _hip_names_none_rocr_left(env: Mapping[str, str]) -> str | None:
    """Return the HIP index variable that names none of the devices ROCR_VISIBLE_DEVICES left.

    None where ROCR_VISIBLE_DEVICES or the index variable (HIP_VISIBLE_DEVICES, else
    CUDA_VISIBLE_DEVICES) is unset, where a value hides every device on purpose, or where some
    device is left. Slurm sets CUDA_VISIBLE_DEVICES and ROCR_VISIBLE_DEVICES to the same
    node-level index (measured: Slurm 22.05, gres.conf without ``Flags=``): task 1 gets ``1`` in
    both, and HIP's index 1 into ROCR's one device is past its end [rocm].
    """
    rocr = env.get("ROCR_VISIBLE_DEVICES")
    name = "HIP_VISIBLE_DEVICES" if "HIP_VISIBLE_DEVICES" in env else "CUDA_VISIBLE_DEVICES"
    value = env.get(name)
    if rocr is None or value is None or hides_every_device(rocr) or hides_every_device(value):
        return None
    return name if rocm_visible(env) == () else None


def level_zero_visible(env: Mapping[str, str]) -> tuple[str, ...] | None:
    """Return the devices a Level Zero (Intel XPU) process sees, or None when unrestricted.

    Each visible device is named by its ZE_AFFINITY_MASK entries [ze]: ``2`` (a whole device),
    ``2.1`` (one tile, exposed as a device of its own), or ``2.0+2.1`` (two tiles of device 2,
    exposed as device 2). Devices come in the order their first entry appears; a repeated entry
    counts once.

    Raises:
        ConfigurationError: If an entry is neither ``N`` nor ``N.M``.
    """
    mask = env.get("ZE_AFFINITY_MASK")
    if mask is None:
        return None
    if hides_every_device(mask):
        return ()
    whole: set[str] = set()
    tiles: dict[str, list[str]] = {}
    for entry in _entries(mask):
        tile = _TILE.fullmatch(entry)
        if not (tile or _INDEX.fullmatch(entry)):
            raise ConfigurationError(
                "device",
                f"$ZE_AFFINITY_MASK is {mask!r}: {entry!r} is neither a device nor device.tile",
                hint="write ZE_AFFINITY_MASK as indices and device.tile pairs, e.g. '0,1' "
                "or '0.0,0.1', or unset it to see every device",
                variable="ZE_AFFINITY_MASK",
                value=mask,
            )
        root = str(int(tile.group(1) if tile else entry))
        named = tiles.setdefault(root, [])
        if tile is None:
            whole.add(root)
        elif (name := f"{root}.{int(tile.group(2))}") not in named:
            named.append(name)
    return tuple(
        root if root in whole or not named else "+".join(named) for root, named in tiles.items()
    )


def identity_of(
    platform: Platform,
    index: int,
    *,
    uuid: str | None,
    pci: tuple[int, int, int] | None,
    visible: tuple[str, ...] | None,
) -> str:
    """Return the string naming the physical device behind device `index` of a process.

    The UUID where the runtime reports one, else the PCI address ``domain:bus:device``: both
    name the device whatever the visibility variables say. Only without either is the visible
    value taken (``xpu:2.1``, ``rocm:GPU-...``, or the index itself where nothing narrows):
    an index names a device only among the node's devices, and a task whose devices a cgroup
    narrowed (Slurm's task-level ``--gpu-bind`` on Cray EX, LUMI, Setonix) sees ``0`` in
    ROCR_VISIBLE_DEVICES whichever device it holds.

    Args:
        platform: The device runtime of torch's build (`distenv.device.build_platform`).
        index: The device's index in this process.
        uuid: The runtime's UUID of the device (torch's ``props.uuid``), None where absent.
        pci: Its PCI ``(domain, bus, device)``, None where the runtime reports none (XPU).
        visible: What the visibility variables show (`rocm_visible`, `level_zero_visible`),
            None: unrestricted.
    """
    if uuid:
        prefix = "XPU-" if platform == "xpu" else "GPU-"
        return uuid if uuid.startswith(("GPU-", "MIG-", "XPU-")) else f"{prefix}{uuid}"
    if pci is not None:
        domain, bus, dev = pci
        return f"{domain:04x}:{bus:02x}:{dev:02x}"
    named = str(index) if visible is None or index >= len(visible) else visible[index]
    return f"{platform}:{named}"


def check_rocm_indices(platform: Platform, env: Mapping[str, str]) -> None:
    """Refuse a ROCm rank whose HIP index variable names none of the devices ROCR left.

    HIP applies HIP_VISIBLE_DEVICES (else CUDA_VISIBLE_DEVICES) to the devices that
    ROCR_VISIBLE_DEVICES left, so the same node-level index in both, as Slurm writes them for AMD
    GPUs unless gres.conf says ``Flags=amd_gpu_env``, leaves every task but the first without a
    device: a GPU job that would train on CPU. Called where the runtime sees no device.

    Raises:
        ConfigurationError: Naming both variables, their values and the fix.
    """
    name = None if platform != "rocm" else _hip_names_none_rocr_left(env)
    if name is None:
        return
    rocr = env["ROCR_VISIBLE_DEVICES"]
    raise ConfigurationError(
        "device",
        f"${name} is {env[name]!r}, which names none of the devices ROCR_VISIBLE_DEVICES="
        f"{rocr!r} left: HIP indexes {name} into what ROCR_VISIBLE_DEVICES exposes, so this "
        "rank sees no GPU",
        hint=f"unset {name} and let ROCR_VISIBLE_DEVICES choose (Slurm sets both unless "
        "gres.conf says Flags=amd_gpu_env), or give it indices into ROCR's list (0 for the "
        "first)",
        variable=name,
        value=env[name],
    )
