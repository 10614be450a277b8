"""The `pytorch` launcher backend (alias `torchrun`): torchrun's environment contract."""

from __future__ import annotations

import re
from collections.abc import Mapping

from distenv.errors import InconsistentEnvironmentError, InvalidVariableError, MissingVariableError
from distenv.launchers.base import Launcher, World
from distenv.master import RUN_ID_VAR, SCOPE_VAR, explicit_master, scope_tag
from distenv.rankinfo import RankInfo
from distenv.variables import Reader, Var

__all__ = ["TorchrunLauncher"]

# DISTENV_RUN_ID as `distenv run` hands it on: --run-id (`distenv.master.RUN_ID_PATTERN`) or an
# enclosing scheduler's job tag (`lsf/4242[0]/-`, a Kubernetes host name of up to 253 characters).
RUN_ID = re.compile(r"[\x21-\x7e]{1,512}")
HINT = "start with torchrun (or distenv run), which sets RANK, WORLD_SIZE, LOCAL_RANK, ..."
FULL_SET = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
KUBEFLOW_SET = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# Variables of scheduler steps and MPI launchers. Kubeflow-style variables (RANK, WORLD_SIZE and
# MASTER_* without LOCAL_RANK) count only when none of these is present: inside a scheduler step they
# are far more likely a leftover `export RANK=0` than a launcher's doing.
SCHEDULER_STEP = (
    "SLURM_STEP_ID",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    "PMIX_RANK",
    "JSM_NAMESPACE_SIZE",
    "LSB_JOBID",
    # A Kubeflow pod (training-operator >= 1.7, Trainer v2): the `kubeflow` backend reads it, and
    # its RANK is the pod's index, not a process's.
    "PET_NNODES",
    # A Vertex AI replica: the `vertex` backend reads it; a prebuilt PyTorch container's RANK is
    # the replica's index, checked there against CLUSTER_SPEC.
    "CLUSTER_SPEC",
)
# Azure ML's marks. Its PyTorch distribution starts every process itself with RANK, LOCAL_RANK,
# WORLD_SIZE and MASTER_* but no LOCAL_WORLD_SIZE: such a process is Azure ML's (the `azureml`
# backend reads it), not a torchrun rank. torchrun or `distenv run` inside Azure ML set
# LOCAL_WORLD_SIZE (and their own marks), and stay this backend's.
AZUREML = ("AZUREML_RUN_ID", "AZ_BATCH_MASTER_NODE", "AZ_BATCHAI_MPI_MASTER_NODE")


class TorchrunLauncher(Launcher):
    """Processes started by torchrun (torch.distributed.run), ``distenv run`` or Kubeflow.

    | variable | fills | required |
    |---|---|---|
    | TORCHELASTIC_RUN_ID | job_id, scope, detection | or the full set |
    | TORCHELASTIC_RESTART_COUNT | restart_count, scope | no |
    | DISTENV_RUN_ID | job_id, scope (distenv run's ranks) | no |
    | RANK | rank | yes |
    | WORLD_SIZE | world_size | yes |
    | LOCAL_RANK | local_rank (absent: Kubeflow style, one process per node) | yes* |
    | LOCAL_WORLD_SIZE (LOCAL_SIZE) | local_world_size (LOCAL_SIZE: DeepSpeed's launcher; absent: the roll call counts) | no |
    | GROUP_RANK | node_rank (default rank // local_world_size, or the roll call) | no |
    | GROUP_WORLD_SIZE | num_nodes (default world_size // local_world_size, or the roll call) | no |
    | MASTER_ADDR, MASTER_PORT | master | yes |
    | DISTENV_SCOPE | detection: distenv's own exports are not a launch | no |
    | SLURM_STEP_ID, OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK, JSM_NAMESPACE_SIZE, LSB_JOBID | veto Kubeflow-style detection | no |
    | PET_NNODES | veto Kubeflow-style detection: a Kubeflow pod, the `kubeflow` backend answers | no |
    | CLUSTER_SPEC | veto Kubeflow-style detection: a Vertex AI replica, the `vertex` backend answers | no |
    | AZUREML_RUN_ID, AZ_BATCH_MASTER_NODE, AZ_BATCHAI_MPI_MASTER_NODE | no LOCAL_WORLD_SIZE: Azure ML's process, veto | no |

    Detection needs ``TORCHELASTIC_RUN_ID`` (torchrun always sets it) or the full set RANK,
    WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT not tagged as distenv's own export of another
    launcher's answer.
    """

    name = "pytorch"
    aliases = ("torchrun",)
    how_to_start = "start it with `torchrun --nproc-per-node 4 train.py ...`"
    variables = (
        Var("TORCHELASTIC_RUN_ID", "job_id", "or the full set", "torchrun's --rdzv-id"),
        Var(
            "TORCHELASTIC_RESTART_COUNT",
            "restart_count, (scope)",
            "no",
            "torchrun's restart number (--max-restarts)",
        ),
        Var(RUN_ID_VAR, "job_id", "no", "distenv run's run id (--run-id, else drawn)"),
        Var("RANK", "rank", "yes", "global rank"),
        Var("WORLD_SIZE", "world_size", "yes", "number of processes"),
        Var("LOCAL_RANK", "local_rank", "yes*", "rank on this node (*absent: Kubeflow style)"),
        Var(
            "LOCAL_WORLD_SIZE", "local_world_size", "no", "processes on this node (else roll call)"
        ),
        Var("LOCAL_SIZE", "local_world_size", "no", "DeepSpeed's launcher's LOCAL_WORLD_SIZE"),
        Var("GROUP_RANK", "node_rank", "no", "node index (else rank // local, or roll call)"),
        Var(
            "GROUP_WORLD_SIZE", "num_nodes", "no", "nodes (else world_size // local, or roll call)"
        ),
        Var("MASTER_ADDR", "master_addr", "yes", "rank 0's host"),
        Var("MASTER_PORT", "master_port", "yes", "rank 0's store port"),
        Var(SCOPE_VAR, "(detection)", "no", "distenv's export tag: such RANK/... are no launch"),
        *(
            Var(name, "(detection)", "no", "a scheduler step: vetoes Kubeflow style")
            for name in SCHEDULER_STEP
        ),
        *(
            Var(name, "(detection)", "no", "Azure ML: without LOCAL_WORLD_SIZE, no torchrun rank")
            for name in AZUREML
        ),
    )

    def _is_own_export(self, reader: Reader) -> bool:
        tag = reader.get(SCOPE_VAR)
        return tag is not None and not tag.startswith(f"{self.name}/")

    def detect(self, env: Mapping[str, str]) -> bool:
        reader = self.reader(env)
        if reader.has("TORCHELASTIC_RUN_ID"):
            return True
        if self._is_own_export(reader):
            return False
        if any(reader.has(name) for name in AZUREML) and not (
            reader.has("LOCAL_WORLD_SIZE") or reader.has("LOCAL_SIZE")
        ):
            return False
        if all(reader.has(name) for name in FULL_SET):
            return True
        return all(reader.has(name) for name in KUBEFLOW_SET) and not any(
            reader.has(name) for name in SCHEDULER_STEP
        )

    def named_detect(self, env: Mapping[str, str]) -> bool:
        """Return whether ``--launcher pytorch`` finds its contract where `detect` did not: the
        full set that `detect` leaves to Azure ML's backend (its PyTorch distribution)."""
        reader = self.reader(env)
        return not self._is_own_export(reader) and all(reader.has(name) for name in FULL_SET)

    def world(self, env: Mapping[str, str]) -> World | None:
        reader = self.reader(env)
        rank = reader.optional_int("RANK")
        return None if rank is None else (rank, reader.optional_int("WORLD_SIZE", minimum=1))

    def _run_id(self, reader: Reader) -> str | None:
        own = reader.get(RUN_ID_VAR)
        if own is not None and not RUN_ID.fullmatch(own):
            raise InvalidVariableError(
                self.name,
                RUN_ID_VAR,
                own,
                "a run id: --run-id's, or a scheduler's job tag (printable, no spaces)",
                hint="distenv run sets it from --run-id; never set it by hand",
            )
        run_id = reader.get("TORCHELASTIC_RUN_ID")
        # torchrun's default --rdzv-id is the word "none": no identity at all.
        return own if run_id in (None, "none") else run_id

    def scope(self, env: Mapping[str, str]) -> str:
        reader = self.reader(env)
        return scope_tag(self.name, self._run_id(reader), reader.get("TORCHELASTIC_RESTART_COUNT"))

    def rank_info(self, env: Mapping[str, str]) -> RankInfo:
        reader = self.reader(env)
        rank = reader.integer("RANK", hint=HINT)
        world_size = reader.integer("WORLD_SIZE", hint=HINT, minimum=1)
        sources = {"rank": "RANK", "world_size": "WORLD_SIZE"}
        local_world_size: int | None
        node_rank: int | None
        num_nodes: int | None
        if reader.has("LOCAL_RANK") or reader.has("TORCHELASTIC_RUN_ID"):
            local_rank = reader.integer("LOCAL_RANK", hint=HINT)
            # DeepSpeed's launcher (deepspeed/launcher/launch.py) names it LOCAL_SIZE. Without
            # either (a wrapper's RANK/LOCAL_RANK/WORLD_SIZE, Azure ML's PyTorch distribution,
            # torch.distributed.launch), init_dist's roll call counts the ranks on this host, as
            # for MPI.
            local_world_size = reader.optional_int("LOCAL_WORLD_SIZE", "LOCAL_SIZE", minimum=1)
            sources["local_rank"] = "LOCAL_RANK"
            if local_world_size is not None:
                sources["local_world_size"] = "LOCAL_WORLD_SIZE"
        else:  # Kubeflow's PyTorchJob: one process per pod.
            local_rank, local_world_size = 0, 1
        node_rank = reader.optional_int("GROUP_RANK")
        num_nodes = reader.optional_int("GROUP_WORLD_SIZE", minimum=1)
        if node_rank is not None and num_nodes is not None:
            sources.update(node_rank="GROUP_RANK", num_nodes="GROUP_WORLD_SIZE")
        elif local_world_size is None:
            node_rank = num_nodes = None  # the roll call numbers the hosts
        else:
            if world_size % local_world_size:
                raise InconsistentEnvironmentError(
                    self.name,
                    f"$WORLD_SIZE={world_size} is not a multiple of "
                    f"$LOCAL_WORLD_SIZE={local_world_size}, so the node index is unknown",
                    hint="set GROUP_RANK and GROUP_WORLD_SIZE (torchrun does)",
                )
            node_rank = rank // local_world_size if node_rank is None else node_rank
            num_nodes = world_size // local_world_size if num_nodes is None else num_nodes
        # torchrun's own MASTER_* are part of its contract: no export tag can make them stale.
        addr, port = explicit_master(reader)
        if addr is None or port is None:
            raise MissingVariableError(
                self.name, "MASTER_PORT" if addr else "MASTER_ADDR", hint=HINT
            )
        return RankInfo.checked(
            self.name,
            sources,
            rank=rank,
            world_size=world_size,
            local_rank=local_rank,
            local_world_size=local_world_size,
            node_rank=node_rank,
            num_nodes=num_nodes,
            master_addr=addr,
            master_port=port,
            job_id=self._run_id(reader),
            restart_count=self.restart_count(env),
        )

    def restart_count(self, env: Mapping[str, str]) -> int:
        return self.reader(env).optional_int("TORCHELASTIC_RESTART_COUNT") or 0
