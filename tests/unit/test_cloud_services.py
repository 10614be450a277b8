"""The `sagemaker` and `azureml` backends over environments recorded from their sources and docs."""

from __future__ import annotations

import pytest

from distenv import RankInfo
from distenv.detection.pipeline import locate
from distenv.errors import (
    DistEnvError,
    InconsistentEnvironmentError,
    InvalidVariableError,
    MissingVariableError,
    NotLaunchedError,
)
from distenv.launchers.registry import AZUREML, SAGEMAKER
from distenv.master import scheduler_port
from tests.support.envs import layout
from tests.support.envs.azureml import (
    AML_MPI_1X2_RANK1,
    AML_MPI_2X2_RANK3,
    AML_NO_MPI_2,
    AML_PYTORCH_2X2_COUNTED_RANK0,
    AML_PYTORCH_2X2_COUNTED_RANK3,
    AML_PYTORCH_2X2_RANK3,
)
from tests.support.envs.sagemaker import (
    SM_HETERO_HOST2,
    SM_MPI_RANK3,
    SM_PLAIN_HOST2,
    SM_TORCHRUN_RANK3,
)

JOB = "pt-ddp-2026-11-23"


def _layout(info: RankInfo) -> tuple[object, ...]:
    return (info.launcher, *layout(info))


def test_sagemaker_entry_point_per_host_is_one_rank_per_host() -> None:
    """No distribution: algo-2's process is rank 1 of 2; the master is SM_HOSTS' first host."""
    info = locate("auto", SM_PLAIN_HOST2, runtime=False).info
    assert _layout(info) == ("sagemaker", 1, 2, 0, 1, 1, 2)
    assert (info.master_addr, info.master_port) == ("algo-1", scheduler_port(JOB, "0"))
    assert info.job_id == JOB


def test_sagemaker_torch_distributed_is_torchruns_contract() -> None:
    """torch_distributed runs torchrun: rank 3 of 4 with the toolkit's master algo-1:7777."""
    info = locate("auto", SM_TORCHRUN_RANK3, runtime=False).info
    assert _layout(info) == ("pytorch", 3, 4, 1, 2, 1, 2)
    assert (info.master_addr, info.master_port) == ("algo-1", 7777)


def test_sagemaker_mpi_rank_takes_the_first_host_not_its_copied_current_host() -> None:
    """MPI mode: OMPI_* answer, the master is SM_HOSTS' first host, and mpirun's copied
    SM_CURRENT_HOST (algo-1 on every rank) numbers no node: the roll call numbers them."""
    detection = locate("auto", SM_MPI_RANK3, runtime=False)
    info = detection.info
    assert _layout(info) == ("mpi", 3, 4, 1, 2, None, None)
    assert (info.master_addr, info.master_port) == ("algo-1", scheduler_port(JOB, "mpi"))
    assert ("sagemaker", "master taken from its allocation: algo-1") in detection.considered


def test_sagemaker_heterogeneous_cluster_needs_master_addr() -> None:
    """A heterogeneous cluster's master is not SM_HOSTS' first host: MASTER_ADDR is asked for."""
    with pytest.raises(MissingVariableError, match="heterogeneous cluster") as caught:
        locate("auto", SM_HETERO_HOST2, runtime=False)
    assert (caught.value.source, caught.value.variable) == ("sagemaker", "MASTER_ADDR")
    info = locate("auto", {**SM_HETERO_HOST2, "MASTER_ADDR": "algo-3"}, runtime=False).info
    assert (info.rank, info.master_addr) == (1, "algo-3")


@pytest.mark.parametrize(
    ("change", "error", "variable", "match"),
    [
        ({"SM_HOSTS": "algo-1,algo-2"}, InvalidVariableError, "SM_HOSTS", "a JSON list"),
        ({"SM_HOSTS": "[]"}, InvalidVariableError, "SM_HOSTS", "a JSON list"),
        ({"SM_HOSTS": '["algo-1","algo-1"]'}, InvalidVariableError, "SM_HOSTS", "distinct"),
        ({"SM_HOSTS": '["algo-1","a;b"]'}, InvalidVariableError, "SM_HOSTS", "a host name"),
        ({"SM_CURRENT_HOST": "algo-9"}, InconsistentEnvironmentError, "SM_CURRENT_HOST", "not in"),
        ({"SM_CURRENT_HOST": ""}, MissingVariableError, "SM_CURRENT_HOST", "SM_CURRENT_HOST"),
    ],
    ids=["not-json", "empty", "duplicate", "bad-host", "unknown-host", "no-current"],
)
def test_sagemaker_bad_values_are_named(
    change: dict[str, str], error: type[DistEnvError], variable: str, match: str
) -> None:
    """Malformed or contradicting SM_* values are refused naming the variable and value."""
    env = {**SM_PLAIN_HOST2, **change}
    with pytest.raises(error, match=match) as caught:
        SAGEMAKER.rank_info(env)
    assert (caught.value.source, caught.value.variable) == ("sagemaker", variable)
    if error is not MissingVariableError:  # the whole value, or the offending host in it
        assert caught.value.value
        assert caught.value.value in env[variable]


@pytest.mark.parametrize(
    ("env", "layout", "master"),
    [
        pytest.param(
            AML_MPI_2X2_RANK3, ("mpi", 3, 4, 1, 2, None, None), ("10.0.0.4", 6105), id="2x2"
        ),
        pytest.param(
            AML_MPI_1X2_RANK1,
            ("mpi", 1, 2, 1, 2, 0, 1),
            ("10.0.0.5", scheduler_port("ddp_1700000001_e5f6a7b8", "mpi")),
            id="1x2",
        ),
    ],
)
def test_azureml_mpi_ranks_take_the_primary_node(
    env: dict[str, str], layout: tuple[object, ...], master: tuple[str, int]
) -> None:
    """Azure ML's MPI ranks: OMPI_* layout (the node layout from the roll call), master from
    AZ_BATCH_MASTER_NODE (host:port) or, on one node, AZ_BATCHAI_MPI_MASTER_NODE with a port from
    the run id."""
    detection = locate("auto", env, runtime=False)
    assert _layout(detection.info) == layout
    assert (detection.info.master_addr, detection.info.master_port) == master
    assert ("azureml", f"master taken from its allocation: {master[0]}") in detection.considered


def test_azureml_user_master_wins() -> None:
    """MASTER_ADDR/MASTER_PORT set by the user win over AZ_BATCH_MASTER_NODE."""
    env = {**AML_MPI_2X2_RANK3, "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}
    info = locate("auto", env, runtime=False).info
    assert (info.master_addr, info.master_port) == ("node0", 29500)


def test_azureml_multi_node_process_without_mpi_is_refused() -> None:
    """Several nodes but no MPI rank: it would be rank 0 of 1 beside the others, so refused."""
    with pytest.raises(NotLaunchedError, match="no OMPI_COMM_WORLD_RANK") as caught:
        locate("auto", AML_NO_MPI_2, runtime=False)
    exc = caught.value
    assert (exc.source, exc.variable, exc.value) == (
        "azureml",
        "AZ_BATCH_MASTER_NODE",
        "10.0.0.4:6105",
    )
    assert "distribution (type mpi" in str(exc)


def test_azureml_one_node_process_without_mpi_is_rank_0_of_1() -> None:
    """One node, no MPI rank: a single process."""
    env = {"AZ_BATCHAI_MPI_MASTER_NODE": "10.0.0.5"}
    info = locate("auto", env, runtime=False).info
    assert _layout(info) == ("azureml", 0, 1, 0, 1, 0, 1)
    assert info.master_addr == "127.0.0.1"


@pytest.mark.parametrize(
    "value",
    [
        "10.0.0.4",
        "10.0.0.4:port",
        ":6105",
        "10.0.0.4:70000",
        "a b:1",
        "10.0.0.4:6105:7",  # issue #25: was host '10.0.0.4:6105', port 7
        "[10.0.0.4:6105]:7",
        "fe80::1:6105",  # an IPv6 host needs brackets: which colon ends it is unknown
    ],
)
def test_azureml_malformed_master_node_is_named(value: str) -> None:
    """AZ_BATCH_MASTER_NODE must be 'host:port'; anything else is refused with its value."""
    env = {**AML_MPI_2X2_RANK3, "AZ_BATCH_MASTER_NODE": value}
    with pytest.raises(InvalidVariableError) as caught:
        AZUREML.allocation_master(env)
    assert (caught.value.source, caught.value.variable) == ("azureml", "AZ_BATCH_MASTER_NODE")
    assert value in str(caught.value)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param(AML_PYTORCH_2X2_RANK3, ("azureml", 3, 4, 1, None, 1, None), id="2x2"),
        pytest.param(
            AML_PYTORCH_2X2_COUNTED_RANK3, ("azureml", 3, 4, 1, 2, 1, 2), id="2x2-node-count"
        ),
        pytest.param(AML_PYTORCH_2X2_COUNTED_RANK0, ("azureml", 0, 4, 0, 2, 0, 2), id="2x2-rank0"),
    ],
)
def test_azureml_pytorch_distribution_is_read_as_azure_ml_started_it(
    env: dict[str, str], expected: tuple[object, ...]
) -> None:
    """Azure ML's PyTorch distribution (RANK, LOCAL_RANK, WORLD_SIZE, NODE_RANK, MASTER_*, no
    LOCAL_WORLD_SIZE) is azureml's: its layout, the local size WORLD_SIZE / AZUREML_NODE_COUNT
    (else the roll call's), and its MASTER_ADDR/MASTER_PORT, not a refusal naming
    LOCAL_WORLD_SIZE (issue #29)."""
    detection = locate("auto", env, runtime=False)
    assert _layout(detection.info) == expected
    assert (detection.info.master_addr, detection.info.master_port) == ("10.0.0.4", 6105)
    assert detection.info.job_id == "ddp_1700000002_c9d0e1f2"
    assert ("pytorch", "not detected: no variables") in detection.considered


def test_torchrun_inside_azure_ml_stays_torchrun() -> None:
    """A process with LOCAL_WORLD_SIZE (torchrun, distenv run) is torchrun's contract."""
    info = locate("auto", {**AML_PYTORCH_2X2_RANK3, "LOCAL_WORLD_SIZE": "2"}, runtime=False).info
    assert _layout(info) == ("pytorch", 3, 4, 1, 2, 1, 2)
    assert (info.master_addr, info.master_port) == ("10.0.0.4", 6105)


@pytest.mark.parametrize(
    ("change", "error", "variable", "match"),
    [
        ({"NODE_RANK": "one"}, InvalidVariableError, "NODE_RANK", "'one', expected"),
        ({"NODE_RANK": ""}, MissingVariableError, "NODE_RANK", "NODE_RANK is not set"),
        ({"NODE_RANK": "2"}, InconsistentEnvironmentError, "NODE_RANK", "not below"),
        ({"RANK": "2"}, InconsistentEnvironmentError, "RANK", "x 2 processes per node"),
        ({"WORLD_SIZE": "5"}, InconsistentEnvironmentError, "WORLD_SIZE", "not a multiple"),
        ({"LOCAL_RANK": "x"}, InvalidVariableError, "LOCAL_RANK", "'x', expected"),
        (
            {"AZUREML_NODE_COUNT": "0"},
            InvalidVariableError,
            "AZUREML_NODE_COUNT",
            r"'0', expected an integer in \[1,",
        ),
        ({"MASTER_PORT": ""}, MissingVariableError, "MASTER_PORT", "MASTER_PORT is not set"),
    ],
    ids=["node-word", "no-node", "node-beyond", "rank", "world", "local", "count", "no-port"],
)
def test_azureml_pytorch_distribution_bad_values_are_named(
    change: dict[str, str], error: type[DistEnvError], variable: str, match: str
) -> None:
    """A malformed or contradicting value of the PyTorch distribution is refused naming it (a
    malformed NODE_RANK got a message naming LOCAL_WORLD_SIZE), with the fix."""
    with pytest.raises(error, match=match) as caught:
        locate("auto", {**AML_PYTORCH_2X2_COUNTED_RANK3, **change}, runtime=False)
    assert (caught.value.source, caught.value.variable) == ("azureml", variable)
    assert "distribution of type pytorch" in (caught.value.hint or "")


def test_azureml_pytorch_rank_left_over_in_an_mpi_job_is_not_the_mpi_ranks() -> None:
    """A process of the PyTorch distribution claims the azureml layer; an MPI job's ranks (no
    RANK/NODE_RANK) stay MPI's."""
    assert not AZUREML.detect({"AZUREML_RUN_ID": "r"})
    assert AZUREML.detect({"AZUREML_RUN_ID": "r", "NODE_RANK": "1"})
    assert AZUREML.world(AML_PYTORCH_2X2_RANK3) == (3, 4)
    assert AZUREML.world(AML_MPI_2X2_RANK3) is None


def test_azureml_master_node_host_over_253_characters_is_refused() -> None:
    """The host part of AZ_BATCH_MASTER_NODE keeps RFC 1123's limits (issue #25: it did not)."""
    value = ".".join(["a" * 60] * 5) + ":6105"
    with pytest.raises(InvalidVariableError, match="at most 253") as caught:
        AZUREML.allocation_master({**AML_MPI_2X2_RANK3, "AZ_BATCH_MASTER_NODE": value})
    assert (caught.value.variable, caught.value.value) == ("AZ_BATCH_MASTER_NODE", value)


def test_azureml_ipv6_master_node_in_brackets() -> None:
    """'[ip]:port' is the one way to give an IPv6 primary node with its port."""
    env = {**AML_MPI_2X2_RANK3, "AZ_BATCH_MASTER_NODE": "[fe80::1]:6105"}
    master = AZUREML.allocation_master(env)
    assert master is not None
    assert (master.host, master.port) == ("fe80::1", 6105)


def test_azureml_process_without_mpi_reports_a_malformed_master_node_first() -> None:
    """A malformed AZ_BATCH_MASTER_NODE is named as malformed, not as a missing MPI launch."""
    with pytest.raises(InvalidVariableError) as caught:
        AZUREML.rank_info({**AML_NO_MPI_2, "AZ_BATCH_MASTER_NODE": "10.0.0.4:6105:7"})
    assert caught.value.variable == "AZ_BATCH_MASTER_NODE"


def test_sagemaker_deeply_nested_hosts_are_refused_in_one_line() -> None:
    """SM_HOSTS of 100 000 '[' (a RecursionError in the JSON parser) is refused, briefly."""
    bomb = "[" * 100_000
    with pytest.raises(InvalidVariableError, match="a JSON list of host names") as caught:
        SAGEMAKER.rank_info({**SM_PLAIN_HOST2, "SM_HOSTS": bomb})
    assert (caught.value.variable, caught.value.value) == ("SM_HOSTS", bomb)
    assert len(str(caught.value)) < 400
    assert "(100000 characters)" in str(caught.value)


@pytest.mark.parametrize("value", ["yes", "1", "truth", "\n"])
def test_sagemaker_is_hetero_must_be_a_boolean(value: str) -> None:
    """SM_IS_HETERO other than true/false is refused, not read as 'not heterogeneous'."""
    with pytest.raises(InvalidVariableError) as caught:
        SAGEMAKER.default_master({**SM_PLAIN_HOST2, "SM_IS_HETERO": value})
    assert (caught.value.variable, caught.value.value) == ("SM_IS_HETERO", value)
