"""Slurm's GPU variables on AMD nodes: ``--gpu-bind=closest`` on MI250X nodes (8 GCDs each),
recorded from vendors' docs, and Slurm's default gres variables, measured here.

No AMD GPU or Cray EX machine is here: each value is what the cited page prints, cited beside it
as [key]; the Slurm numbering variables are the ones every srun task gets (srun(1) OUTPUT
ENVIRONMENT, as the captures in slurm.py show them), with illustrative job ids.

Sources:
  [olcf]    OLCF, hello_jobstep README (code.ornl.gov/olcf/hello_jobstep; the Frontier User
            Guide's "GPU Mapping" section runs the same program): on Frontier,
            ``srun -N2 -n16 -c7 --gpus-per-task=1 --gpu-bind=closest`` gives the tasks of each
            node ROCR_VISIBLE_DEVICES (its GPU_ID column, "the node-level GPU ID read from
            ROCR_VISIBLE_DEVICES") 4, 5, 2, 3, 6, 7, 0, 1, on bus ids d1, d6, c9, ce, d9, de,
            c1, c6; each task's HIP runtime sees one device, index 0 (RT_GPU_ID).
  [frontier] Frontier User Guide (docs.olcf.ornl.gov/systems/frontier_user_guide.html): 8 GCDs
            per node, shown as 8 GPUs "according to Slurm, ROCR_VISIBLE_DEVICES, and the ROCr
            runtime"; 4 NUMA domains, 2 L3 regions each, one GCD per L3 region (hardware
            threads 0-7 GPU 4, 8-15 GPU 5, 16-23 GPU 2, ...).
  [pawsey]  Pawsey, "Example Slurm Batch Scripts for Setonix on GPU Compute Nodes"
            (pawsey.atlassian.net): on Setonix's MI250X nodes (HPE Cray EX, the node LUMI-G
            has), ``srun -N 1 -n 3 -c 8 --gres=gpu:3 --gpus-per-task=1 --gpu-bind=closest``
            gives every task ROCR_VISIBLE_DEVICES ``0`` and buses d1, d6, c9: the task-level
            cgroup (LUMI's binding course: "control groups at the task level ... when doing
            task-level GPU binding via Slurm") leaves each task one device, numbered 0.
"""

from __future__ import annotations

# [olcf] by local rank: the GCD each task is bound to, and its PCI bus.
FRONTIER_CLOSEST_GCD = ("4", "5", "2", "3", "6", "7", "0", "1")
FRONTIER_CLOSEST_BUS = ("d1", "d6", "c9", "ce", "d9", "de", "c1", "c6")
FRONTIER_NODES = ("frontier10227", "frontier10228")  # [olcf]


def _srun_task(
    rank: int, *, size: int, per_node: int, nodes: tuple[str, ...], job: str
) -> dict[str, str]:
    local, node = rank % per_node, rank // per_node
    return {
        "SLURMD_NODENAME": nodes[node],
        "SLURM_JOB_ID": job,
        "SLURM_JOBID": job,
        "SLURM_JOB_NODELIST": ",".join(nodes),
        "SLURM_JOB_NUM_NODES": str(len(nodes)),
        "SLURM_NNODES": str(len(nodes)),
        "SLURM_NODELIST": ",".join(nodes),
        "SLURM_STEP_NODELIST": ",".join(nodes),
        "SLURM_STEP_NUM_NODES": str(len(nodes)),
        "SLURM_STEP_NUM_TASKS": str(size),
        "SLURM_STEP_TASKS_PER_NODE": f"{per_node}(x{len(nodes)})"
        if len(nodes) > 1
        else str(per_node),
        "SLURM_TASKS_PER_NODE": f"{per_node}(x{len(nodes)})" if len(nodes) > 1 else str(per_node),
        "SLURM_NTASKS": str(size),
        "SLURM_NPROCS": str(size),
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(local),
        "SLURM_NODEID": str(node),
    }


# `srun -N2 -n16 -c7 --gpus-per-task=1 --gpu-bind=closest python train.py` on Frontier [olcf].
FRONTIER_2N_16T_CLOSEST = [
    {
        **_srun_task(rank, size=16, per_node=8, nodes=FRONTIER_NODES, job="1920834"),
        "ROCR_VISIBLE_DEVICES": FRONTIER_CLOSEST_GCD[rank % 8],  # [olcf]
    }
    for rank in range(16)
]

# `srun -N 1 -n 3 -c 8 --gres=gpu:3 --gpus-per-task=1 --gpu-bind=closest python train.py` on
# Setonix [pawsey]: the same ROCR_VISIBLE_DEVICES in every task, three different GCDs.
SETONIX_CLOSEST_BUS = ("d1", "d6", "c9")  # [pawsey]
SETONIX_1N_3T_CLOSEST = [
    {
        **_srun_task(rank, size=3, per_node=3, nodes=("nid001004",), job="11048213"),
        "ROCR_VISIBLE_DEVICES": "0",  # [pawsey]
    }
    for rank in range(3)
]

# Measured on this machine's simulated Slurm cluster "one" (Slurm 22.05.8, gres.conf with
# AutoDetect=off and no Flags=, fake GPU device files), `srun -n 2 --gpus-per-task=1`: Slurm
# writes the task's node-level GPU index into CUDA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES,
# ZE_AFFINITY_MASK and GPU_DEVICE_ORDINAL alike (its numbering variables as in slurm.py).
SRUN_DEFAULT_GRES_FLAGS_2T = [
    {
        **_srun_task(rank, size=2, per_node=2, nodes=("vm",), job="420"),
        "CUDA_VISIBLE_DEVICES": str(rank),
        "ROCR_VISIBLE_DEVICES": str(rank),
        "ZE_AFFINITY_MASK": str(rank),
        "GPU_DEVICE_ORDINAL": str(rank),
        "SLURM_STEP_GPUS": str(rank),
    }
    for rank in range(2)
]
