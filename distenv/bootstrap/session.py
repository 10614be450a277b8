"""One rank's bootstrap: its place in the job's rendezvous (`Session`) and the runner (`Bootstrap`).

A `Session` owns what every phase of the bootstrap shares: rank 0's store once reached, this rank's
`RankInfo`, the rendezvous scope and the torchrun attempt, and the operations the phases need on
them (each phase's keys, the scope's claim and check, this rank's state for the others, the error
of a rank that lost the store). A `Bootstrap` owns the time: the rendezvous timeout, the deadline
derived from it, the one watched thread every phase runs in, and SIGINT/SIGTERM, which end the
bootstrap at once and are recorded for the others. `init_dist` and `distenv doctor` build both and
run their phases (`distenv.bootstrap.rollcall.meet`, `distenv.bootstrap.group.join_group`) through `Bootstrap.run`.
"""

from __future__ import annotations

import contextlib
import re
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from distenv._hosts import this_host
from distenv.bootstrap.protocol import ROLLCALL, STATE, STATES, UP, prefix, scope_key
from distenv.bootstrap.records import NetRecord, matches
from distenv.bootstrap.scope import ScopeCheck, claim_scope, job_scope
from distenv.bootstrap.store import first_line, master_address
from distenv.bootstrap.waits import peek, read_many
from distenv.deadline import Deadline, Watch, bounded, interruptible, watched
from distenv.errors import (
    DistEnvError,
    RendezvousError,
    RendezvousTimeoutError,
    RollCallError,
    StoreTakenError,
)
from distenv.rankinfo import RankInfo
from distenv.settings import TIMEOUT_VAR, Settings
from distenv.timing import GRACE_S, LOOKUP_S, MARGIN_S, RELEASE_S, SIGNAL_MARK_S

if TYPE_CHECKING:
    from distenv.detection.pipeline import Detection

__all__ = ["FOREIGN_HINT", "STATES", "Bootstrap", "Session"]

T = TypeVar("T")

#: The fix for every value in the store that this job's ranks did not write.
FOREIGN_HINT = (
    "something else on the network writes to this job's port: give the job another "
    "MASTER_PORT, and see docs/security.md"
)
# A state record: the state, ``@`` a host name, and for "up" ``#`` a token of hex digits.
MAX_STATE_BYTES = 512
_TOKEN = re.compile(r"(?:[0-9a-f]{16})?")


#: The store and channel of this process's last failed bootstrap (`Session.release`).
_KEPT: list[list[Any]] = []
_KEPT_LOCK = threading.Lock()


def forget_failed(held: list[Any] | None = None) -> None:
    """Close the channel and drop the store a failed bootstrap left (`Session.release`), or only
    `held` if it is still the one kept: its port is free again once this returns."""
    with _KEPT_LOCK:  # the timer and a retried init_dist may both come here
        if not _KEPT or (held is not None and _KEPT[0] is not held):
            return
        held = _KEPT.pop()
    kept = [item for item in held if item is not None]
    held.clear()  # the timer's reference to the list holds nothing more
    for item in kept:
        if hasattr(item, "close"):
            item.close()
    del kept


class Session:
    """This rank's place in its job's rendezvous: rank 0's store, who this rank is, and its keys.

    Args:
        info: This rank's RankInfo.
        scope: The rendezvous scope (`distenv.bootstrap.scope.job_scope`).
        restart: The torchrun attempt (``TORCHELASTIC_RESTART_COUNT``, as read): each has its own
            keys.
        agent_store: Whether torchrun's agent store serves the job (every rank is its client).
        master_from: Where the master address came from, for the error when it does not resolve.
        leaders: ``DISTENV_NODE_LEADERS`` (`distenv.bootstrap.role.Role`).
    """

    def __init__(
        self,
        info: RankInfo,
        scope: str,
        *,
        restart: str = "0",
        agent_store: bool = False,
        master_from: str = "MASTER_ADDR",
        leaders: str = "auto",
    ) -> None:
        self.info, self.scope, self.restart = info, scope, restart
        self.agent_store, self.master_from, self.leaders = agent_store, master_from, leaders
        self.store: Any = None  # rank 0's store, once reached (`distenv.bootstrap.rollcall.meet`)
        #: How this rank reaches rank 0 (`distenv.bootstrap.channel.Channel`), chosen once from
        #: its role by the roll call (`distenv.bootstrap.rollcall.meet`) and kept for the
        #: group-up check; None before (a roll call held without `meet` is flat).
        self.channel: Any = None
        #: Whether a failed bootstrap keeps its store `RELEASE_S` longer (`release`): not once a
        #: signal ended it, nor after a collision, whose rank 0 lingered already (`guard.linger`).
        self.keeps_store = True

    @classmethod
    def of(cls, detection: Detection, info: RankInfo, settings: Settings) -> Session:
        """Return the session of the job `detection` found, for this rank (`info`)."""
        forget_failed()
        return cls(
            info,
            job_scope(detection.job_tag, info.world_size, detection.mpi_token),
            restart=settings.restart,
            agent_store=settings.agent_store,
            master_from=detection.master_from,
            leaders=settings.node_leaders,
        )

    def release(self, failure: BaseException) -> None:
        """Keep rank 0's store and this rank's channel `RELEASE_S` longer after a failed
        bootstrap (not one a signal or a collision ended), then let them go, so that the port is free soon after.

        The others may still read this rank's verdict and states in the store (they stop
        waiting at the same deadline), and a leader's members its last word. torch's store has
        no close: its server stops when the last reference goes. The `failure` the caller is
        about to raise holds, through its traceback (and the tracebacks chained to it), the
        finished frames of every phase, whose locals reach the store: their locals are cleared,
        so that `_KEPT` holds the only reference; a timer drops it (`forget_failed`), and so
        does an `init_dist` retried in this process, which then listens on the port again at
        once instead of when the garbage collector next runs.
        """
        forget_failed()
        held = [self.store, self.channel]
        with _KEPT_LOCK:
            _KEPT.append(held)
        self.channel = self.store = None
        timer = threading.Timer(RELEASE_S, forget_failed, (held,))
        timer.daemon = True
        timer.start()
        seen: set[int] = set()
        exc: BaseException | None = failure
        while exc is not None and id(exc) not in seen:
            seen.add(id(exc))
            traceback.clear_frames(exc.__traceback__)
            exc = exc.__cause__ or exc.__context__
        if not self.keeps_store:  # stopped by a signal, or a collision: the port is free at once
            forget_failed(held)

    @property
    def master(self) -> str:
        """Return ``host:port`` of rank 0's store."""
        return master_address(self.info)

    def keys(self, phase: str) -> str:
        """Return the prefix of one phase's keys (`distenv.bootstrap.protocol.prefix`)."""
        return prefix(self.scope, phase, self.restart)

    def scoped(self, phase: str) -> Any:
        """Return the store as one phase sees it: under that phase's prefix."""
        from torch._C._distributed_c10d import PrefixStore

        return PrefixStore(self.keys(phase), self.store)

    def claim(self, hostname: str | None = None, net: NetRecord | None = None) -> None:
        """Claim the store for this job (rank 0); raise `StoreTakenError` if another's is there.

        With `net`, the claim offers rank 0's node (`hostname`) to the others' network probe.
        """
        claim_scope(self.store, self.info, self.scope, scope_key(self.restart), hostname, net)

    def check(self, deadline: Deadline, phase: str = ROLLCALL) -> ScopeCheck:
        """Return the check that the store is this job's (every rank but 0), ending at `deadline`;
        a rank of another world size says so in rank 0's `phase`."""
        return ScopeCheck(
            self.store,
            self.info,
            self.scope,
            scope_key(self.restart),
            deadline,
            resized=lambda scope: prefix(scope, phase, self.restart),
        )

    def _state_key(self, rank: int) -> str:
        return f"{self.keys(UP)}/{STATE.of(rank)}"

    def mark(self, state: str, *, wait: float = 0.0, token: str = "", aside: bool = False) -> None:
        """Record this rank's state (`STATES`) with its host; with `wait`, best effort within it.

        `token` (the group-up check's) is a fresh random string that rank 0 echoes back to this
        rank alone, so that no value written in advance under a fixed key can stand for it.
        `aside` writes over a connection of its own: a signal's record, made from the main thread
        while the bootstrap's connection may be held by a wait in the store
        (`distenv.bootstrap.waits.wait_value`).
        """
        value = f"{state}@{this_host()}" + (f"#{token}" if token else "")
        key = self._state_key(self.info.rank)
        if not wait:
            self.store.set(key, value)
            return

        def write() -> None:
            (self.connection(wait) if aside else self.store).set(key, value)

        # Rank 0's store may be gone or stuck: the others' deadline names this rank anyway.
        with contextlib.suppress(TimeoutError, RuntimeError):
            bounded(write, Deadline.after(wait), TimeoutError)

    def connection(self, timeout: float) -> Any:
        """Return a new client connection to rank 0's store (its requests time out after
        `timeout`)."""
        import datetime

        from torch._C._distributed_c10d import TCPStore

        info = self.info
        return TCPStore(
            str(info.master_addr),
            int(info.master_port or 0),
            is_master=False,
            timeout=datetime.timedelta(seconds=timeout),
            wait_for_workers=False,
        )

    def read_states(self, ranks: Sequence[int]) -> dict[int, tuple[str, str] | None]:
        """Return each rank's recorded ``(state, host)``, None where it wrote none (or garbage)."""
        return {
            rank: None if state is None else state[:2]
            for rank, state in zip(ranks, self._states(ranks, many=False), strict=True)
        }

    def up_tokens(self, ranks: Sequence[int]) -> dict[int, str | None]:
        """Return the token of each rank that recorded itself up, None for the others.

        Read in chunks (`read_many`): rank 0 reads every rank's record in the group-up check.
        """
        return {
            rank: state[2] if state is not None and state[0] == "up" and state[2] else None
            for rank, state in zip(ranks, self._states(ranks, many=True), strict=True)
        }

    def _states(self, ranks: Sequence[int], *, many: bool) -> list[tuple[str, str, str] | None]:
        """Return each rank's ``(state, host, token)``, validated; None where absent or garbage."""
        keys = [self._state_key(rank) for rank in ranks]
        raws = read_many(self.store, keys) if many else [peek(self.store, k) for k in keys]
        states: list[tuple[str, str, str] | None] = []
        for raw in raws:
            if raw is None or len(raw) > MAX_STATE_BYTES:
                states.append(None)
                continue
            state, _, rest = raw.decode("ascii", "replace").partition("@")
            host, _, token = rest.partition("#")
            valid = state in STATES and matches("hostname", host) and _TOKEN.fullmatch(token)
            states.append((state, host, token) if valid else None)
        return states

    @contextlib.contextmanager
    def losing(self, during: str) -> Iterator[None]:
        """Raise `lost` for a connection to rank 0's store that breaks inside, `during` a phase.

        torch reports a store that went away as a ``RuntimeError`` (its ``DistError``); nothing
        else inside a phase raises one. A ``MemoryError`` is torch's ``std::bad_alloc``: the
        server answered with a length no store sends (another service holds the port).
        """
        try:
            yield
        except RuntimeError as exc:
            raise self.lost(during, exc) from None
        except MemoryError:
            info = self.info
            raise StoreTakenError(
                info.launcher,
                f"{info.who}: the server at {self.master} answered "
                f"a store request {during} with a length no torch store sends (std::bad_alloc)",
                hint="another service holds that port: give this job its own MASTER_PORT",
                variable="MASTER_PORT",
                value=str(info.master_port),
            ) from None

    def collided(self, what: str) -> RollCallError:
        """Return the error of a rank that met another process of this job's identity: `what`
        it found (`distenv.bootstrap.problems.SAME_IDENTITY`), a refusal as the verdict's is."""
        from distenv.bootstrap.problems import COLLISION_HINT, SAME_IDENTITY

        info = self.info
        return RollCallError(
            info.launcher,
            f"{info.who}: {SAME_IDENTITY}, {self.scope!r} at "
            f"{self.master}: {what}; this job does not train",
            hint=COLLISION_HINT,
        )

    def lost(self, during: str, exc: BaseException) -> RendezvousError:
        """Return the error of a rank whose connection to rank 0's store broke `during` a phase."""
        info = self.info
        return RendezvousError(
            info.launcher,
            f"{info.who} lost rank 0's store at {self.master} {during}: {first_line(exc)}",
            hint="rank 0 ended: it died, or gave up at its own deadline (a rank that started "
            "later waits longer); its log says why and names any missing rank",
        )


class Bootstrap:
    """Runs one rank's bootstrap phases in one watched thread, by one deadline, signals handled.

    Args:
        session: This rank's session.
        timeout: The rendezvous timeout: how long a rank may take to reach rank 0's store, and
            how long rank 0 waits for every rank to check in.
        deadline: When the whole bootstrap must be over (`deadline_for`), counted from the entry
            to `init_dist` or `distenv doctor`.
    """

    def __init__(self, session: Session, timeout: float, deadline: Deadline) -> None:
        self.session, self.timeout, self.deadline = session, timeout, deadline
        #: When a wait that names its own cause gives up: just before the deadline, so that its
        #: message, not the deadline's generic one, is what the user reads.
        self.waits = deadline.sooner(MARGIN_S)
        self.watch = Watch("the connection to rank 0's store", deadline, self._too_late)

    @staticmethod
    def deadline_for(timeout: float) -> Deadline:
        """Return the deadline of a bootstrap starting now with this rendezvous timeout."""
        return Deadline.after(timeout + GRACE_S)

    def enter(self, what: str, deadline: Deadline, expired: Callable[[], BaseException]) -> None:
        """Start a phase: `what` it is, its `deadline`, `expired()` the error after it."""
        self.watch.enter(what, deadline, expired)

    def leave_time_to_name(self) -> Deadline:
        """Make the remaining waits end `LOOKUP_S` earlier; return the phases' own deadline.

        The phases after the roll call name a rank that did not come up with the state it
        recorded, read from rank 0's store after they stop waiting, and that store may be what
        stopped answering (a frozen rank 0): the read is bounded by the deadline
        (`distenv.bootstrap.channel.absent`), so the waits before it must leave it that time.
        """
        named = self.deadline.sooner(LOOKUP_S)
        self.waits = named.sooner(MARGIN_S)
        return named

    def run(self, phases: Callable[[Bootstrap], T]) -> T:
        """Return ``phases(self)``, run in the watched thread; raise a phase's error at its deadline.

        A SIGINT or SIGTERM ends the run at once with a `RendezvousError`, after recording the
        signal as this rank's state for the others (best effort, `SIGNAL_MARK_S`).
        """
        with interruptible(self.watch, self.session.info.launcher, self._stopped):
            return watched(lambda _: phases(self), self.watch)

    def _stopped(self, signal_name: str) -> None:
        self.session.keeps_store = False
        if self.session.store is not None:
            self.session.mark(signal_name, wait=SIGNAL_MARK_S, aside=True)

    def _too_late(self) -> DistEnvError:
        info = self.session.info
        return RendezvousTimeoutError(
            info.launcher,
            f"{info.who}: the bootstrap did not end within {self.deadline.seconds:g} s",
            hint=f"check every rank's log; raise the limit with rendezvous_timeout= or "
            f"${TIMEOUT_VAR}",
        )
