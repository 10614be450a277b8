"""This node's network path: its interfaces, what each backend advertises by default, the route.

gloo and NCCL each advertise one address of this node to the others, chosen blindly (issue #24):

- gloo (`GLOO_SOCKET_IFNAME` unset) resolves this node's host name and takes the first address it
  can bind, falling back to loopback; it never checks that another node can reach it. Debian's
  ``127.0.1.1 <hostname>`` line, a management NIC or a docker0 first in /etc/hosts all win.
- NCCL (`NCCL_SOCKET_IFNAME` unset) takes the first interface in a fixed order: InfiniBand
  (``ib*``), then any other but docker and loopback, then docker, then loopback.

Against both stands the address the kernel itself would use to reach the master (a UDP
``connect``, which sends nothing): the interface that demonstrably routes to the job's store.
`path` gathers the three for `distenv info --network`; `predict` lists, for the roll call's probe,
the addresses each backend would advertise and the one it could advertise instead (the first
address of the interface toward the master, which is what the backend takes once told that
interface's name). Linux only (``ioctl`` on a socket, /proc/net/if_inet6); no subprocess, no
``ip``; imported only when asked.
"""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import ipaddress
import re
import socket
import struct
from collections.abc import Mapping, Sequence
from typing import NamedTuple

__all__ = [
    "EXPORTED",
    "USER_CHOICE",
    "Candidate",
    "Interface",
    "Path",
    "Prediction",
    "Route",
    "backends_to_probe",
    "export",
    "gloo_default",
    "interfaces",
    "nccl_default",
    "path",
    "predict",
]

# <linux/sockios.h>: the interface list (IPv4 addresses) and one interface's flags.
_SIOCGIFCONF = 0x8912
_SIOCGIFFLAGS = 0x8913
_IFF_UP = 0x1
_IFF_LOOPBACK = 0x8
_IFREQ = 40  # sizeof(struct ifreq) on 64-bit Linux
_MAX_IFREQS = 1024
_IF_INET6 = "/proc/net/if_inet6"
_MAX_IF_INET6_BYTES = 1 << 20

#: The variables by which a user chooses a backend's network path, per backend. Where any of a
#: backend's is set, distenv neither probes that backend's default nor changes it. torch RPC's
#: TP_SOCKET_IFNAME is never read or written either: distenv does not probe tensorpipe.
USER_CHOICE: dict[str, tuple[str, ...]] = {
    "gloo": ("GLOO_SOCKET_IFNAME",),
    "nccl": ("NCCL_SOCKET_IFNAME", "NCCL_COMM_ID", "NCCL_SOCKET_FAMILY"),
}
#: What distenv sets where it moves a backend to another interface, one variable per backend.
EXPORTED = {"gloo": "GLOO_SOCKET_IFNAME", "nccl": "NCCL_SOCKET_IFNAME"}
# Interface names a record may carry (Linux allows more; such an interface is never offered).
_IFNAME = re.compile(r"[A-Za-z0-9_.@-]{1,15}")


class Interface(NamedTuple):
    """One network interface: its name, whether it is up and a loopback, and its addresses."""

    name: str
    up: bool
    loopback: bool
    addresses: tuple[str, ...]


class Route(NamedTuple):
    """How this node reaches a host: the source address the kernel picks, and its interface."""

    host: str
    address: str
    interface: str | None


class Path(NamedTuple):
    """This node's network path to the master, and what each backend would advertise."""

    hostname: str
    resolved: tuple[str, ...]
    gloo: tuple[str, str]  # (address, why)
    nccl: tuple[str | None, str]  # (interface, why)
    route: Route | None
    route_error: str | None
    interfaces: tuple[Interface, ...]

    def warnings(self) -> list[str]:
        """Return what would likely fail across nodes: an advertised address off the route.

        gloo on a loopback address while the master is reached over a network fails for sure;
        NCCL on another interface than the route's fails only where the nodes share no network
        on it, so that is said as a condition.
        """
        found: list[str] = []
        # A master reached over loopback is on this node: nothing crosses a network.
        if self.route is None or _is_loopback(self.route.address):
            return found
        gloo, _ = self.gloo
        if _is_loopback(gloo):
            fix = f"GLOO_SOCKET_IFNAME={self.route.interface}" if self.route.interface else ""
            found.append(
                f"gloo would advertise {gloo}, but this node reaches the master from "
                f"{self.route.address}"
                + (f" on {self.route.interface}" if self.route.interface else "")
                + ": the other nodes cannot reach a loopback address"
                + (f" (export {fix} on this node)" if fix else "")
            )
        nccl, _ = self.nccl
        if nccl is not None and self.route.interface and nccl != self.route.interface:
            found.append(
                f"NCCL would use {nccl}, but this node reaches the master on "
                f"{self.route.interface} (export NCCL_SOCKET_IFNAME={self.route.interface} if "
                f"the nodes share no network on {nccl})"
            )
        return found


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def _flags(sock: socket.socket, name: str) -> int:
    request = struct.pack("16sH14x", name.encode()[:15], 0)
    try:
        result = fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, request)
    except OSError:
        return 0
    return int(struct.unpack("16sH14x", result)[1])


def _ipv4(sock: socket.socket) -> dict[str, list[str]]:
    """Return the IPv4 addresses of every interface (SIOCGIFCONF), by interface name."""
    # An array's buffer_info() gives its address for the ioctl's pointer, without ctypes's import.
    buffer = array.array("B", bytes(_IFREQ * _MAX_IFREQS))
    address, size = buffer.buffer_info()
    request = struct.pack("iL", size, address)
    length = struct.unpack("iL", fcntl.ioctl(sock.fileno(), _SIOCGIFCONF, request))[0]
    raw = buffer.tobytes()
    found: dict[str, list[str]] = {}
    for offset in range(0, length, _IFREQ):
        entry = raw[offset : offset + _IFREQ]
        name = entry[:16].split(b"\0", 1)[0].decode(errors="replace").split(":")[0]
        found.setdefault(name, []).append(socket.inet_ntoa(entry[20:24]))
    return found


def _ipv6() -> dict[str, list[str]]:
    """Return the IPv6 addresses of every interface (/proc/net/if_inet6), by interface name."""
    found: dict[str, list[str]] = {}
    with contextlib.suppress(OSError), open(_IF_INET6, "rb") as file:
        for line in file.read(_MAX_IF_INET6_BYTES).decode(errors="replace").splitlines():
            fields = line.split()
            if len(fields) != 6 or len(fields[0]) != 32:
                continue
            raw = bytes.fromhex(fields[0])
            address = str(ipaddress.IPv6Address(raw))
            if address.startswith("fe80:"):
                address += f"%{fields[5]}"
            found.setdefault(fields[5], []).append(address)
    return found


def interfaces() -> tuple[Interface, ...]:
    """Return this node's interfaces, in the kernel's order, with their addresses."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        v4 = _ipv4(sock)
        v6 = _ipv6()
        found = []
        for _, name in socket.if_nameindex():
            flags = _flags(sock, name)
            found.append(
                Interface(
                    name,
                    bool(flags & _IFF_UP),
                    bool(flags & _IFF_LOOPBACK),
                    tuple(v4.get(name, ())) + tuple(v6.get(name, ())),
                )
            )
    return tuple(found)


def _resolve(host: str) -> tuple[str, ...]:
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return ()
    return tuple(dict.fromkeys(str(info[4][0]) for info in infos))


def _bindable(address: str) -> bool:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((address, 0))
        except OSError:
            return False
    return True


def gloo_default(
    hostname: str, resolved: Sequence[str], found: Sequence[Interface], env: Mapping[str, str]
) -> tuple[str, str]:
    """Return the address gloo would advertise, and why (gloo's ``createDefaultDevice``)."""
    named = env.get("GLOO_SOCKET_IFNAME")
    if named:
        first = named.split(",")[0]
        addresses = next((i.addresses for i in found if i.name == first), ())
        where = addresses[0] if addresses else "(no address)"
        return where, f"GLOO_SOCKET_IFNAME={named}: the address of {first}"
    for address in resolved:
        if _bindable(address):
            return address, f"the first address host name {hostname!r} resolves to that binds"
    return "127.0.0.1", f"host name {hostname!r} resolves to no address that binds: loopback"


def nccl_default(found: Sequence[Interface], env: Mapping[str, str]) -> tuple[str | None, str]:
    """Return the interface NCCL would use for its sockets, and why (NCCL's fixed order)."""
    named = env.get("NCCL_SOCKET_IFNAME")
    if named:
        return named, f"NCCL_SOCKET_IFNAME={named}"
    usable = [i for i in found if i.up and i.addresses]
    rules = (
        ("an InfiniBand interface (ib*) first", lambda i: i.name.startswith("ib")),
        (
            "the first interface that is not docker or loopback",
            lambda i: not i.loopback and not i.name.startswith("docker"),
        ),
        ("a docker interface, nothing better", lambda i: i.name.startswith("docker")),
        ("loopback, nothing else", lambda i: i.loopback),
    )
    for why, rule in rules:
        match = next((i for i in usable if rule(i)), None)
        if match is not None:
            return match.name, why
    return None, "no interface with an address"


def route(host: str, port: int, found: Sequence[Interface]) -> Route:
    """Return the source address (and its interface) the kernel uses toward `host`.

    A UDP socket's ``connect`` picks the route and sends nothing.

    Raises:
        OSError: `host` does not resolve, or there is no route to it (ENETUNREACH).
    """
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect(sockaddr)
        address = str(sock.getsockname()[0])
    owner = next((i.name for i in found if address in i.addresses), None)
    return Route(host, address, owner)


def path(master_addr: str | None, master_port: int | None, env: Mapping[str, str]) -> Path:
    """Return this node's network path: host name, addresses, both backends' defaults, route."""
    hostname = socket.gethostname()
    found = interfaces()
    resolved = _resolve(hostname)
    reached: Route | None = None
    error: str | None = None
    if master_addr:
        try:
            reached = route(master_addr, int(master_port or 0), found)
        except OSError as exc:
            error = exc.strerror or str(exc)
    return Path(
        hostname,
        resolved,
        gloo_default(hostname, resolved, found, env),
        nccl_default(found, env),
        reached,
        error,
        found,
    )


def backends_to_probe(backend: str, env: Mapping[str, str]) -> tuple[str, ...]:
    """Return the backends of torch's `backend` string whose path distenv checks: gloo and NCCL,
    each unless the user chose its path (`USER_CHOICE`)."""
    named = {part.rpartition(":")[2].strip().lower() for part in backend.split(",")}
    return tuple(
        name
        for name in ("gloo", "nccl")
        if name in named and not any(env.get(var) for var in USER_CHOICE[name])
    )


def export(backend: str, interface: str) -> tuple[str, str]:
    """Return the variable and value that move `backend` to `interface`, in its own syntax.

    gloo takes a plain name; NCCL reads a bare name as a prefix (``eth1`` also matches
    ``eth10``), so it gets its exact-match form ``=eth1``.
    """
    return EXPORTED[backend], ("=" + interface if backend == "nccl" else interface)


class Candidate(NamedTuple):
    """An address this node could advertise, and its interface (None: no interface holds it,
    such as Debian's 127.0.1.1, which lo answers without owning)."""

    address: str
    interface: str | None


class Prediction(NamedTuple):
    """What this node's backends would advertise, and what they could advertise instead.

    `candidates` holds each backend's default first, then the first address of the interface
    toward the master (`route`, its index; None where the kernel has no route or the master is
    on no interface here), then, where asked (rank 0), the first address of every other up
    interface. `defaults` pairs each backend with its default's index. `unreachable` is the
    kernel's reason where it knows no route to the master at all.
    """

    hostname: str
    candidates: tuple[Candidate, ...]
    defaults: tuple[tuple[str, int], ...]
    route: int | None
    unreachable: str | None


def _first_address(found: Sequence[Interface], name: str) -> str | None:
    """Return the address a backend told to use interface `name` advertises: its first (IPv4
    before IPv6, as ``getifaddrs`` lists them)."""
    return next((i.addresses[0] for i in found if i.name == name and i.addresses), None)


def predict(
    master_addr: str,
    master_port: int,
    backends: Sequence[str],
    env: Mapping[str, str],
    *,
    limit: int,
    every_interface: bool = False,
) -> Prediction:
    """Return this node's candidates for the roll call's probe (see `Prediction`), at most
    `limit` of them."""
    hostname = socket.gethostname()
    found = interfaces()
    candidates: list[Candidate] = []

    def add(address: str | None, interface: str | None) -> int | None:
        if address is None or (interface is not None and not _IFNAME.fullmatch(interface)):
            return None
        for index, candidate in enumerate(candidates):
            if candidate.address == address:
                return index
        if len(candidates) >= limit:
            return None
        candidates.append(Candidate(address, interface))
        return len(candidates) - 1

    def owner(address: str) -> str | None:
        return next((i.name for i in found if address in i.addresses), None)

    defaults: list[tuple[str, int]] = []
    for backend in backends:
        if backend == "gloo":
            address, _ = gloo_default(hostname, _resolve(hostname), found, env)
            index = add(address, owner(address))
        else:
            name, _ = nccl_default(found, env)
            index = None if name is None else add(_first_address(found, name), name)
        if index is not None:
            defaults.append((backend, index))
    toward: int | None = None
    unreachable: str | None = None
    try:
        reached = route(master_addr, master_port, found)
    except OSError as exc:
        if exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            unreachable = exc.strerror or str(exc)
    else:
        if reached.interface is not None:
            toward = add(_first_address(found, reached.interface), reached.interface)
    if every_interface:
        up = [i for i in found if i.up and i.addresses]
        for interface in sorted(up, key=lambda i: i.loopback):
            add(interface.addresses[0], interface.name)
    return Prediction(hostname, tuple(candidates), tuple(defaults), toward, unreachable)
