"""The `kubeflow` launcher backend: pods of a Kubeflow PyTorchJob (v1) or TrainJob (Trainer v2).

Kubernetes cannot run on the project's test machines; the tests use environments recorded from the
operators' sources (kubeflow/training-operator v1.7.0 and v1.8.0,
``pkg/controller.v1/pytorch/envvar.go`` and ``master.go``; kubeflow/trainer v2.1.0,
``pkg/runtime/framework/plugins/torch/torch.go``), and the docs say so. ``distenv run`` reading
these variables in a pod is tested for real, with two ``distenv run`` as the two pods.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from distenv._hosts import check_hostname
from distenv.errors import (
    InconsistentEnvironmentError,
    InvalidVariableError,
    MissingVariableError,
    NotLaunchedError,
    shown,
)
from distenv.launchers.base import Default, Scheduler, World
from distenv.master import scope_tag
from distenv.rankinfo import RankInfo
from distenv.variables import Reader, Var

__all__ = ["KubeflowLauncher"]

# torchrun's --nproc-per-node words (torch.distributed.run, determine_local_world_size: auto, cpu,
# gpu, xpu, or the PrivateUse1 device's name, e.g. npu), which the operators pass through verbatim;
# anything else but a positive number is malformed.
NPROC_WORDS = ("auto", "cpu", "gpu", "xpu")
NPROC_DEVICE = r"[a-z][a-z0-9_]{1,31}"
# An elastic PyTorchJob's PET_NNODES (minReplicas:maxReplicas).
ELASTIC_RANGE = r"[0-9]{1,7}:[0-9]{1,7}"
START_HINT = (
    "make the container's command `torchrun train.py ...` (it reads the PET_* variables) or "
    "`distenv run --nproc-per-node {nproc} train.py ...`, or set nprocPerNode to 1"
)


class KubeflowLauncher(Scheduler):
    """One process per pod of a Kubeflow PyTorchJob (v1) or TrainJob (v2), or the pod's agent.

    | variable | fills | required |
    |---|---|---|
    | PET_NNODES | num_nodes, detection | yes |
    | PET_NODE_RANK | node_rank (and rank, one process per pod) | yes |
    | PET_NPROC_PER_NODE | processes per pod: only 1 makes a direct start a launch | no |
    | PET_MASTER_ADDR, PET_MASTER_PORT | master (the operator's contract) | yes |
    | RANK, WORLD_SIZE | v1 only: the pod index, pods x nprocPerNode (checked) | no |

    The operators set the PET_* variables for torchrun, which reads them as its options; torchrun
    or ``distenv run`` in the pod then starts the node's ranks. A process started directly in the
    pod is a complete launch only with one process per pod (nprocPerNode 1; in v1 also when
    WORLD_SIZE equals the pods); otherwise it is refused, naming the fix.
    """

    name = "kubeflow"
    aliases = ("pytorchjob", "trainjob")
    how_to_start = (
        "submit a PyTorchJob or TrainJob whose container runs `torchrun train.py ...` or "
        "`distenv run --nproc-per-node N train.py ...`"
    )
    variables = (
        Var("PET_NNODES", "num_nodes", "yes", "pods (replicas; v1 elastic: a range 'min:max')"),
        Var("PET_NODE_RANK", "node_rank", "yes", "pod index (v1: master 0, worker i is i+1)"),
        Var(
            "PET_NPROC_PER_NODE", "local_world_size", "no", "nprocPerNode: a number or auto/cpu/gpu"
        ),
        Var("PET_MASTER_ADDR", "master_addr", "yes", "master pod's host (v1: <job>-master-0)"),
        Var("PET_MASTER_PORT", "master_port", "yes", "master's port (v1: 23456, v2: 29500)"),
        Var("RANK", "(checked)", "no", "v1: the pod index, not a process rank"),
        Var("WORLD_SIZE", "(checked)", "no", "v1 (since 1.7): pods x nprocPerNode"),
    )

    def detect(self, env: Mapping[str, str]) -> bool:
        return self.reader(env).has("PET_NNODES")

    def _nodes(self, reader: Reader) -> tuple[int, int]:
        """Return ``(node_rank, num_nodes)``, refusing an elastic range and a missing index."""
        text = reader.get("PET_NNODES") or ""
        if ":" in text:
            # Only a well-formed range 'min:max' is an elastic job; anything else is malformed.
            if not re.fullmatch(ELASTIC_RANGE, text.strip()):
                raise InvalidVariableError(
                    self.name, "PET_NNODES", text, "a node count, or an elastic range 'min:max'"
                )
            raise NotLaunchedError(
                self.name,
                f"$PET_NNODES is {shown(text)}: an elastic PyTorchJob, whose node count and ranks "
                "only torchrun's rendezvous decides",
                hint="make the container's command `torchrun train.py ...`",
                variable="PET_NNODES",
                value=text,
            )
        num_nodes = reader.parse_int("PET_NNODES", text, minimum=1)
        node_rank = reader.integer(
            "PET_NODE_RANK",
            hint="a v1 PyTorchJob sets it only with a Master replica: add one, or run torchrun "
            "with an elasticPolicy",
        )
        if node_rank >= num_nodes:
            raise InconsistentEnvironmentError(
                self.name,
                f"$PET_NODE_RANK={node_rank} is not below $PET_NNODES={num_nodes}",
                hint="these come from the operator; check the job's replicas",
                variable="PET_NODE_RANK",
                value=str(node_rank),
            )
        return node_rank, num_nodes

    def _master(self, reader: Reader) -> tuple[str, int]:
        hint = "the operator sets it for the job's master pod; check the job's replica specs"
        _, addr = reader.require("PET_MASTER_ADDR", hint=hint)
        port = reader.integer("PET_MASTER_PORT", hint=hint, minimum=1, maximum=65535)
        return check_hostname(self.name, "PET_MASTER_ADDR", addr), port

    def _nproc(self, reader: Reader) -> str | None:
        """Return PET_NPROC_PER_NODE, stripped: a positive number or a word torchrun accepts."""
        value = reader.get("PET_NPROC_PER_NODE")
        if value is None:
            return None
        text = value.strip()
        if text.isascii() and text.isdigit():
            return str(reader.parse_int("PET_NPROC_PER_NODE", value, minimum=1))
        if not re.fullmatch(NPROC_DEVICE, text):
            raise InvalidVariableError(
                self.name,
                "PET_NPROC_PER_NODE",
                value,
                f"a positive number of processes or a device word ({', '.join(NPROC_WORDS)})",
                hint="set the job's nprocPerNode to a positive number or 'auto'",
            )
        return text

    def _one_per_pod(self, reader: Reader, num_nodes: int) -> bool:
        """Return whether the job runs one process per pod, refusing a contradicting WORLD_SIZE."""
        nproc = self._nproc(reader) or "1"
        world = reader.optional_int("WORLD_SIZE", minimum=1)
        if nproc.isdigit() and world is not None and world != num_nodes * int(nproc):
            raise InconsistentEnvironmentError(
                self.name,
                f"$WORLD_SIZE={world} is not $PET_NNODES={num_nodes} x $PET_NPROC_PER_NODE={nproc}",
                hint="these come from the operator; unset a WORLD_SIZE set in the pod template",
                variable="WORLD_SIZE",
                value=str(world),
            )
        # training-operator v1.7+ counts a non-numeric nprocPerNode (its default 'auto') as 1 in
        # WORLD_SIZE (getNprocPerNodeInt): WORLD_SIZE equal to the pods says one process each.
        return nproc == "1" or (world is not None and world == num_nodes)

    def world(self, env: Mapping[str, str]) -> World | None:
        reader = self.reader(env)
        if not reader.has("PET_NNODES"):
            return None
        try:
            node_rank, num_nodes = self._nodes(reader)
            one = self._one_per_pod(reader, num_nodes)
        except (NotLaunchedError, InconsistentEnvironmentError, MissingVariableError):
            return None
        # With several processes per pod the pod's own process is no rank: it states none.
        return (node_rank, num_nodes) if one else None

    def scope(self, env: Mapping[str, str]) -> str:
        # No Kubernetes variable names the job; the master pod's name does (<job>-master-0).
        return scope_tag(self.name, self.reader(env).get("PET_MASTER_ADDR"), None)

    def node_agent(self, env: Mapping[str, str]) -> RankInfo | None:
        reader = self.reader(env)
        if not reader.has("PET_NNODES"):
            return None
        node_rank, num_nodes = self._nodes(reader)
        return self._info(reader, node_rank, num_nodes)

    def processes_per_node(self, env: Mapping[str, str]) -> tuple[str, str] | None:
        value = self._nproc(self.reader(env))
        return None if value is None else ("PET_NPROC_PER_NODE", value)

    def _info(self, reader: Reader, node_rank: int, num_nodes: int) -> RankInfo:
        addr, port = self._master(reader)
        return RankInfo.one_per_node(
            self.name,
            {"rank": "PET_NODE_RANK", "world_size": "PET_NNODES"},
            node_rank,
            num_nodes,
            master_addr=addr,
            master_port=port,
            job_id=addr,
        )

    def rank_info(self, env: Mapping[str, str]) -> RankInfo:
        reader = self.reader(env)
        node_rank, num_nodes = self._nodes(reader)
        if not self._one_per_pod(reader, num_nodes):
            nproc = self._nproc(reader) or "?"
            world = reader.get("WORLD_SIZE")
            raise NotLaunchedError(
                self.name,
                f"this process was started directly in pod {node_rank} of {num_nodes} "
                f"($PET_NNODES), but "
                f"$PET_NPROC_PER_NODE is {nproc!r}"
                + (f" ($WORLD_SIZE={world})" if world else "")
                + ": the job expects the pod to start its processes, so this one would run as "
                "one of them and wait for the rest",
                hint=START_HINT.format(nproc=nproc if nproc.isdigit() else "N"),
                variable="PET_NPROC_PER_NODE",
                value=nproc,
            )
        rank = reader.optional_int("RANK")
        if rank is not None and rank != node_rank:
            raise InconsistentEnvironmentError(
                self.name,
                f"$RANK={rank} is not the pod's $PET_NODE_RANK={node_rank}",
                hint="unset a RANK set in the pod template (the operator sets it)",
                variable="RANK",
                value=str(rank),
            )
        return self._info(reader, node_rank, num_nodes)

    def allocation_master(self, env: Mapping[str, str]) -> Default | None:
        return None
