"""The `sagemaker` launcher backend: Amazon SageMaker training jobs.

SageMaker cannot run on the project's test machines; the tests use environments recorded from the
SageMaker Training Toolkit's source (aws/sagemaker-training-toolkit v5.1.0:
``src/sagemaker_training/environment.py`` ``to_env_vars`` and ``get_master_hostname``, ``mapping.py``,
``torch_distributed.py``, ``mpi.py``), and the docs say so.
"""

from __future__ import annotations

from collections.abc import Mapping

from distenv._hosts import check_hostname
from distenv.errors import InconsistentEnvironmentError, InvalidVariableError, shown
from distenv.launchers.base import Scheduler
from distenv.master import MASTER_VARS, Default, scheduler_port, scope_tag
from distenv.rankinfo import RankInfo
from distenv.variables import Reader, Var

__all__ = ["SagemakerLauncher"]

HOSTS_HINT = "SageMaker sets it in every training container; do not set it yourself"
# SM_HOSTS of the largest job SageMaker runs is a few kilobytes; past this it is corrupt.
MAX_HOSTS_CHARS = 1_000_000


class SagemakerLauncher(Scheduler):
    """The process SageMaker starts on each host, and the hosts of its MPI mode.

    | variable | fills | required |
    |---|---|---|
    | SM_HOSTS | num_nodes, master_addr (its first host), detection | yes |
    | SM_CURRENT_HOST | rank, node_rank (its index in SM_HOSTS) | yes |
    | SM_IS_HETERO | refuses a heterogeneous cluster's default master | no |
    | TRAINING_JOB_NAME | job_id, master_port, scope | no |
    | MASTER_ADDR, MASTER_PORT, DISTENV_SCOPE, DISTENV_MASTER_ADDR_FORMAT | master | no |

    Without a distribution the toolkit runs the entry point once per host: rank = the host's
    index, world size = hosts. ``torch_distributed`` runs torchrun (its contract answers);
    MPI mode (``mpi``, ``smdistributed``) runs mpirun, whose ranks carry ``OMPI_*`` but no
    MASTER_ADDR: the master is SM_HOSTS' first host. mpirun's ``-x`` copies the first host's
    SM_CURRENT_HOST to every rank, so it numbers no node there.
    """

    name = "sagemaker"
    how_to_start = "run it as a SageMaker training job's entry point"
    variables = (
        Var(
            "SM_HOSTS", "num_nodes", "yes", 'JSON list of the job\'s hosts: \'["algo-1","algo-2"]\''
        ),
        Var("SM_CURRENT_HOST", "node_rank", "yes", "this container's host, e.g. 'algo-2'"),
        Var("SM_IS_HETERO", "(master)", "no", "'true' for a heterogeneous cluster"),
        Var("TRAINING_JOB_NAME", "job_id", "no", "the training job's name (port and scope)"),
        *MASTER_VARS,
    )

    def detect(self, env: Mapping[str, str]) -> bool:
        return self.reader(env).has("SM_HOSTS")

    def _hosts(self, reader: Reader) -> list[str]:
        _, text = reader.require("SM_HOSTS", hint=HOSTS_HINT)
        expected = 'a JSON list of host names, e.g. ["algo-1","algo-2"]'
        # A list of host names nests nothing: a bracket inside it is no host name, and a deeply
        # nested value would exhaust the parser's recursion. Bounded before it is parsed.
        body = text.strip()[1:]
        if len(text) > MAX_HOSTS_CHARS or "[" in body or "{" in body:
            raise InvalidVariableError(
                self.name,
                "SM_HOSTS",
                text,
                f"{expected}: one flat list of at most {MAX_HOSTS_CHARS} characters",
            )
        import json  # only here: detection of every other launcher never parses JSON

        try:
            hosts = json.loads(text)
        except (ValueError, RecursionError):
            hosts = None
        if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) for h in hosts):
            raise InvalidVariableError(self.name, "SM_HOSTS", text, expected)
        if len(set(hosts)) != len(hosts):
            raise InvalidVariableError(self.name, "SM_HOSTS", text, "distinct host names")
        return [check_hostname(self.name, "SM_HOSTS", host) for host in hosts]

    def _index(self, reader: Reader, hosts: list[str]) -> int:
        _, current = reader.require("SM_CURRENT_HOST", hint=HOSTS_HINT)
        if current not in hosts:
            listed = reader.get("SM_HOSTS") or ""
            raise InconsistentEnvironmentError(
                self.name,
                f"$SM_CURRENT_HOST={shown(current)} is not in $SM_HOSTS={shown(listed)}",
                hint=HOSTS_HINT,
                variable="SM_CURRENT_HOST",
                value=current,
            )
        return hosts.index(current)

    def _hetero(self, reader: Reader) -> bool:
        """Return SM_IS_HETERO as a boolean (the toolkit writes JSON's true/false)."""
        value = reader.get("SM_IS_HETERO")
        if value is None or value.strip().lower() == "false":
            return False
        if value.strip().lower() == "true":
            return True
        raise InvalidVariableError(
            self.name, "SM_IS_HETERO", value, "'true' or 'false'", hint=HOSTS_HINT
        )

    def _job(self, reader: Reader) -> str:
        return reader.get("TRAINING_JOB_NAME") or "0"

    def scope(self, env: Mapping[str, str]) -> str:
        return scope_tag(self.name, self.reader(env).get("TRAINING_JOB_NAME"), None)

    def rank_info(self, env: Mapping[str, str]) -> RankInfo:
        reader = self.reader(env)
        hosts = self._hosts(reader)
        index = self._index(reader, hosts)
        return RankInfo.one_per_node(
            self.name,
            {"rank": "SM_CURRENT_HOST", "world_size": "SM_HOSTS"},
            index,
            len(hosts),
            job_id=reader.get("TRAINING_JOB_NAME"),
        )

    def _first_host(self, reader: Reader, step: str) -> Default:
        if self._hetero(reader):
            # get_master_hostname takes the first host of the distribution's instance groups,
            # which SM_HOSTS' order does not show.
            return Default(
                None,
                scheduler_port(self._job(reader), step),
                missing="a heterogeneous cluster's master is the first host of the instance "
                "groups that run the distribution, not SM_HOSTS' first: set MASTER_ADDR to it",
                source=self.name,
            )
        host = self._hosts(reader)[0]
        port = scheduler_port(self._job(reader), step)
        return Default(host, port, source=self.name, variable="SM_HOSTS")

    def default_master(self, env: Mapping[str, str]) -> Default | None:
        reader = self.reader(env)
        return self._first_host(reader, "0") if reader.has("SM_HOSTS") else None

    def allocation_master(self, env: Mapping[str, str]) -> Default | None:
        reader = self.reader(env)
        return self._first_host(reader, "mpi") if reader.has("SM_HOSTS") else None
