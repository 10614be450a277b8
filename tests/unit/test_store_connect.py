"""How a rank other than rank 0 reaches the store: probed first, except an agent's store."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest

import distenv.bootstrap.store as store_module
from distenv.bootstrap.store import connect_store
from distenv.deadline import Deadline, Watch
from distenv.rankinfo import RankInfo


@pytest.fixture
def server() -> Iterator[int]:
    """A real TCPStore server on a free port; yield its port."""
    from torch.distributed import TCPStore

    # Port 0: the server binds the port the kernel picks (no window for another to take it).
    master = TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=10))  # fmt: skip
    yield master.port
    del master


def _probes(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Record every plain connection `connect_store` opens before the store's own."""
    opened: list[Any] = []
    probe = store_module._connect_once

    def recording(addresses: Any, timeout: float) -> None:
        opened.append(addresses)
        probe(addresses, timeout)

    monkeypatch.setattr(store_module, "_connect_once", recording)
    return opened


@pytest.mark.parametrize(("agent_store", "probes"), [(False, 1), (True, 0)])
def test_only_a_store_that_may_not_be_up_yet_is_probed_first(
    server: int, monkeypatch: pytest.MonkeyPatch, agent_store: bool, probes: int
) -> None:
    """Rank 0's own store may still be starting: rank 1 probes the port before torch connects.

    An agent's store listened before the ranks started: rank 1 connects once, the store's own.
    """
    opened = _probes(monkeypatch)
    info = RankInfo(
        launcher="torchrun", rank=1, world_size=2, local_rank=1, local_world_size=2,
        node_rank=0, num_nodes=1, master_addr="127.0.0.1", master_port=server,
    )  # fmt: skip
    deadline = Deadline.after(10)
    watch = Watch("connecting", deadline, lambda: TimeoutError("test"))
    store = connect_store(info, watch, deadline, agent_store=agent_store)
    store.set("key", b"value")
    assert store.get("key") == b"value"
    assert len(opened) == probes
