"""Rank 0's release of a group its backend proved (`distenv.bootstrap.group.release_group`).

Where NCCL's eager init proves the group, the group-up round trip is skipped and rank 0 writes
one release, the fresh value its verdict announced, after one read of the roll call's extra claims
(the #44 collision guard). Flat ranks over a real TCPStore, one thread each; the same steps run
under real launchers only on a GPU machine (NCCL with device_id=).
"""

from __future__ import annotations

import threading
import time

import pytest

from distenv import RankInfo
from distenv.bootstrap.group import release_group
from distenv.bootstrap.problems import SAME_IDENTITY
from distenv.bootstrap.protocol import COLLIDED, EXTRAS, RELEASE, ROLLCALL, UP, prefix
from distenv.bootstrap.session import Bootstrap, Session
from distenv.deadline import Deadline
from distenv.errors import RendezvousError, RendezvousTimeoutError
from distenv.timing import MARGIN_S

WORLD = 3
VALUE = "0123456789abcdef"
SCOPE = "slurm/7/0"


def _release(before: dict[str, str], within: float = 60.0) -> dict[int, object]:
    """Run rank 0's release and every other rank's wait, the store holding `before` (keys under
    the session's prefix) first; return each rank's outcome (None, or the error it raised)."""
    import datetime

    from torch.distributed import TCPStore

    server = TCPStore(
        "127.0.0.1", 0, WORLD, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False
    )
    outcomes: dict[int, object] = {}

    def session_of(rank: int) -> Session:
        info = RankInfo(
            launcher="slurm", rank=rank, world_size=WORLD, local_rank=rank,
            local_world_size=WORLD, node_rank=0, num_nodes=1,
            master_addr="127.0.0.1", master_port=server.port,
        )  # fmt: skip
        session = Session(info, SCOPE)
        session.store = server if rank == 0 else TCPStore("127.0.0.1", server.port, WORLD, False)
        return session

    for key, value in before.items():
        server.set(key, value)
    sessions = {rank: session_of(rank) for rank in range(WORLD)}

    def rank_main(rank: int) -> None:
        boot = Bootstrap(sessions[rank], 10.0, Deadline.after(within + MARGIN_S))
        try:
            release_group(boot, VALUE)
            outcomes[rank] = None
        except (RendezvousError, RendezvousTimeoutError) as exc:
            outcomes[rank] = exc

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return outcomes


def _key(phase: str, name: str) -> str:
    return f"{prefix(SCOPE, phase, '0')}/{name}"


def test_rank_0_releases_every_rank_with_its_verdicts_value() -> None:
    """No extra claim: every rank returns, having read the verdict's value, long before the
    deadline (60 s; generous for a loaded machine)."""
    start = time.monotonic()
    assert _release({}) == dict.fromkeys(range(WORLD))
    assert time.monotonic() - start < 30


def test_an_extra_claim_after_the_verdict_fails_every_rank_naming_the_collision() -> None:
    """A process of this identity filed an extra claim after the verdict: rank 0 writes COLLIDED
    instead of the value, and every rank fails naming the collision (#44 item 2)."""
    outcomes = _release({_key(ROLLCALL, EXTRAS.name): "1"})
    for rank in range(WORLD):
        error = outcomes[rank]
        assert isinstance(error, RendezvousError), outcomes
        assert SAME_IDENTITY in str(error)
        assert "TORCHELASTIC_RUN_ID" in str(error)
    assert "claimed a rank in the roll call after the verdict" in str(outcomes[0])
    assert "refused the group" in str(outcomes[1])


@pytest.mark.parametrize("forged", ["fedcba9876543210", COLLIDED.decode()[:3]])
def test_a_release_written_before_rank_0_passes_no_rank(forged: str) -> None:
    """A value in the release key before rank 0 writes, other than its verdict's: rank 0 refuses
    it as a foreign write, and every other rank names it forged."""
    outcomes = _release({_key(UP, RELEASE.name): forged})
    assert isinstance(outcomes[0], RendezvousError), outcomes
    assert "a process outside this job wrote the release" in str(outcomes[0])
    for rank in range(1, WORLD):
        error = outcomes[rank]
        assert isinstance(error, RendezvousError), outcomes
        assert "was not written by this job's rank 0" in str(error)


def test_a_rank_released_by_nobody_names_rank_0_by_its_deadline() -> None:
    """Rank 0 stopped after its init returned: the others name it by their deadline."""
    import datetime

    from torch.distributed import TCPStore

    server = TCPStore(
        "127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False
    )
    info = RankInfo(
        launcher="slurm", rank=1, world_size=2, local_rank=1, local_world_size=2, node_rank=0,
        num_nodes=1, master_addr="127.0.0.1", master_port=server.port,
    )  # fmt: skip
    session = Session(info, SCOPE)
    session.store = TCPStore("127.0.0.1", server.port, 2, False)
    start = time.monotonic()
    with pytest.raises(RendezvousTimeoutError) as error:
        release_group(Bootstrap(session, 2.0, Deadline.after(6.0)), VALUE)
    took = time.monotonic() - start
    assert "rank 0 did not release the process group within 6 s" in str(error.value)
    assert took < 6.0 + 1.0, took
