"""The MPI transport of `distenv.master`'s exchange rule: rank 0's master, broadcast with mpi4py.

`distenv.master` decides *what* rank 0 publishes (its host name, mapped, and a free port); this
module only carries it, and checks first that mpi4py talks to the MPI library that started the
ranks. mpi4py is the optional extra ``distenv[mpi]``, imported only when an MPI job has no master.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from distenv.errors import MasterResolutionError
from distenv.master import Exchange
from distenv.rankinfo import RankInfo

__all__ = ["ABI_HINT", "mpi_exchange"]

ABI_HINT = (
    "mpi4py is talking to a different MPI library than the one that started the ranks: under "
    "MPICH/Intel MPI set MPI4PY_MPIABI=mpich and put a libmpi.so.12 of that library first on "
    "LD_LIBRARY_PATH (or export MASTER_ADDR and MASTER_PORT so no MPI call is needed)"
)


def mpi_exchange(info: RankInfo, comm: Any = None) -> Exchange:
    """Return an `Exchange` that broadcasts rank 0's master over `comm` (``MPI.COMM_WORLD``).

    Collective: every rank of the job must call the exchange.

    Raises (when called):
        MasterResolutionError: If mpi4py is missing or sees a different world than the launcher.
    """

    def exchange(rank0_master: Callable[[], tuple[str, int]]) -> tuple[str, int]:
        world = comm
        if world is None:
            try:
                from mpi4py import MPI
            except ImportError:
                raise MasterResolutionError(
                    info.launcher,
                    f"rank {info.rank} of {info.world_size} has no MASTER_ADDR and mpi4py is not "
                    "installed to ask rank 0 for its host",
                    hint="pip install 'distenv[mpi]', or export MASTER_ADDR and MASTER_PORT",
                ) from None
            world = MPI.COMM_WORLD
        size, rank = world.Get_size(), world.Get_rank()
        if (size, rank) != (info.world_size, info.rank):
            raise MasterResolutionError(
                info.launcher,
                f"mpi4py sees rank {rank} of {size}, but the launcher's variables say rank "
                f"{info.rank} of {info.world_size}",
                hint=ABI_HINT,
            )
        host, port = world.bcast(rank0_master() if rank == 0 else None, root=0)
        return str(host), int(port)

    return exchange
