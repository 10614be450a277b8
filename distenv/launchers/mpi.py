"""The `mpi` launcher backend: ranks started by mpirun / mpiexec of the common MPI libraries."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from distenv.errors import MissingVariableError
from distenv.launchers.base import AllocationLauncher, Nodes, World
from distenv.master import MASTER_VARS, scheduler_port, scope_tag
from distenv.rankinfo import RankInfo
from distenv.variables import Reader, Var

__all__ = ["FLAVORS", "PMI_FD", "Flavor", "MpiLauncher"]

#: Hydra's (and any PMI-1 server's) socket to this rank; on one node its peer process, the node's
#: PMI proxy, names the launch where no variable does (`distenv.detection.pipeline`, run time).
PMI_FD = Var("PMI_FD", "master_port", "no", "PMI: the server's socket; its peer names the launch")


class Flavor(NamedTuple):
    """The variables one MPI library's launcher sets; each tuple lists alternatives in order."""

    name: str
    rank: str
    size: tuple[str, ...]
    local_rank: tuple[str, ...]
    local_size: tuple[str, ...]
    node: tuple[str, ...] = ()


# First match wins. Open MPI and MVAPICH2 set their own names; Cray PALS sets PALS_* beside the PMI_*
# names Hydra uses, so it is tested before Hydra. A bare PMIX_RANK (srun --mpi=pmix, prterun) names
# no world size: it is detected, but only an enclosing scheduler step can complete it.
FLAVORS = (
    Flavor(
        "Open MPI",
        "OMPI_COMM_WORLD_RANK",
        ("OMPI_COMM_WORLD_SIZE",),
        ("OMPI_COMM_WORLD_LOCAL_RANK",),
        ("OMPI_COMM_WORLD_LOCAL_SIZE",),
    ),
    Flavor(
        "MVAPICH2",
        "MV2_COMM_WORLD_RANK",
        ("MV2_COMM_WORLD_SIZE",),
        ("MV2_COMM_WORLD_LOCAL_RANK",),
        ("MV2_COMM_WORLD_LOCAL_SIZE",),
    ),
    Flavor(
        "Cray PALS",
        "PALS_RANKID",
        ("PMI_SIZE",),
        ("PALS_LOCAL_RANKID", "PMI_LOCAL_RANK"),
        ("PALS_LOCAL_SIZE", "PMI_LOCAL_SIZE"),
        ("PALS_NODEID",),
    ),
    Flavor(
        "MPICH/Intel MPI (Hydra) or PMI",
        "PMI_RANK",
        ("PMI_SIZE",),
        ("MPI_LOCALRANKID", "PMI_LOCAL_RANK"),
        ("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"),
    ),
    Flavor("PMIx", "PMIX_RANK", (), (), ()),
)

_MEANINGS = {
    "rank": "rank",
    "size": "world_size",
    "local_rank": "local_rank",
    "local_size": "local_world_size",
    "node": "node_rank",
}


def _declare() -> tuple[Var, ...]:
    seen: dict[str, Var] = {}
    for flavor in FLAVORS:
        for attr, field in _MEANINGS.items():
            value = getattr(flavor, attr)
            for name in (value,) if isinstance(value, str) else value:
                required = "yes" if attr != "node" else "no"
                seen.setdefault(name, Var(name, field, required, f"{flavor.name}: {field}"))
    return tuple(seen.values())


class MpiLauncher(AllocationLauncher):
    """Ranks started by an MPI launcher: Open MPI, MPICH / Intel MPI (Hydra), MVAPICH2, Cray PALS.

    | library | rank | world_size | local_rank | local_world_size | node_rank |
    |---|---|---|---|---|---|
    | Open MPI (mpirun) | OMPI_COMM_WORLD_RANK | OMPI_COMM_WORLD_SIZE | OMPI_COMM_WORLD_LOCAL_RANK | OMPI_COMM_WORLD_LOCAL_SIZE | |
    | MVAPICH2 | MV2_COMM_WORLD_RANK | MV2_COMM_WORLD_SIZE | MV2_COMM_WORLD_LOCAL_RANK | MV2_COMM_WORLD_LOCAL_SIZE | |
    | Cray PALS | PALS_RANKID | PMI_SIZE | PALS_LOCAL_RANKID (PMI_LOCAL_RANK) | PALS_LOCAL_SIZE (PMI_LOCAL_SIZE) | PALS_NODEID |
    | MPICH / Intel MPI (Hydra) | PMI_RANK | PMI_SIZE | MPI_LOCALRANKID (PMI_LOCAL_RANK) | MPI_LOCALNRANKS (PMI_LOCAL_SIZE) | |
    | PMIx (srun --mpi=pmix) | PMIX_RANK | (none: needs the enclosing step) | | | |

    All but PALS_NODEID are required for the library detected; a name in parentheses is read
    where the first is unset.

    | variable | fills | required |
    |---|---|---|
    | PMIX_NAMESPACE | export tag: one PMIx launch (Open MPI, ``srun --mpi=pmix``, jsrun) | no |
    | PALS_APID | export tag: one Cray PALS launch | no |
    | PMI_FD | master_port on one node without mpi4py: Hydra's PMI server behind it | no |
    | MASTER_ADDR, MASTER_PORT, DISTENV_SCOPE, DISTENV_MASTER_ADDR_FORMAT | master | no |

    Inside a scheduler's step that spans the allocation (mpiexec.hydra inside salloc), that step numbers the nodes (`placed_rank_info`);
    otherwise no MPI library tells a rank its node index and node count (Open MPI 5 sets no
    OMPI_MCA_orte_*, Hydra nothing of the kind; ``OMPI_COMM_WORLD_NODE_RANK`` is *not* a node index:
    it is a local rank counted across jobs), so node_rank and num_nodes are left unknown (None)
    and `init_dist`'s roll call numbers the hosts in order of their lowest rank, unless the
    local size is the world size: then every rank is on this one node. Nodes may hold
    different numbers of ranks, in any order. PALS_NODEID, where set, is the node index. The master
    comes from MASTER_ADDR / MASTER_PORT, else an enclosing scheduler's allocation, else
    `distenv.resolve` finds it over MPI (mpi4py; on one node rank 0 sends 127.0.0.1); a one-node
    job without mpi4py takes 127.0.0.1 and a port derived from the launch (`launch_port`, or the
    PMI server behind ``PMI_FD`` under Hydra).

    The job's identity (its export tag, from which the rendezvous scope is made) is
    ``PMIX_NAMESPACE`` where the launcher is PMIx based (Open MPI 4/5, ``srun --mpi=pmix``,
    jsrun), ``PALS_APID`` under Cray PALS; Hydra exports none, so its tag holds only the world
    size, and its rendezvous scope only that unless rank 0's master is exchanged over MPI
    (docs/security.md).
    """

    name = "mpi"
    how_to_start = (
        "start it with `mpirun -np 4 python train.py ...` (Open MPI) or `mpiexec -n 4 python "
        "train.py ...` (MPICH, Intel MPI), or with `srun --mpi=pmix` inside a Slurm job"
    )
    variables = (
        *_declare(),
        Var(
            "PMIX_NAMESPACE", "(export tag)", "no", "PMIx: this launch's namespace (Open MPI, srun)"
        ),
        Var("PALS_APID", "(export tag)", "no", "Cray PALS: this launch's application id"),
        PMI_FD,
        *MASTER_VARS,
    )

    def _flavor(self, reader: Reader) -> Flavor | None:
        for flavor in FLAVORS:
            if reader.has(flavor.rank):
                return flavor
        return None

    def detect(self, env: Mapping[str, str]) -> bool:
        return self._flavor(self.reader(env)) is not None

    def world(self, env: Mapping[str, str]) -> World | None:
        reader = self.reader(env)
        flavor = self._flavor(reader)
        if flavor is None:
            return None
        size = reader.optional_int(*flavor.size, minimum=1) if flavor.size else None
        return reader.integer(flavor.rank), size

    def placed_rank_info(self, env: Mapping[str, str], nodes: Nodes | None) -> RankInfo:
        reader = self.reader(env)
        flavor = self._flavor(reader)
        if flavor is None:
            raise MissingVariableError(
                self.name, FLAVORS[0].rank, hint="start the ranks with mpirun or mpiexec"
            )
        hint = f"{flavor.name} sets these when it starts the ranks; start them with its launcher"
        if not flavor.size:
            raise MissingVariableError(
                self.name,
                "PMI_SIZE",
                hint=f"${flavor.rank} alone carries no world size; under srun --mpi=pmix use "
                "--launcher slurm or auto, elsewhere start the ranks with mpirun/mpiexec",
            )
        rank = reader.integer(flavor.rank, hint=hint)
        size_var, size_text = reader.require(*flavor.size, hint=hint)
        world_size = reader.parse_int(size_var, size_text, minimum=1)
        local_var, local_text = reader.require(
            *flavor.local_rank,
            hint=f"${flavor.rank} and ${size_var} without ${flavor.local_rank[0]} are no "
            f"{flavor.name.split(' (')[0]} launch but a PMI server's (srun --mpi=pmi2, Flux's pmi or cray-pals "
            "plug-in): inside a Slurm step or a Flux job use --launcher auto, which reads the "
            "scheduler's variables; elsewhere start the ranks with mpirun/mpiexec",
        )
        local_rank = reader.parse_int(local_var, local_text)
        lsize_var, lsize_text = reader.require(*flavor.local_size, hint=hint)
        local_size = reader.parse_int(lsize_var, lsize_text, minimum=1)
        sources = {
            "rank": flavor.rank,
            "world_size": size_var,
            "local_rank": local_var,
            "local_world_size": lsize_var,
        }
        node = reader.first(*flavor.node)
        node_rank: int | None = None
        num_nodes: int | None = None
        if nodes is not None:
            node_rank, num_nodes = nodes.node_rank, nodes.num_nodes
            sources.update(node_rank=nodes.node_var, num_nodes=nodes.count_var)
        elif node is not None:
            # No node count beside it: the roll call counts the hosts.
            node_rank = reader.parse_int(*node)
            sources["node_rank"] = node[0]
        if num_nodes is None and local_size == world_size:
            # Every rank of the job is on this node: one node, nothing to exchange.
            node_rank, num_nodes = 0, 1
            sources.update(node_rank=lsize_var, num_nodes=lsize_var)
        return RankInfo.checked(
            self.name,
            sources,
            rank=rank,
            world_size=world_size,
            local_rank=local_rank,
            local_world_size=local_size,
            node_rank=node_rank,
            num_nodes=num_nodes,
            master_addr=None,
            master_port=None,
            job_id=None,
        )

    def launch_port(self, env: Mapping[str, str]) -> int | None:
        """Return a port every rank of this launch derives alike from its identity, or None.

        ``PMIX_NAMESPACE`` (Open MPI 4/5, ``srun --mpi=pmix``) or ``PALS_APID`` names the launch;
        Hydra exports no identity (None). A one-node job without mpi4py uses it with 127.0.0.1
        (`distenv.detection.pipeline`).
        """
        reader = self.reader(env)
        launch = reader.get("PMIX_NAMESPACE") or reader.get("PALS_APID")
        return None if launch is None else scheduler_port(launch, "mpi")

    def scope(self, env: Mapping[str, str]) -> str:
        # PMIx launchers and Cray PALS name the launch; Hydra names nothing every rank shares but
        # the size.
        reader = self.reader(env)
        flavor = self._flavor(reader)
        size = None
        if flavor is not None and flavor.size:
            number = reader.optional_int(*flavor.size, minimum=1)
            size = None if number is None else str(number)
        return scope_tag(self.name, reader.get("PMIX_NAMESPACE") or reader.get("PALS_APID"), size)
