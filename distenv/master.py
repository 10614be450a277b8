"""Where rank 0's store listens: the one owner of ``MASTER_ADDR`` and ``MASTER_PORT``.

Every caller (detection, `distenv.resolve`, ``distenv run``, `distenv.launch`) describes what it
knows in a `MasterQuery` and asks `find_master`. The rules, in order; for each of the address and
the port the first rule that knows it wins:

1. **stated**: the launcher's own contract states the master (torchrun's ``MASTER_ADDR`` /
   ``MASTER_PORT``, a plug-in that knows it): used as given.
2. **explicit**: ``MASTER_ADDR`` / ``MASTER_PORT`` in the environment, for launchers that declare
   them, unless ``DISTENV_SCOPE`` says distenv exported them for another job step (ignored, with a
   warning: a stale ``eval "$(distenv export)"`` inherited through ``srun --export=ALL``).
3. **flags**: ``distenv run --master-addr/--master-port``, ``launch(master_addr=, master_port=)``.
4. **default**: the launcher layer's own answer (`Default`): Slurm's first host of the step and
   `scheduler_port`, LSF's first host, 127.0.0.1 for a batch script. Under an arbitrary or plane
   distribution Slurm knows no host, and ``MASTER_ADDR`` is required.
5. **allocation**: MPI ranks inside a scheduler's allocation take its first host and a port derived
   from the job alone, when no address is known yet (ranks of one MPI job see different steps).

Rules 4 and 5 pass their host through ``DISTENV_MASTER_ADDR_FORMAT`` (``{host}-ib``). Detection
stops there (it reads the environment only). `find_master` with ``runtime=True`` goes on:

6. **local**: one node (a single process, or a local launcher's one node): 127.0.0.1 and a free
   port. A local launcher spanning several nodes needs the address given; its port is 29500. An
   MPI job on one node (local size = world size) without mpi4py: 127.0.0.1 and a port its ranks
   derive alike from the launch (`MasterQuery.node_port`).
7. **exchange**: otherwise (an MPI job with no master): rank 0's host name, mapped (127.0.0.1 on
   one node), and a free port picked on rank 0, sent to every rank by the `Exchange` the caller
   passes (mpi4py's broadcast, `distenv.detection.exchange`).
"""

from __future__ import annotations

import _thread
import zlib
from collections.abc import Callable, Mapping
from typing import NamedTuple

from distenv._hosts import check_hostname
from distenv.errors import (
    ConfigurationError,
    InvalidVariableError,
    MissingVariableError,
    shown,
    warn,
)
from distenv.variables import Reader, Var

__all__ = [
    "DEFAULT_PORT",
    "FORMAT_VAR",
    "LOCAL_HOST",
    "MASTER_VARS",
    "PORT_HIGH",
    "PORT_LOW",
    "PORT_STRIDE",
    "RUN_ID_PATTERN",
    "RUN_ID_VAR",
    "SCOPE_VAR",
    "Default",
    "Exchange",
    "LocalLaunch",
    "Master",
    "MasterQuery",
    "addr_origin",
    "explicit_master",
    "find_master",
    "free_port",
    "host_port",
    "map_master_host",
    "scheduler_port",
    "scope_tag",
    "tcp_url",
]

SCOPE_VAR = "DISTENV_SCOPE"
#: The job identity a local launcher (``distenv run``, `distenv.launch`) hands its ranks.
RUN_ID_VAR = "DISTENV_RUN_ID"
RUN_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}"
FORMAT_VAR = "DISTENV_MASTER_ADDR_FORMAT"
LOCAL_HOST = "127.0.0.1"
# torchrun's default for --master-port; a local launcher spanning several nodes uses it.
DEFAULT_PORT = 29500

MASTER_VARS = (
    Var("MASTER_ADDR", "master_addr", "no", "rank 0's host; set by you, it wins over the default"),
    Var("MASTER_PORT", "master_port", "no", "rank 0's store port; set by you, it wins"),
    Var(
        SCOPE_VAR,
        "(export tag)",
        "no",
        "launcher/job/step that distenv exported MASTER_* for; other scopes' values are ignored",
    ),
    Var(
        FORMAT_VAR,
        "master_addr",
        "no",
        "maps the default master host to the address to use, e.g. '{host}-ib'",
    ),
)

# Ports come from [PORT_LOW, PORT_LOW + PORT_SPAN): above the registered services most clusters run,
# and below Linux's default ephemeral range (net.ipv4.ip_local_port_range = 32768 60999), so the
# kernel never hands our port to some outgoing connection first.
PORT_LOW = 10_000
PORT_HIGH = 32_768
# The largest prime below PORT_HIGH - PORT_LOW: the stride is invertible modulo a prime, so two job
# ids share a step's port only when a multiple of PORT_SPAN apart, which no round distance
# (22768 = PORT_HIGH - PORT_LOW) is.
PORT_SPAN = 22_751
# Job ids step PORT_STRIDE apart modulo the span, step ids 1 apart. The stride was searched for the
# patterns that share nodes (tests/unit/test_master.py checks each figure): two jobs whose ids
# differ by at most 708 never collide while their steps differ by at most 31; by at most 2133 with
# steps 0-7; by at most 3 with steps up to 255; two steps of one job never do; job ids 22768 apart
# never do for steps up to 63.
PORT_STRIDE = 9_755
# `free_port`: its random draws before the kernel picks, the fewest ports it draws from, the ports
# torch's own defaults take (torchrun's rendezvous, MASTER_PORT), and the ports it returned.
DRAWS, MIN_DRAWN, TORCH_PORTS = 64, 1_000, frozenset({29_400, 29_500})
_GIVEN: set[int] = set()
_PICKING = _thread.allocate_lock()


def _as_number(text: str) -> int:
    # A job id of more than 20 digits is no scheduler's (and int() refuses past 4300 digits);
    # surrogatepass: os.environ holds undecodable bytes as lone surrogates.
    if text.isascii() and text.isdigit() and len(text) <= 20:
        return int(text)
    return zlib.crc32(text.encode("utf-8", "surrogatepass"))


def scheduler_port(job_id: str, step: str = "0") -> int:
    """Return the master port every rank of a job step derives alike, without talking.

    ``PORT_LOW + (job * PORT_STRIDE + step) % PORT_SPAN``; non-numeric ids are hashed with CRC-32.
    Related jobs (consecutive ids, array elements, steps) avoid each other as the constants'
    comment says; unrelated jobs sharing a node collide like random ports: about
    ``N**2 / (2 * PORT_SPAN)`` for N concurrent jobs (0.2 % for 10). A collision is an error that
    names the other job (`distenv.bootstrap.scope`), never a silent join.
    """
    return PORT_LOW + (_as_number(job_id) * PORT_STRIDE + _as_number(step)) % PORT_SPAN


def scope_tag(launcher: str, job_id: str | None, step: str | None) -> str:
    """Return the `DISTENV_SCOPE` value naming one launcher's job step."""
    return f"{launcher}/{job_id or '-'}/{step or '-'}"


def host_port(host: str, port: int) -> str:
    """Return ``host:port``, with an IPv6 address in brackets (``[fe80::1]:29500``)."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def tcp_url(host: str, port: int) -> str:
    """Return the ``tcp://`` URL of a store (``tcp://[::1]:29500`` for IPv6)."""
    return f"tcp://{host_port(host, port)}"


def free_port(host: str = "") -> int:
    """Return a TCP port that was free on `host` a moment ago and that this process never
    returned before.

    Drawn at random from `scheduler_port`'s range, cut where the kernel's ephemeral range
    (``net.ipv4.ip_local_port_range``) starts lower, skipping torch's default ports: between the
    pick and the store's bind (seconds, while the ranks import torch), a port of the ephemeral
    range can go to any outgoing connection or listener on the node first. Where that leaves
    under `MIN_DRAWN` ports, the kernel picks.
    """
    import secrets
    import socket  # here: detection never needs them

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    high = min(PORT_HIGH, _ephemeral_low())
    with _PICKING:
        for _ in range(DRAWS if high - PORT_LOW >= MIN_DRAWN else 0):
            port = PORT_LOW + secrets.randbelow(high - PORT_LOW)
            if port in _GIVEN or port in TORCH_PORTS:
                continue
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
            _GIVEN.add(port)
            return port
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        _GIVEN.add(port)
        return port


def _ephemeral_low(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    """Return the first port of the kernel's ephemeral range (`PORT_HIGH` where unknown)."""
    try:
        with open(path, encoding="ascii") as file:
            return int(file.read(64).split()[0])
    except (OSError, ValueError, IndexError):
        return PORT_HIGH


def map_master_host(source: str, env: Mapping[str, str], host: str) -> str:
    """Apply ``DISTENV_MASTER_ADDR_FORMAT`` (``{host}`` is replaced) to a default master host.

    127.0.0.1 (a one-node default) is checked against the template but kept as it is.
    """
    template = Reader(source, env, MASTER_VARS).get(FORMAT_VAR)
    if template is None:
        return host
    if "{host}" not in template:
        raise ConfigurationError(
            source,
            f"${FORMAT_VAR} is {shown(template)}, expected a template containing '{{host}}'",
            hint="e.g. DISTENV_MASTER_ADDR_FORMAT='{host}-ib'",
            variable=FORMAT_VAR,
            value=template,
        )
    if host == LOCAL_HOST:  # loopback names this host on every network: nothing to map
        return host
    return check_hostname(source, FORMAT_VAR, template.replace("{host}", host))


class Default(NamedTuple):
    """A launcher layer's own answer for the master, when nobody states one.

    Attributes:
        host: The default host, before ``DISTENV_MASTER_ADDR_FORMAT``; None when the layer cannot
            know it.
        port: The port every rank derives alike, or None.
        missing: When `host` is None: why, and what to do; ``MASTER_ADDR`` is then required.
        source: The layer's name, for the note that says where the master came from.
        variable: The variable `host` was read from (``SLURM_STEP_NODELIST``), named by errors
            about the host; empty when it is not one variable.
    """

    host: str | None
    port: int | None
    missing: str | None = None
    source: str = ""
    variable: str = ""


class LocalLaunch(NamedTuple):
    """A local launcher (``distenv run``, `distenv.launch`) asking for its ranks' master.

    Attributes:
        nodes: How many nodes the launch spans (one local launcher each).
        option: How the user gives the address (``--master-addr``, ``master_addr``).
        hint: What to do when several nodes have no address.
    """

    nodes: int
    option: str
    hint: str


class MasterQuery(NamedTuple):
    """What one caller knows that bears on the master.

    Attributes:
        source: Who asks (a launcher's name, ``run``, ``launch``); errors start with it.
        env: The environment of rules 2, 4 and 5 (``MASTER_*``, ``DISTENV_SCOPE``, the format).
        job_tag: This job step's export tag (`scope_tag`): ``MASTER_*`` exported with any other
            tag are stale.
        explicit: Whether ``MASTER_ADDR``/``MASTER_PORT`` of `env` count (the launcher declares
            them; `none` and most plug-ins do not).
        stated: What the launcher's own contract states, ``(addr, port)``.
        flags: What a local launcher's options say, ``(addr, port)``.
        default: The launcher layer's `Default`.
        allocation: The enclosing scheduler's allocation `Default` (MPI ranks inside Slurm/LSF).
        world_size: The job's size (a single process is rule 6).
        local: Set for a local launcher.
        node_port: Set for a launch whose ranks all run on this host (an MPI job whose local
            size is its size): 127.0.0.1 then serves as the address (rules 6 and 7), and this
            returns, at run time, a port every rank derives alike without talking, or None (then
            rule 7's exchange runs).
    """

    source: str
    env: Mapping[str, str]
    job_tag: str = ""
    explicit: bool = False
    stated: tuple[str | None, int | None] = (None, None)
    flags: tuple[str | None, int | None] = (None, None)
    default: Default | None = None
    allocation: Default | None = None
    world_size: int = 1
    local: LocalLaunch | None = None
    node_port: Callable[[], int | None] | None = None


class Master(NamedTuple):
    """`find_master`'s answer, with the rule that gave each part.

    Attributes:
        addr: Rank 0's host, or None while unresolved.
        port: Rank 0's store port, or None while unresolved.
        addr_rule: ``stated``, ``explicit``, ``flags``, ``default``, ``allocation``, ``local``,
            ``exchange``, or ``unresolved``.
        port_rule: Likewise for the port.
    """

    addr: str | None
    port: int | None
    addr_rule: str = "unresolved"
    port_rule: str = "unresolved"

    @property
    def is_resolved(self) -> bool:
        """Whether both the address and the port are known."""
        return self.addr is not None and self.port is not None


#: Sends rank 0's ``(host, port)`` to every rank: called on every rank with a function that only
#: rank 0 calls; returns rank 0's answer (`distenv.detection.exchange.mpi_exchange` builds one over MPI).
Exchange = Callable[[Callable[[], tuple[str, int]]], tuple[str, int]]


def _explicit(query: MasterQuery) -> tuple[str | None, int | None]:
    """Rule 2: ``MASTER_ADDR``/``MASTER_PORT``, validated, unless exported for another scope."""
    reader = Reader(query.source, query.env, MASTER_VARS)
    addr, port_text = reader.get("MASTER_ADDR"), reader.get("MASTER_PORT")
    tag = reader.get(SCOPE_VAR)
    if tag is not None and tag != query.job_tag and (addr is not None or port_text is not None):
        warn(
            "%s: ignoring MASTER_ADDR=%s MASTER_PORT=%s: distenv exported them for %s, this is %s",
            query.source,
            addr,
            port_text,
            tag,
            query.job_tag,
        )
        return None, None
    return explicit_master(reader)


def explicit_master(reader: Reader) -> tuple[str | None, int | None]:
    """Return ``MASTER_ADDR`` and ``MASTER_PORT`` read by `reader`, validated (None if unset)."""
    addr, port_text = reader.get("MASTER_ADDR"), reader.get("MASTER_PORT")
    port = None
    if port_text is not None:
        port = reader.parse_int("MASTER_PORT", port_text, minimum=1)
        if port > 65535:
            raise InvalidVariableError(
                reader.source, "MASTER_PORT", port_text, "a port number in [1, 65535]"
            )
    if addr is not None:
        addr = check_hostname(reader.source, "MASTER_ADDR", addr)
    return addr, port


class _Answer:
    """The address and port found so far, each with the rule that found it."""

    def __init__(self) -> None:
        self.addr: str | None = None
        self.port: int | None = None
        self.addr_rule = self.port_rule = "unresolved"

    def offer(self, rule: str, addr: str | None, port: int | None) -> None:
        if self.addr is None and addr is not None:
            self.addr, self.addr_rule = addr, rule
        if self.port is None and port is not None:
            self.port, self.port_rule = port, rule

    def master(self) -> Master:
        return Master(self.addr, self.port, self.addr_rule, self.port_rule)


def find_master(
    query: MasterQuery, *, runtime: bool = False, exchange: Exchange | None = None
) -> Master:
    """Return the master for `query`, by the rules of this module, in order.

    Args:
        query: What the caller knows.
        runtime: Also apply rules 6 and 7, which pick free ports (detection does not).
        exchange: How rank 0 tells the others its master (rule 7); without it an MPI job's
            master stays unresolved.

    Raises:
        MissingVariableError: Slurm's arbitrary/plane distribution without ``MASTER_ADDR``.
        ConfigurationError: A local launcher on several nodes without the address; a bad format.
        InvalidVariableError: A malformed ``MASTER_ADDR`` or ``MASTER_PORT``.
    """
    answer = _Answer()
    answer.offer("stated", *query.stated)
    if query.explicit:
        answer.offer("explicit", *_explicit(query))
    answer.offer("flags", *query.flags)
    default = query.default
    if default is not None:
        if answer.addr is None and default.host is None and default.missing is not None:
            raise MissingVariableError(query.source, "MASTER_ADDR", hint=default.missing)
        host = None
        if answer.addr is None and default.host is not None:
            host = map_master_host(query.source, query.env, default.host)
        answer.offer("default", host, default.port)
    allocation = query.allocation
    if answer.addr is None and allocation is not None and allocation.host is not None:
        # The allocation's scheduler names the error: the host came from its variables.
        host = map_master_host(allocation.source or query.source, query.env, allocation.host)
        answer.offer("allocation", host, allocation.port)
    if not runtime or (answer.addr is not None and answer.port is not None):
        return answer.master()
    local = query.local
    if local is not None and local.nodes > 1:
        if answer.addr is None:
            raise ConfigurationError(
                query.source, f"{local.nodes} nodes but no {local.option}", hint=local.hint
            )
        answer.offer("local", None, DEFAULT_PORT)
    elif local is not None or query.world_size == 1:
        addr = answer.addr or LOCAL_HOST
        answer.offer("local", addr, free_port(addr if addr == LOCAL_HOST else ""))
    elif query.node_port is not None and (shared := query.node_port()) is not None:
        answer.offer("local", LOCAL_HOST, shared)
    elif exchange is not None:
        known = answer.addr, answer.port

        def rank0_master() -> tuple[str, int]:
            import socket

            host = known[0] or (
                LOCAL_HOST
                if query.node_port is not None  # one node: whatever the host name resolves to
                else map_master_host(query.source, query.env, socket.gethostname())
            )
            return host, known[1] or free_port()

        answer.offer("exchange", *exchange(rank0_master))
    return answer.master()


def addr_origin(query: MasterQuery, master: Master) -> str:
    """Return where `master`'s address came from, for errors about it.

    A variable (``MASTER_ADDR``, ``SLURM_STEP_NODELIST``), an option (``--master-addr``), or a
    phrase; errors name it instead of a ``MASTER_ADDR`` the user never set.
    """
    rule = master.addr_rule
    if rule in ("stated", "explicit"):
        return "MASTER_ADDR"
    if rule == "flags":
        return query.local.option if query.local is not None else "MASTER_ADDR"
    layer = query.default if rule == "default" else query.allocation
    if rule in ("default", "allocation") and layer is not None:
        return layer.variable or f"the {layer.source or query.source} job's host list"
    return {"local": "this host", "exchange": "rank 0's host name"}.get(rule, "MASTER_ADDR")
