"""Rank 0's store: creating it, or reaching it.

Rank 0 listens (on the MASTER_ADDR address where that is safe), the others connect within the
rendezvous timeout. Before torch's client sees the port, a rank greets it as that client would
(`_greet`): a listener that closes or resets the connection, or answers the greeting with anything
but its echo, is named at once, and one that never answers at the deadline, in one line each, never
under torch's retry logs. Waiting on the store and reading it in bulk is
`distenv.bootstrap.waits`'s. Every blocking call runs inside the bootstrap's watched thread
(`distenv.deadline.watched`), so a phase's deadline ends it whatever it is blocked in.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import socket
import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from distenv.deadline import Deadline, Watch, pause
from distenv.errors import (
    DistEnvError,
    InitError,
    MasterResolutionError,
    RendezvousTimeoutError,
    StoreTakenError,
)
from distenv.master import FORMAT_VAR, host_port
from distenv.rankinfo import RankInfo
from distenv.settings import TIMEOUT_VAR
from distenv.timing import (
    MIN_CONNECT_S,
    OUTLIVE_S,
    PROBE_FIRST_S,
    PROBE_MAX_S,
    PROBE_MIN_S,
    PROBE_TIMEOUT_S,
)

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

__all__ = [
    "connect_store",
    "first_line",
    "host_store",
    "listen_address",
    "master_address",
]

# How torch's TCPStore client opens a connection (torch/csrc/distributed/c10d/TCPStore.cpp,
# TCPClient: validate, then ping), as it sends it, little-endian: a VALIDATE query (type 0) with
# the magic number, then a PING (type 13) with a nonce that a store echoes as 4 bytes.
_VALIDATE = struct.pack("<BI", 0, 0x3C85F7CE)
_PING = 13


def master_address(info: RankInfo) -> str:
    """Return ``host:port`` of rank 0's store."""
    return host_port(str(info.master_addr), int(info.master_port or 0))


def first_line(exc: BaseException) -> str:
    """Return the first line of an exception's text (torch's carry C++ stack dumps after it)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ---- reaching the store -------------------------------------------------------------------------


def _resolve(info: RankInfo, host: str, port: int, origin: str = "MASTER_ADDR") -> list[Any]:
    """Return the master's addresses, raising at once if it does not resolve.

    The error names where the address came from (`origin`): the user's MASTER_ADDR, or a
    scheduler's node list, whose node names need not be host names (Slurm's NodeName may differ
    from NodeHostname).
    """
    # An ASCII name goes as bytes: a str makes CPython load the idna codec first, once per
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

    The MASTER_ADDR address when it is given literally (a loopback one included: a one-node job,
    nobody else needs to reach it). A *name* is resolved again on every node, and the answer
    here need not be theirs: Debian maps the host's own name to 127.0.1.1, a container host to
    its docker0 address, while the other nodes reach it by its real address. So a name listens
    on every interface, as torch's store does by default.
    """
    family, _, _, _, sockaddr = addresses[0]
    address = ipaddress.ip_address(str(sockaddr[0]).split("%")[0])
    literal = host.strip("[]") == str(sockaddr[0])
    if not literal or address.is_unspecified:
        return family, ""
    return family, str(sockaddr[0])


def _listening_socket(source: str, host: str, port: int, addresses: Sequence[Any]) -> int:
    """Return the fd of a socket listening for the store (`TCPStore(master_listen_fd=)`).

    `source` (rank 0's launcher, or ``run`` for a node agent) starts the errors' messages.
    """
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
                source,
                f"rank 0 cannot listen on port {port} ($MASTER_PORT={port!r}) for the "
                "store: the port is already in use",
                hint="another process on this node holds it; export MASTER_PORT=<another "
                "port>, or unset it where the launcher derives one",
                variable="MASTER_PORT",
                value=str(port),
            ) from None
        raise InitError(
            source,
            f"rank 0 cannot listen on {host_port(host, port)} for the store: {exc.strerror}",
            hint="check MASTER_ADDR names this host and MASTER_PORT is a usable port",
            consequence=False,
        ) from None
    # Detached: the store owns the descriptor now (closing ours could hang a client).
    return sock.detach()


def _connect_once(addresses: Sequence[Any], timeout: float) -> socket.socket:
    """Return a TCP connection to the first of `addresses` that accepts one.

    ``socket.create_connection`` without its second lookup: the addresses are `_resolve`'s.
    """
    failure: OSError = OSError("no address")
    for family, kind, proto, _, sockaddr in addresses:
        sock = socket.socket(family, kind, proto)
        sock.settimeout(timeout)
        try:
            sock.connect(sockaddr)
            return sock
        except OSError as exc:
            sock.close()
            failure = exc
    raise failure


def _greet(sock: socket.socket, deadline: Deadline) -> str | None:
    """Greet a connected master as torch's store client does; return what went wrong, if anything.

    None: it echoed the nonce, as a store does. Otherwise the problem, for a message: it closed
    or reset the connection, answered something else (shown in hex, never verbatim), or said
    nothing by `deadline` (``""``).
    """
    nonce = os.urandom(4)
    reply = b""
    try:
        sock.settimeout(max(deadline.left(), PROBE_MIN_S))
        sock.sendall(_VALIDATE + struct.pack("<B", _PING) + nonce)
        while len(reply) < len(nonce):
            chunk = sock.recv(len(nonce) - len(reply))
            if not chunk:
                return "it closed the connection when greeted as a store"
            reply += chunk
    except TimeoutError:
        return ""
    except OSError as exc:
        return f"it failed the connection when greeted as a store ({exc.strerror or exc})"
    if reply != nonce:
        return f"it answered a store's ping with 0x{reply.hex()}, not its echo 0x{nonce.hex()}"
    return None


def _wait_reachable(info: RankInfo, addresses: Sequence[Any], deadline: Deadline) -> socket.socket:
    """Return a connection to the master (at `addresses`) once it accepts one; raise at `deadline`.

    Probing with a plain socket first keeps torch's C++ retry logs and stack dumps out of the
    user's first message, and bounds the wait exactly.
    """
    host, port = str(info.master_addr), int(info.master_port or 0)
    delay, last = PROBE_FIRST_S, ""
    while True:
        try:
            return _connect_once(addresses, max(min(deadline.left(), PROBE_TIMEOUT_S), PROBE_MIN_S))
        except OSError as exc:
            last = str(exc) or type(exc).__name__
        remaining = deadline.left()
        if remaining <= 0:
            raise RendezvousTimeoutError(
                info.launcher,
                f"{info.who} could not reach rank 0's store at "
                f"{host_port(host, port)} within {deadline.seconds:g} s (last error: {last})",
                hint="check that rank 0 is running and that MASTER_ADDR/MASTER_PORT name a host "
                "and port this node can reach (a firewall, or DISTENV_MASTER_ADDR_FORMAT for the "
                f"right interface); raise the limit with rendezvous_timeout= or ${TIMEOUT_VAR}",
                variable="MASTER_ADDR",
                value=host,
            )
        # Back off: rank 0 may still be importing torch.
        pause(min(delay, remaining))
        delay = min(delay * 2, PROBE_MAX_S)


def connect_store(
    info: RankInfo,
    watch: Watch,
    deadline: Deadline,
    *,
    agent_store: bool,
    master_from: str = "MASTER_ADDR",
) -> Store:
    """Create (rank 0) or reach (others) the TCPStore at the master, by `deadline`.

    Runs in a `watched` call: each step tells `watch` by when it must be over and what to say
    otherwise, so a listener that accepts connections but never answers as a store is reported
    at the rendezvous timeout, not waited for. Under torchrun's agent store (`agent_store`) every
    rank, rank 0 included, is a client, and none probes the port first. `master_from` says where
    the master address came from (`distenv.detection.pipeline.Detection.master_from`), for the
    error when it does not resolve.
    """
    from torch._C._distributed_c10d import TCPStore

    host, port = str(info.master_addr), int(info.master_port or 0)
    where = host_port(host, port)
    what = "the connection to rank 0's store"

    def no_answer(problem: str) -> Callable[[], DistEnvError]:
        return lambda: RendezvousTimeoutError(
            info.launcher,
            f"{info.who}: {problem} within {deadline.seconds:g} s",
            hint="check MASTER_ADDR and MASTER_PORT; with another service on that port, give "
            "this job its own MASTER_PORT",
            variable="MASTER_PORT",
            value=str(port),
        )

    silent = (
        f"{where} accepts connections but is not answering as a torch store (another service, "
        "or rank 0 stopped?)"
    )
    watch.enter(what, deadline, no_answer(f"the master address {host!r} did not resolve"))
    addresses = _resolve(info, host, port, master_from)
    timeout = datetime.timedelta(seconds=max(deadline.left(), MIN_CONNECT_S))
    if info.rank == 0 and not agent_store:
        fd = _listening_socket(info.launcher, host, port, addresses)
        watch.enter(what, deadline, no_answer(f"rank 0's store on {where} did not start"))
        return TCPStore(
            host,
            port,
            info.world_size,
            is_master=True,
            timeout=timeout,
            wait_for_workers=False,
            master_listen_fd=fd,
        )
    if not agent_store:
        # The probe names its own cause at `deadline`: only the whole call's deadline cuts it
        # short. An agent's store (torchrun's, `distenv run`'s) listened before any rank was
        # started, and the agent reached it from this node: the probe would cost its server one
        # more accept per rank and find nothing.
        watch.enter(what, watch.end, no_answer(f"{where} did not accept a connection"))
        with _wait_reachable(info, addresses, deadline) as probe:
            watch.enter(what, deadline, no_answer(silent))
            problem = _greet(probe, deadline)
        if problem == "":
            raise no_answer(silent)()
        if problem is not None:
            raise StoreTakenError(
                info.launcher,
                f"{info.who}: {where} accepted a connection but is not a torch store: {problem}",
                hint="check MASTER_ADDR and MASTER_PORT; another service holds that port: give "
                "this job its own MASTER_PORT",
                variable="MASTER_PORT",
                value=str(port),
            )
    watch.enter(what, deadline, no_answer(silent))
    # Longer than the deadline: a constructor given up on must still be waiting when the process
    # ends (`distenv.deadline`), not retrying into the user's log or throwing as it finalises.
    timeout += datetime.timedelta(seconds=OUTLIVE_S)
    try:
        return TCPStore(host, port, info.world_size, is_master=False, timeout=timeout)
    except RuntimeError as exc:  # torch's DistError
        raise no_answer(
            f"{where} accepted a connection but refused the store: {first_line(exc)}"
        )() from None


def host_store(source: str, host: str, port: int, timeout: float) -> Store:
    """Create the TCPStore server of a launcher's node agents on ``host:port`` and return it.

    ``distenv run --max-restarts`` hosts the job's store in node 0's agent, which outlives every
    attempt (as torchrun's agent store does): the agents agree there on each attempt, and the
    ranks, all clients, hold each attempt's rendezvous there.

    Raises:
        MasterResolutionError: If `host` does not resolve.
        DistEnvError: If the port is taken or cannot be listened on.
    """
    from torch._C._distributed_c10d import TCPStore

    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise MasterResolutionError(
            source,
            f"node 0's agent cannot resolve the master address {host!r}: {exc.strerror}",
            hint="pass --master-addr with a name or address of this host that every node resolves",
            variable="--master-addr",
            value=host,
        ) from None
    fd = _listening_socket(source, host, port, addresses)
    return TCPStore(
        host,
        port,
        is_master=True,
        timeout=datetime.timedelta(seconds=timeout),
        wait_for_workers=False,
        master_listen_fd=fd,
    )
