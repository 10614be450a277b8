"""Job isolation: the rendezvous scope, its claim on rank 0's store, and every rank's check of it.

The rendezvous scope names one job (`job_scope`): the launcher's job identity, the world's size and,
where the master was exchanged over MPI, rank 0's random token. Rank 0 writes it under the scope
key (`distenv.bootstrap.protocol.scope_key`) right after creating the store (`claim_scope`); every other rank reads it before writing
anything and stops at once if it names another job (`StoreTakenError`, `ScopeCheck`). Every key a
job writes lies under a prefix holding its scope (`distenv.bootstrap.protocol.prefix`), and every record carries it. The scope
prevents accidents, not attacks (job ids are public): docs/security.md says what distenv does and
does not protect against.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Any

from distenv._hosts import this_host
from distenv.bootstrap.protocol import ALL, CUT, KEY_ROOT, SIZES, WRITTEN, prefix, scope_key
from distenv.bootstrap.records import (
    ForeignRecordError,
    NetRecord,
    claim,
    matches,
    parse_claim,
    parse_scope,
)
from distenv.bootstrap.store import master_address
from distenv.bootstrap.waits import count_to, peek, wait_value
from distenv.deadline import Deadline
from distenv.errors import RendezvousError, RendezvousTimeoutError, StoreTakenError
from distenv.rankinfo import RankInfo

__all__ = ["KEY_ROOT", "ScopeCheck", "claim_scope", "job_scope", "prefix", "scope_key"]


def job_scope(job: str, world_size: int, token: bytes | None = None) -> str:
    """Return the rendezvous scope: the launcher's job identity (`job`) and the world's size.

    The size tells apart two jobs whose launchers export no identity (torchrun's default run id
    ``none``, Hydra) unless they are also the same size; `token`, the random bytes rank 0 sent
    with its master when the master was exchanged over MPI, tells apart any two such jobs. An
    identity that does not fit the record schema's pattern (a run id with spaces, say) is replaced
    by its digest.
    """
    text = f"{job}/n{world_size}" + ("" if token is None else f"/{token.hex()}")
    if matches("scope", text):
        return text
    return "sha256-" + hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:40]


def claim_scope(
    store: Any,
    info: RankInfo,
    scope: str,
    key: str,
    hostname: str | None = None,
    net: NetRecord | None = None,
) -> None:
    """Write this job's scope under the scope `key` (rank 0), unless another job's is there.

    With `net`, the claim also offers rank 0's node (`hostname`) to the others' network probe
    (`distenv.bootstrap.records.parse_claim`).

    Raises:
        StoreTakenError: If the key holds another scope already.
    """
    value = claim(scope, hostname, net)
    found = store.compare_set(key, "", value)
    if found != value.encode():
        _taken(info, key, found, scope)


class ScopeCheck:
    """A rank's check that the store it reached is this job's (every rank but rank 0).

    `poll` peeks at the scope key: True once it holds this job's scope, False while it is absent,
    `StoreTakenError` at once if it names another job. A rank checks once before writing anything
    (rank 0 has usually claimed the key by then), then checks in even if the key is still absent:
    its record lies under this job's own prefix, which no other job reads, and before it waits for
    the verdict it `wait`s for the claim. So a rank 0 that arrives last finds everybody checked
    in, instead of everybody waiting for its claim before checking in. A rank that probes the
    network path `wait`s for the claim first: it needs rank 0's addresses, which the claim
    carries (`host0`, `net0`), before it checks in.
    """

    def __init__(
        self,
        store: Any,
        info: RankInfo,
        scope: str,
        key: str,
        deadline: Deadline,
        *,
        resized: Callable[[str], str] | None = None,
    ) -> None:
        self.store, self.info, self.scope, self.key = store, info, scope, key
        self.deadline = deadline
        #: The prefix of rank 0's roll call for its scope, where a rank of another world size
        #: says so (`other_size`); None: it says nothing there.
        self.resized = resized
        self.confirmed = False
        self.wrote = False  # whether this rank has checked in (said in the error)
        #: Rank 0's host name and network record, from its claim (None: it offers none).
        self.host0: str | None = None
        self.net0: NetRecord | None = None

    def poll(self) -> bool:
        """Return whether the scope is confirmed; raise if another's, or absent at the deadline."""
        if self.confirmed:
            return True
        found = peek(self.store, self.key)
        if found is None:
            if self.deadline.passed():
                raise self.absent()
            return False
        self._judge(found)
        return True

    def wait(self) -> None:
        """Return once the scope is confirmed, waiting in the store for rank 0's claim until the
        check's deadline (then `absent`)."""
        if self.confirmed:
            return
        found = wait_value(self.store, self.key, self.deadline)
        if found is None:
            raise self.absent()
        self._judge(found)

    def _judge(self, found: bytes) -> None:
        try:
            scope, self.host0, self.net0 = parse_claim(self.key, found)
        except ForeignRecordError:
            scope = ""
        if scope != self.scope:
            sizes = other_size(scope, self.scope)
            if sizes is not None:
                raise self._other_size(scope, *sizes)
            _taken(self.info, self.key, found, self.scope, wrote=self.wrote)
        self.confirmed = True

    def _other_size(self, scope: str, theirs: int, ours: int) -> RendezvousError:
        """Tell rank 0 (its roll call's `SIZES`, then `CUT` on its count: it stops waiting at
        once) and return the error of a rank of this job whose world is not rank 0's."""
        from distenv.bootstrap.problems import SIZE_HINT

        info = self.info
        if self.resized is not None:
            keys = self.resized(scope)
            self.store.append(f"{keys}/{SIZES.name}", f"{ours}@{this_host()}\n")
            count_to(self.store, f"{keys}/{WRITTEN.name}", CUT, CUT, f"{keys}/{ALL.name}")
        return RendezvousError(
            info.launcher,
            f"{info.who}: a size mismatch: rank 0's store at "
            f"{master_address(info)} holds this job ({scope.rpartition('/n')[0]!r}) started for "
            f"a world of {theirs} ranks, this rank's node for {ours}",
            hint=SIZE_HINT,
            variable="WORLD_SIZE",
            value=str(ours),
        )

    def absent(self) -> RendezvousTimeoutError:
        """Return the error of a scope key still absent at the deadline."""
        info = self.info
        return RendezvousTimeoutError(
            info.launcher,
            f"{info.who} reached {master_address(info)}, but it is "
            "a store not started by distenv, or rank 0 stalled before claiming it (no scope "
            f"written under {self.key!r})",
            hint="check rank 0's log; if another program uses that port, give this job its own "
            "MASTER_PORT",
            variable="MASTER_PORT",
            value=str(info.master_port),
        )


_SIZED = re.compile(r"(?P<job>.+)/n(?P<size>[0-9]{1,8})")


def other_size(theirs: str, ours: str) -> tuple[int, int] | None:
    """Return ``(their size, ours)`` where scopes `theirs` and `ours` (`job_scope`) name one
    job identity with two world sizes; None otherwise (another job, or an MPI token)."""
    a, b = _SIZED.fullmatch(theirs), _SIZED.fullmatch(ours)
    if a is None or b is None or a["job"] != b["job"] or a["size"] == b["size"]:
        return None
    return int(a["size"]), int(b["size"])


def _taken(info: RankInfo, key: str, found: bytes, scope: str, *, wrote: bool = False) -> None:
    try:
        claimed = parse_scope(key, found)
    except ForeignRecordError:
        other = "not claimed by distenv"
    else:
        # This job's own scope, in a claim this process did not write.
        other = (
            "claimed under this job's scope by another process (a second rank 0, or one outside "
            "the job)"
            if claimed == scope
            else f"another job's: {claimed}"
        )
    written = (
        "wrote only its check-in, under this job's own keys, which the other job never reads"
        if wrote
        else "wrote nothing there"
    )
    raise StoreTakenError(
        info.launcher,
        f"{info.who}: the store at {master_address(info)} is "
        f"{other}; this job is {scope}. It did not join, and {written}",
        hint="two jobs derived or were given the same MASTER_PORT on that host: export another "
        "MASTER_PORT for this job (or unset it where the launcher derives one), or start it "
        "when the other has ended",
        variable="MASTER_PORT",
        value=str(info.master_port),
    )
