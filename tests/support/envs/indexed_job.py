"""Indexed Job / JobSet pod environments, recorded from the documentation (Kubernetes can't run here).

Sources: Kubernetes documentation, "Jobs", completion mode Indexed (the pod's index is the
annotation batch.kubernetes.io/job-completion-index and, from Kubernetes 1.22 on, the
environment variable JOB_COMPLETION_INDEX); kubernetes-sigs/jobset v0.12.0,
site/static/examples/pytorch/cnn-mnist/mnist.yaml (JobSet "pytorch", replicatedJob "workers",
completions 4: the user sets MASTER_ADDR "pytorch-workers-0-0.pytorch", MASTER_PORT "3389" and
RANK from the completion index; the node count is only on torchrun's command line).
"""

# JobSet's PyTorch example as written, pod 2: RANK is the completion index, no WORLD_SIZE.
JOBSET_EXAMPLE_POD2 = {
    "JOB_COMPLETION_INDEX": "2",
    "MASTER_ADDR": "pytorch-workers-0-0.pytorch",
    "MASTER_PORT": "3389",
    "RANK": "2",
    "PYTHONUNBUFFERED": "0",
}

# The same pod template with WORLD_SIZE 4 instead of RANK: one process per pod, started directly.
JOBSET_WORLD_POD2 = {
    "JOB_COMPLETION_INDEX": "2",
    "MASTER_ADDR": "pytorch-workers-0-0.pytorch",
    "MASTER_PORT": "3389",
    "WORLD_SIZE": "4",
}

# An Indexed Job whose template sets nothing: only the index.
INDEXED_BARE_POD1 = {"JOB_COMPLETION_INDEX": "1"}
