"""The `vertex` launcher backend: replicas of a Vertex AI custom training job.

Vertex AI cannot run on the project's test machines; the tests use environments recorded from
Google's documentation (cloud.google.com/vertex-ai/docs/training/distributed-training, sections
"Structure of the training cluster" and "CLUSTER_SPEC"; AI Platform Training's "Configuring
distributed training for PyTorch" for the prebuilt PyTorch containers' MASTER_ADDR, MASTER_PORT,
WORLD_SIZE and RANK) and from googleapis/python-aiplatform v1.x
(``google/cloud/aiplatform/training_utils/environment_variables.py``: CLUSTER_SPEC,
CLOUD_ML_JOB_ID), and the docs say so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from distenv._hosts import check_hostname
from distenv.errors import (
    DistEnvError,
    InconsistentEnvironmentError,
    InvalidVariableError,
    NotLaunchedError,
    shown,
)
from distenv.launchers.base import Scheduler, World
from distenv.master import MASTER_VARS, Default, scope_tag
from distenv.rankinfo import RankInfo
from distenv.variables import Reader, Var

__all__ = ["VertexLauncher"]

SPEC = "CLUSTER_SPEC"
# workerPoolSpecs[0] is the primary replica, [1] the workers: they run the training script and
# form the training world, primary first. [2] holds parameter servers or Reduction Server
# replicas (Google's reduction server image, reached through NCCL, no rank of the world) and [3]
# evaluators, which run beside the training and join no process group.
TRAINING_POOLS = ("workerpool0", "workerpool1")
POOL = r"workerpool[0-9]"
# The CustomJobSpec in "job" makes CLUSTER_SPEC a few kilobytes; past a megabyte it is corrupt.
MAX_SPEC_CHARS = 1_000_000
SPEC_HINT = "Vertex AI sets CLUSTER_SPEC on every replica; do not set or edit it yourself"
EXPECTED = (
    'Vertex AI\'s JSON: {"cluster": {"workerpool0": ["host:port"], ...}, "task": {"type": '
    '"workerpool0", "index": 0}, ...}'
)


class Cluster(NamedTuple):
    """The training world as CLUSTER_SPEC describes it, and this replica's place in it."""

    node_rank: int
    num_nodes: int
    master: tuple[str, int]


class VertexLauncher(Scheduler):
    """One process per replica of a Vertex AI custom job, or the replica's ``distenv run``.

    | variable | fills | required |
    |---|---|---|
    | CLUSTER_SPEC | num_nodes, node_rank (and rank), master (workerpool0's replica), detection | yes |
    | CLOUD_ML_JOB_ID | job_id, scope | no |
    | RANK, WORLD_SIZE | prebuilt PyTorch containers: the replica's rank and the replicas (checked) | no |
    | MASTER_ADDR, MASTER_PORT, DISTENV_SCOPE, DISTENV_MASTER_ADDR_FORMAT | master | no |

    The training world is workerpool0 (the primary replica) then workerpool1 (the workers), in
    CLUSTER_SPEC's order: rank = the replica's place in it, world size = their replicas, master =
    workerpool0's first replica. A replica of workerpool2 (parameter servers, Reduction Server)
    or workerpool3 (evaluators) is no rank of it and is refused. The prebuilt PyTorch containers'
    MASTER_ADDR/MASTER_PORT win over workerpool0's address (explicit master); their RANK and
    WORLD_SIZE must agree with CLUSTER_SPEC (the agreement check of `distenv.detection`).
    """

    name = "vertex"
    aliases = ("vertex-ai",)
    how_to_start = (
        "submit a Vertex AI custom job whose worker pools run `distenv run --nproc-per-node N "
        "train.py` (or torchrun) on each replica"
    )
    variables = (
        Var(
            SPEC,
            "num_nodes, node_rank, (master)",
            "yes",
            "JSON: the worker pools' replicas ('host:port') and this task's pool and index",
        ),
        Var("CLOUD_ML_JOB_ID", "job_id", "no", "the custom job's id (scope)"),
        Var("RANK", "(checked)", "no", "prebuilt PyTorch containers: this replica's rank"),
        Var("WORLD_SIZE", "(checked)", "no", "prebuilt PyTorch containers: the replicas"),
        *MASTER_VARS,
    )

    def detect(self, env: Mapping[str, str]) -> bool:
        return self.reader(env).has(SPEC)

    def _invalid(self, text: str, what: str) -> InvalidVariableError:
        return InvalidVariableError(self.name, SPEC, text, f"{EXPECTED}; {what}", hint=SPEC_HINT)

    def _load(self, text: str) -> dict[str, Any]:
        """Parse CLUSTER_SPEC, bounded in size and nesting, into its top-level object."""
        if len(text) > MAX_SPEC_CHARS:
            raise self._invalid(text, f"at most {MAX_SPEC_CHARS} characters")
        import json  # only here: detection of every other launcher never parses JSON

        try:
            spec = json.loads(text)
        except RecursionError:  # nested past the parser's limit: no spec Vertex AI writes
            raise self._invalid(text, "it nests too deeply to be one") from None
        except ValueError as exc:  # truncated or not JSON at all
            raise self._invalid(text, f"it is no JSON ({str(exc)[:80]})") from None
        if not isinstance(spec, dict):
            raise self._invalid(text, "it is no JSON object")
        return spec

    def _pools(self, text: str, spec: dict[str, Any]) -> dict[str, list[tuple[str, int]]]:
        """Return the worker pools' replicas as ``(host, port)``, by pool name."""
        cluster = spec.get("cluster")
        if not isinstance(cluster, dict) or not cluster:
            raise self._invalid(text, 'its "cluster" is no object of worker pools')
        pools: dict[str, list[tuple[str, int]]] = {}
        for pool, replicas in cluster.items():
            if not re.fullmatch(POOL, pool):
                raise self._invalid(text, f"its cluster names a pool {pool!r:.40}")
            if not isinstance(replicas, list) or not all(isinstance(r, str) for r in replicas):
                raise self._invalid(text, f'its "{pool}" is no list of "host:port"')
            pools[pool] = [self._replica(text, pool, replica) for replica in replicas]
        return pools

    def _replica(self, text: str, pool: str, replica: str) -> tuple[str, int]:
        host, _, port = replica.rpartition(":")
        valid = port.isascii() and port.isdigit() and len(port) <= 5
        if not host or not valid or not 0 < int(port) < 65536:
            raise self._invalid(text, f"{pool}'s replica {replica!r:.80} is no 'host:port'")
        try:
            return check_hostname(self.name, SPEC, host), int(port)
        except InvalidVariableError as exc:
            raise self._invalid(text, f"{pool}'s replica {replica!r:.80}: {exc.problem}") from None

    def _task(self, text: str, spec: dict[str, Any]) -> tuple[str, int]:
        task = spec.get("task")
        kind = task.get("type") if isinstance(task, dict) else None
        index = task.get("index") if isinstance(task, dict) else None
        # bool is an int to Python; JSON's true is no index.
        if not isinstance(kind, str) or not isinstance(index, int) or isinstance(index, bool):
            raise self._invalid(text, 'its "task" needs a pool "type" and an integer "index"')
        return kind, index

    def _cluster(self, reader: Reader) -> Cluster:
        """Read CLUSTER_SPEC: this replica's place in the training world, and its master."""
        _, text = reader.require(SPEC, hint=SPEC_HINT)
        spec = self._load(text)
        pools = self._pools(text, spec)
        kind, index = self._task(text, spec)
        if kind not in pools:
            raise self._inconsistent(
                text, f"task.type {kind!r:.40} is none of its pools ({', '.join(pools)})"
            )
        if not 0 <= index < len(pools[kind]):
            raise self._inconsistent(
                text, f"task.index {index} is outside {kind}'s {len(pools[kind])} replica(s)"
            )
        if kind not in TRAINING_POOLS:
            raise NotLaunchedError(
                self.name,
                f"this replica is {kind}[{index}] of $CLUSTER_SPEC: parameter servers, Reduction "
                "Server (workerpool2) and evaluators (workerpool3) are no ranks of the training "
                "world, which is workerpool0 then workerpool1",
                hint="run distenv only in workerpool0 and workerpool1; start an evaluator's "
                "script with --launcher none",
                variable=SPEC,
                value=text,
            )
        if not pools.get("workerpool0"):
            raise self._inconsistent(text, "workerpool0, the primary replica, has no replica")
        world = [r for pool in TRAINING_POOLS for r in pools.get(pool, [])]
        offset = len(pools["workerpool0"]) if kind == "workerpool1" else 0
        return Cluster(offset + index, len(world), world[0])

    def _inconsistent(self, text: str, problem: str) -> InconsistentEnvironmentError:
        return InconsistentEnvironmentError(
            self.name,
            f"$CLUSTER_SPEC={shown(text)}: its {problem}",
            hint=SPEC_HINT,
            variable=SPEC,
            value=text,
        )

    def _agree(self, reader: Reader, cluster: Cluster) -> None:
        """Refuse a prebuilt container's RANK or WORLD_SIZE that contradicts CLUSTER_SPEC."""
        for name, stated in (("RANK", cluster.node_rank), ("WORLD_SIZE", cluster.num_nodes)):
            value = reader.optional_int(name)
            if value is not None and value != stated:
                raise InconsistentEnvironmentError(
                    self.name,
                    f"${name}={value} is not CLUSTER_SPEC's {stated} (the training world is "
                    "workerpool0 then workerpool1, one process per replica)",
                    hint=f"unset a {name} set in the worker pool's env; Vertex AI's prebuilt "
                    "PyTorch containers set it to the replica's place in CLUSTER_SPEC",
                    variable=name,
                    value=str(value),
                )

    def world(self, env: Mapping[str, str]) -> World | None:
        reader = self.reader(env)
        if not reader.has(SPEC):
            return None
        try:
            cluster = self._cluster(reader)
        except DistEnvError:  # malformed, or no rank: rank_info reports it
            return None
        return cluster.node_rank, cluster.num_nodes

    def scope(self, env: Mapping[str, str]) -> str:
        return scope_tag(self.name, self.reader(env).get("CLOUD_ML_JOB_ID"), None)

    def rank_info(self, env: Mapping[str, str]) -> RankInfo:
        reader = self.reader(env)
        cluster = self._cluster(reader)
        self._agree(reader, cluster)
        return RankInfo.one_per_node(
            self.name,
            {"rank": SPEC, "world_size": SPEC},
            cluster.node_rank,
            cluster.num_nodes,
            job_id=reader.get("CLOUD_ML_JOB_ID"),
        )

    def _master(self, env: Mapping[str, str]) -> Default | None:
        reader = self.reader(env)
        if not reader.has(SPEC):
            return None
        host, port = self._cluster(reader).master
        return Default(host, port, source=self.name, variable=SPEC)

    def default_master(self, env: Mapping[str, str]) -> Default | None:
        return self._master(env)

    def allocation_master(self, env: Mapping[str, str]) -> Default | None:
        return self._master(env)
