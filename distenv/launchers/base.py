"""The public plug-in contract: `Launcher`, and the types for launchers that need more of it.

A launcher backend is a stateless object whose methods are pure functions of an environment
mapping, read through `Launcher.reader` (which refuses undeclared variables). Detection asks the
type, never the name: a `Scheduler` (Slurm, LSF, or a plug-in for PBS or Flux) owns an allocation
and is an outer layer; an `AllocationLauncher` (MPI) starts ranks that may lean on the allocation
of every scheduler enclosing them. Where rank 0's store listens is decided by `distenv.master`
from what the launcher states (`Launcher.rank_info`) and its `Launcher.default_master`.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import ClassVar, NamedTuple

from distenv.master import Default
from distenv.rankinfo import RankInfo
from distenv.variables import Reader, Var

__all__ = [
    "PLUGIN_GROUP",
    "AllocationLauncher",
    "Default",
    "Launcher",
    "Nodes",
    "Scheduler",
    "World",
]

# Third-party launchers register under this entry-point group (docs/plugins.md). distenv scans it
# only for a name that is not built in, or for the plug-ins named in DISTENV_PLUGINS: scanning
# entry points costs tens of milliseconds (`distenv.launchers.registry`).
PLUGIN_GROUP = "distenv.launchers"

# (rank, world size) as one launcher layer sees them; the size is None where the layer does not say.
World = tuple[int, int | None]


class Nodes(NamedTuple):
    """This rank's node as an enclosing scheduler's daemon step numbers it.

    Attributes:
        node_rank: Index of this node.
        num_nodes: Number of nodes.
        node_var: The variable `node_rank` was read from (named in errors).
        count_var: The variable `num_nodes` was read from.
    """

    node_rank: int
    num_nodes: int
    node_var: str
    count_var: str


class Launcher(abc.ABC):
    """A launcher backend: turns one launcher's variables into a `RankInfo`.

    Implementations are stateless; every method is a pure function of the mapping it is given.
    They must read variables only through `reader`, which refuses undeclared names.
    """

    #: The name users type (``--launcher NAME``).
    name: ClassVar[str]
    #: Other accepted spellings of `name`.
    aliases: ClassVar[tuple[str, ...]] = ()
    #: Every variable the backend reads; the docs render this table. Declaring ``MASTER_ADDR``
    #: and ``MASTER_PORT`` (`distenv.master.MASTER_VARS`) lets the user's values win.
    variables: ClassVar[tuple[Var, ...]]
    #: How a user starts processes under this launcher: the hint when ``--launcher NAME`` finds
    #: none of its variables (typically a login node). A plug-in says how its jobs start.
    how_to_start: ClassVar[str] = ""

    def reader(self, env: Mapping[str, str]) -> Reader:
        """Return a `Reader` over `env` limited to this backend's declared variables."""
        return Reader(self.name, env, self.variables)

    @property
    def honours_master_vars(self) -> bool:
        """Whether the user's ``MASTER_ADDR``/``MASTER_PORT`` count (this launcher declares them)."""
        return any(var.name == "MASTER_ADDR" for var in self.variables)

    @abc.abstractmethod
    def detect(self, env: Mapping[str, str]) -> bool:
        """Return whether this launcher's variables are present in `env`."""

    @abc.abstractmethod
    def rank_info(self, env: Mapping[str, str]) -> RankInfo:
        """Return this process's `RankInfo`, or raise a `DistEnvError` saying what is wrong.

        Its master fields are what the launcher's own contract states (torchrun's MASTER_*), used
        as given; leave them None to let `distenv.master` decide (from `default_master`).
        """

    def restart_count(self, env: Mapping[str, str]) -> int:
        """Return how many times this launcher restarted the job or rank before (0: first run).

        A launcher that restarts nothing keeps the default; `rank_info` fills
        `RankInfo.restart_count` from it, and an MPI job inside a scheduler's allocation takes
        the scheduler's.
        """
        return 0

    def default_master(self, env: Mapping[str, str]) -> Default | None:
        """Return where this launcher puts rank 0's store when nobody says, or None if it can't."""
        return None

    def node_agent(self, env: Mapping[str, str]) -> RankInfo | None:
        """Return this process as its node's one agent, where `rank_info` refuses it as no rank.

        A launcher that starts one process per node and expects it to start the node's ranks (a
        Kubeflow pod with nprocPerNode > 1) answers for ``distenv run`` there: rank = node index,
        world size = nodes, one local process, and the master. Others return None.
        """
        return None

    def processes_per_node(self, env: Mapping[str, str]) -> tuple[str, str] | None:
        """Return the variable, and its value, by which this launcher's job states how many
        processes each node runs (a torchrun ``--nproc-per-node`` spec), or None if it states
        none. ``distenv run`` as the node's agent (`node_agent`) checks its own count against it.
        """
        return None

    def world(self, env: Mapping[str, str]) -> World | None:
        """Return ``(rank, size)`` as this layer states them, or None if it states no rank.

        Used to tell nested launchers apart; it does not validate the rest of the environment.
        """
        return None

    def scope(self, env: Mapping[str, str]) -> str:
        """Return the export tag: the job step whose answer distenv's exports carry.

        ``launcher/job/step`` (`distenv.master.scope_tag`), exported as ``DISTENV_SCOPE`` beside
        ``MASTER_*`` so that another step finding them knows they are not its own.
        """
        return f"{self.name}/-/-"


class AllocationLauncher(Launcher):
    """A launcher whose ranks may lean on the allocation of an enclosing `Scheduler` (MPI).

    Its ranks may be the scheduler's own tasks (``srun --mpi=pmix``, ``jsrun``): detection then
    takes the scheduler's layout when both layers number this process alike (`Launcher.world`).
    Or daemons running as one scheduler step across the allocation started them (mpirun or
    Hydra inside ``salloc``): that step numbers the nodes (`Scheduler.daemon_nodes`, handed to
    `placed_rank_info`) and the allocation gives the master (`Scheduler.allocation_master`).
    """

    def rank_info(self, env: Mapping[str, str]) -> RankInfo:
        """Return this process's `RankInfo` outside any daemon step (`placed_rank_info`)."""
        return self.placed_rank_info(env, None)

    @abc.abstractmethod
    def placed_rank_info(self, env: Mapping[str, str], nodes: Nodes | None) -> RankInfo:
        """Return the `RankInfo`, numbering the nodes by `nodes` where a daemon step gives it.

        `nodes` is None outside a scheduler's daemon step (the launcher numbers its nodes
        itself, or leaves them to the roll call).
        """


class Scheduler(Launcher):
    """A launcher that owns an allocation of nodes (Slurm, LSF; PBS or Flux as plug-ins).

    Besides its own tasks' `RankInfo`, a scheduler tells an `AllocationLauncher` (MPI) started
    inside its allocation where the master is (`allocation_master`), and may say how its daemon
    step numbers the nodes (`daemon_nodes`) and how to put its job back in the queue.
    """

    def requeue_command(self, env: Mapping[str, str]) -> list[str] | None:
        """Return the argument list that puts this job back in the queue, or None if it can't.

        `distenv.requeue` runs it on one rank.
        """
        return None

    def daemon_nodes(self, env: Mapping[str, str]) -> Nodes | None:
        """Return this node's numbering when this process runs in a step spanning the allocation.

        mpiexec.hydra (and Open MPI's mpirun inside salloc) start one daemon per node as the tasks
        of one step spanning the allocation, so that step's node index is the MPI rank's node,
        even when nodes hold different numbers of ranks. Return None when unknown: the default,
        for a scheduler none of whose variables numbers a daemon step's nodes (an MPI rank's
        node is then the roll call's, from the ranks' host names).
        """
        return None

    @abc.abstractmethod
    def allocation_master(self, env: Mapping[str, str]) -> Default | None:
        """Return the allocation's first host (unmapped) and a port derived from the job alone.

        Ranks of one MPI job see different steps (mpirun's own node has none), so the port must
        not depend on the step. Return None outside an allocation.
        """
