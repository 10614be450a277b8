"""distenv.comm: rank helpers, per-node groups and bucketed averaging, on real gloo groups."""

from __future__ import annotations

import warnings

import pytest

with warnings.catch_warnings():
    # torch warns at import when NumPy is missing (the CPU test venv has none).
    warnings.simplefilter("ignore")
    import torch

import distenv
from distenv.comm import plan_buckets
from distenv.errors import ConfigurationError, InitError
from tests.support.spawn import contract_env, free_port, run_workers

WORLD = 3
F32, F64, F16 = "torch.float32", "torch.float64", "torch.float16"


@pytest.fixture(scope="module")
def comm_results() -> list[dict]:
    """Run the comm scenario once on a 3-rank gloo group; every test below reads its results."""
    port = free_port()
    return run_workers("comm", [contract_env(rank, WORLD, port) for rank in range(WORLD)])


@pytest.mark.parametrize(
    ("items", "limit", "expected"),
    [
        pytest.param([], 10, [], id="empty"),
        pytest.param([("a", 4), ("a", 4), ("a", 4)], 10, [[0, 1], [2]], id="fills-then-spills"),
        pytest.param([("a", 5), ("a", 5)], 10, [[0, 1]], id="exactly-full"),
        pytest.param([("a", 4), ("a", 30), ("a", 4)], 10, [[0], [1], [2]], id="big-alone"),
        pytest.param([("a", 30), ("a", 30)], 10, [[0], [1]], id="all-bigger-than-bucket"),
        pytest.param(
            [("a", 2), ("b", 2), ("a", 2), ("b", 2)], 10, [[0, 2], [1, 3]], id="keys-never-mix"
        ),
        pytest.param(
            [("f32", 80), ("f64", 56), ("f16", 6), ("f32", 40)],
            50,
            [[0], [1], [2], [3]],
            id="worker-small-buckets",
        ),
    ],
)
def test_plan_buckets(items, limit, expected):
    """Buckets stay within the limit, never mix dtype/device keys, and a big tensor goes alone."""
    assert plan_buckets(items, limit) == expected


def test_helpers_without_group():
    """Without a process group every helper acts as rank 0 of 1, and averaging changes nothing."""
    calls = []

    @distenv.master_only
    def record(x):
        calls.append(x)
        return x + 1

    tensor = torch.arange(4.0)
    param = torch.nn.Parameter(torch.ones(2))
    param.grad = torch.full((2,), 3.0)
    distenv.allreduce_params([tensor])
    distenv.allreduce_grads([param])
    distenv.barrier()
    assert distenv.get_dist_info() == (0, 1)
    assert distenv.is_main_process()
    assert record(1) == 2
    assert calls == [1]
    assert tensor.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert param.grad.tolist() == [3.0, 3.0]


def test_get_local_group_needs_a_group():
    """get_local_group() without a process group raises InitError with a hint, not torch's error."""
    with pytest.raises(InitError, match=r"^comm: .*does not exist\. Hint: call distenv.init_dist"):
        distenv.get_local_group()


@pytest.mark.parametrize("size", [0, -1.0])
def test_bucket_size_must_be_positive(size):
    """A non-positive bucket size is a ConfigurationError naming the value."""
    with pytest.raises(ConfigurationError, match=rf"bucket_size_mb={size!r} must be positive"):
        distenv.allreduce_params([torch.ones(1)], bucket_size_mb=size)


def test_allreduce_params_small_buckets(comm_results):
    """Parameters of 3 dtypes are averaged exactly, one bucket per tensor when buckets are tiny."""
    expected = [
        [2.0] * 20,
        [2.0 * i for i in range(7)],
        [2.0, 4.0, 6.0],
        [1.0] * 10,
    ]
    for result in comm_results:
        assert result["small"] == expected
        assert result["small_calls"] == [[F32, 20], [F64, 7], [F16, 3], [F32, 10]]


def test_allreduce_params_default_buckets(comm_results):
    """With the default bucket size, one collective per dtype carries every tensor of it."""
    for result in comm_results:
        assert result["default"] == result["small"]
        assert result["default_calls"] == [[F32, 30], [F64, 7], [F16, 3]]


def test_allreduce_grads(comm_results):
    """Gradients are averaged in their own dtype, None stays None, parameters are untouched."""
    for result in comm_results:
        assert result["grads"] == [[1.0, 1.0, 1.0], [1.0, 3.0], None, [8.0, -8.0]]
        assert result["grad_dtypes"] == [F32, F64, None, F16]
        assert result["grad_params"] == [[0.0] * 3, [0.0] * 2, [0.0] * 4, [0.0] * 2]
        assert result["grad_calls"] == [[F32, 3], [F64, 2], [F16, 2]]


def test_buckets_share_one_buffer(comm_results):
    """Five buckets in two dtypes are copied into one buffer the size of a bucket: whenever gloo
    drops its reference to a collective's tensor, the copies never hold more than one bucket."""
    for result in comm_results:
        assert result["bucketed"] == [1.0 + i for i in range(10)]  # the mean of rank + i
        # Besides torch's scalars of a few bytes: one allocation of a bucket, not one per bucket.
        large = [n for n in result["bucket_allocations"] if n >= 1000]
        assert large == [8000], result["bucket_allocations"]


def test_rank_helpers(comm_results):
    """get_dist_info, is_main_process and master_only follow the group's rank."""
    for rank, result in enumerate(comm_results):
        assert result["dist_info"] == [rank, WORLD]
        assert result["is_main"] is (rank == 0)
        assert result["master_only"] == (30 if rank == 0 else None)
        assert result["wrapped"] == ["times_ten", "Multiply by ten."]


def test_seed_per_rank(comm_results):
    """seed_everything(per_rank=True) adds the group rank to the seed."""
    assert [result["seed"] for result in comm_results] == [100, 101, 102]


def test_logger_ranks(comm_results):
    """get_logger(ranks=(0, 2)) prints on ranks 0 and 2 only, each line naming its rank."""
    logs = [result["log"] for result in comm_results]
    assert logs[1] == ""
    for rank in (0, 2):
        assert logs[rank].count("\n") == 1
        assert logs[rank].endswith(f" rank{rank} INFO workers: hello from {rank}\n")


def test_local_group_uneven_nodes():
    """get_local_group() on nodes of 2, 2, 2 and 1 ranks: each rank's group is exactly its node."""
    nodes = [0, 0, 1, 1, 2, 2, 3]
    port = free_port()
    envs = [contract_env(rank, len(nodes), port, node_of=nodes) for rank in range(len(nodes))]
    results = run_workers("local_group", envs, timeout=90)
    members = {0: [0, 1], 1: [2, 3], 2: [4, 5], 3: [6]}
    for rank, result in enumerate(results):
        node = nodes[rank]
        assert result["node"] == node
        assert result["ranks"] == members[node]
        assert result["size"] == len(members[node])
        assert result["sum"] == float(sum(members[node]))
        assert result["cached"] is True
