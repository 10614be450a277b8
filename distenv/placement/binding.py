"""Which CPUs each local rank is bound to, per mode: pure functions of a `Topology`.

The modes are torchrun's (``--numa-binding``, torch/numa/binding.py) with the same meaning where a
rank has an accelerator, plus ``auto``:

- ``node``: the CPUs of the NUMA node of the rank's accelerator.
- ``socket``: the CPUs of every NUMA node on that node's socket.
- ``exclusive``: the rank's share of that node's cores, split evenly among the ranks on the node
  (contiguous, in CPU order; the first shares get the extra cores, as torch gives them).
- ``core-complex``: one whole L3 domain of that node, a different one per rank where there are
  enough (the largest first, as torch ranks them).
- ``auto``: as ``exclusive``, the cores taken in L3-domain order; in a job where no rank has an
  accelerator, every allowed core is shared out among the ranks in NUMA and L3 order (8 ranks on
  an EPYC with 8 core complexes: one each).

Every set is taken within the CPUs the rank may use (online, in the cgroup's cpuset); a core's
SMT siblings stay together. "Its block of ranks": the ranks without an accelerator are spread
over the NUMA nodes that have allowed CPUs in contiguous blocks (ranks 0-3 on node 0, 4-7 on node 1),
and share them with the ranks whose accelerator is there.
A rank whose accelerator's node has no allowed CPU (a cpuset on the other socket) counts as one
without an accelerator. Where the node has fewer cores than ranks, CPUs are shared out; where it
has fewer CPUs than ranks, ranks share them round robin.

The one difference from torch: ``exclusive`` and ``core-complex`` share a node among the *ranks*
on it, where torch shares it among the node's *GPUs*, used or not; the two agree when every GPU
has its rank.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from distenv.placement.topology import Accelerator, Topology

__all__ = ["MODES", "OFF", "bind", "cores_of", "far_from"]

#: torchrun's ``--numa-binding`` values, then distenv's own.
MODES = ("node", "socket", "exclusive", "core-complex", "auto")
#: The value that binds nothing (also the default).
OFF = "none"

Unit = frozenset[int]


def cores_of(topology: Topology, cpus: frozenset[int]) -> int:
    """Return how many cores `cpus` touch (what ``OMP_NUM_THREADS`` should follow)."""
    return len({topology.core[cpu] for cpu in cpus if cpu in topology.core})


def far_from(topology: Topology, cpus: frozenset[int], device: Accelerator) -> bool:
    """Return whether no CPU of `cpus` is on the socket of `device`'s NUMA node."""
    near = topology.nodes.get(device.node, frozenset()) if device.node is not None else frozenset()
    sockets = {topology.package[cpu] for cpu in near if cpu in topology.package}
    held = {topology.package[cpu] for cpu in cpus if cpu in topology.package}
    return bool(sockets) and not held & sockets


def _units(
    topology: Topology, cpus: frozenset[int], key: Callable[[int], tuple[int, ...]]
) -> list[Unit]:
    """Return the cores within `cpus`, each a set of SMT siblings, ordered by `key` of its first CPU."""
    cores: dict[int, set[int]] = {}
    for cpu in cpus:
        cores.setdefault(topology.core[cpu], set()).add(cpu)
    return sorted((frozenset(c) for c in cores.values()), key=lambda core: key(min(core)))


def _share(units: list[Unit], count: int, position: int) -> Unit:
    """Return the `position`-th of `count` even, contiguous shares of `units` (extra units go to
    the first shares, as torch gives them); a CPU each, round robin, where there are too few."""
    if len(units) < count:
        cpus = [frozenset({cpu}) for unit in units for cpu in sorted(unit)]
        if len(cpus) < count:
            return cpus[position % len(cpus)]
        units = cpus
    base, extra = divmod(len(units), count)
    start = position * base + min(position, extra)
    end = start + base + (1 if position < extra else 0)
    return frozenset().union(*units[start:end])


def _home(topology: Topology, allowed: frozenset[int], device: Accelerator | None) -> int | None:
    """Return the NUMA node a rank's accelerator puts it on, None where it has none usable."""
    if device is None:
        return None
    usable = [n for n, cpus in sorted(topology.nodes.items()) if cpus & allowed]
    node = device.node
    if node is None:
        # The kernel says -1 (one node, or firmware without the table): the first node of its
        # local CPUs, else the only node there is (torch takes node 0).
        near = device.local_cpus & allowed
        only = usable[0] if len(usable) == 1 else None
        node = next((n for n in usable if near & topology.nodes[n]), only)
    return node if node in usable else None


def bind(topology: Topology, mode: str, devices: Sequence[Accelerator | None]) -> tuple[Unit, ...]:
    """Return the CPUs of each local rank for `mode` (one of `MODES`).

    Args:
        topology: The node, read by `distenv.placement.topology.read_topology`.
        mode: One of `MODES`.
        devices: Each local rank's accelerator, in local rank order (None: it has none, or it is
            unknown).

    Returns:
        One CPU set per local rank. Where a launcher already bound this process
        (`Topology.launcher_bound`), every rank keeps that affinity.
    """
    count = len(devices)
    if topology.launcher_bound or count == 0:
        return tuple(topology.affinity for _ in devices)
    allowed = topology.allowed or topology.affinity
    nodes = {n: cpus & allowed for n, cpus in topology.nodes.items() if cpus & allowed}
    homes = [_home(topology, allowed, device) for device in devices]
    loose = [rank for rank, home in enumerate(homes) if home is None]
    ordered = sorted(nodes)

    def node_key(cpu: int) -> tuple[int, ...]:
        home = next((n for n in ordered if cpu in nodes[n]), 0)
        return (home, topology.cache[cpu], cpu)

    # auto with no accelerator at all (a CPU job): every allowed core, shared out in NUMA and L3
    # order. Otherwise ranks without one take NUMA nodes in blocks, beside the others.
    pooled = mode == "auto" and len(loose) == count
    pool = _units(topology, allowed, node_key) if pooled else []
    for rank in loose:
        if not pooled and ordered:
            homes[rank] = ordered[loose.index(rank) * len(ordered) // len(loose)]
    result: list[Unit] = []
    for rank, home in enumerate(homes):
        group = [r for r, h in enumerate(homes) if h == home]
        position = group.index(rank)
        if home is None:  # pooled: a share of every allowed core
            result.append(_share(pool, count, rank) if pool else allowed)
            continue
        cpus = nodes[home]
        if mode == "node":
            result.append(cpus)
        elif mode == "socket":
            socket = topology.package[min(cpus)]
            result.append(
                frozenset().union(
                    *(c for c in nodes.values() if topology.package[min(c)] == socket)
                )
            )
        elif mode == "exclusive":
            result.append(_share(_units(topology, cpus, lambda cpu: (cpu,)), len(group), position))
        elif mode == "core-complex":
            domains: dict[int, set[int]] = {}
            for cpu in cpus:
                domains.setdefault(topology.cache[cpu], set()).add(cpu)
            ranked = sorted(domains.values(), key=lambda d: (-len(d), min(d)))
            result.append(frozenset(ranked[position % len(ranked)]))
        else:  # auto
            by_cache = _units(topology, cpus, lambda cpu: (topology.cache[cpu], cpu))
            result.append(_share(by_cache, len(group), position))
    return tuple(result)
