"""Kubeflow pod environments, recorded from the operators' sources (Kubernetes cannot run here).

Sources, each variable as the operator's code sets it:

- kubeflow/training-operator v1.8.0 (the PyTorchJob v1 API), pkg/controller.v1/pytorch/envvar.go
  `setPodEnv`: WORLD_SIZE = replicas x getNprocPerNodeInt(nprocPerNode) (a non-number such as the
  default "auto" counts 1; v1.7.0 introduced the product), RANK and PET_NODE_RANK = the replica
  index (the Master is 0, Worker i is i + 1), PET_NPROC_PER_NODE = spec.nprocPerNode verbatim,
  PET_NNODES = replicas (a range "min:max" under an elasticPolicy); master.go: MASTER_ADDR and
  PET_MASTER_ADDR = "<job>-master-0", MASTER_PORT and PET_MASTER_PORT = the container's
  "pytorchjob-port" (pytorch_types.go: default 23456); PYTHONUNBUFFERED=1.
- kubeflow/trainer v2.1.0 (TrainJob, Trainer v2), pkg/runtime/framework/plugins/torch/torch.go
  `EnforceMLPolicy`: only PET_NNODES, PET_NPROC_PER_NODE (a number, or "auto"/"gpu" with GPUs),
  PET_NODE_RANK (from the Job completion index annotation), PET_MASTER_ADDR =
  "<trainjob>-node-0-0.<trainjob>", PET_MASTER_PORT = 29500 (constants.ContainerTrainerPort).
  The pods are an Indexed Job's (JobSet), so Kubernetes also sets JOB_COMPLETION_INDEX
  (kubernetes.io docs, "Jobs": Completion mode Indexed).
- A rank that torchrun started in a pod has the pod's variables plus torchrun's contract; its
  variable set is the one captured from real torchrun runs (tests/support/envs/torchrun.py, TORCHRUN_4),
  with torchrun's default rendezvous id "none".
"""

from collections.abc import Mapping

# PyTorchJob "ddp" (v1.8.0), Master 1 + Worker 1 replicas, nprocPerNode "2": the Worker's pod.
POD_V1_2X2_WORKER0 = {
    "PYTHONUNBUFFERED": "1",
    "MASTER_PORT": "23456",
    "PET_MASTER_PORT": "23456",
    "MASTER_ADDR": "ddp-master-0",
    "PET_MASTER_ADDR": "ddp-master-0",
    "WORLD_SIZE": "4",
    "RANK": "1",
    "PET_NODE_RANK": "1",
    "PET_NPROC_PER_NODE": "2",
    "PET_NNODES": "2",
}

# The same job's Master pod.
POD_V1_2X2_MASTER = {**POD_V1_2X2_WORKER0, "RANK": "0", "PET_NODE_RANK": "0"}

# Rank 3 of that job: local rank 1 of torchrun in the Worker's pod (torchrun reads PET_*).
TORCHRUN_IN_POD_V1_RANK3 = {
    **POD_V1_2X2_WORKER0,
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "RANK": "3",
    "WORLD_SIZE": "4",
    "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_RUN_ID": "none",
}

# PyTorchJob "ddp", nprocPerNode "1": one process per pod, the Worker's pod.
POD_V1_2X1_WORKER0 = {
    **POD_V1_2X2_WORKER0,
    "WORLD_SIZE": "2",
    "PET_NPROC_PER_NODE": "1",
}

# PyTorchJob with the default nprocPerNode "auto": WORLD_SIZE counts one process per pod.
POD_V1_AUTO_WORKER0 = {**POD_V1_2X2_WORKER0, "WORLD_SIZE": "2", "PET_NPROC_PER_NODE": "auto"}

# An elastic PyTorchJob (elasticPolicy minReplicas 1, maxReplicas 4, no Master replica): PET_NNODES
# is a range, and neither RANK nor PET_NODE_RANK is set (they come with a Master replica only).
POD_V1_ELASTIC = {
    "PYTHONUNBUFFERED": "1",
    "PET_NNODES": "1:4",
    "PET_NPROC_PER_NODE": "2",
    "PET_RDZV_BACKEND": "c10d",
    "PET_RDZV_ENDPOINT": "elastic-worker-0:23456",
}

# TrainJob "trainjob" (trainer v2.1.0), numNodes 2, numProcPerNode 2: node 1's pod.
TRAINJOB_2X2_NODE1 = {
    "PET_NNODES": "2",
    "PET_NPROC_PER_NODE": "2",
    "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "trainjob-node-0-0.trainjob",
    "PET_MASTER_PORT": "29500",
    "JOB_COMPLETION_INDEX": "1",
}

# TrainJob with GPUs and numProcPerNode "auto": the number is torchrun's to decide.
TRAINJOB_AUTO_NODE1 = {**TRAINJOB_2X2_NODE1, "PET_NPROC_PER_NODE": "auto"}

# TrainJob numProcPerNode 1: one process per pod, node 1's pod.
TRAINJOB_2X1_NODE1 = {**TRAINJOB_2X2_NODE1, "PET_NPROC_PER_NODE": "1"}


def two_pods(recorded: Mapping[str, str], port: int) -> list[dict[str, str]]:
    """Return the two pods' environments of a 2-pod job on this machine: pod 0 (the master,
    127.0.0.1 on `port`) and pod 1."""
    pods = []
    for node in (0, 1):
        env = {**recorded, "PET_NODE_RANK": str(node), "PET_MASTER_ADDR": "127.0.0.1"}
        env["PET_MASTER_PORT"] = str(port)
        if "RANK" in env:  # v1: RANK is the pod index, MASTER_* mirror PET_MASTER_*
            env.update(RANK=str(node), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        pods.append(env)
    return pods
