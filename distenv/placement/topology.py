"""This node's CPUs, caches, NUMA nodes and accelerators, read from the kernel (sysfs, procfs).

What is read, under a root directory (``/`` on a live node; a recorded tree in tests and in
``distenv info --topology --sysfs DIR``), every file bounded (`distenv.placement.cpus.read_small`):

- ``sys/devices/system/cpu/online``: the online CPUs (offline ones, and the SMT siblings under
  ``nosmt``, are not in it);
- ``.../cpuN/topology/thread_siblings_list``: the CPUs of N's core (its SMT siblings);
- ``.../cpuN/topology/core_siblings_list`` and ``physical_package_id``: N's socket;
- ``.../cpuN/cache/indexK/{level,type,shared_cpu_list}``: the CPUs sharing N's last-level cache
  (an L3 domain: AMD's core complex);
- ``sys/devices/system/node/nodeM/cpulist``: NUMA node M's CPUs (none for memory-only nodes, such
  as Grace Hopper's GPU memory);
- ``sys/bus/pci/devices/BDF/{class,vendor,numa_node,local_cpulist}``: each accelerator, its NUMA
  node and its near CPUs;
- ``proc/self/cgroup``, then ``sys/fs/cgroup/PATH/cpuset.cpus.effective`` (v2) or
  ``sys/fs/cgroup/cpuset/PATH/cpuset.effective_cpus`` (v1): the CPUs the cgroup allows (Slurm's
  task/cgroup, Docker ``--cpuset-cpus``, Kubernetes' static CPU manager);

plus this process's affinity (``sched_getaffinity``) on a live node. No subprocess, no numactl,
no NVML: the login node, the container and the recorded tree are read the same way.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from distenv.placement.cpus import format_cpus, parse_cpus, read_small

__all__ = ["Accelerator", "Topology", "read_topology"]

#: PCI vendor ids of accelerator makers, and the name distenv gives them.
VENDORS = {"0x10de": "nvidia", "0x1002": "amd", "0x8086": "intel"}
#: PCI classes (base, subclass) of accelerators: 3D controllers (NVIDIA data-centre GPUs) and
#: "display controller, other" (AMD Instinct, Intel Data Center GPU Max). VGA (0x0300) counts for
#: NVIDIA only: its workstation cards are VGA, while AMD's and Intel's VGA devices are mostly
#: integrated graphics that no rank should be placed by.
ACCELERATOR_CLASSES = {"0x0302": ("nvidia", "amd", "intel"), "0x0380": ("nvidia", "amd", "intel")}
VGA_CLASS = ("0x0300", ("nvidia",))
#: Bytes of /proc/self/cgroup read: one line per v1 hierarchy, each a controller list and a path.
CGROUP_LIMIT = 16384


@dataclass(frozen=True)
class Accelerator:
    """One PCI accelerator as sysfs describes it.

    Attributes:
        address: Its PCI address (``0000:1b:00.0``); accelerators are numbered in this order.
        vendor: ``nvidia``, ``amd`` or ``intel``.
        node: Its NUMA node, or None where the kernel says -1 (one node, or the firmware did not tell).
        local_cpus: The CPUs the kernel calls local to it (``local_cpulist``), online ones only.
    """

    address: str
    vendor: str
    node: int | None
    local_cpus: frozenset[int]


@dataclass(frozen=True)
class Topology:
    """This node's CPUs as the kernel describes them, and the ones this process may use.

    Attributes:
        core: Each online CPU's core, named by its smallest CPU (SMT siblings share it).
        package: Each online CPU's socket (``physical_package_id``).
        cache: Each online CPU's last-level cache domain, named by its smallest CPU.
        nodes: Each NUMA node's online CPUs (memory-only nodes have none).
        accelerators: The PCI accelerators, in PCI address order.
        cpuset: The cgroup's CPUs, or None where no cpuset was found.
        cgroup: Where `cpuset` was read (``v2 /slurm/...``), for the report; ``""`` if nowhere.
        affinity: The CPUs this process may run on now.
    """

    core: Mapping[int, int]
    package: Mapping[int, int]
    cache: Mapping[int, int]
    nodes: Mapping[int, frozenset[int]]
    accelerators: tuple[Accelerator, ...]
    cpuset: frozenset[int] | None
    cgroup: str
    affinity: frozenset[int]

    @property
    def online(self) -> frozenset[int]:
        """Return the online CPUs."""
        return frozenset(self.core)

    @property
    def allowed(self) -> frozenset[int]:
        """Return the CPUs a rank may be bound to: online, and in the cgroup's cpuset."""
        online = self.online
        return online if self.cpuset is None else online & self.cpuset

    @property
    def launcher_bound(self) -> bool:
        """Return whether this process's affinity is already narrower than what it is allowed.

        That is a binding someone chose (``srun --cpu-bind``, ``mpirun --bind-to``, ``taskset``,
        ``numactl``): distenv keeps it.
        """
        return bool(self.affinity) and self.affinity < self.allowed

    def describe(self) -> list[str]:
        """Return the topology as lines for ``distenv info --topology``."""
        allowed = self.allowed
        cores = {self.core[cpu] for cpu in allowed}
        domains = {self.cache[cpu] for cpu in allowed}
        lines = [
            f"cpus: {format_cpus(self.online)} online, {format_cpus(allowed)} allowed "
            f"({_count(len(allowed), 'CPU')}, {_count(len(cores), 'core')}, "
            f"{_count(len(domains), 'L3 domain')}, "
            f"{_count(len(set(self.package.values())), 'socket')})",
            f"cpuset: {format_cpus(self.cpuset) if self.cpuset is not None else 'none found'}"
            + (f" ({self.cgroup})" if self.cgroup else ""),
            f"affinity: {format_cpus(self.affinity)}"
            + (
                " (narrower than allowed: a launcher bound this process)"
                if self.launcher_bound
                else ""
            ),
        ]
        for node, cpus in sorted(self.nodes.items()):
            shown = format_cpus(cpus) if cpus else "no CPUs"
            lines.append(f"numa node {node}: {shown}")
        for index, device in enumerate(self.accelerators):
            near = "unknown" if device.node is None else str(device.node)
            lines.append(
                f"accelerator {index}: {device.address} {device.vendor}, numa node {near}, "
                f"local cpus {format_cpus(device.local_cpus) or 'unknown'}"
            )
        return lines


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _cpus_of(path: str) -> frozenset[int] | None:
    text = read_small(path)
    return None if text is None else parse_cpus(text)


def _number(path: str) -> int | None:
    text = read_small(path)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _listed(folder: str) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


def _online(cpu_dir: str) -> frozenset[int]:
    found = _cpus_of(f"{cpu_dir}/online")
    if found is not None:
        return found
    names = _listed(cpu_dir)
    return frozenset(int(n[3:]) for n in names if n.startswith("cpu") and n[3:].isdigit())


def _last_level_cache(cpu: str) -> frozenset[int] | None:
    """Return the CPUs sharing `cpu`'s highest-level data or unified cache (as torch reads it)."""
    best, shared = -1, None
    for entry in _listed(f"{cpu}/cache"):
        if not entry.startswith("index") or not entry[5:].isdigit():
            continue
        index = f"{cpu}/cache/{entry}"
        if read_small(f"{index}/type") not in ("Unified", "Data"):
            continue
        level = _number(f"{index}/level")
        if level is not None and level > best:
            found = _cpus_of(f"{index}/shared_cpu_list")
            if found is not None:
                best, shared = level, found
    return shared


def _cpu_maps(cpu_dir: str, online: frozenset[int]) -> tuple[dict[int, int], ...]:
    """Return each online CPU's core, package and cache domain.

    Each core, package and cache domain is read once, from its first CPU: a 224-CPU node costs
    about 150 reads, not 3000.
    """
    core: dict[int, int] = {}
    package: dict[int, int] = {}
    cache: dict[int, int] = {}
    for cpu in sorted(online):
        topo = f"{cpu_dir}/cpu{cpu}/topology"
        if cpu not in core:
            siblings = (_cpus_of(f"{topo}/thread_siblings_list") or frozenset()) & online | {cpu}
            first = min(siblings)
            core.update(dict.fromkeys(siblings, first))
        if cpu not in package:
            members = (_cpus_of(f"{topo}/core_siblings_list") or frozenset()) & online | {cpu}
            number = _number(f"{topo}/physical_package_id")
            package.update(dict.fromkeys(members, max(number or 0, 0)))
        if cpu not in cache:
            shared = _last_level_cache(f"{cpu_dir}/cpu{cpu}")
            # No cache information (some VMs): each CPU is its own domain.
            domain = (shared or frozenset()) & online | {cpu}
            first = min(domain)
            cache.update(dict.fromkeys(domain, first))
    return core, package, cache


def _nodes(node_dir: str, online: frozenset[int]) -> dict[int, frozenset[int]]:
    nodes = {}
    for name in _listed(node_dir):
        if name.startswith("node") and name[4:].isdigit():
            nodes[int(name[4:])] = (_cpus_of(f"{node_dir}/{name}/cpulist") or frozenset()) & online
    return nodes or {0: online}  # a kernel without NUMA: one node


def _kind(device: str) -> str | None:
    """Return the vendor name of an accelerator at `device`, or None if it is not one."""
    vendor = VENDORS.get(read_small(f"{device}/vendor") or "")
    if vendor is None:
        return None
    prefix = (read_small(f"{device}/class") or "")[:6]
    if vendor in ACCELERATOR_CLASSES.get(prefix, ()):
        return vendor
    return vendor if prefix == VGA_CLASS[0] and vendor in VGA_CLASS[1] else None


def _accelerators(pci_dir: str, online: frozenset[int]) -> tuple[Accelerator, ...]:
    found = []
    for name in _listed(pci_dir):
        device = f"{pci_dir}/{name}"
        vendor = _kind(device)
        if vendor is None:
            continue
        node = _number(f"{device}/numa_node")
        local = _cpus_of(f"{device}/local_cpulist") or frozenset()
        known = node if node is not None and node >= 0 else None
        found.append(Accelerator(name, vendor, known, local & online))
    return tuple(found)


def _cgroup_cpuset(root: str) -> tuple[frozenset[int] | None, str]:
    """Return the cgroup's effective cpuset and where it was read, walking up to the first
    cgroup that has the file (the cpuset controller need not be enabled in a leaf)."""
    try:
        with open(f"{root}/proc/self/cgroup", "rb") as handle:
            text = handle.read(CGROUP_LIMIT).decode("ascii", "replace")
    except OSError:
        return None, ""
    unified = os.path.exists(f"{root}/sys/fs/cgroup/cgroup.controllers")
    files: tuple[str, ...]
    for line in text.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if unified and number == "0" and not controllers:
            base, files, version = f"{root}/sys/fs/cgroup", ("cpuset.cpus.effective",), "v2"
        elif not unified and "cpuset" in controllers.split(","):
            base = f"{root}/sys/fs/cgroup/cpuset"
            files, version = ("cpuset.effective_cpus", "cpuset.cpus"), "v1"
        else:
            continue
        parts = [p for p in path.split("/") if p and p not in (".", "..")]
        while True:
            for name in files:
                cpus = _cpus_of("/".join((base, *parts, name)))
                if cpus:
                    return cpus, f"cgroup {version} /{'/'.join(parts)}"
            if not parts:
                break
            parts.pop()
    return None, ""


def read_topology(root: str | Path = "/", affinity: frozenset[int] | None = None) -> Topology:
    """Read the node's topology under `root`.

    Args:
        root: The directory holding ``sys/`` and ``proc/``: ``/`` on a live node, a recorded
            tree otherwise.
        affinity: This process's CPUs; by default ``os.sched_getaffinity(0)`` when `root` is
            ``/``, else the tree's allowed CPUs (a recorded tree has no process).
    """
    base = str(root).rstrip("/")
    cpu_dir = f"{base}/sys/devices/system/cpu"
    online = _online(cpu_dir)
    core, package, cache = _cpu_maps(cpu_dir, online)
    cpuset, cgroup = _cgroup_cpuset(base)
    topology = Topology(
        core=core,
        package=package,
        cache=cache,
        nodes=_nodes(f"{base}/sys/devices/system/node", online),
        accelerators=_accelerators(f"{base}/sys/bus/pci/devices", online),
        cpuset=cpuset,
        cgroup=cgroup,
        affinity=frozenset(),
    )
    if affinity is None:
        live = Path(root).resolve() == Path("/")
        affinity = frozenset(os.sched_getaffinity(0)) if live else topology.allowed
    return replace(topology, affinity=affinity)
