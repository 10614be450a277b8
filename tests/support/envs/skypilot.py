"""SkyPilot task environments, recorded from SkyPilot's documentation and source (it cannot run here).

Sources:

- docs.skypilot.co/en/stable/running-jobs/environment-variables.html, "Environment variables for
  run": SKYPILOT_NODE_RANK ("Rank (an integer ID from 0 to num_nodes-1) of the node executing
  the task"), SKYPILOT_NODE_IPS ("A string of IP addresses of the nodes reserved to execute the
  task, where each line contains one IP address"), SKYPILOT_NUM_NODES ("Same value as
  $(echo "$SKYPILOT_NODE_IPS" | wc -l)"), SKYPILOT_NUM_GPUS_PER_NODE (the count of
  `accelerators: <name>:<count>`), SKYPILOT_TASK_ID ("sky-<timestamp>_<cluster-name>_<task-id>",
  example sky-2023-07-06-21-18-31-563597_myclus_1; a managed job keeps it across recoveries:
  sky-managed-2023-07-06-21-18-31-563597_my-job-name_1-0).
- skypilot-org/skypilot master (2026), sky/backends/task_codegen.py, `RayCodeGen.add_setup`:
  job_ip_list_str = '\\n'.join(job_ip_rank_list), the nodes' private IPs ordered as the
  cluster's nodes (head first); `_add_ray_task`: SKYPILOT_NODE_IPS = job_ip_list_str,
  SKYPILOT_NUM_NODES = len(job_ip_rank_list), SKYPILOT_NODE_RANK = the node's index in that
  list, SKYPILOT_NUM_GPUS_PER_NODE = ceil(accelerator count). The docs' distributed example
  (running-jobs/distributed-jobs.html) runs torchrun with --master_addr = the first line.

A task with `num_nodes: 2` and `accelerators: A100:2`; IPs and the task id are examples of the
documented forms.
"""

from collections.abc import Mapping

_task = {
    "SKYPILOT_NODE_IPS": "10.128.0.14\n10.128.0.15",
    "SKYPILOT_NUM_NODES": "2",
    "SKYPILOT_NUM_GPUS_PER_NODE": "2",
    "SKYPILOT_TASK_ID": "sky-2026-11-23-09-12-44-102937_ddp_1",
}

# The run: commands on the head node, and on the second node.
SKY_2N_NODE0 = {**_task, "SKYPILOT_NODE_RANK": "0"}
SKY_2N_NODE1 = {**_task, "SKYPILOT_NODE_RANK": "1"}

# A managed job's task (sky jobs launch): the id survives recoveries.
SKY_MANAGED_NODE1 = {
    **SKY_2N_NODE1,
    "SKYPILOT_TASK_ID": "sky-managed-2026-11-23-09-12-44-102937_ddp_7-0",
}

# torchrun in run:, as the docs' example starts it (--nproc_per_node=$SKYPILOT_NUM_GPUS_PER_NODE
# --node_rank=$SKYPILOT_NODE_RANK --master_addr=<first IP> --master_port=8008): rank 3; the
# variable set is the one captured from real torchrun runs (tests/support/envs/torchrun.py).
SKY_TORCHRUN_RANK3 = {
    **SKY_2N_NODE1,
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "10.128.0.14",
    "MASTER_PORT": "8008",
    "RANK": "3",
    "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_RUN_ID": "none",
    "WORLD_SIZE": "4",
}


def two_nodes(recorded: Mapping[str, str]) -> list[dict[str, str]]:
    """Return both nodes' environments of the recorded task on this machine: the IPs become
    127.0.0.1 (node 0, the master) and 127.0.0.2, and each node gets its rank."""
    ips = "127.0.0.1\n127.0.0.2"
    return [{**recorded, "SKYPILOT_NODE_IPS": ips, "SKYPILOT_NODE_RANK": str(n)} for n in (0, 1)]
