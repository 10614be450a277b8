"""Volcano Job pod environments, recorded from Volcano's source (it cannot run here).

Source: volcano-sh/volcano v1.15.1, pkg/controllers/job/plugins: env/env.go (VK_TASK_INDEX and
VC_TASK_INDEX: the pod's index within its task), svc/svc.go (for every task, VC_<TASK>_HOSTS:
"<job>-<task>-<i>.<job>" joined by commas, and VC_<TASK>_NUM), distributed-framework/pytorch/
pytorch.go (MASTER_ADDR "<job>-master-0.<job>", MASTER_PORT 23456 by default, WORLD_SIZE = all
tasks' replicas, RANK 0 for the master and index + 1 for worker <index>). Job "pt" with tasks
"master" (1 replica) and "worker" (2 replicas).
"""

_svc = {
    "VC_MASTER_HOSTS": "pt-master-0.pt",
    "VC_MASTER_NUM": "1",
    "VC_WORKER_HOSTS": "pt-worker-0.pt,pt-worker-1.pt",
    "VC_WORKER_NUM": "2",
}

# worker-0 without the pytorch plugin: its index is 0, like master-0's.
VOLCANO_WORKER0_SVC = {**_svc, "VK_TASK_INDEX": "0", "VC_TASK_INDEX": "0"}

# worker-0 with the pytorch plugin: rank 1 of 3.
VOLCANO_WORKER0_PYTORCH = {
    **VOLCANO_WORKER0_SVC,
    "MASTER_ADDR": "pt-master-0.pt",
    "MASTER_PORT": "23456",
    "WORLD_SIZE": "3",
    "RANK": "1",
}

# A one-pod job (task "master", 1 replica), no pytorch plugin.
VOLCANO_SINGLE = {
    "VC_MASTER_HOSTS": "one-master-0.one",
    "VC_MASTER_NUM": "1",
    "VK_TASK_INDEX": "0",
    "VC_TASK_INDEX": "0",
}
