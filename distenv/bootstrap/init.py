"""`init_dist` and `setup`: from this process's launcher to a torch process group.

This module only orchestrates; each step's rules live in the module named. Both functions run the
same steps, in this order, and are the only functions of distenv that change the process
(os.environ, the multiprocessing start method, the current CUDA or XPU device):

1. read the runtime settings (`distenv.settings`), then detect and resolve the `RankInfo`
   (`distenv.detection.pipeline.locate`);
2. set the multiprocessing start method (``spawn`` unless one is set already);
3. select and set this rank's device (CUDA, ROCm or XPU), before any process group exists
   (`distenv.device`);
4. export torchrun's ``env://`` contract into os.environ, tagged with ``DISTENV_SCOPE`` so that
   later detection recognises distenv's own exports (`distenv.master`), and remember what was
   decided (`distenv.state`);

and `init_dist` goes on to

5. under one deadline (the rendezvous timeout + `distenv.timing.GRACE_S`), run by one
   `distenv.bootstrap.session.Bootstrap`: reach rank 0's store, prove it is this job's and hold the roll
   call over it (`distenv.bootstrap.rollcall`: every rank checks in, rank 0 validates and names missing
   ranks, numbers the nodes where the launcher named none and probes the network path the
   backends will take), export the interface the probe chose where a node's default cannot be
   reached, then create the process group with the same store and check that every rank came
   up (`distenv.bootstrap.group`); a node layout the roll call filled is exported and remembered;
6. log one summary line on rank 0 (logger ``distenv``, INFO);
7. seed every generator, if asked (`distenv.seeding`);
8. with a hang timeout, start the in-process hang autopsy over the job's store
   (`distenv.bootstrap.hang`), unless ``distenv run``'s rank wrapper watches the rank already.

torch is imported inside the functions, and so are the rank log, the seeding and the hang autopsy
(and `distenv.placement`, in `distenv.bootstrap.prepare`) where a rank asks for them: importing
this module stays cheap, and a rank that uses none of them does not load them.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from distenv import state
from distenv.bootstrap.group import join_group
from distenv.bootstrap.prepare import check_start_method, locate_rank, prepare
from distenv.bootstrap.protocol import ROLLCALL
from distenv.bootstrap.rollcall import fill_layout, make_checkin, meet, network_exports
from distenv.bootstrap.session import Bootstrap, Session
from distenv.bootstrap.store import master_address
from distenv.bootstrap.teardown import register as end_groups_at_exit
from distenv.device import (
    choose_backend,
    device_name,
    rank_backend,
)
from distenv.errors import ConfigurationError, DistEnvError, InitError
from distenv.exits import one_line, rank_of
from distenv.rankinfo import RankInfo
from distenv.settings import Settings, seconds

if TYPE_CHECKING:
    from pathlib import Path

    from distenv.settings import Timeout

__all__ = ["init_dist", "setup"]

logger = logging.getLogger("distenv")


def _log_folder(argument: str | os.PathLike[str] | None, setting: str | None) -> Path | None:
    """Return the rank's log folder (`distenv.postmortem.ranklog.folder`), None for none; the
    rank log is imported only where a folder is asked for."""
    if argument is None and setting is None:
        return None
    from distenv.postmortem.ranklog import folder

    return folder(argument, setting)


def _keep_log(logs: Path | None, rank: int | None, local_rank: int | None) -> None:
    """Start the rank's log in `logs`, if any; its record is written before the teardown's end."""
    if logs is not None and rank is not None:
        from distenv.postmortem.ranklog import start

        end_groups_at_exit()  # first: the log's handler, registered after it, runs before it
        start(logs, rank, local_rank)


@one_line
def setup(
    launcher: str = "auto",
    *,
    start_method: str | None = "spawn",
    set_device: bool = True,
    allow_gpu_sharing: bool = False,
    master_addr_format: str | None = None,
    cpu_binding: str | None = None,
) -> RankInfo:
    """Prepare this process for a framework that creates the process group itself.

    Does everything `init_dist` does except the process group: resolves the `RankInfo`, sets the
    multiprocessing start method, selects and sets the CUDA device, and exports torchrun's
    contract (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
    ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and DISTENV_SCOPE) into os.environ,
    which Lightning, HF accelerate and DeepSpeed read. Call it before they start.

    Args:
        launcher: ``auto`` or a launcher name (see `distenv.detection.pipeline.explain`).
        start_method: The multiprocessing start method to set when none is set yet (DataLoader
            workers use it); None leaves it alone.
        set_device: Whether to call ``torch.cuda.set_device`` with the selected device.
        allow_gpu_sharing: Whether ranks may share a physical GPU; stored for the cross-rank
            check (`gpu_sharing_allowed`).
        master_addr_format: Maps the launcher's default master host to the address to use,
            e.g. ``"{host}-ib"`` (overrides ``$DISTENV_MASTER_ADDR_FORMAT``; explicit
            MASTER_ADDR still wins).
        cpu_binding: Bind this rank's CPUs near its accelerator: ``node``, ``socket``,
            ``exclusive``, ``core-complex`` (torchrun's ``--numa-binding``), ``auto`` or
            ``none``; default ``$DISTENV_CPU_BINDING``, else none. Never narrows a binding the
            launcher set (docs/placement.md).

    Returns:
        This rank's resolved `RankInfo`. Where the launcher names no node layout (an MPI
        launcher alone), its ``node_rank`` and ``num_nodes`` are None and GROUP_RANK /
        GROUP_WORLD_SIZE are not exported, and where it counts no ranks per node (Flux with
        several tasks on each of several nodes), ``local_world_size`` is None and
        LOCAL_WORLD_SIZE is not exported: only `init_dist`'s roll call numbers the nodes and
        counts their ranks.

    Raises:
        DistEnvError: If detection or resolution fails, or an argument is invalid.
    """
    check_start_method(start_method)
    detection, info = locate_rank(launcher, master_addr_format)
    prepare(
        detection,
        info,
        start_method=start_method,
        set_device=set_device,
        allow_gpu_sharing=allow_gpu_sharing,
        cpu_binding=cpu_binding,
    )
    return info


def _init_process_group(
    boot: Bootstrap, backend: str, device: int | None, timeout: float | None
) -> RankInfo:
    """Hold the roll call and create the group; return the RankInfo with the roll call's layout."""
    info = boot.session.info
    checkin = make_checkin(
        boot.session, backend, device, allow_gpu_sharing=state.gpu_sharing_allowed()
    )

    def phases(boot: Bootstrap) -> RankInfo:
        # Everybody checks in before torch is asked to wait: a missing rank is named, not waited
        # for.
        verdict = meet(boot, checkin, ROLLCALL)
        placed = fill_layout(info, verdict, checkin)
        _export_paths(network_exports(verdict, checkin), info)
        hosts = {c.rank: c.hostname for c in verdict.checkins}
        join_group(
            boot,
            backend=backend,
            device=device,
            timeout=timeout,
            hosts=hosts,
            release=verdict.release,
        )
        return placed

    try:
        return boot.run(phases)
    except BaseException as exc:
        boot.session.release(exc)
        raise


def _export_paths(exports: dict[str, str], info: RankInfo) -> None:
    """Export the interfaces the roll call's network probe chose for this node, and say so once
    per node (its first rank)."""
    if not exports:
        return
    os.environ.update(exports)
    if info.local_rank == 0:
        logger.warning(
            "distenv: the network probe found that this node's default address for the process "
            "group cannot be reached from the other nodes, and that another interface's can: "
            "exported %s (docs/network.md)",
            " ".join(f"{name}={value}" for name, value in sorted(exports.items())),
        )


def _placed(info: RankInfo, known: RankInfo) -> RankInfo:
    """Export and remember the node layout the roll call filled in (`known` is `info` if none)."""
    if known is not info:
        os.environ.update(known.to_env())
        current = state.current()
        if current is not None:
            state.remember(current._replace(info=known))
    return known


def _reuse(info: RankInfo, backend: str | None) -> RankInfo:
    """Return the RankInfo of the group that exists, or raise if it is another world.

    A `backend` asked for explicitly must be the group's: keeping gloo where ``mpi`` was asked
    for would run every collective on another transport without a word.
    """
    import torch.distributed as dist

    current = str(dist.get_backend())
    if backend is not None and backend.strip().lower() != current.lower():
        raise ConfigurationError(
            info.launcher,
            f"torch.distributed is already initialised with backend {current!r}, but "
            f"init_dist was now asked for backend={backend!r}",
            hint=f"call init_dist once, with backend={backend.strip()!r} (or call "
            "torch.distributed.destroy_process_group() first)",
            variable="backend",
            value=backend,
        )
    rank, size = dist.get_rank(), dist.get_world_size()
    if (rank, size) != (info.rank, info.world_size):
        raise InitError(
            info.launcher,
            f"torch.distributed is already initialised as rank {rank} of {size}, but the "
            f"launcher says {info.who}",
            hint="call init_dist once, before anything else creates the default process group "
            "(or call torch.distributed.destroy_process_group() first)",
            consequence=False,
        )
    return info


@one_line
def init_dist(
    launcher: str = "auto",
    backend: str | None = None,
    *,
    timeout: Timeout | None = None,
    rendezvous_timeout: Timeout | None = None,
    start_method: str | None = "spawn",
    set_device: bool = True,
    allow_gpu_sharing: bool = False,
    seed: int | None = None,
    master_addr_format: str | None = None,
    hang_timeout: Timeout | None = None,
    cpu_binding: str | None = None,
    log_dir: str | os.PathLike[str] | None = None,
) -> RankInfo:
    """Initialise torch.distributed for this process, whatever launcher started it.

    Runs `setup`'s steps (resolve, start method, CUDA device, export of torchrun's contract),
    then creates the default process group over a TCPStore on ``MASTER_ADDR:MASTER_PORT``, logs
    one summary line on rank 0 (logger ``distenv``, INFO: configure logging, e.g. with
    `distenv.get_logger`, to see it), and seeds the generators if `seed` is given. With no
    launcher (``none``) it makes a 1-rank group on 127.0.0.1 and a free port.

    Calling it again for the same rank and world returns the same `RankInfo` and creates nothing;
    a `backend` named again must be the group's.
    At exit the group ends before the interpreter finalises, within 5 s (`distenv.bootstrap.teardown`):
    ``destroy_process_group()`` is optional, and `atexit` handlers that need the group must be
    registered after this call.

    Args:
        launcher: ``auto`` or a launcher name (see `distenv.detection.pipeline.explain`).
        backend: The process-group backend; by default ``nccl`` when CUDA (or ROCm, whose nccl
            is RCCL) is usable and this rank has a device, ``xccl`` on an XPU build of torch
            >= 2.8 with a device, else ``gloo``. Any torch spelling wins as given
            (``"cpu:gloo,cuda:nccl"``, ``"mpi"``).
        timeout: torch's process-group timeout (seconds or a timedelta); torch's default if None.
        rendezvous_timeout: How long a rank may take to reach rank 0's store (seconds or a
            timedelta); default ``$DISTENV_TIMEOUT``, else 300 s.
        start_method: The multiprocessing start method to set when none is set yet; DataLoader
            workers use it (``spawn``: clean workers that need a picklable dataset and a
            ``__main__`` guard). None leaves it alone.
        set_device: Whether to call ``torch.cuda.set_device`` (``torch.xpu.set_device`` on XPU
            builds) before the group exists and pass
            ``device_id`` to init_process_group.
        allow_gpu_sharing: Whether ranks may share a physical GPU; stored for the cross-rank
            check (`gpu_sharing_allowed`).
        seed: If given, `distenv.seed_everything` (seed) after the group exists.
        master_addr_format: Maps the launcher's default master host to the address to use,
            e.g. ``"{host}-ib"`` (overrides ``$DISTENV_MASTER_ADDR_FORMAT``; explicit
            MASTER_ADDR still wins).
        hang_timeout: Seconds (or a timedelta) a rank may make no progress once the group is
            up; default ``$DISTENV_HANG_TIMEOUT``, else never. When one rank made none for
            that long, every rank posts its stack to the job's store, rank 0 prints one card
            naming the rank whose stack differs, and every rank ends with status 124
            (docs/failures.md). Under ``distenv run --hang-timeout`` its own autopsy runs
            instead.
        cpu_binding: Bind this rank's CPUs near its accelerator before the group exists:
            ``node``, ``socket``, ``exclusive``, ``core-complex`` (torchrun's
            ``--numa-binding``), ``auto`` or ``none``; default ``$DISTENV_CPU_BINDING``, else
            none. Never narrows a binding the launcher set (docs/placement.md).
        log_dir: A folder where this rank keeps its output (``rank-N.log``) and the record of
            its failure (``rank-N.report``, ``rank-N.fault``) for ``distenv why``; default
            ``$DISTENV_LOG_DIR``, else none (`distenv.postmortem.ranklog`).

    Returns:
        This rank's resolved `RankInfo`.

    Raises:
        RendezvousTimeoutError: If this rank cannot reach rank 0's store within the rendezvous
            timeout, or not every rank checks in.
        ConfigurationError: If an argument, DISTENV_TIMEOUT, DISTENV_HANG_TIMEOUT,
            DISTENV_CPU_BINDING or DISTENV_LOG_DIR is invalid, or `backend` is not the backend of
            the group that exists.
        InitError: If torch.distributed is already initialised for another world, or torch
            refuses the group.
        DistEnvError: If detection or resolution fails, or rank 0's port is taken.
    """
    settings = Settings.read(os.environ)
    pg_seconds = None if timeout is None else seconds(timeout, "timeout")
    rendezvous_seconds = settings.rendezvous_seconds(rendezvous_timeout)
    hang = (
        settings.hang_seconds(None, who="init")
        if hang_timeout is None
        else seconds(hang_timeout, "hang_timeout")
    )
    deadline = Bootstrap.deadline_for(rendezvous_seconds)
    check_start_method(start_method)
    if backend is not None:
        choose_backend(cuda_available=False, has_device=False, explicit=backend)
    if seed is not None:
        from distenv.seeding import check_seed

        check_seed(seed)

    logs = _log_folder(log_dir, settings.log_dir)
    # Detection first: a misconfigured job is refused before paying for `import torch`.
    try:
        detection, info = locate_rank(launcher, master_addr_format, deadline)
    except DistEnvError:
        _keep_log(logs, rank_of(os.environ), None)  # the refusal is the rank's record, if known
        raise
    _keep_log(logs, info.rank, info.local_rank)
    import torch.distributed as dist

    if not dist.is_available():
        raise InitError(
            "init",
            "this torch build has no torch.distributed",
            hint="install a torch wheel from pytorch.org (every official build includes it)",
            consequence=False,
        )
    if dist.is_initialized():
        return _reuse(info, backend)
    device = prepare(
        detection,
        info,
        start_method=start_method,
        set_device=set_device,
        allow_gpu_sharing=allow_gpu_sharing,
        cpu_binding=cpu_binding,
    )
    chosen = rank_backend(device, backend)
    boot = Bootstrap(Session.of(detection, info, settings), rendezvous_seconds, deadline)
    known = _init_process_group(boot, chosen, device if set_device else None, pg_seconds)
    info = _placed(info, known)
    if info.rank == 0:
        logger.info(
            "init_dist: launcher=%s world_size=%d nodes=%d master=%s backend=%s device=%s",
            info.launcher,
            info.world_size,
            info.num_nodes or 0,
            master_address(info),
            chosen,
            device_name(device),
        )
    if seed is not None:
        from distenv.seeding import seed_everything

        seed_everything(seed)
    if hang is not None:
        from distenv.bootstrap.hang import arm

        arm(boot.session, hang, None if logs is None else str(logs))
    return info
