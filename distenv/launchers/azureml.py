"""The `azureml` launcher backend: the master of an Azure Machine Learning MPI job.

Azure ML cannot run on the project's test machines; the tests use environments recorded from its
documentation ("Distributed GPU training guide", learn.microsoft.com/azure/machine-learning/
how-to-train-distributed-gpu, section "Environment variables from Open MPI", SDK v1 and v2
editions), and the docs say so.
"""

from __future__ import annotations

from collections.abc import Mapping

from distenv._hosts import check_hostname
from distenv.errors import InvalidVariableError, NotLaunchedError, shown
from distenv.launchers.base import Nodes, Scheduler
from distenv.master import LOCAL_HOST, MASTER_VARS, Default, scheduler_port, scope_tag
from distenv.rankinfo import RankInfo
from distenv.variables import Reader, Var

__all__ = ["AzuremlLauncher"]

MULTI = "AZ_BATCH_MASTER_NODE"
SINGLE = "AZ_BATCHAI_MPI_MASTER_NODE"
START_HINT = (
    "give the command job a distribution (type mpi, with process_count_per_instance) so that "
    "Azure ML starts the ranks with mpirun"
)


class AzuremlLauncher(Scheduler):
    """The nodes of an Azure ML MPI job; its ranks are MPI's (``OMPI_COMM_WORLD_*``).

    | variable | fills | required |
    |---|---|---|
    | AZ_BATCH_MASTER_NODE | master_addr, master_port: 'host:port', jobs of several nodes | one of the two |
    | AZ_BATCHAI_MPI_MASTER_NODE | master_addr: 'host', a job of one node | one of the two |
    | AZUREML_RUN_ID | job_id, master_port (one node), scope | no |
    | MASTER_ADDR, MASTER_PORT, DISTENV_SCOPE, DISTENV_MASTER_ADDR_FORMAT | master | no |

    Azure ML builds the mpirun command itself; its ranks carry Open MPI's variables but no
    MASTER_ADDR, which this backend supplies as the enclosing allocation's master. Azure ML states
    no rank of its own: a process with its variables but no MPI rank is rank 0 of 1 on one node,
    and refused on several.
    """

    name = "azureml"
    how_to_start = "submit an Azure ML command job with an mpi distribution"
    variables = (
        Var(
            MULTI,
            "master_addr",
            "one of the two",
            "'host:port' of the primary node (several nodes)",
        ),
        Var(SINGLE, "master_addr", "one of the two", "the primary node's host (one node)"),
        Var("AZUREML_RUN_ID", "job_id", "no", "the run's id (azureml-core reads it)"),
        *MASTER_VARS,
    )

    def detect(self, env: Mapping[str, str]) -> bool:
        reader = self.reader(env)
        return reader.has(MULTI) or reader.has(SINGLE)

    def scope(self, env: Mapping[str, str]) -> str:
        return scope_tag(self.name, self.reader(env).get("AZUREML_RUN_ID"), None)

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

    def daemon_nodes(self, env: Mapping[str, str]) -> Nodes | None:
        # No Azure ML variable numbers the nodes: init_dist's roll call numbers the ranks' hosts.
        return None
