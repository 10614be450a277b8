"""The steps `setup` and `init_dist` share: this process made ready for a process group.

`prepare` sets the multiprocessing start method, selects and sets this rank's device, binds its
CPUs where asked (`distenv.placement`), exports torchrun's ``env://`` contract tagged with
``DISTENV_SCOPE`` and remembers what was decided (`distenv.state`). `locate_rank` detects the
`RankInfo`; `check_start_method` refuses a start method before anything changed.
"""

from __future__ import annotations

import logging
import os

from distenv import state
from distenv.bootstrap.teardown import register as end_groups_at_exit
from distenv.deadline import Deadline
from distenv.detection.pipeline import Detection, locate
from distenv.device import pci_address, rank_device, set_current_device
from distenv.errors import ConfigurationError
from distenv.master import SCOPE_VAR
from distenv.rankinfo import RankInfo
from distenv.settings import OMP_VAR, Settings

__all__ = ["check_start_method", "locate_rank", "prepare"]

logger = logging.getLogger("distenv")


def check_start_method(start_method: str | None) -> None:
    """Refuse a start method this platform does not have, before anything changed."""
    import multiprocessing  # here: it costs milliseconds that `import distenv` should not pay

    if start_method is not None and start_method not in multiprocessing.get_all_start_methods():
        raise ConfigurationError(
            "init",
            f"start_method={start_method!r} is not available here",
            hint=f"use one of {', '.join(multiprocessing.get_all_start_methods())}, or None",
        )


def _apply_start_method(start_method: str | None) -> None:
    """Set the default start method unless the program chose one already.

    DataLoader workers (``num_workers > 0``) use this default. Under ``spawn`` they start clean
    interpreters: no copy of a CUDA context or of the process group's threads (``fork`` after
    either can deadlock), at the price of a slower start, a dataset that must pickle, and a main
    module that must be guarded by ``if __name__ == "__main__":``.
    """
    if start_method is None:
        return
    import multiprocessing

    current = multiprocessing.get_start_method(allow_none=True)
    if current is None:
        multiprocessing.set_start_method(start_method)
    elif current != start_method:
        logger.debug("keeping multiprocessing start method %r (set before distenv)", current)


def locate_rank(
    launcher: str, master_addr_format: str | None, deadline: Deadline | None = None
) -> tuple[Detection, RankInfo]:
    """Detect this process's launcher and return its detection and `RankInfo` (the one kept
    from an earlier call where it is the same world)."""
    # An MPI job with no master asks rank 0 over MPI: within the bootstrap's deadline.
    detection = locate(launcher, master_addr_format=master_addr_format, deadline=deadline)
    return detection, state.kept(detection.info)


def _binding_mode(argument: str | None, setting: str | None) -> str | None:
    """Return the CPU binding asked for (`distenv.placement.apply.chosen_mode`), None for none.

    `distenv.placement` is imported only where a binding is asked for: a rank that binds nothing
    does not pay for loading it.
    """
    if argument is None and setting is None:
        return None
    from distenv.placement.apply import chosen_mode

    return chosen_mode("init", argument, setting)


def _bind_cpus(info: RankInfo, mode: str | None, settings: Settings, device: int | None) -> None:
    """Bind this rank's threads to its share of the node (`distenv.placement`), unless a launcher
    bound it already, and set ``OMP_NUM_THREADS`` and torch's threads to the cores it holds where
    the user set none. Before the process group: its threads inherit the binding."""
    if mode is None:
        return
    from distenv.placement.apply import bind_threads, place_ranks
    from distenv.placement.cpus import format_cpus
    from distenv.placement.topology import read_topology

    count = info.local_world_size
    if count is None:
        if info.local_rank == 0:
            logger.warning(
                "distenv: %s: cpu binding %r needs the number of ranks on this node, which %s "
                "does not give; binding nothing",
                info.launcher,
                mode,
                info.launcher,
            )
        return
    topology = read_topology()
    address = None if device is None else pci_address(device)
    mine = next((a for a in topology.accelerators if a.address == address), None)
    own = None if mine is None else (info.local_rank, mine)
    placement = place_ranks(mode, count, os.environ, topology=topology, own=own)
    if placement.note is not None and info.local_rank == 0:
        logger.warning("distenv: cpu binding %s: %s", mode, placement.note)
    # Kept or bound, the rank's threads follow the CPUs it holds.
    cpus = placement.cpus[info.local_rank]
    if placement.bound:
        bind_threads(cpus)
    if settings.omp_num_threads is None:
        import torch

        threads = placement.threads(info.local_rank)
        os.environ[OMP_VAR] = str(threads)
        torch.set_num_threads(threads)
    logger.debug(
        "distenv: cpu binding %s: local rank %d on CPUs %s",
        mode,
        info.local_rank,
        format_cpus(cpus),
    )


def prepare(
    detection: Detection,
    info: RankInfo,
    *,
    start_method: str | None,
    set_device: bool,
    allow_gpu_sharing: bool,
    cpu_binding: str | None,
) -> int | None:
    """Run the steps `setup` and `init_dist` share; return the selected CUDA device index."""
    settings = Settings.read(os.environ)
    mode = _binding_mode(cpu_binding, settings.cpu_binding)
    _apply_start_method(start_method)
    device = rank_device(info)
    if set_device and device is not None:
        # Before init_process_group: NCCL binds its communicator to the current device, and a
        # rank left on cuda:0 puts its context (and, before device_id existed, its
        # communicator) on another rank's GPU.
        set_current_device(device)
    _bind_cpus(info, mode, settings, device)
    exported = info.to_env()
    os.environ.update(exported)
    for name in ("GROUP_RANK", "GROUP_WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        if name not in exported:  # the node layout is unknown until the roll call
            os.environ.pop(name, None)
    os.environ[SCOPE_VAR] = detection.job_tag
    state.remember(state.State(info, detection.job_tag, device, allow_gpu_sharing))
    # Whoever creates the process group (init_dist, or the framework after setup), it ends
    # before the interpreter finalises (distenv.bootstrap.teardown).
    end_groups_at_exit()
    return device
