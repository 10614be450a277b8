"""``distenv info --topology``: this node's CPUs, NUMA nodes and accelerators, and each local
rank's binding, read from sysfs (or a recorded tree: ``--sysfs DIR``)."""

from __future__ import annotations

import argparse
import os

from distenv.placement.apply import chosen_mode, place_ranks, rank_devices
from distenv.placement.binding import MODES, OFF
from distenv.placement.topology import read_topology
from distenv.settings import CPU_BINDING_VAR, Settings

__all__ = ["add_topology_options", "show_topology"]

WHO = "distenv info"
#: More local ranks than a node has CPUs (the most a kernel configures) is a typo.
MAX_RANKS = 8192


def _folder(text: str) -> str:
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a directory")
    return text


def _ranks(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) <= MAX_RANKS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of ranks in [1, {MAX_RANKS}]")
    return int(text)


def add_topology_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--topology`` and its options to the ``info`` parser."""
    parser.add_argument(
        "--topology",
        action="store_true",
        help="show this node's CPUs, NUMA nodes and accelerators from sysfs, and the CPUs each "
        "local rank would be bound to (docs: placement)",
    )
    parser.add_argument(
        "--sysfs",
        type=_folder,
        metavar="DIR",
        help="with --topology: read the tree under DIR (holding sys/ and proc/) instead of /",
    )
    parser.add_argument(
        "--numa-binding",
        dest="numa_binding",
        choices=(*MODES, OFF),
        help=f"with --topology: the mode to show (default: ${CPU_BINDING_VAR}, else auto)",
    )
    parser.add_argument(
        "--nproc-per-node",
        dest="nproc_per_node",
        type=_ranks,
        metavar="N",
        help="with --topology: local ranks (default: one per visible accelerator, else 1)",
    )


def show_topology(args: argparse.Namespace) -> int:
    """Print the topology and each local rank's binding; return the exit status."""
    root = args.sysfs or "/"
    topology = read_topology(root)
    mode = chosen_mode(WHO, args.numa_binding, Settings.read(os.environ).cpu_binding) or "auto"
    count = args.nproc_per_node
    if count is None:
        visible = rank_devices(topology, os.environ, len(topology.accelerators)) or []
        count = len({device for device in visible if device is not None}) or 1
    placement = place_ranks(mode, count, os.environ, topology=topology)
    print(f"topology of {root}:")
    for line in topology.describe():
        print(f"  {line}")
    print(f"binding {mode!r} of {count} local rank{'s' if count > 1 else ''}:")
    for line in placement.lines():
        print(f"  {line}")
    if placement.note is not None:
        print(f"note: {placement.note}")
    return 0
