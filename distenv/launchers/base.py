"""The interface every launcher backend implements."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import ClassVar

from distenv._env import Reader, Var
from distenv.rankinfo import RankInfo

__all__ = ["Launcher", "World"]

# (rank, world size) as one launcher layer sees them; the size is None where the layer does not say.
World = tuple[int, int | None]


class Launcher(abc.ABC):
    """A launcher backend: turns one launcher's variables into a `RankInfo`.

    Implementations are stateless; every method is a pure function of the mapping it is given.
    They must read variables only through `reader`, which refuses undeclared names.
    """

    #: The name users type (``--launcher NAME``).
    name: ClassVar[str]
    #: Other accepted spellings of `name`.
    aliases: ClassVar[tuple[str, ...]] = ()
    #: Every variable the backend reads; the docs render this table.
    variables: ClassVar[tuple[Var, ...]]

    def reader(self, env: Mapping[str, str]) -> Reader:
        """Return a `Reader` over `env` limited to this backend's declared variables."""
        return Reader(self.name, env, self.variables)

    @abc.abstractmethod
    def detect(self, env: Mapping[str, str]) -> bool:
        """Return whether this launcher's variables are present in `env`."""

    @abc.abstractmethod
    def rank_info(self, env: Mapping[str, str]) -> RankInfo:
        """Return this process's `RankInfo`, or raise a `DistEnvError` saying what is wrong."""

    def world(self, env: Mapping[str, str]) -> World | None:
        """Return ``(rank, size)`` as this layer states them, or None if it states no rank.

        Used to tell nested launchers apart; it does not validate the rest of the environment.
        """
        return None

    def scope(self, env: Mapping[str, str]) -> str:
        """Return the job/step identity that tags distenv's exports (see `distenv._master`)."""
        return f"{self.name}/-/-"

    def daemon_nodes(self, env: Mapping[str, str]) -> tuple[int, int] | None:
        """Return ``(node_rank, num_nodes)`` when an MPI launcher's daemons run as this layer's tasks.

        mpiexec.hydra (and Open MPI's mpirun inside salloc) start one daemon per node as the tasks
        of one step spanning the allocation, so that step's node index is the MPI rank's node,
        even when nodes hold different numbers of ranks. Others return None.
        """
        return None

    def allocation_master(self, env: Mapping[str, str]) -> tuple[str, int] | None:
        """Return the master a launcher started *inside* this scheduler's allocation should use.

        Schedulers (Slurm, LSF) answer with the first host of the allocation and a port derived from
        the job id; others return None.
        """
        return None
