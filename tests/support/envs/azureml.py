"""Azure ML MPI job environments, recorded from Azure ML's documentation (it cannot run here).

Source: Azure Machine Learning, "Distributed GPU training guide" (SDK v2 edition,
learn.microsoft.com/azure/machine-learning/how-to-train-distributed-gpu, and its SDK v1 edition),
section "Environment variables from Open MPI": an MPI job's ranks carry OMPI_COMM_WORLD_RANK,
OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE, and
AZ_BATCH_MASTER_NODE ("the primary address with port, MASTER_ADDR:MASTER_PORT") on several nodes or
AZ_BATCHAI_MPI_MASTER_NODE ("the primary address", single node) on one; Azure ML builds the mpirun
command itself and sets no MASTER_ADDR. AZUREML_RUN_ID is the run's id (azureml-core's
`Run.get_context` reads it in a submitted run). Host names and the port are examples of the
documented forms.
"""

# instance_count 2, distribution mpi with process_count_per_instance 2: rank 3 (second node).
AML_MPI_2X2_RANK3 = {
    "AZUREML_RUN_ID": "ddp_1700000000_a1b2c3d4",
    "AZ_BATCH_MASTER_NODE": "10.0.0.4:6105",
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}

# instance_count 1, process_count_per_instance 2: rank 1 on the only node.
AML_MPI_1X2_RANK1 = {
    "AZUREML_RUN_ID": "ddp_1700000001_e5f6a7b8",
    "AZ_BATCHAI_MPI_MASTER_NODE": "10.0.0.5",
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}

# The same multi-node job's variables seen by a process no MPI launcher started.
AML_NO_MPI_2 = {
    "AZUREML_RUN_ID": "ddp_1700000000_a1b2c3d4",
    "AZ_BATCH_MASTER_NODE": "10.0.0.4:6105",
}

# distribution PyTorch, instance_count 2, process_count_per_instance 2: rank 3. The same guide's
# PyTorch section: Azure ML sets MASTER_ADDR, MASTER_PORT, WORLD_SIZE and NODE_RANK on each node
# and the process-level RANK and LOCAL_RANK; no LOCAL_WORLD_SIZE. Whether AZ_BATCH_MASTER_NODE is
# also set there is not documented: it is left out.
AML_PYTORCH_2X2_RANK3 = {
    "AZUREML_RUN_ID": "ddp_1700000002_c9d0e1f2",
    "MASTER_ADDR": "10.0.0.4",
    "MASTER_PORT": "6105",
    "WORLD_SIZE": "4",
    "NODE_RANK": "1",
    "RANK": "3",
    "LOCAL_RANK": "1",
}

# The same process with AZUREML_NODE_COUNT, the job's instance_count: not in the guide, but set
# on Azure ML's nodes and read by scripts written for Azure ML (e.g. `NODE_COUNT=$AZUREML_NODE_COUNT`
# in Microsoft's and others' launch scripts); with it, the local world size is WORLD_SIZE / nodes.
AML_PYTORCH_2X2_COUNTED_RANK3 = {**AML_PYTORCH_2X2_RANK3, "AZUREML_NODE_COUNT": "2"}

# Rank 0 of that job: node 0's first process, on the master itself.
AML_PYTORCH_2X2_COUNTED_RANK0 = {
    **AML_PYTORCH_2X2_COUNTED_RANK3,
    "NODE_RANK": "0",
    "RANK": "0",
    "LOCAL_RANK": "0",
}


def pytorch_processes(port: int, nodes: int = 2, per_node: int = 2) -> list[dict[str, str]]:
    """Return every process's environment of a PyTorch-distribution job on this machine, as
    Azure ML starts them (`AML_PYTORCH_2X2_COUNTED_RANK3`'s variables), the master at
    127.0.0.1:`port`."""
    return [
        {
            **AML_PYTORCH_2X2_COUNTED_RANK3,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": str(nodes * per_node),
            "AZUREML_NODE_COUNT": str(nodes),
            "NODE_RANK": str(node),
            "RANK": str(node * per_node + local),
            "LOCAL_RANK": str(local),
        }
        for node in range(nodes)
        for local in range(per_node)
    ]
