"""The collision guard after the roll call: two jobs of one identity never train as one group.

Two jobs started with the same identity (``TORCHELASTIC_RUN_ID``, world size and master port) meet
in one roll call. A positive verdict counted no extra claim (`distenv.bootstrap.flat.check_in`), so
an extra claim filed after it is a second process of this identity whose ranks may have joined this
job's group: rank 0 reads the count once more before the group goes (`extra_claims`) and refuses
it (`refuse`). The group-up check carries the refusal in each rank's acknowledgement
(`distenv.bootstrap.flat.FlatChannel.acknowledge`); where the backend's init proves the group
(`distenv.bootstrap.proof`), rank 0's one release carries it (`release`, `await_release`).
"""

from __future__ import annotations

from collections.abc import Callable

from distenv.bootstrap.channel import check_release
from distenv.bootstrap.protocol import COLLIDED, EXTRAS, RELEASE, ROLLCALL, UP, Message
from distenv.bootstrap.session import FOREIGN_HINT, Bootstrap, Session
from distenv.bootstrap.waits import wait_value
from distenv.deadline import Deadline, pause
from distenv.errors import DistEnvError, RendezvousError
from distenv.timing import COLLISION_LINGER_S

__all__ = ["await_release", "extra_claims", "linger", "refuse", "release"]


def extra_claims(session: Session) -> int:
    """Rank 0: return the count of extra claims filed in the roll call (one read)."""
    return int(session.store.add(f"{session.keys(ROLLCALL)}/{EXTRAS.name}", 0))


def refuse(boot: Bootstrap) -> DistEnvError:
    """Rank 0 that refused its group to a second process of its identity: keep the store for
    the others' last reads (`linger`), then return the error to raise."""
    linger(boot, Deadline.after(COLLISION_LINGER_S))
    return boot.session.collided(
        "a process of this identity claimed a rank in the roll call after the verdict"
    )


def linger(boot: Bootstrap, until: Deadline) -> None:
    """Rank 0 that found two processes of its job's identity: keep the store until `until`.

    The other job's ranks may still be probing for a store with backoff (`PROBE_MAX_S` between
    probes); one that reaches this one before it goes reads the verdict and names the collision,
    instead of reaching, later, another rank 0 of this identity and mixing with it. After it,
    the store goes as the bootstrap fails (`distenv.bootstrap.session.Session.release`).
    """
    boot.session.keeps_store = False
    pause(max(min(until.left(), boot.waits.left()), 0.0))


def release(boot: Bootstrap, value: str, hand_on: Callable[[Bootstrap, str], None]) -> None:
    """Rank 0, its init returned: write the release (`value`, its verdict's), or COLLIDED and
    fail; `hand_on` tells its own node's members (a leader's).

    One read and one write, against the group-up check's records, count and per-rank echoes.
    """
    session = boot.session
    store, key = session.store, f"{session.keys(UP)}/{RELEASE.name}"
    if extra_claims(session):
        store.set(key, COLLIDED.decode())
        hand_on(boot, Message.RELEASE.encode(COLLIDED.decode()))
        raise refuse(boot)
    if store.compare_set(key, "", value) != value.encode():
        info = session.info
        raise RendezvousError(
            info.launcher,
            f"rank 0 of {info.world_size}: a process outside this job wrote the release of the "
            f"process group in the store at {session.master} before rank 0 did",
            hint=FOREIGN_HINT,
        )
    hand_on(boot, Message.RELEASE.encode(value))


def await_release(
    boot: Bootstrap,
    value: str,
    missing: Callable[[], DistEnvError],
    hand_on: Callable[[Bootstrap, str], None],
) -> None:
    """A rank (or leader) other than 0: wait once for rank 0's release; hand it on (a leader's
    members compare it with their own verdict's value); raise unless it is `value`."""
    session = boot.session
    found = wait_value(session.store, f"{session.keys(UP)}/{RELEASE.name}", boot.waits)
    if found is not None:
        known = found in (COLLIDED, value.encode())
        hand_on(boot, Message.RELEASE.encode(found.decode() if known else "-"))
    check_release(session, found, value, missing)
