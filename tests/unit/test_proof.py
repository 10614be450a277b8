"""Which backends' init proves the process group (`distenv.bootstrap.proof.proves_group`).

Where it does, the group-up round trip is skipped and rank 0 only releases the group; where it
does not (gloo, measured in docs/faults.md; lazy NCCL; any other backend), the check is kept.
"""

from __future__ import annotations

import pytest

from distenv.bootstrap.proof import NCCL_NONBLOCKING_VAR, proves_group


@pytest.mark.parametrize(
    ("backend", "eager", "env", "proven"),
    [
        pytest.param("nccl", True, {}, True, id="nccl-device_id"),
        pytest.param("NCCL", True, {}, True, id="nccl-upper-case"),
        pytest.param("nccl", False, {}, False, id="nccl-lazy"),
        pytest.param("nccl", True, {NCCL_NONBLOCKING_VAR: "1"}, False, id="nccl-nonblocking-1"),
        pytest.param("nccl", True, {NCCL_NONBLOCKING_VAR: "True"}, False, id="nccl-nonblocking"),
        pytest.param("nccl", True, {NCCL_NONBLOCKING_VAR: "0"}, True, id="nccl-blocking-0"),
        pytest.param("nccl", True, {NCCL_NONBLOCKING_VAR: ""}, True, id="nccl-blocking-empty"),
        pytest.param("gloo", False, {}, False, id="gloo-eager"),
        pytest.param("gloo", True, {}, False, id="gloo-with-device"),
        pytest.param("gloo", False, {"TORCH_GLOO_LAZY_INIT": "1"}, False, id="gloo-lazy"),
        pytest.param("cpu:gloo,cuda:nccl", True, {}, True, id="multi-nccl-eager"),
        pytest.param("cpu:gloo, cuda:nccl", True, {}, True, id="multi-spaced"),
        pytest.param("cpu:gloo,cuda:nccl", False, {}, False, id="multi-nccl-lazy"),
        pytest.param(
            "cpu:gloo,cuda:nccl", True, {NCCL_NONBLOCKING_VAR: "yes"}, False, id="multi-nonblocking"
        ),
        pytest.param("mpi", False, {}, False, id="mpi"),
        pytest.param("ucc", True, {}, False, id="ucc"),
        pytest.param("xccl", True, {}, False, id="unknown"),
        pytest.param("", False, {}, False, id="empty"),
    ],
)
def test_only_a_collective_init_proves_the_group(
    backend: str, eager: bool, env: dict[str, str], proven: bool
) -> None:
    """NCCL's eager, blocking init proves it, alone or in a multi-backend string; nothing else."""
    assert proves_group(backend, eager_device=eager, environ=env) is proven
