"""Vertex AI custom job environments, recorded from Google's documentation (it cannot run here).

Sources:

- cloud.google.com/vertex-ai/docs/training/distributed-training, "Structure of the training
  cluster" (workerPoolSpecs[0] is the primary replica, [1] the workers, [2] parameter servers or
  Reduction Server, [3] evaluators) and "CLUSTER_SPEC": a JSON object with "cluster" (each worker
  pool's replicas as "host:port", e.g. "cmle-training-workerpool0-ab123cd4e5-0:2222"),
  "environment" ("cloud"), "task" ("type": this replica's pool, "index": its zero-based index in
  the pool, "trial": the hyperparameter tuning trial) and "job" (the CustomJobSpec submitted).
- googleapis/python-aiplatform v1.x, google/cloud/aiplatform/training_utils/environment_variables.py:
  CLUSTER_SPEC and CLOUD_ML_JOB_ID ("the name given to the training job") as Vertex AI sets them.
- AI Platform Training, "Configuring distributed training for PyTorch" (the prebuilt PyTorch
  containers Vertex AI inherited): WORLD_SIZE (the nodes), RANK (the node's index, 0 on the
  master), MASTER_ADDR (the master's host name) and MASTER_PORT on each replica.

Hash suffixes, job ids and the images are examples of the documented forms.
"""

from __future__ import annotations

import json

JOB_ID = "6253470451476185088"
IMAGE = "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-1.py310:latest"


def _replicas(pool: int, count: int, host: str | None = None, port: int = 2222) -> list[str]:
    return [
        f"{host or f'cmle-training-workerpool{pool}-ab123cd4e5-{i}'}:{port}" for i in range(count)
    ]


def cluster_spec(
    task: str, index: int, sizes: tuple[int, ...], *, host: str | None = None, port: int = 2222
) -> str:
    """Return CLUSTER_SPEC as the documentation shows it: pools of `sizes` replicas, this task."""
    spec = {
        "cluster": {
            f"workerpool{pool}": _replicas(pool, count, host, port)
            for pool, count in enumerate(sizes)
        },
        "environment": "cloud",
        "task": {"type": task, "index": index},
        "job": {
            "workerPoolSpecs": [
                {
                    "machineSpec": {"machineType": "n1-standard-8"},
                    "replicaCount": str(count),
                    "containerSpec": {"imageUri": IMAGE, "command": ["distenv", "run"]},
                }
                for count in sizes
            ]
        },
    }
    return json.dumps(spec)


# Primary (workerpool0, 1 replica) + 2 workers (workerpool1): the second worker, node 2 of 3.
VERTEX_1P2W_WORKER1 = {
    "CLUSTER_SPEC": cluster_spec("workerpool1", 1, (1, 2)),
    "CLOUD_ML_JOB_ID": JOB_ID,
}

# The same job's primary replica.
VERTEX_1P2W_PRIMARY = {
    "CLUSTER_SPEC": cluster_spec("workerpool0", 0, (1, 2)),
    "CLOUD_ML_JOB_ID": JOB_ID,
}

# The second worker in a prebuilt PyTorch container: RANK, WORLD_SIZE and MASTER_* too.
VERTEX_PYTORCH_1P2W_WORKER1 = {
    **VERTEX_1P2W_WORKER1,
    "RANK": "2",
    "WORLD_SIZE": "3",
    "MASTER_ADDR": "cmle-training-workerpool0-ab123cd4e5-0",
    "MASTER_PORT": "2222",
}

# Primary + 2 workers + 1 Reduction Server replica (workerpool2): the reduction server's view.
VERTEX_REDUCTION_SERVER = {
    "CLUSTER_SPEC": cluster_spec("workerpool2", 0, (1, 2, 1)),
    "CLOUD_ML_JOB_ID": JOB_ID,
}

# The same job with Reduction Server: its first worker, node 1 of 3 (workerpool2 is not counted).
VERTEX_REDUCTION_WORKER0 = {
    "CLUSTER_SPEC": cluster_spec("workerpool1", 0, (1, 2, 1)),
    "CLOUD_ML_JOB_ID": JOB_ID,
}

# One replica only: the primary alone.
VERTEX_SINGLE = {"CLUSTER_SPEC": cluster_spec("workerpool0", 0, (1,)), "CLOUD_ML_JOB_ID": JOB_ID}

# Rank 5 of torchrun --nproc-per-node 2 in the second worker of the prebuilt PyTorch container
# (torchrun replaces RANK and WORLD_SIZE with its own; its set as in tests/support/envs/torchrun.py).
TORCHRUN_IN_VERTEX_RANK5 = {
    **VERTEX_PYTORCH_1P2W_WORKER1,
    "RANK": "5",
    "WORLD_SIZE": "6",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "2",
    "GROUP_WORLD_SIZE": "3",
    "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_RUN_ID": "none",
}


def two_replicas(port: int) -> list[dict[str, str]]:
    """Return the primary's and one worker's environments of a 1 + 1 job on this machine, the
    primary at 127.0.0.1:`port` (every replica's address rewritten to 127.0.0.1)."""
    return [
        {
            "CLUSTER_SPEC": cluster_spec(task, 0, (1, 1), host="127.0.0.1", port=port),
            "CLOUD_ML_JOB_ID": JOB_ID,
        }
        for task in ("workerpool0", "workerpool1")
    ]
