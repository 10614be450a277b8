"""How a rank other than rank 0 reaches the store: probed and greeted first, except an agent's
store; a listener that is no store is named before torch's client sees it."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest

import distenv.bootstrap.store as store_module
from distenv.bootstrap.store import connect_store
from distenv.deadline import Deadline, Watch
from distenv.errors import RendezvousTimeoutError, StoreTakenError
from distenv.rankinfo import RankInfo
from tests.support.hostile import hostile_listener


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

    def recording(addresses: Any, timeout: float) -> Any:
        opened.append(addresses)
        return probe(addresses, timeout)

    monkeypatch.setattr(store_module, "_connect_once", recording)
    return opened


@pytest.mark.parametrize(("agent_store", "probes"), [(False, 1), (True, 0)])
def test_only_a_store_that_may_not_be_up_yet_is_probed_first(
    server: int, monkeypatch: pytest.MonkeyPatch, agent_store: bool, probes: int
) -> None:
    """Rank 0's own store may still be starting: rank 1 probes the port before torch connects.

    An agent's store listened before the ranks started: rank 1 connects once, the store's own.
    The probe greets the store as torch's client does, and a store answers it.
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


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("reset", "it failed the connection when greeted as a store (Connection reset by peer)"),
        ("close", "it closed the connection when greeted as a store"),
        ("wrong-ping", "it answered a store's ping with 0x48545450"),  # "HTTP"
    ],
)
def test_a_listener_that_is_no_store_is_refused_at_once_before_torch_sees_it(
    monkeypatch: pytest.MonkeyPatch, mode: str, said: str
) -> None:
    """The probe greets the port as torch's client would: a reset, a close or a wrong echo is
    a `StoreTakenError` at once, naming the address and the fix; torch's client never connects."""
    monkeypatch.setattr("torch._C._distributed_c10d.TCPStore", None)  # never reached
    with hostile_listener(mode) as port:
        info = RankInfo(
            launcher="torchrun", rank=1, world_size=2, local_rank=1, local_world_size=2,
            node_rank=0, num_nodes=1, master_addr="127.0.0.1", master_port=port,
        )  # fmt: skip
        deadline = Deadline.after(30)
        watch = Watch("connecting", deadline, lambda: TimeoutError("test"))
        with pytest.raises(StoreTakenError) as caught:
            connect_store(info, watch, deadline, agent_store=False)
    assert deadline.left() > 25
    assert f"127.0.0.1:{port} accepted a connection but is not a torch store: {said}" in str(
        caught.value
    )
    assert caught.value.variable == "MASTER_PORT"
    assert "give this job its own MASTER_PORT" in str(caught.value)


def test_a_silent_listener_is_named_at_the_deadline() -> None:
    """A listener that never answers the greeting: named at the deadline, as such."""
    with hostile_listener("silent") as port:
        info = RankInfo(
            launcher="torchrun", rank=1, world_size=2, local_rank=1, local_world_size=2,
            node_rank=0, num_nodes=1, master_addr="127.0.0.1", master_port=port,
        )  # fmt: skip
        deadline = Deadline.after(1)
        watch = Watch("connecting", deadline, lambda: TimeoutError("test"))
        with pytest.raises(RendezvousTimeoutError) as caught:
            connect_store(info, watch, deadline, agent_store=False)
    assert -5 < deadline.left() <= 0  # at the deadline, with a loaded machine's slack
    assert "not answering as a torch store (another service, or rank 0 stopped?) within 1 s" in (
        str(caught.value)
    )
