"""The rendezvous: rank 0's store, this job's keys in it, and the roll call.

Every rank reaches the job's one store (rank 0's TCPStore, or torchrun's agent store), proves it is
this job's, and holds the roll call over it before the process group exists, so that nobody joins
another job and nobody hangs silently:

1. `connect_store`: rank 0 listens (on the MASTER_ADDR address where that is safe), the others
   connect within the rendezvous timeout; a listener that accepts connections but never answers as
   a store is named as such.
2. `claim_scope` / `ScopeCheck`: rank 0 writes this job's scope (`distenv.pipeline.Detection`)
   under the scope key right after creating the store; every other rank reads it before writing
   anything and stops at once if it names another job (`StoreTakenError`); if rank 0 has not
   claimed it yet, the rank checks in under its own job's keys and confirms the scope before it
   reads the verdict. Every key this job
   writes is under a prefix holding the scope (`prefix`), and every record carries it.
3. `roll_call`: every rank claims its rank's key with its `CheckIn` (``compare_set``, so a second
   process claiming the same rank finds the key taken and files its record as an extra claim:
   both are seen); rank 0 validates the records (`distenv.records`: nothing read from the store
   is trusted) and publishes a verdict of structured problems, which every rank renders from its
   own templates.

Every blocking store call runs under the bootstrap's `Deadline` (`distenv.deadline.bounded`) and
signals end the wait at once. Rank 0 reads N records (in chunks of `CHUNK` keys) and every rank
reads one verdict: O(N) store traffic, not O(N^2). A rank other than 0 makes four round trips when
nobody is late: peek at the scope, claim its key, count itself written, peek at the verdict
(`peek`: one ``compare_set`` that reads a key or says it is absent, where ``check`` + ``get`` take
two). The scope prevents accidents, not attacks (job ids are public):
docs/security.md says what distenv does and does not protect against.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import ipaddress
import os
import re
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from distenv.deadline import (
    SIGNAL_MARK_S,
    Deadline,
    Watch,
    bounded,
    interruptible,
    pause,
    watched,
)
from distenv.device import device_identity
from distenv.errors import (
    DistEnvError,
    InitError,
    MasterResolutionError,
    RendezvousError,
    RendezvousTimeoutError,
    StoreTakenError,
)
from distenv.master import FORMAT_VAR, host_port
from distenv.rankinfo import RankInfo
from distenv.records import (
    CheckIn,
    ForeignRecordError,
    Verdict,
    host_sizes,
    matches,
    node_hosts,
    parse_checkin,
    parse_scope,
    parse_verdict,
    validate,
)
from distenv.settings import TIMEOUT_VAR, Settings

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

    from distenv.problems import Problem

__all__ = [
    "Presence",
    "ScopeCheck",
    "check_in",
    "claim_scope",
    "connect_store",
    "fill_layout",
    "first_line",
    "job_scope",
    "listen_address",
    "lost_store",
    "make_checkin",
    "mark",
    "master_address",
    "meet",
    "meet_in",
    "peek",
    "poll_cap",
    "prefix",
    "read_states",
    "roll_call",
    "scope_key",
    "too_late",
    "wait_key",
]

KEY_ROOT = "distenv"
# Rank 0 publishes the verdict only after its own wait; the others allow it this much longer.
VERDICT_GRACE_S = 10.0
POLL_S = 0.5
# The waiting ranks' polls of rank 0's store, all together, per second, and the shortest pause
# between one rank's polls.
POLLS_PER_S = 8000
MIN_POLL_S = 0.0005
# Keys per multi_get when rank 0 reads the check-ins: one huge request costs more than its chunks.
CHUNK = 512
# What `peek` compares with: never written by distenv (its values are JSON, scopes and states).
_ABSENT = b"\x00distenv:absent"
# Extra claims rank 0 reads: beyond this many, the verdict already says enough.
MAX_EXTRA = 64


def job_scope(scope: str, world_size: int, token: bytes | None = None) -> str:
    """Return the scope the rendezvous uses: the launcher's job identity and the world's size.

    The size tells apart two jobs whose launchers export no identity (torchrun's default run id
    ``none``, Hydra) unless they are also the same size; `token`, the random bytes rank 0 sent
    with its master when the master was exchanged over MPI, tells apart any two such jobs. An
    identity that does not fit the record schema's pattern (a run id with spaces, say) is replaced
    by its digest.
    """
    text = f"{scope}/n{world_size}" + ("" if token is None else f"/{token.hex()}")
    if matches("scope", text):
        return text
    return "sha256-" + hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:40]


def scope_key(settings: Settings) -> str:
    """Return the key naming the job that owns the store (one per torchrun attempt)."""
    # torchrun's agent store outlives a worker restart: each attempt claims its own key.
    return f"{KEY_ROOT}/scope/{settings.restart}"


def prefix(scope: str, phase: str, settings: Settings) -> str:
    """Return the prefix of one phase's keys (``rollcall``, ``pg``, ``up``, ``doctor``)."""
    return f"{KEY_ROOT}/{scope}/{phase}/{settings.restart}"


def lost_store(info: RankInfo, during: str, exc: BaseException) -> RendezvousError:
    """Return the error of a rank whose connection to rank 0's store broke `during` a phase."""
    return RendezvousError(
        info.launcher,
        f"rank {info.rank} of {info.world_size} lost rank 0's store at {master_address(info)} "
        f"{during}: {first_line(exc)}",
        hint="rank 0 ended: it died, or gave up at its own deadline (a rank that started later "
        "waits longer); its log says why and names any missing rank",
    )


def master_address(info: RankInfo) -> str:
    """Return ``host:port`` of rank 0's store."""
    return host_port(str(info.master_addr), int(info.master_port or 0))


def first_line(exc: BaseException) -> str:
    """Return the first line of an exception's text (torch's carry C++ stack dumps after it)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _pauses(cap: float) -> Iterator[float]:
    """Yield sleep lengths: 0.2 ms, doubling up to `cap` (quick when peers are quick).

    Ranks usually arrive within a millisecond of each other: the first looks cost a few round
    trips, and a rank that arrives sees the others notice within twice its lateness.
    """
    pause = 0.0002
    while True:
        yield pause
        pause = min(pause * 2, cap)


def poll_cap(world_size: int) -> float:
    """How long the N - 1 waiting ranks may sleep between polls of rank 0's store.

    Short for small jobs (every millisecond shows in their start-up: a wait backs off by doubling,
    so it notices an event up to one pause late), longer for large ones so that the store is asked
    at most about `POLLS_PER_S` times a second in all. ``Store.wait`` would avoid polling, but a
    wait that times out leaves the client's connection out of step with the server.
    """
    return min(max(world_size / POLLS_PER_S, MIN_POLL_S), POLL_S)


def wait_key(store: Any, key: str, until: float, cap: float) -> bool:
    """Poll until `key` exists (True) or `until` passes (False)."""
    pauses = _pauses(cap)
    while True:
        if store.check([key]):
            return True
        if time.monotonic() >= until:
            return False
        pause(next(pauses))


def peek(store: Any, key: str) -> bytes | None:
    """Return `key`'s value, or None if it does not exist: one round trip, never blocking.

    ``compare_set`` with an expected value nobody writes returns the value a key holds, or, for a
    missing key, the expected value itself without creating the key. (A key that holds exactly
    that value reads as absent: what a forger gains is a wait, bounded by the deadline.)
    """
    value = bytes(store.compare_set(key, _ABSENT, _ABSENT))
    return None if value == _ABSENT else value


def wait_value(
    store: Any, key: str, until: float, cap: float, ready: Callable[[], bool] | None = None
) -> bytes | None:
    """Poll until `key` exists and return its value, or None once `until` passes.

    With `ready`, each poll asks it first, and looks at `key` only once it has said True.
    """
    pauses = _pauses(cap)
    while True:
        value = peek(store, key) if ready is None or ready() else None
        if value is not None:
            return value
        if time.monotonic() >= until:
            return None
        pause(next(pauses))


def _wait_count(store: Any, key: str, count: int, until: float) -> None:
    # Only rank 0 waits on counts: one poller, so it can afford to look often.
    pauses = _pauses(MIN_POLL_S)
    while int(store.add(key, 0)) < count and time.monotonic() < until:
        pause(next(pauses))


# ---- the store ----------------------------------------------------------------------------------


def _resolve(info: RankInfo, host: str, port: int, origin: str = "MASTER_ADDR") -> list[Any]:
    """Return the master's addresses, raising at once if it does not resolve.

    The error names where the address came from (`origin`): the user's MASTER_ADDR, or a
    scheduler's node list, whose node names need not be host names (Slurm's NodeName may differ
    from NodeHostname).
    """
    # An ASCII name goes as bytes: a str makes CPython load the idna codec first, 1-3 ms once per
    # process, inside every rank's bootstrap.
    name: str | bytes = host.encode("ascii") if host.isascii() else host
    try:
        return socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        if origin not in ("", "MASTER_ADDR"):
            where = f"${origin}" if re.fullmatch(r"[A-Z_][A-Z0-9_]*", origin) else origin
            raise MasterResolutionError(
                info.launcher,
                f"rank {info.rank} cannot resolve the master address {host!r}, which distenv "
                f"took from {where} (MASTER_ADDR is not set): {exc.strerror}",
                hint="a node name need not be a host name; export MASTER_ADDR=<a name or IP "
                "address of rank 0's node that every node resolves>, or map node names to host "
                f"names with {FORMAT_VAR} (--master-addr-format, init_dist(master_addr_format=)),"
                " e.g. '{host}-ib' or '{host}.cluster.example'",
                variable=origin if where != origin else None,
                value=host,
            ) from None
        raise MasterResolutionError(
            info.launcher,
            f"rank {info.rank} cannot resolve the master address {host!r} "
            f"($MASTER_ADDR={host!r}): {exc.strerror}",
            hint="use a name every node resolves (or its IP address); on clusters whose fast "
            "network has other names, set DISTENV_MASTER_ADDR_FORMAT, e.g. '{host}-ib'",
            variable="MASTER_ADDR",
            value=host,
        ) from None


def listen_address(host: str, addresses: Sequence[Any]) -> tuple[int, str]:
    """Return the address family and address rank 0's store listens on (``""``: every interface).

    The MASTER_ADDR address when it is a routable one, or a loopback address given literally
    (a one-node job: nobody else needs to reach it). A *name* that resolves to loopback stays on
    every interface: Debian maps the host's own name to 127.0.1.1, while the other nodes reach it
    by its real address.
    """
    family, _, _, _, sockaddr = addresses[0]
    address = ipaddress.ip_address(str(sockaddr[0]).split("%")[0])
    literal = host.strip("[]") == str(sockaddr[0])
    if address.is_loopback and not literal:
        return family, ""
    if address.is_unspecified:
        return family, ""
    return family, str(sockaddr[0])


def _listening_socket(info: RankInfo, host: str, port: int, addresses: Sequence[Any]) -> int:
    """Return the fd of a socket listening for the store (`TCPStore(master_listen_fd=)`)."""
    family, address = listen_address(host, addresses)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError as exc:
            if address == "" or exc.errno == 98:  # EADDRINUSE
                raise
            # The name resolves to an address this host does not own (a NAT, an alias).
            sock.close()
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("", port))
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        sock.close()
        if exc.errno == 98:
            raise DistEnvError(
                info.launcher,
                f"rank 0 cannot listen on port {port} ($MASTER_PORT={port!r}) for the "
                "store: the port is already in use",
                hint="another process on this node holds it; export MASTER_PORT=<another "
                "port>, or unset it where the launcher derives one",
                variable="MASTER_PORT",
                value=str(port),
            ) from None
        raise InitError(
            info.launcher,
            f"rank 0 cannot listen on {host_port(host, port)} for the store: {exc.strerror}",
            hint="check MASTER_ADDR names this host and MASTER_PORT is a usable port",
        ) from None
    # Detached: the store owns the descriptor now (closing ours could hang a client).
    return sock.detach()


def _connect_once(addresses: Sequence[Any], timeout: float) -> None:
    """Open and close one TCP connection to the first of `addresses` that accepts one.

    ``socket.create_connection`` without its second lookup: the addresses are `_resolve`'s.
    """
    failure: OSError = OSError("no address")
    for family, kind, proto, _, sockaddr in addresses:
        with socket.socket(family, kind, proto) as sock:
            sock.settimeout(timeout)
            try:
                sock.connect(sockaddr)
                return
            except OSError as exc:
                failure = exc
    raise failure


def _wait_reachable(
    info: RankInfo, host: str, port: int, addresses: Sequence[Any], until: float, limit: float
) -> None:
    """Return once ``host:port`` (at `addresses`) accepts a TCP connection; raise at `until`.

    Probing with a plain socket first keeps torch's C++ retry logs and stack dumps out of the
    user's first message, and bounds the wait exactly.
    """
    # Start at 1 ms: rank 0 usually listens within milliseconds of the others' first probe, and
    # a 50 ms first pause cost every srun bootstrap ~100 ms (docs/benchmarks.md).
    delay, last = 0.001, ""
    while True:
        remaining = until - time.monotonic()
        try:
            _connect_once(addresses, max(min(remaining, 5.0), 0.1))
            return
        except OSError as exc:
            last = str(exc) or type(exc).__name__
        remaining = until - time.monotonic()
        if remaining <= 0:
            raise RendezvousTimeoutError(
                info.launcher,
                f"rank {info.rank} of {info.world_size} could not reach rank 0's store at "
                f"{host_port(host, port)} within {limit:g} s (last error: {last})",
                hint="check that rank 0 is running and that MASTER_ADDR/MASTER_PORT name a host "
                "and port this node can reach (a firewall, or DISTENV_MASTER_ADDR_FORMAT for the "
                f"right interface); raise the limit with rendezvous_timeout= or ${TIMEOUT_VAR}",
                variable="MASTER_ADDR",
                value=host,
            )
        # Back off: rank 0 may still be importing torch.
        pause(min(delay, remaining))
        delay = min(delay * 2, 1.0)


def connect_store(
    info: RankInfo,
    deadline: Deadline,
    watch: Watch,
    *,
    agent_store: bool,
    master_from: str = "MASTER_ADDR",
) -> Store:
    """Create (rank 0) or reach (others) the TCPStore at the master, by the deadline.

    Runs in a `watched` call: each step tells `watch` by when it must be over and what to say
    otherwise, so a listener that accepts connections but never answers as a store is reported
    at the rendezvous timeout, not waited for. Under torchrun's agent store (`agent_store`) every
    rank, rank 0 included, is a client. `master_from` says where the master address came from
    (`distenv.pipeline.Detection.master_from`), for the error when it does not resolve.
    """
    from torch._C._distributed_c10d import TCPStore

    host, port = str(info.master_addr), int(info.master_port or 0)
    where = host_port(host, port)
    limit = deadline.timeout
    until = min(time.monotonic() + limit, deadline.waits_end)
    what = "the connection to rank 0's store"

    def no_answer(problem: str) -> Callable[[], DistEnvError]:
        return lambda: RendezvousTimeoutError(
            info.launcher,
            f"rank {info.rank} of {info.world_size}: {problem} within {limit:g} s",
            hint="check MASTER_ADDR and MASTER_PORT; with another service on that port, give "
            "this job its own MASTER_PORT",
            variable="MASTER_PORT",
            value=str(port),
        )

    watch.enter(what, until, no_answer(f"the master address {host!r} did not resolve"))
    addresses = _resolve(info, host, port, master_from)
    timeout = datetime.timedelta(seconds=max(until - time.monotonic(), 1.0))
    if info.rank == 0 and not agent_store:
        fd = _listening_socket(info, host, port, addresses)
        watch.enter(what, until, no_answer(f"rank 0's store on {where} did not start"))
        return TCPStore(
            host,
            port,
            info.world_size,
            is_master=True,
            timeout=timeout,
            wait_for_workers=False,
            master_listen_fd=fd,
        )
    watch.enter(what, deadline.at, no_answer(f"{where} did not accept a connection"))
    _wait_reachable(info, host, port, addresses, until, limit)
    watch.enter(
        what,
        until,
        no_answer(
            f"{where} accepts connections but is not answering as a torch store (another service?)"
        ),
    )
    try:
        return TCPStore(host, port, info.world_size, is_master=False, timeout=timeout)
    except RuntimeError as exc:  # torch's DistError
        raise no_answer(
            f"{where} accepted a connection but refused the store: {first_line(exc)}"
        )() from None


def claim_scope(store: Any, info: RankInfo, scope: str, settings: Settings) -> None:
    """Write this job's scope under the scope key (rank 0), unless another job's is there.

    Raises:
        StoreTakenError: If the key holds another scope already.
    """
    key = scope_key(settings)
    found = store.compare_set(key, "", scope)
    if found != scope.encode():
        _taken(info, key, found, scope)


class ScopeCheck:
    """A rank's check that the store it reached is this job's (every rank but rank 0).

    `poll` peeks at the scope key: True once it holds this job's scope, False while it is absent,
    `StoreTakenError` at once if it names another job. A rank checks once before writing anything
    (rank 0 has usually claimed the key by then), then checks in even if the key is still absent:
    its record lies under this job's own prefix, which no other job reads, and the wait for the
    verdict goes on polling the scope first. So a rank 0 that arrives last finds everybody checked
    in, instead of everybody waiting for its claim before checking in.
    """

    def __init__(
        self, store: Any, info: RankInfo, scope: str, settings: Settings, until: float
    ) -> None:
        self.store, self.info, self.scope, self.until = store, info, scope, until
        self.key = scope_key(settings)
        self.confirmed = False
        self.wrote = False  # whether this rank has checked in (said in the error)

    def poll(self) -> bool:
        """Return whether the scope is confirmed; raise if another's, or absent at `until`."""
        if self.confirmed:
            return True
        found = peek(self.store, self.key)
        if found is None:
            if time.monotonic() >= self.until:
                raise self.absent()
            return False
        if found != self.scope.encode():
            _taken(self.info, self.key, found, self.scope, wrote=self.wrote)
        self.confirmed = True
        return True

    def absent(self) -> RendezvousTimeoutError:
        info = self.info
        return RendezvousTimeoutError(
            info.launcher,
            f"rank {info.rank} of {info.world_size} reached {master_address(info)}, but it is "
            "a store not started by distenv, or rank 0 stalled before claiming it (no scope "
            f"written under {self.key!r})",
            hint="check rank 0's log; if another program uses that port, give this job its own "
            "MASTER_PORT",
            variable="MASTER_PORT",
            value=str(info.master_port),
        )


def _taken(info: RankInfo, key: str, found: bytes, scope: str, *, wrote: bool = False) -> None:
    try:
        other = f"another job's: {parse_scope(key, found)}"
    except ForeignRecordError:
        other = "not claimed by distenv"
    written = (
        "wrote only its check-in, under this job's own keys, which the other job never reads"
        if wrote
        else "wrote nothing there"
    )
    raise StoreTakenError(
        info.launcher,
        f"rank {info.rank} of {info.world_size}: the store at {master_address(info)} is "
        f"{other}; this job is {scope}. It did not join, and {written}",
        hint="two jobs derived or were given the same MASTER_PORT on that host: export another "
        "MASTER_PORT for this job (or unset it where the launcher derives one), or start it "
        "when the other has ended",
        variable="MASTER_PORT",
        value=str(info.master_port),
    )


# ---- the roll call ------------------------------------------------------------------------------


def roll_call(
    store: Any,
    info: RankInfo,
    checkin: CheckIn,
    *,
    timeout: float,
    until: float,
    check: bool = True,
    scope_check: ScopeCheck | None = None,
) -> Verdict:
    """Check in, and on rank 0 gather, validate and publish; return the verdict or raise it.

    Args:
        store: The store of this job's roll call (a PrefixStore under `prefix`).
        info: This rank's RankInfo.
        checkin: What this rank reports.
        timeout: Seconds rank 0 waits for everybody (others wait a little longer for the verdict).
        until: The monotonic time by which every wait here ends (the bootstrap's deadline).
        check: Raise when the verdict is negative (`distenv doctor` passes False to print it).
        scope_check: A rank other than 0 whose scope is not confirmed yet: the wait for the
            verdict confirms it first.

    Raises:
        StoreTakenError: The scope key names another job (`scope_check`).
        RendezvousTimeoutError: Ranks missing (rank 0), or no verdict arrived (others).
        RendezvousError: The verdict found problems, or was not written by this job's rank 0.
    """
    check_in(store, checkin)
    if scope_check is not None:
        scope_check.wrote = True
    if info.rank == 0:
        verdict = _gather(store, info, checkin.scope, min(time.monotonic() + timeout, until))
        # The others need the outcome, not every record: a verdict carrying N check-ins, read by
        # N - 1 ranks, makes rank 0's store serve O(N^2) bytes (docs/benchmarks.md).
        published = verdict.to_json()
        if store.compare_set("verdict", "", published) != published.encode():
            raise RendezvousError(
                info.launcher,
                f"rank 0: a process outside this job wrote this job's roll-call verdict in the "
                f"store at {checkin.master} before rank 0 did",
                hint="something else on the network writes to this job's port: give the job "
                "another MASTER_PORT, and see docs/security.md",
            )
        if not verdict.ok or not check:
            # Rank 0 may exit next (a negative verdict, `distenv doctor`), and its store with
            # it: let the others read first. They poll, so this costs milliseconds.
            arrived = len(verdict.checkins) - 1
            _wait_count(store, "read", arrived, min(time.monotonic() + VERDICT_GRACE_S, until))
    else:
        verdict = _await_verdict(store, info, checkin, timeout, until, scope_check)
        if not verdict.ok or not check:
            store.add("read", 1)
    if check and not verdict.ok:
        error = RendezvousTimeoutError if verdict.missing else RendezvousError
        raise error(
            info.launcher,
            "roll call failed: " + "; ".join(verdict.describe(timeout)),
            hint="run `distenv doctor` under the same launcher for a per-rank table",
        )
    return verdict


def fill_layout(info: RankInfo, verdict: Verdict, checkin: CheckIn) -> RankInfo:
    """Return `info` with the node layout its launcher left unknown, from the roll call's verdict.

    The verdict numbers the hosts in order of their lowest rank (`distenv.records.node_hosts`);
    this rank's node is the position of the host name it checked in with, and its local world
    size, where unknown, the verdict's count of ranks on that host (`distenv.records.host_sizes`).
    A known layout is kept as the launcher stated it (the roll call checked it against the hosts).

    Raises:
        RendezvousError: The verdict does not name this rank's host, or does not count its ranks
            (not this job's rank 0's).
    """
    if info.layout_known or not verdict.ok:
        return info
    node = verdict.node_of(checkin.hostname)
    size = None if node is None else verdict.size_of(node)
    if node is None or (info.local_world_size is None and size is None):
        what = (
            f"numbers {len(verdict.nodes)} node(s) but not this rank's host "
            f"{checkin.hostname!r}, so its node is unknown"
            if node is None
            else f"does not count the ranks on this rank's host {checkin.hostname!r}, so its "
            "local world size is unknown"
        )
        raise RendezvousError(
            info.launcher,
            f"rank {info.rank}: the roll call's verdict {what}",
            hint="the verdict was not written by this job's rank 0, or a host's name changed "
            "during the start-up: see docs/security.md, and give the job its own MASTER_PORT",
        )
    return info.replace(
        node_rank=node if info.node_rank is None else info.node_rank,
        num_nodes=len(verdict.nodes) if info.num_nodes is None else info.num_nodes,
        local_world_size=size if info.local_world_size is None else info.local_world_size,
    )


def check_in(store: Any, checkin: CheckIn) -> None:
    """Write this rank's record under its rank's key (or, if taken, as an extra claim); count it.

    Two round trips: the claim (``compare_set``) and the count, made after the write so that rank 0
    never reads a missing key. A process that finds its rank's key taken (a second claimer, or a
    forger that came first) files its record under ``extra/<n>``, so rank 0 sees both claims.
    """
    record = checkin.to_json()
    if bytes(store.compare_set(f"checkin/{checkin.rank}", "", record)) != record.encode():
        store.set(f"extra/{int(store.add('extras', 1))}", record)
    store.add("written", 1)


def _await_verdict(
    store: Any,
    info: RankInfo,
    checkin: CheckIn,
    timeout: float,
    until: float,
    scope_check: ScopeCheck | None,
) -> Verdict:
    limit = min(time.monotonic() + timeout + VERDICT_GRACE_S, until)
    ready = None if scope_check is None else scope_check.poll
    raw = wait_value(store, "verdict", limit, poll_cap(info.world_size), ready)
    if raw is None:
        if scope_check is not None and not scope_check.confirmed:
            raise scope_check.absent()
        raise RendezvousTimeoutError(
            info.launcher,
            f"rank {info.rank} checked in at {checkin.master} but rank 0 published no "
            f"verdict within {timeout + VERDICT_GRACE_S:.0f} s",
            hint="rank 0 may have died or be stuck before init_dist; check its log",
        )
    try:
        return parse_verdict("verdict", raw, scope=checkin.scope, world_size=info.world_size)
    except ForeignRecordError as exc:
        raise RendezvousError(
            info.launcher,
            f"rank {info.rank}: the roll-call verdict in the store at {checkin.master} was not "
            f"written by this job's distenv ({exc.why})",
            hint="something else on the network writes to this job's port: give the job "
            "another MASTER_PORT, and see docs/security.md",
        ) from None


def _read(store: Any, keys: list[str]) -> list[bytes | None]:
    """Return the values of `keys` (None where absent): a multi_get per chunk when all are there."""
    values: list[bytes | None] = []
    for start in range(0, len(keys), CHUNK):
        chunk = keys[start : start + CHUNK]
        # multi_get waits for a missing key: ask first (one round trip per chunk).
        if hasattr(store, "multi_get") and store.check(chunk):
            values += [bytes(v) for v in store.multi_get(chunk)]
        else:
            values += [peek(store, key) for key in chunk]
    return values


def _gather(store: Any, info: RankInfo, scope: str, until: float) -> Verdict:
    world = info.world_size
    _wait_count(store, "written", world, until)
    complete = int(store.add("written", 0)) >= world
    keys = [f"checkin/{rank}" for rank in range(world)]
    extras = min(int(store.add("extras", 0)), MAX_EXTRA)
    keys += [f"extra/{n}" for n in range(1, extras + 1)]
    checkins: list[CheckIn] = []
    foreign: list[str] = []
    for rank, (key, raw) in enumerate(zip(keys, _read(store, keys), strict=True)):
        if raw is None:
            continue
        try:
            record = parse_checkin(key, raw)
        except ForeignRecordError:
            foreign.append(key)
            continue
        if (
            record.scope != scope
            or record.world_size != world
            or (rank < world and record.rank != rank)
        ):
            foreign.append(key)
            continue
        checkins.append(record)
    found = tuple(checkins)
    if complete and not foreign:
        problems = validate(found, world)
        nodes = () if problems else node_hosts(found, layout_known=info.layout_known)
        sizes = host_sizes(found, nodes)
        return Verdict(not problems, tuple(problems), found, scope, nodes, sizes)
    from distenv.problems import ForeignCheckIn, missing_ranks

    named: list[Problem] = [ForeignCheckIn(key) for key in foreign]
    if not complete:
        named.append(missing_ranks(world, info.local_world_size, found))
    else:
        named += validate(found, world)
    return Verdict(False, tuple(named), found, scope)


def make_checkin(
    info: RankInfo, backend: str, device: int | None, *, allow_gpu_sharing: bool, scope: str
) -> CheckIn:
    """Return what this rank reports in the roll call."""
    import torch

    return CheckIn(
        rank=info.rank,
        world_size=info.world_size,
        local_rank=info.local_rank,
        local_world_size=info.local_world_size,
        node_rank=info.node_rank,
        hostname=socket.gethostname(),
        pid=os.getpid(),
        launcher=info.launcher,
        master=master_address(info),
        backend=backend,
        torch_version=str(torch.__version__),
        device=None if device is None else device_identity(device),
        allow_gpu_sharing=allow_gpu_sharing,
        scope=scope,
    )


class Presence:
    """This rank's place in the store, once it has one: so that a signal can tell the others."""

    def __init__(self, info: RankInfo, scope: str, settings: Settings) -> None:
        self.info, self.scope, self.settings = info, scope, settings
        self.store: Store | None = None

    def left(self, signal_name: str) -> None:
        """Record, best effort and briefly, that a signal stopped this rank."""
        if self.store is not None:
            mark(self.store, self.info, self.scope, self.settings, signal_name, wait=SIGNAL_MARK_S)


def meet_in(
    watch: Watch,
    presence: Presence,
    checkin: CheckIn,
    *,
    deadline: Deadline,
    settings: Settings,
    phase: str,
    check: bool = True,
    master_from: str = "MASTER_ADDR",
) -> tuple[Store, Verdict]:
    """Reach rank 0's store, prove it is this job's, and hold the roll call under `phase`.

    The body of `meet`, run inside a `watched` call (``init_dist`` runs its whole bootstrap in one).
    Returns the store (unprefixed) and the verdict.
    """
    from torch._C._distributed_c10d import PrefixStore

    info, scope = presence.info, checkin.scope
    store = presence.store = connect_store(
        info, deadline, watch, agent_store=settings.agent_store, master_from=master_from
    )
    start = time.monotonic()

    def stalled() -> DistEnvError:
        return RendezvousTimeoutError(
            info.launcher,
            f"rank {info.rank} of {info.world_size}: rank 0's store at {checkin.master} stopped "
            f"answering during the roll call (no reply within {deadline.bound:g} s of the start)",
            hint="rank 0 may be stopped (SIGSTOP, a debugger) or its node overloaded; check its "
            "log and state",
        )

    watch.enter("the roll call", deadline.at, stalled)
    try:
        scope_check = None
        if info.rank == 0:
            claim_scope(store, info, scope, settings)
        else:
            scope_check = ScopeCheck(
                store, info, scope, settings, min(start + deadline.timeout, deadline.waits_end)
            )
            scope_check.poll()  # another job's store: refused before writing anything
        verdict = roll_call(
            PrefixStore(prefix(scope, phase, settings), store),
            info,
            checkin,
            timeout=deadline.timeout,
            until=deadline.waits_end,
            check=check,
            scope_check=scope_check,
        )
    except RuntimeError as exc:  # torch's DistError: the store went away
        raise lost_store(info, "during the roll call", exc) from None
    return store, verdict


def meet(
    info: RankInfo,
    checkin: CheckIn,
    *,
    deadline: Deadline,
    settings: Settings,
    phase: str,
    check: bool = True,
    master_from: str = "MASTER_ADDR",
) -> tuple[Store, Verdict]:
    """Reach rank 0's store, prove it is this job's, and hold the roll call under `phase`.

    Returns the store (unprefixed) and the verdict.

    Raises:
        StoreTakenError: The store belongs to another job (or to no distenv job).
        RendezvousTimeoutError: The store was not reached, or ranks are missing.
        RendezvousError: The verdict found problems (with `check`), or a signal interrupted.
        DistEnvError: Rank 0 cannot listen on the port, or the master does not resolve.
    """
    presence = Presence(info, checkin.scope, settings)
    watch = Watch("the connection to rank 0's store", deadline.at, too_late(info, deadline))
    with interruptible(watch, info.launcher, presence.left):
        return watched(
            lambda w: meet_in(
                w,
                presence,
                checkin,
                deadline=deadline,
                settings=settings,
                phase=phase,
                check=check,
                master_from=master_from,
            ),
            watch,
        )


def too_late(info: RankInfo, deadline: Deadline) -> Callable[[], DistEnvError]:
    """Return the error of a bootstrap that outlived its deadline in no phase of its own."""
    return lambda: RendezvousTimeoutError(
        info.launcher,
        f"rank {info.rank} of {info.world_size}: the bootstrap did not end within "
        f"{deadline.bound:g} s",
        hint=f"check every rank's log; raise the limit with rendezvous_timeout= or ${TIMEOUT_VAR}",
    )


# ---- where each rank is: what the others name when the group does not come up ------------------

#: A rank's states, in order; a signal's name replaces the state of a rank that was stopped.
STATES = ("joining", "up", "SIGINT", "SIGTERM", "failed")


def _state_key(scope: str, settings: Settings, rank: int) -> str:
    return f"{prefix(scope, 'up', settings)}/state/{rank}"


def mark(
    store: Any, info: RankInfo, scope: str, settings: Settings, state: str, *, wait: float = 0.0
) -> None:
    """Record this rank's state (`STATES`) with its host; with `wait`, best effort within it."""
    value = f"{state}@{socket.gethostname()}"
    key = _state_key(scope, settings, info.rank)
    if not wait:
        store.set(key, value)
        return
    # Rank 0's store may be gone or stuck: the others' deadline names this rank anyway.
    with contextlib.suppress(TimeoutError, RuntimeError):
        bounded(lambda: store.set(key, value), time.monotonic() + wait, TimeoutError)


def read_states(
    store: Any, scope: str, settings: Settings, ranks: Sequence[int]
) -> dict[int, tuple[str, str] | None]:
    """Return each rank's recorded ``(state, host)``, None where it wrote none (or garbage)."""
    states: dict[int, tuple[str, str] | None] = {}
    for rank in ranks:
        raw = peek(store, _state_key(scope, settings, rank))
        if raw is None:
            states[rank] = None
            continue
        state, _, host = raw.decode("ascii", "replace").partition("@")
        valid = state in STATES and matches("hostname", host)
        states[rank] = (state, host) if valid else None
    return states
