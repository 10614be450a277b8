"""SageMaker training-container environments, recorded from the SageMaker Training Toolkit's source.

SageMaker cannot run here. Source: aws/sagemaker-training-toolkit v5.1.0,
src/sagemaker_training/environment.py `Environment.to_env_vars` (every key becomes SM_<KEY>;
mapping.py `to_env_vars` writes non-strings as compact JSON: SM_HOSTS '["algo-1","algo-2"]',
SM_IS_HETERO 'false') and `get_master_hostname` (the first host, or the first of the
distribution's instance groups in a heterogeneous cluster); params.py: TRAINING_JOB_NAME is the
platform's. torch_distributed.py runs `torchrun --nnodes N --nproc_per_node P --master_addr
<first host> --master_port 7777 --node_rank <index of SM_CURRENT_HOST>`; a torchrun rank's variable
set is the captured one (tests/support/envs/torchrun.py), with torchrun's default rendezvous id "none".
mpi.py's MasterRunner runs `mpirun --host algo-1:2,algo-2:2 -np 4 ... -x NAME` for every SM_*
variable: each rank gets Open MPI's OMPI_COMM_WORLD_* and the *first host's* SM_CURRENT_HOST.
"""

_job = {
    "SM_HOSTS": '["algo-1","algo-2"]',
    "SM_IS_HETERO": "false",
    "SM_NUM_GPUS": "2",
    "TRAINING_JOB_NAME": "pt-ddp-2026-11-23",
}

# No distribution: the entry point runs once on each host; this is algo-2's process.
SM_PLAIN_HOST2 = {**_job, "SM_CURRENT_HOST": "algo-2"}

# distribution torch_distributed, 2 hosts x 2 GPUs: rank 3, torchrun's local rank 1 on algo-2.
SM_TORCHRUN_RANK3 = {
    **SM_PLAIN_HOST2,
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "algo-1",
    "MASTER_PORT": "7777",
    "RANK": "3",
    "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_RUN_ID": "none",
    "WORLD_SIZE": "4",
}

# distribution mpi, processes_per_host 2: rank 3 runs on algo-2 but sees algo-1's SM_CURRENT_HOST.
SM_MPI_RANK3 = {
    **_job,
    "SM_CURRENT_HOST": "algo-1",
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}

# A heterogeneous cluster (instance groups), no distribution: the master is not SM_HOSTS' first.
SM_HETERO_HOST2 = {**SM_PLAIN_HOST2, "SM_IS_HETERO": "true"}
