"""The `aws-batch` launcher backend: the nodes of an AWS Batch multi-node parallel job.

AWS Batch cannot run on the project's test machines; the tests use environments recorded from the
AWS Batch User Guide ("Multi-node parallel jobs" > "Environment variables", docs.aws.amazon.com/
batch/latest/userguide/mnp-env-vars.html; "AWS Batch job environment variables", job_env_vars.html;
"Compute environment considerations for MNP", mnp-ce.html), and the docs say so. Two
``distenv run`` given those variables on loopback are tested for real.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from distenv.errors import InconsistentEnvironmentError, InvalidVariableError, shown
from distenv.launchers.base import Scheduler, World
from distenv.master import MASTER_VARS, Default, scheduler_port, scope_tag
from distenv.rankinfo import RankInfo
from distenv.variables import Reader, Var, decimal

__all__ = ["AwsBatchLauncher"]

COUNT = "AWS_BATCH_JOB_NUM_NODES"
INDEX = "AWS_BATCH_JOB_NODE_INDEX"
MAIN = "AWS_BATCH_JOB_MAIN_NODE_INDEX"
MAIN_IP = "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"
JOB = "AWS_BATCH_JOB_ID"
ATTEMPT = "AWS_BATCH_JOB_ATTEMPT"
HINT = "AWS Batch sets it in every node of a multi-node parallel job (AWS_BATCH_ is its prefix)"


def this_address() -> str | None:
    """Return the address the other nodes reach this one at: its private IPv4, or None.

    An MNP container has its own elastic network interface and "a primary private IP address"
    (awsvpc network mode, AWS Batch User Guide, mnp-ce.html): the address AWS hands the child
    nodes as AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS. It is the first IPv4 address of an
    interface that is up and no loopback, skipping link-local ones (169.254.0.0/16: the ECS
    agent's bridge to the task metadata endpoint). Read from the kernel's interface list
    (`distenv.system.netpath`, an ioctl: no subprocess, no network), on the main node only.
    """
    from distenv.system.netpath import interfaces  # here: only the main node needs its interfaces

    for interface in interfaces():
        if not interface.up or interface.loopback:
            continue
        for address in interface.addresses:
            ip = ipaddress.ip_address(address.split("%")[0])
            if ip.version == 4 and not ip.is_link_local and not ip.is_loopback:
                return address
    return None


class AwsBatchLauncher(Scheduler):
    """The container AWS Batch runs on each node of a multi-node parallel (MNP) job.

    | variable | fills | required |
    |---|---|---|
    | AWS_BATCH_JOB_NUM_NODES | num_nodes, detection | yes |
    | AWS_BATCH_JOB_NODE_INDEX | rank, node_rank (counted from the main node) | yes |
    | AWS_BATCH_JOB_MAIN_NODE_INDEX | node_rank: the main node is node 0 | yes |
    | AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS | master_addr | on child nodes |
    | AWS_BATCH_JOB_ID | job_id (without the node's ``#N``), master_port, scope | no |
    | AWS_BATCH_JOB_ATTEMPT | restart_count (attempt - 1), master_port | no |
    | MASTER_ADDR, MASTER_PORT, DISTENV_SCOPE, DISTENV_MASTER_ADDR_FORMAT | master | no |

    AWS Batch starts one container per node: a training script as its command is one rank per
    node, and ``distenv run -n K`` as its command starts K ranks per node of one job. Rank 0's
    store must be where the children are told to connect, the main node (which need not be
    index 0): nodes are numbered from it, ``(index - main) mod nodes``. The children's master is
    the main node's private IPv4 address; the main node, which AWS does not tell its own address,
    takes it from its interfaces (`this_address`): every rank must name the master alike. The
    port is derived from the job id without the ``#N`` that names each node's part of the job,
    and the attempt, alike on every node.
    """

    name = "aws-batch"
    aliases = ("awsbatch", "batch")
    how_to_start = (
        "submit an AWS Batch multi-node parallel job whose container command is "
        "`distenv run --nproc-per-node N train.py`"
    )
    variables = (
        Var(COUNT, "num_nodes", "yes", "the nodes of the multi-node parallel job"),
        Var(INDEX, "node_rank", "yes", "this node's index, 0 to num_nodes-1"),
        Var(
            MAIN, "(node numbering)", "yes", "the main node's index: node 0 of distenv's numbering"
        ),
        Var(
            MAIN_IP, "master_addr", "on child nodes", "the main node's private IPv4 (absent there)"
        ),
        Var(JOB, "job_id", "no", "'<job id>#<node index>' in a node of an MNP job"),
        Var(ATTEMPT, "restart_count", "no", "the job's attempt, the first is 1"),
        *MASTER_VARS,
    )

    def detect(self, env: Mapping[str, str]) -> bool:
        return self._detected(self.reader(env))

    def _detected(self, reader: Reader) -> bool:
        # Also asked by `default_master`: detection asks each public hook once (detection.layer).
        return any(reader.has(name) for name in (COUNT, INDEX, MAIN))

    def _nodes(self, reader: Reader) -> tuple[int, int, int]:
        """Return ``(index, main, num_nodes)``, each index checked against the node count."""
        count = reader.integer(COUNT, hint=HINT, minimum=1)
        index = reader.integer(INDEX, hint=HINT)
        main = reader.integer(MAIN, hint=HINT)
        for name, value in ((INDEX, index), (MAIN, main)):
            if value >= count:
                raise InconsistentEnvironmentError(
                    self.name,
                    f"${name}={value} is not below ${COUNT}={count}",
                    hint="AWS Batch numbers the nodes 0 to numNodes-1; check the job "
                    "definition's nodeProperties (numNodes, mainNode)",
                    variable=name,
                    value=str(value),
                )
        return index, main, count

    def _node_rank(self, reader: Reader) -> tuple[int, int]:
        index, main, count = self._nodes(reader)
        return (index - main) % count, count

    def _job(self, reader: Reader) -> str | None:
        """Return the job id without the node's ``#N``, refusing a suffix that is not this node."""
        job = reader.get(JOB)
        if job is None:
            return None
        base, sep, suffix = job.rpartition("#")
        if not sep:
            return job
        if not base or not (suffix.isascii() and suffix.isdigit()):
            raise InvalidVariableError(
                self.name, JOB, job, "a job id, or '<job id>#<node index>'", hint=HINT
            )
        index = reader.integer(INDEX, hint=HINT)
        if decimal(suffix) != index:  # not int(): a suffix may hold more than 4300 digits
            node = suffix if len(suffix) <= 20 else f"of {len(suffix)} digits"
            raise InconsistentEnvironmentError(
                self.name,
                f"${JOB}={shown(job)} names node {node} but ${INDEX}={index}",
                hint="AWS Batch sets both for the same node; unset any copy set in the job "
                "definition's environment",
                variable=JOB,
                value=job,
            )
        return base

    def _attempt(self, reader: Reader) -> int:
        return reader.optional_int(ATTEMPT, hint=HINT, minimum=1) or 1

    def _port(self, reader: Reader) -> int:
        return scheduler_port(self._job(reader) or "0", str(self._attempt(reader)))

    def restart_count(self, env: Mapping[str, str]) -> int:
        return self._attempt(self.reader(env)) - 1

    def world(self, env: Mapping[str, str]) -> World | None:
        reader = self.reader(env)
        return self._node_rank(reader) if reader.has(INDEX) else None

    def scope(self, env: Mapping[str, str]) -> str:
        job = self.reader(env).get(JOB)
        return scope_tag(self.name, job.rpartition("#")[0] or job if job else None, None)

    def rank_info(self, env: Mapping[str, str]) -> RankInfo:
        reader = self.reader(env)
        node, count = self._node_rank(reader)
        return RankInfo.checked(
            self.name,
            {"rank": INDEX, "world_size": COUNT},
            rank=node,
            world_size=count,
            local_rank=0,
            local_world_size=1,
            node_rank=node,
            num_nodes=count,
            master_addr=None,
            master_port=None,
            job_id=self._job(reader),
            restart_count=self._attempt(reader) - 1,
        )

    def _main_ip(self, reader: Reader) -> str | None:
        value = reader.get(MAIN_IP)
        if value is None:
            return None
        try:
            return str(ipaddress.IPv4Address(value.strip()))
        except ValueError:
            raise InvalidVariableError(
                self.name, MAIN_IP, value, "an IPv4 address, e.g. '10.0.1.5'", hint=HINT
            ) from None

    def default_master(self, env: Mapping[str, str]) -> Default | None:
        reader = self.reader(env)
        if not self._detected(reader):
            return None
        port = self._port(reader)
        ip = self._main_ip(reader)
        if ip is not None:
            return Default(ip, port, source=self.name, variable=MAIN_IP)
        index, main, _ = self._nodes(reader)
        if index != main:
            # MASTER_ADDR, where the user sets it, answers first (distenv.master rule 2).
            return Default(
                None,
                port,
                missing=f"node {index} is a child node (the main node is {main}), where AWS Batch "
                f"sets ${MAIN_IP}; set MASTER_ADDR to the main node's address if it is absent",
                source=self.name,
            )
        own = this_address()
        if own is None:
            return Default(
                None,
                port,
                missing="this is the main node, which AWS Batch does not tell its address, and "
                "it has no private IPv4 address on an interface that is up: set MASTER_ADDR to "
                "the address the child nodes reach it at",
                source=self.name,
            )
        return Default(own, port, source=self.name, variable="")

    def allocation_master(self, env: Mapping[str, str]) -> Default | None:
        # MPI ranks on other nodes carry the main node's variables (mpirun -x) or none: only the
        # children's address names the main node alike everywhere; else MPI's exchange decides.
        reader = self.reader(env)
        ip = self._main_ip(reader)
        return (
            None
            if ip is None
            else Default(ip, self._port(reader), source=self.name, variable=MAIN_IP)
        )
