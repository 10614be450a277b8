"""This node's network path: its interfaces, what each backend advertises by default, the route.

gloo and NCCL each advertise one address of this node to the others, chosen blindly (issue #24):

- gloo (`GLOO_SOCKET_IFNAME` unset) resolves this node's host name and takes the first address it
  can bind, falling back to loopback; it never checks that another node can reach it. Debian's
  ``127.0.1.1 <hostname>`` line, a management NIC or a docker0 first in /etc/hosts all win.
- NCCL (`NCCL_SOCKET_IFNAME` unset) takes the first interface in a fixed order: InfiniBand
  (``ib*``), then any other but docker and loopback, then docker, then loopback.

Against both stands the address the kernel itself would use to reach the master (a UDP
``connect``, which sends nothing): the interface that demonstrably routes to the job's store.
`path` gathers the three for `distenv info --network`. Linux only (``ioctl`` on a socket,
/proc/net/if_inet6); no subprocess, no ``ip``; imported only when asked.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import socket
import struct
from collections.abc import Mapping, Sequence
from typing import NamedTuple

__all__ = ["Interface", "Path", "Route", "gloo_default", "interfaces", "nccl_default", "path"]

# <linux/sockios.h>: the interface list (IPv4 addresses) and one interface's flags.
_SIOCGIFCONF = 0x8912
_SIOCGIFFLAGS = 0x8913
_IFF_UP = 0x1
_IFF_LOOPBACK = 0x8
_IFREQ = 40  # sizeof(struct ifreq) on 64-bit Linux
_MAX_IFREQS = 1024
_IF_INET6 = "/proc/net/if_inet6"
_MAX_IF_INET6_BYTES = 1 << 20


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
    buffer = bytearray(_IFREQ * _MAX_IFREQS)
    request = struct.pack("iL", len(buffer), _address_of(buffer))
    length = struct.unpack("iL", fcntl.ioctl(sock.fileno(), _SIOCGIFCONF, request))[0]
    found: dict[str, list[str]] = {}
    for offset in range(0, length, _IFREQ):
        entry = bytes(buffer[offset : offset + _IFREQ])
        name = entry[:16].split(b"\0", 1)[0].decode(errors="replace").split(":")[0]
        found.setdefault(name, []).append(socket.inet_ntoa(entry[20:24]))
    return found


def _address_of(buffer: bytearray) -> int:
    import ctypes

    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


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
