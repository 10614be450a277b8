"""Placement at the entry points: the mode asked for, each rank's accelerator, and the binding.

`place_ranks` is the one rule `distenv run` (every rank of its node, before they start),
`distenv info --topology` and `init_dist` (this rank) share; `bind_threads` applies a CPU set to
this process. Only the entry points pass ``os.environ`` in.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from distenv.errors import ConfigurationError, shown
from distenv.placement.binding import MODES, OFF, bind, cores_of, far_from
from distenv.placement.cpus import format_cpus
from distenv.placement.topology import Accelerator, Topology, read_topology
from distenv.settings import CPU_BINDING_VAR
from distenv.visibility import VARIABLES, Platform, visible_devices

__all__ = [
    "Placement",
    "bind_threads",
    "binding_mode",
    "chosen_mode",
    "far_socket",
    "place_ranks",
    "rank_devices",
    "threads_each",
]

#: The device runtime (`distenv.visibility.Platform`) of each accelerator maker's devices.
PLATFORMS: dict[str, Platform] = {"nvidia": "cuda", "amd": "rocm", "intel": "xpu"}
SPELLINGS = f"one of {', '.join(MODES)} or {OFF}"


def binding_mode(who: str, value: str | None, variable: str | None = None) -> str | None:
    """Return the binding mode `value` names (one of `MODES`), or None for none.

    Args:
        who: Who reads it, for the error (``init``, ``distenv run``).
        value: The value as given; None or empty: none.
        variable: The environment variable it came from, or None for an argument.

    Raises:
        ConfigurationError: If `value` is not a mode, naming where it came from.
    """
    mode = (value or "").strip().lower().replace("_", "-")
    if mode in ("", OFF):
        return None
    if mode in MODES:
        return mode
    where = f"${variable} is {shown(value or '')}" if variable else f"cpu_binding={value!r}"
    raise ConfigurationError(
        who,
        f"{where}, expected {SPELLINGS}",
        hint="auto binds each rank near its accelerator (docs: placement); none leaves the CPUs alone",
        variable=variable,
        value=value,
    )


def chosen_mode(who: str, argument: str | None, setting: str | None) -> str | None:
    """Return the binding mode: `argument` (``cpu_binding=``, ``--numa-binding``) if given, else
    the setting ``$DISTENV_CPU_BINDING``; None for none.

    Raises:
        ConfigurationError: If the one that applies is not a mode (`binding_mode`).
    """
    if argument is not None:
        return binding_mode(who, argument)
    return binding_mode(who, setting, CPU_BINDING_VAR)


def _visible(found: Sequence[Accelerator], env: Mapping[str, str]) -> list[Accelerator] | None:
    """Return the accelerators `env` lets a process see, in its order (`distenv.visibility`);
    None if a value names devices by something other than an index (UUIDs, MIG instances) or
    cannot be read: sysfs cannot tell which."""
    if not found:
        return []
    try:
        names = visible_devices(PLATFORMS[found[0].vendor], env)
    except ConfigurationError:
        return None
    if names is None:
        return list(found)
    visible = []
    for name in names:
        card = name.partition("+")[0].partition(".")[0]  # a Level Zero tile is on its card
        if not card.isdigit():
            return None
        if int(card) >= len(found):
            break  # as CUDA does: the list ends at the first index that is not a device
        visible.append(found[int(card)])
    return visible


def rank_devices(
    topology: Topology, env: Mapping[str, str], count: int
) -> list[Accelerator | None] | None:
    """Return the accelerator of each of `count` local ranks started with `env`, or None if
    unknown.

    As `distenv.device.select_device`: local rank r uses visible device ``r % visible``.
    """
    visible = _visible(topology.accelerators, env)
    if visible is None:
        return None
    return [visible[rank % len(visible)] if visible else None for rank in range(count)]


def far_socket(topology: Topology, env: Mapping[str, str], device: int | None) -> str | None:
    """Return why this process sits on the far socket of its accelerator, or None if it does not.

    Args:
        topology: The node, with this process's affinity.
        env: This process's environment (the visibility variables).
        device: The index of its accelerator among the visible ones (`distenv.device`), or None.
    """
    visible = _visible(topology.accelerators, env)
    if device is None or not visible or device >= len(visible):
        return None
    near = visible[device]
    if not far_from(topology, topology.affinity, near):
        return None
    return (
        f"its CPUs ({format_cpus(topology.affinity)}) are all on another socket than its "
        f"accelerator {near.address} (NUMA node {near.node}): its host memory and data loading "
        "cross the link between sockets. Hint: bind near it with DISTENV_CPU_BINDING=auto or "
        "distenv run --numa-binding auto, or let the launcher bind it (srun --cpu-bind)"
    )


def threads_each(topology: Topology, count: int) -> int:
    """Return ``OMP_NUM_THREADS`` for each of `count` unbound ranks: the cores they may use, shared."""
    usable = topology.affinity & topology.allowed or topology.allowed
    return max(1, cores_of(topology, usable) // max(count, 1))


@dataclass(frozen=True)
class Placement:
    """The binding of every local rank of a node.

    Attributes:
        topology: The node.
        mode: The mode (one of `MODES`).
        devices: Each local rank's accelerator (None: none, or unknown).
        cpus: Each local rank's CPUs.
        note: Why the binding is not what the mode says (a launcher bound the process, the
            accelerators could not be told apart), or None.
        bound: Whether distenv binds the ranks (False where it keeps the launcher's affinity).
    """

    topology: Topology
    mode: str
    devices: tuple[Accelerator | None, ...]
    cpus: tuple[frozenset[int], ...]
    note: str | None
    bound: bool

    def threads(self, local_rank: int) -> int:
        """Return the cores local rank `local_rank` holds (its ``OMP_NUM_THREADS``)."""
        return max(1, cores_of(self.topology, self.cpus[local_rank]))

    def far(self) -> list[int]:
        """Return the local ranks none of whose CPUs are on their accelerator's socket."""
        return [
            rank
            for rank, device in enumerate(self.devices)
            if device is not None and far_from(self.topology, self.cpus[rank], device)
        ]

    def lines(self) -> list[str]:
        """Return one line per local rank, for ``distenv info --topology``."""
        lines = []
        for rank, cpus in enumerate(self.cpus):
            device = self.devices[rank]
            near = "no accelerator" if device is None else f"accelerator {device.address}"
            far = " (far socket)" if rank in self.far() else ""
            lines.append(
                f"local rank {rank}: cpus {format_cpus(cpus)} ({self.threads(rank)} cores), "
                f"{near}{far}"
            )
        return lines


def place_ranks(
    mode: str,
    count: int,
    env: Mapping[str, str],
    *,
    root: str | Path = "/",
    topology: Topology | None = None,
    own: tuple[int, Accelerator] | None = None,
) -> Placement:
    """Return the binding of the `count` local ranks of this node for `mode`.

    Args:
        mode: One of `MODES`.
        count: Local ranks on the node.
        env: The ranks' environment (the accelerator visibility variables).
        root: Where the kernel's files are (`read_topology`), when `topology` is None.
        topology: The node, if already read.
        own: ``(local rank, accelerator)`` that one rank knows for itself (`init_dist` asks
            torch); the others are found from `env`. Where that rank sees a single accelerator
            of several (per-task binding: srun ``--gpus-per-task``), the others are assumed to
            hold the rest in PCI order, as Slurm hands them out.
    """
    topology = topology or read_topology(root)
    devices = rank_devices(topology, env, count)
    note = None
    if devices is None and own is None:
        names = ", ".join(VARIABLES[PLATFORMS[topology.accelerators[0].vendor]])
        note = (
            f"{names} names devices by UUID or MIG instance, which sysfs cannot map to PCI "
            "devices: the ranks are placed as if they had no accelerator"
        )
    devices = devices or [None] * count
    if own is not None:
        rank, device = own
        if len({d for d in devices if d is not None}) <= 1 < len(topology.accelerators):
            accelerators = topology.accelerators
            devices = [accelerators[r % len(accelerators)] for r in range(count)]
        devices[rank] = device
    cpus = bind(topology, mode, devices)
    if topology.launcher_bound:
        note = (
            f"this process's CPUs ({format_cpus(topology.affinity)}) are narrower than its "
            f"cpuset ({format_cpus(topology.allowed)}): a launcher bound it (srun --cpu-bind, "
            "mpirun --bind-to, taskset, numactl); keeping that binding"
        )
    return Placement(topology, mode, tuple(devices), cpus, note, not topology.launcher_bound)


def bind_threads(cpus: frozenset[int]) -> None:
    """Bind this process's threads to `cpus`: the calling thread, and every other thread that
    still has the calling thread's former affinity (as torch does: a thread bound on purpose
    keeps its binding). Threads started later inherit it."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return
    for name in tasks:
        try:
            tid = int(name)
            if os.sched_getaffinity(tid) == before:
                os.sched_setaffinity(tid, cpus)
        except (ValueError, OSError):  # the thread ended meanwhile
            continue
