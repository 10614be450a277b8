"""AWS Batch multi-node parallel job environments, recorded from the AWS Batch User Guide.

AWS Batch cannot run here. Sources (docs.aws.amazon.com/batch/latest/userguide/, 2026):

- mnp-env-vars.html, "Environment variables" of multi-node parallel jobs:
  AWS_BATCH_JOB_MAIN_NODE_INDEX ("the index number of the job's main node"),
  AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS ("only set in multi-node parallel job child
  nodes. This variable isn't present on the main node"), AWS_BATCH_JOB_NODE_INDEX ("The node
  index begins at 0"), AWS_BATCH_JOB_NUM_NODES ("the number of nodes that you have requested").
- job_env_vars.html: AWS_BATCH_JOB_ID, AWS_BATCH_JOB_ATTEMPT ("The first attempt is numbered
  1"), AWS_BATCH_JQ_NAME, AWS_BATCH_CE_NAME.
- multi-node-parallel-jobs.html: a node of the job is addressed as "<job id>#N" (N from 0),
  which is its AWS_BATCH_JOB_ID; the job's other attempts update every node's attempt.
- mnp-ce.html: MNP containers use the awsvpc network mode, each with "its own elastic network
  interface, a primary private IP address, and an internal DNS hostname".

A job definition with numNodes 2 and mainNode 0; the job id (a UUID) and the address are examples
of the documented forms.
"""

_JOB = "5f2b9ad0-7c1e-4b8e-9d43-2a51f6c0e7b1"
_job = {
    "AWS_BATCH_CE_NAME": "gpu-mnp",
    "AWS_BATCH_JQ_NAME": "training",
    "AWS_BATCH_JOB_ATTEMPT": "1",
    "AWS_BATCH_JOB_NUM_NODES": "2",
    "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
}

# The main node: no address of its own.
MNP_2N_MAIN = {**_job, "AWS_BATCH_JOB_ID": f"{_JOB}#0", "AWS_BATCH_JOB_NODE_INDEX": "0"}

# The child node.
MNP_2N_CHILD = {
    **_job,
    "AWS_BATCH_JOB_ID": f"{_JOB}#1",
    "AWS_BATCH_JOB_NODE_INDEX": "1",
    "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "10.0.1.27",
}

# mainNode 1 of 3: node index 0 is a child, counted after the main node.
MNP_3N_MAIN1_NODE0 = {
    **_job,
    "AWS_BATCH_JOB_NUM_NODES": "3",
    "AWS_BATCH_JOB_MAIN_NODE_INDEX": "1",
    "AWS_BATCH_JOB_ID": f"{_JOB}#0",
    "AWS_BATCH_JOB_NODE_INDEX": "0",
    "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "10.0.1.28",
}

# The child node of the job's second attempt (a retry strategy with attempts 2).
MNP_2N_CHILD_ATTEMPT2 = {**MNP_2N_CHILD, "AWS_BATCH_JOB_ATTEMPT": "2"}

# torchrun as the child's command (--nnodes $AWS_BATCH_JOB_NUM_NODES --node_rank
# $AWS_BATCH_JOB_NODE_INDEX --master_addr $AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS): rank 3;
# the variable set is the one captured from real torchrun runs (tests/support/envs/torchrun.py).
MNP_TORCHRUN_RANK3 = {
    **MNP_2N_CHILD,
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "10.0.1.27",
    "MASTER_PORT": "29500",
    "RANK": "3",
    "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_RUN_ID": "none",
    "WORLD_SIZE": "4",
}


def two_nodes(job_id: str, main_address: str) -> list[dict[str, str]]:
    """Return the main node's and the child's environments of a 2-node job `job_id` on this
    machine: the main node's private IPv4 becomes `main_address`, one of this machine's own."""
    main = {**MNP_2N_MAIN, "AWS_BATCH_JOB_ID": f"{job_id}#0"}
    child = {
        **MNP_2N_CHILD,
        "AWS_BATCH_JOB_ID": f"{job_id}#1",
        "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": main_address,
    }
    return [main, child]
