"""`RankInfo`: where this process stands in the job, in torchrun's vocabulary."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from distenv.errors import InconsistentEnvironmentError, MasterResolutionError

__all__ = ["ENV_CONTRACT", "LAYOUT_FIELDS", "RankInfo", "check_fields"]

# Fields and types of the JSON object `distenv info --json` prints; external tools rely on them.
JSON_FIELDS = (
    "launcher",
    "rank",
    "world_size",
    "local_rank",
    "local_world_size",
    "node_rank",
    "num_nodes",
    "master_addr",
    "master_port",
    "job_id",
    "restart_count",
)
#: The fields a launcher may leave unknown (None): its environment names no node layout (Open MPI
#: 5 or Hydra alone, Flux's node index and tasks per node, PALS's node count). `init_dist`'s roll
#: call fills them from the ranks' host names (`distenv.bootstrap.records.node_hosts`, `host_sizes`).
LAYOUT_FIELDS = ("node_rank", "num_nodes", "local_world_size")


def check_fields(
    launcher: str, fields: Mapping[str, Any], sources: Mapping[str, str] | None = None
) -> None:
    """Check RankInfo fields for consistency, naming each by its source variable where known.

    Args:
        launcher: Who is asking, for the error message.
        fields: RankInfo field values by name.
        sources: Field name -> the environment variable it was read from.

    Raises:
        InconsistentEnvironmentError: On the first field that does not fit.
    """
    sources = sources or {}

    def label(name: str) -> str:
        source = sources.get(name)
        return f"{name}={fields[name]!r} (${source})" if source else f"{name}={fields[name]!r}"

    def fail(problem: str) -> None:
        hint = (
            f"these values come from {launcher}'s variables, which contradict each other; let "
            "the launcher set them, never override them by hand"
            if sources
            else None
        )
        raise InconsistentEnvironmentError(launcher, problem, hint=hint)

    for name in JSON_FIELDS[1:7]:
        # The node layout may be unknown (None) until the roll call fills it (`LAYOUT_FIELDS`).
        if type(fields[name]) is not int and not (name in LAYOUT_FIELDS and fields[name] is None):
            fail(f"{label(name)} is not an int")
    # The global pair first: a launcher may derive the node fields from the rank (rank //
    # local size), and an out-of-range rank is then the cause to name, with its variable; the
    # node before the local pair, whose size may be read at the node's index.
    pairs = (("rank", "world_size"), ("node_rank", "num_nodes"), ("local_rank", "local_world_size"))
    for low, high in pairs:
        top = fields[high] if fields[high] is not None else fields["world_size"]
        if fields[high] is not None and fields[high] < 1:
            fail(f"{label(high)} must be at least 1")
        if fields[low] is not None and not 0 <= fields[low] < top:
            fail(f"{label(low)} is outside [0, {label(high) if fields[high] else top})")
    for part in ("local_world_size", "num_nodes"):
        if fields[part] is not None and fields[part] > fields["world_size"]:
            fail(f"{label(part)} exceeds {label('world_size')}")
    port = fields["master_port"]
    if port is not None and (type(port) is not int or not 1 <= port <= 65535):
        fail(f"{label('master_port')} is not a port in [1, 65535]")
    addr = fields["master_addr"]
    if addr is not None and (not isinstance(addr, str) or not addr):
        fail(f"{label('master_addr')} is not a host name")
    restarts = fields.get("restart_count", 0)
    if type(restarts) is not int or restarts < 0:
        fail(f"{label('restart_count')} is not a non-negative int")


# torchrun's environment contract (torch.distributed.run, "Environment Variables"), in the order
# `RankInfo.to_env` writes it.
ENV_CONTRACT = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


@dataclass(frozen=True, kw_only=True)
class RankInfo:
    """Where this process stands in a distributed job.

    A launcher backend builds one from its scheduler's variables; `init_dist` turns it into a process
    group. It validates itself on construction and never touches the process.

    Attributes:
        launcher: The launcher backend that produced it (`pytorch`, `mpi`, `slurm`, `lsf`, `none`, or
            a plug-in's name).
        rank: Global rank, ``0 <= rank < world_size``.
        world_size: Number of processes in the job.
        local_rank: Rank among the processes on this node.
        local_world_size: Number of processes on this node; ``None`` while unknown (Flux with
            several tasks on each of several nodes names none): `init_dist`'s roll call counts
            the ranks on this rank's host and fills it.
        node_rank: Index of this node, ``0 <= node_rank < num_nodes``; ``None`` while unknown:
            where the launcher's environment names no node layout (Open MPI 5 or MPICH's Hydra
            alone, Flux), `init_dist`'s roll call numbers the hosts in order of their lowest
            rank and fills it.
        num_nodes: Number of nodes the job's processes run on; ``None`` while unknown (as
            `node_rank`).
        master_addr: Host of rank 0's store, verbatim (never DNS-resolved); ``None`` only until an
            MPI master (or a single process's free port) is resolved by `distenv.resolve`.
        master_port: Port of rank 0's store; ``None`` under the same condition.
        job_id: The scheduler's job id, when there is one.
        restart_count: How many times the launcher restarted this job or rank before this run:
            Slurm's ``SLURM_RESTART_COUNT`` (after a requeue), torchrun's
            ``TORCHELASTIC_RESTART_COUNT``, 1 when LSF's ``LSB_RESTART`` is ``Y``; else 0. A
            training script resumes from its checkpoint when it is above 0.
    """

    launcher: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int | None
    node_rank: int | None
    num_nodes: int | None
    master_addr: str | None
    master_port: int | None
    job_id: str | None = None
    restart_count: int = 0

    def __post_init__(self) -> None:
        # to_dict, not dataclasses.asdict: every field is a scalar, and asdict's recursive deep
        # copy made validation the slowest part of detection.
        check_fields(self.launcher, self.to_dict())

    @classmethod
    def checked(cls, launcher: str, sources: Mapping[str, str], **fields: Any) -> RankInfo:
        """Build a RankInfo whose validation errors name the variables in `sources`."""
        check_fields(launcher, {"job_id": None, "restart_count": 0, **fields}, sources)
        return cls(launcher=launcher, **fields)

    @classmethod
    def one_per_node(
        cls,
        launcher: str,
        sources: Mapping[str, str],
        node: int,
        nodes: int,
        *,
        master_addr: str | None = None,
        master_port: int | None = None,
        job_id: str | None = None,
    ) -> RankInfo:
        """Return the one process of node `node` of `nodes` (rank = node index), validated.

        For launchers that start one process per node or pod (a Kubeflow pod with one process,
        an Indexed Job, SageMaker): errors name the variables in `sources`.
        """
        return cls.checked(
            launcher,
            sources,
            rank=node,
            world_size=nodes,
            local_rank=0,
            local_world_size=1,
            node_rank=node,
            num_nodes=nodes,
            master_addr=master_addr,
            master_port=master_port,
            job_id=job_id,
        )

    @classmethod
    def single(
        cls,
        launcher: str,
        *,
        master_addr: str | None = "127.0.0.1",
        master_port: int | None = None,
        job_id: str | None = None,
        restart_count: int = 0,
    ) -> RankInfo:
        """Return rank 0 of a 1-process world."""
        return cls(
            launcher=launcher,
            rank=0,
            world_size=1,
            local_rank=0,
            local_world_size=1,
            node_rank=0,
            num_nodes=1,
            master_addr=master_addr,
            master_port=master_port,
            job_id=job_id,
            restart_count=restart_count,
        )

    @property
    def is_resolved(self) -> bool:
        """Whether the master address and port are known."""
        return self.master_addr is not None and self.master_port is not None

    @property
    def layout_known(self) -> bool:
        """Whether the node layout is known (else `init_dist`'s roll call fills it)."""
        return (
            self.node_rank is not None
            and self.num_nodes is not None
            and self.local_world_size is not None
        )

    @property
    def who(self) -> str:
        """Return ``rank R of W``: how every message of distenv names this rank."""
        return f"rank {self.rank} of {self.world_size}"

    @property
    def is_main(self) -> bool:
        """Whether this is global rank 0."""
        return self.rank == 0

    def replace(self, **changes: Any) -> RankInfo:
        """Return a copy with `changes` applied (and validated)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready mapping of `distenv info --json` (ints stay ints)."""
        return {name: getattr(self, name) for name in JSON_FIELDS}

    def to_env(self) -> dict[str, str]:
        """Return torchrun's environment contract for this rank (the ``env://`` variables).

        GROUP_RANK, GROUP_WORLD_SIZE and LOCAL_WORLD_SIZE are left out while unknown
        (`layout_known`): `init_dist` exports them once its roll call has filled them.

        Raises:
            MasterResolutionError: If the master is not resolved yet.
        """
        if not self.is_resolved:
            raise MasterResolutionError(
                self.launcher,
                "the master address/port is not resolved yet",
                hint="call distenv.resolve(info) first (init_dist and setup do)",
            )
        values = (
            self.rank,
            self.world_size,
            self.local_rank,
            self.local_world_size,
            self.node_rank,
            self.num_nodes,
            self.rank,
            self.world_size,
            self.master_addr,
            self.master_port,
        )
        return {
            name: str(value)
            for name, value in zip(ENV_CONTRACT, values, strict=True)
            if value is not None
        }
