"""The `azureml` launcher backend: Azure Machine Learning's MPI and PyTorch distributions.

Azure ML cannot run on the project's test machines; the tests use environments recorded from its
documentation ("Distributed GPU training guide", learn.microsoft.com/azure/machine-learning/
how-to-train-distributed-gpu, sections "Environment variables from Open MPI" and "PyTorch", SDK v1
and v2 editions), and the docs say so.
"""

from __future__ import annotations

from collections.abc import Mapping

from distenv._hosts import check_hostname
from distenv.errors import (
    InconsistentEnvironmentError,
    InvalidVariableError,
    MissingVariableError,
    NotLaunchedError,
    shown,
)
from distenv.launchers.base import Scheduler, World
from distenv.master import (
    LOCAL_HOST,
    MASTER_VARS,
    Default,
    explicit_master,
    scheduler_port,
    scope_tag,
)
from distenv.rankinfo import RankInfo
from distenv.variables import Reader, Var

__all__ = ["AzuremlLauncher"]

MULTI = "AZ_BATCH_MASTER_NODE"
SINGLE = "AZ_BATCHAI_MPI_MASTER_NODE"
RUN_ID = "AZUREML_RUN_ID"
NODES = "AZUREML_NODE_COUNT"
# The PyTorch distribution's per-process variables (the guide's "PyTorch" section): Azure ML
# starts process_count_per_instance processes on each node itself, with RANK and LOCAL_RANK per
# process and WORLD_SIZE, NODE_RANK, MASTER_ADDR and MASTER_PORT per node, but no LOCAL_WORLD_SIZE.
PER_PROCESS = ("RANK", "LOCAL_RANK", "NODE_RANK")
PYTORCH_HINT = (
    "Azure ML's PyTorch distribution sets it for each process it starts: give the command job a "
    "distribution of type pytorch with process_count_per_instance, and do not set it yourself"
)
START_HINT = (
    "give the command job a distribution (type mpi, with process_count_per_instance) so that "
    "Azure ML starts the ranks with mpirun"
)


class AzuremlLauncher(Scheduler):
    """The processes of Azure ML's PyTorch distribution, and the nodes of its MPI distribution.

    | variable | fills | required |
    |---|---|---|
    | AZ_BATCH_MASTER_NODE | master_addr, master_port: 'host:port', MPI jobs of several nodes | one of the three |
    | AZ_BATCHAI_MPI_MASTER_NODE | master_addr: 'host', an MPI job of one node | one of the three |
    | AZUREML_RUN_ID | job_id, master_port (one node), scope | one of the three |
    | RANK, LOCAL_RANK | PyTorch distribution: rank, local_rank (per process) | PyTorch distribution |
    | WORLD_SIZE, NODE_RANK | PyTorch distribution: world_size, node_rank (per node) | PyTorch distribution |
    | AZUREML_NODE_COUNT | PyTorch distribution: num_nodes, local_world_size = WORLD_SIZE / nodes | no |
    | MASTER_ADDR, MASTER_PORT, DISTENV_SCOPE, DISTENV_MASTER_ADDR_FORMAT | master (set by Azure ML's PyTorch distribution) | no |

    PyTorch distribution: Azure ML starts every process itself with torchrun-like variables but
    no LOCAL_WORLD_SIZE; the `pytorch` backend leaves such a process to this one. Without
    AZUREML_NODE_COUNT the node count and local size come from init_dist's roll call.

    MPI distribution: Azure ML builds the mpirun command itself; its ranks carry Open MPI's
    variables but no MASTER_ADDR, which this backend supplies as the enclosing allocation's
    master. A process with its variables but no MPI rank is rank 0 of 1 on one node, and refused
    on several.
    """

    name = "azureml"
    how_to_start = "submit an Azure ML command job with a pytorch or mpi distribution"
    variables = (
        Var(
            MULTI,
            "master_addr",
            "one of the three",
            "'host:port' of the primary node (several nodes)",
        ),
        Var(SINGLE, "master_addr", "one of the three", "the primary node's host (one node)"),
        Var(RUN_ID, "job_id", "one of the three", "the run's id (azureml-core reads it)"),
        Var("RANK", "rank", "PyTorch distribution", "the process's global rank"),
        Var("LOCAL_RANK", "local_rank", "PyTorch distribution", "the process's rank on its node"),
        Var("WORLD_SIZE", "world_size", "PyTorch distribution", "processes of the job"),
        Var("NODE_RANK", "node_rank", "PyTorch distribution", "this node's index"),
        Var(NODES, "num_nodes", "no", "the job's instance_count (undocumented; scripts read it)"),
        *MASTER_VARS,
    )

    def detect(self, env: Mapping[str, str]) -> bool:
        reader = self.reader(env)
        return reader.has(MULTI) or reader.has(SINGLE) or self._per_process(reader)

    def _per_process(self, reader: Reader) -> bool:
        """Return whether this is a process of the PyTorch distribution: Azure ML's marks and a
        per-process variable (LOCAL_WORLD_SIZE, which Azure ML never sets, goes to `pytorch`)."""
        marked = reader.has(RUN_ID) or reader.has(MULTI) or reader.has(SINGLE)
        return marked and any(reader.has(name) for name in PER_PROCESS)

    def world(self, env: Mapping[str, str]) -> World | None:
        reader = self.reader(env)
        if not self._per_process(reader):
            return None
        try:
            return reader.integer("RANK"), reader.optional_int("WORLD_SIZE", minimum=1)
        except (InvalidVariableError, MissingVariableError):
            return None

    def _pytorch(self, reader: Reader) -> RankInfo:
        """Read the PyTorch distribution's process: torchrun's names, no LOCAL_WORLD_SIZE."""
        rank = reader.integer("RANK", hint=PYTORCH_HINT)
        world_size = reader.integer("WORLD_SIZE", hint=PYTORCH_HINT, minimum=1)
        local_rank = reader.integer("LOCAL_RANK", hint=PYTORCH_HINT)
        node_rank = reader.integer("NODE_RANK", hint=PYTORCH_HINT)
        nodes = reader.optional_int(NODES, hint=PYTORCH_HINT, minimum=1)
        sources = {
            "rank": "RANK",
            "world_size": "WORLD_SIZE",
            "local_rank": "LOCAL_RANK",
            "node_rank": "NODE_RANK",
        }
        per_node = None
        if nodes is not None:
            per_node = self._per_node(rank, world_size, local_rank, node_rank, nodes)
            sources.update(num_nodes=NODES, local_world_size=NODES)
        addr, port = explicit_master(reader)
        if addr is None or port is None:
            missing = "MASTER_PORT" if addr else "MASTER_ADDR"
            raise MissingVariableError(self.name, missing, hint=PYTORCH_HINT)
        return RankInfo.checked(
            self.name,
            sources,
            rank=rank,
            world_size=world_size,
            local_rank=local_rank,
            local_world_size=per_node,
            node_rank=node_rank,
            num_nodes=nodes,
            master_addr=addr,
            master_port=port,
            job_id=reader.get(RUN_ID),
        )

    def _per_node(self, rank: int, world: int, local: int, node: int, nodes: int) -> int:
        """Return the processes per node, refusing a layout Azure ML's launch cannot make."""
        problem, variable, value = "", "", ""
        if node >= nodes:
            problem = f"$NODE_RANK={node} is not below ${NODES}={nodes}"
            variable, value = "NODE_RANK", str(node)
        elif world % nodes:
            problem = f"$WORLD_SIZE={world} is not a multiple of ${NODES}={nodes}"
            variable, value = "WORLD_SIZE", str(world)
        elif rank != node * (world // nodes) + local:
            # process_count_per_instance processes on every node, numbered node by node.
            problem = (
                f"$RANK={rank} is not $NODE_RANK={node} x {world // nodes} processes per node "
                f"+ $LOCAL_RANK={local}"
            )
            variable, value = "RANK", str(rank)
        if problem:
            raise InconsistentEnvironmentError(
                self.name, problem, hint=PYTORCH_HINT, variable=variable, value=value
            )
        return world // nodes

    def scope(self, env: Mapping[str, str]) -> str:
        return scope_tag(self.name, self.reader(env).get(RUN_ID), None)

    def _master(self, reader: Reader) -> Default | None:
        """Return the primary node with the documented port, or a port derived from the run."""
        run = reader.get("AZUREML_RUN_ID") or "0"
        both = reader.get(MULTI)
        if both is not None:
            return Default(*self._host_port(both), source=self.name, variable=MULTI)
        single = reader.get(SINGLE)
        if single is None:
            return None
        host = check_hostname(self.name, SINGLE, single)
        return Default(host, scheduler_port(run, "mpi"), source=self.name, variable=SINGLE)

    def _host_port(self, value: str) -> tuple[str, int]:
        """Parse AZ_BATCH_MASTER_NODE: ``ip:port`` (an IPv6 address in brackets), nothing more."""
        expected = "'host:port' (an IPv6 host in brackets: '[fe80::1]:6105')"
        host, _, port_text = value.rpartition(":")
        # A colon left in an unbracketed host is a second port or a mangled value, not IPv6.
        if not host or (":" in host and not host.startswith("[")):
            raise InvalidVariableError(self.name, MULTI, value, expected)
        if not (port_text.isascii() and port_text.isdigit()) or len(port_text) > 5:
            raise InvalidVariableError(self.name, MULTI, value, expected)
        port = int(port_text)
        if not 1 <= port <= 65535:
            raise InvalidVariableError(self.name, MULTI, value, "a port in [1, 65535]")
        try:
            host = check_hostname(self.name, MULTI, host)
        except InvalidVariableError:
            raise InvalidVariableError(
                self.name,
                MULTI,
                value,
                "'host:port' whose host is an IP address or a host name (at most 253 "
                "characters, labels of 1 to 63)",
            ) from None
        return host, port

    def allocation_master(self, env: Mapping[str, str]) -> Default | None:
        return self._master(self.reader(env))

    def default_master(self, env: Mapping[str, str]) -> Default | None:
        reader = self.reader(env)
        if not reader.has(SINGLE) and not reader.has(MULTI):
            return None
        return Default(LOCAL_HOST, scheduler_port(reader.get("AZUREML_RUN_ID") or "0", "0"))

    def rank_info(self, env: Mapping[str, str]) -> RankInfo:
        reader = self.reader(env)
        if self._per_process(reader):
            return self._pytorch(reader)
        master = reader.get(MULTI)
        if master is not None:
            self._host_port(master)  # a malformed value is reported as such first
            raise NotLaunchedError(
                self.name,
                f"${MULTI} is {shown(master)}: a job of several nodes, but no MPI launcher "
                "numbered this process (no OMPI_COMM_WORLD_RANK), so it would run as rank 0 of 1 beside "
                "the other nodes",
                hint=START_HINT,
                variable=MULTI,
                value=master,
            )
        return RankInfo.single(self.name, master_addr=None, job_id=reader.get("AZUREML_RUN_ID"))
