"""Filling in what the environment cannot say: an MPI job's master, a single process's port."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Any

from distenv._env import Reader
from distenv._master import FORMAT_VAR, MASTER_VARS, map_master_host
from distenv.detect import Detection, explain
from distenv.errors import MasterResolutionError
from distenv.rankinfo import RankInfo

__all__ = ["detect_resolved", "free_port", "resolve"]

ABI_HINT = (
    "mpi4py is talking to a different MPI library than the one that started the ranks: under "
    "MPICH/Intel MPI set MPI4PY_MPIABI=mpich and put a libmpi.so.12 of that library first on "
    "LD_LIBRARY_PATH (or export MASTER_ADDR and MASTER_PORT so no MPI call is needed)"
)


def free_port(host: str = "") -> int:
    """Return a TCP port that was free on `host` a moment ago (the kernel's pick)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def resolve(info: RankInfo, *, env: Mapping[str, str] | None = None, comm: Any = None) -> RankInfo:
    """Return `info` with its master address and port known.

    A resolved `info` is returned as is. A single process gets 127.0.0.1 and a free port. An MPI
    job without MASTER_ADDR gets rank 0's host name (mapped by DISTENV_MASTER_ADDR_FORMAT) and a
    free port picked on rank 0, broadcast over MPI with mpi4py (``pip install 'distenv[mpi]'``).
    This is a collective call for MPI jobs: every rank must make it.

    Args:
        info: What detection found.
        env: The environment (for DISTENV_MASTER_ADDR_FORMAT); `os.environ` by default.
        comm: An mpi4py communicator to use instead of ``MPI.COMM_WORLD``.

    Raises:
        MasterResolutionError: If mpi4py is missing or sees a different world than the launcher.
    """
    if info.is_resolved:
        return info
    env = os.environ if env is None else env
    if info.world_size == 1:
        addr = info.master_addr or "127.0.0.1"
        return info.replace(master_addr=addr, master_port=info.master_port or free_port(addr))
    if comm is None:
        try:
            from mpi4py import MPI
        except ImportError:
            raise MasterResolutionError(
                info.launcher,
                f"rank {info.rank} of {info.world_size} has no MASTER_ADDR and mpi4py is not "
                "installed to ask rank 0 for its host",
                hint="pip install 'distenv[mpi]', or export MASTER_ADDR and MASTER_PORT",
            ) from None
        comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    if (size, rank) != (info.world_size, info.rank):
        raise MasterResolutionError(
            info.launcher,
            f"mpi4py sees rank {rank} of {size}, but the launcher's variables say rank "
            f"{info.rank} of {info.world_size}",
            hint=ABI_HINT,
        )
    payload = None
    if rank == 0:
        host = info.master_addr or map_master_host(
            Reader(info.launcher, env, MASTER_VARS), socket.gethostname()
        )
        payload = (host, info.master_port or free_port())
    host, port = comm.bcast(payload, root=0)
    return info.replace(master_addr=host, master_port=port)


def detect_resolved(
    launcher: str = "auto", *, master_addr_format: str | None = None
) -> tuple[Detection, RankInfo]:
    """Detect from os.environ and resolve the master, as `init_dist` and the CLI do.

    Returns:
        The detection (with its reasons) and the resolved `RankInfo`.
    """
    detection = explain(launcher, master_addr_format=master_addr_format)
    formats = None if master_addr_format is None else {FORMAT_VAR: master_addr_format}
    return detection, resolve(detection.info, env=formats)
