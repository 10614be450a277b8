"""CPU lists as the kernel writes them (``0-3,8,10-11``), and the bounded reads of sysfs files.

The kernel's list format is cpuset(7)'s "List format"; every file distenv reads for placement
(``online``, ``cpulist``, ``thread_siblings_list``, ``shared_cpu_list``, ``cpuset.cpus``) uses it.
"""

from __future__ import annotations

import os

__all__ = ["MAX_CPU", "READ_LIMIT", "format_cpus", "parse_cpus", "read_small"]

#: Larger CPU numbers are refused: no kernel configures more (NR_CPUS is at most 8192).
MAX_CPU = 8191
#: Bytes read from one sysfs or procfs file: each holds one short line.
READ_LIMIT = 4096


def read_small(path: str) -> str | None:
    """Return the text of a small kernel file (at most `READ_LIMIT` bytes), or None if unreadable.

    Plain descriptors and string paths: a node's topology is some 200 such reads, and pathlib's
    objects would cost more than the reads themselves.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, READ_LIMIT).decode("ascii", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)


def parse_cpus(text: str) -> frozenset[int] | None:
    """Return the CPUs of a kernel CPU list (``0-3,8``), or None if it is not one.

    An empty list is an empty set (a NUMA node without CPUs writes an empty ``cpulist``).
    """
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            return None
        first, last = int(low), int(high or low)
        if first > last or last > MAX_CPU:
            return None
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def format_cpus(cpus: frozenset[int] | set[int]) -> str:
    """Return `cpus` as a kernel CPU list, ranges collapsed (``{0, 1, 2, 8}`` -> ``0-2,8``)."""
    parts: list[str] = []
    ordered = sorted(cpus)
    start = 0
    for index, cpu in enumerate(ordered):
        if index + 1 == len(ordered) or ordered[index + 1] != cpu + 1:
            first = ordered[start]
            parts.append(str(first) if first == cpu else f"{first}-{cpu}")
            start = index + 1
    return ",".join(parts)
