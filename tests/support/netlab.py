"""A network lab: "nodes" as Linux network namespaces, to run ranks on networks that break gloo.

A `Topology` (see `tests/support/topologies.py`) is data: networks, and nodes with their NICs,
host name and /etc/hosts. `Lab(topology)` builds it on this machine and tears it down on exit:

- every node is a network namespace with loopback up and its NICs; a NIC is one end of a veth
  pair whose other end is a port of its network's bridge, or (``network=None``) a bridge of its
  own with no port, like a ``docker0`` without containers;
- the bridges live in a "switch" namespace of their own, so the root namespace's links, routes
  and addresses are never touched, and the addresses (10.213.0.0/16) never leave the namespaces;
  a network marked ``isolated`` has isolated bridge ports: its nodes cannot reach each other
  (ARP fails), like a management network seen from the compute nodes;
- each node's /etc/hosts and /etc/hostname are files in /etc/netns/<namespace>/, which
  ``ip netns exec`` bind-mounts over /etc/ for the command; the UTS host name is set by a tiny
  Python wrapper run under ``unshare --uts`` that calls `socket.sethostname` and then execs the
  command, so `socket.gethostname()` (what gloo resolves) is the node's name.

`Lab.command` wraps an argv to run on a node, `Lab.popen` / `Lab.run` start it (own session,
killed at a timeout). Teardown runs in ``finally``: it kills the process groups the lab started,
then every process still in its namespaces (by pid, as ``ip netns pids`` lists them), deletes the
namespaces (which deletes their veths and bridges) and the /etc/netns directories. Names carry
`RUN_PREFIX` (a random tag and this process's pid): other work on the machine may create
namespaces too, and `sweep` removes only this process's leftovers (tests/conftest.py calls it at
the end of the session).

Needs root and iproute2's ``ip``; commands run without a shell, as argument lists.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO

IP = "ip"
NETNS_RUN = Path("/run/netns")  # where `ip netns add` keeps its namespaces (ip-netns(8))
NETNS_ETC = Path("/etc/netns")  # per-namespace files `ip netns exec` bind-mounts over /etc
# Every namespace and /etc/netns directory this process makes starts with this prefix.
RUN_PREFIX = f"nl{secrets.token_hex(2)}{os.getpid()}-"
IFNAMSIZ = 15  # the kernel's limit on an interface name (IFNAMSIZ - 1)
IP_TIMEOUT_S = 10.0
KILL_WAIT_S = 5.0
# Run as `python -c` between `unshare --uts` and the node's command: set the UTS host name of
# this (new) UTS namespace, then become the command. argv: [-c, hostname, program, args...].
AS_HOST = (
    "import os, socket, sys; socket.sethostname(sys.argv[1]); os.execvp(sys.argv[2], sys.argv[2:])"
)

_serial = itertools.count()


@dataclass(frozen=True)
class Network:
    """A layer-2 segment: one bridge in the switch namespace.

    Attributes:
        name: The bridge's name (at most 15 characters).
        isolated: Its ports cannot reach each other (bridge port isolation): every node has an
            address on it, but no node reaches another's.
    """

    name: str
    isolated: bool = False


@dataclass(frozen=True)
class Nic:
    """A node's interface.

    Attributes:
        name: The interface name inside the node (at most 15 characters).
        address: Its first address with prefix length, e.g. ``10.213.1.10/24`` (or IPv6).
        network: The `Network` it plugs into; None for a bridge of its own with no port
            (``docker0`` on a node without containers: its address binds, nothing reaches it).
        more: Further addresses with prefix lengths, added after `address` in this order (IPv4
            or IPv6; `address` stays the interface's first, the one a backend told its name
            advertises).
    """

    name: str
    address: str
    network: str | None
    more: tuple[str, ...] = ()

    @property
    def ip(self) -> str:
        """The address without its prefix length."""
        return self.address.split("/", 1)[0]


@dataclass(frozen=True)
class Node:
    """One "machine": its host name, its NICs in creation order, its /etc/hosts lines in order."""

    hostname: str
    nics: tuple[Nic, ...]
    hosts: tuple[tuple[str, str], ...]  # (address, name) per /etc/hosts line

    def hosts_file(self) -> str:
        """The text of this node's /etc/hosts."""
        return "".join(f"{address}\t{name}\n" for address, name in self.hosts)

    def resolves(self, name: str) -> str | None:
        """The address `name` resolves to on this node: its first /etc/hosts line, or None."""
        return next((address for address, n in self.hosts if n == name), None)


@dataclass(frozen=True)
class Topology:
    """A lab to build: networks, nodes, and how a user would set MASTER_ADDR on it.

    Attributes:
        name: Short identifier (the benchmark's row, a test id).
        report: The real report it reproduces (issue #24 cites each).
        networks: The bridges.
        nodes: The nodes; node 0 hosts rank 0.
        master_addr: MASTER_ADDR as a user of this cluster would set it (a name or an address).
        routable: Whether some choice of interface on each node lets every pair of ranks connect.
    """

    name: str
    report: str
    networks: tuple[Network, ...]
    nodes: tuple[Node, ...]
    master_addr: str
    routable: bool = True

    def __post_init__(self) -> None:
        known = {net.name for net in self.networks}
        for node in self.nodes:
            for nic in node.nics:
                if len(nic.name) > IFNAMSIZ:
                    raise ValueError(f"{self.name}: NIC name {nic.name!r} is over 15 characters")
                if nic.network is not None and nic.network not in known:
                    raise ValueError(f"{self.name}: NIC {nic.name!r} on unknown {nic.network!r}")
        for net in self.networks:
            if len(net.name) > IFNAMSIZ:
                raise ValueError(f"{self.name}: network name {net.name!r} is over 15 characters")


def ip(*args: str, namespace: str | None = None) -> str:
    """Run ``ip [-n NAMESPACE] ARGS`` and return its stdout; raise with its stderr on failure."""
    argv = [IP, *(["-n", namespace] if namespace else []), *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def namespaces(prefix: str = RUN_PREFIX) -> list[str]:
    """The network namespaces whose names start with `prefix` (all of them for ``""``)."""
    if not NETNS_RUN.is_dir():
        return []
    return sorted(p.name for p in NETNS_RUN.iterdir() if p.name.startswith(prefix))


def leftovers(prefix: str = RUN_PREFIX) -> list[str]:
    """Namespaces and /etc/netns entries with names starting with `prefix` (empty: all gone)."""
    etc = sorted(p.name for p in NETNS_ETC.iterdir()) if NETNS_ETC.is_dir() else []
    return [*namespaces(prefix), *(f"/etc/netns/{n}" for n in etc if n.startswith(prefix))]


def pids(namespace: str) -> list[int]:
    """The processes in `namespace` (``ip netns pids``; [] once it is gone)."""
    try:
        out = ip("netns", "pids", namespace)
    except RuntimeError:
        return []
    return [int(word) for word in out.split()]


def _kill_all_in(namespace: str) -> None:
    """SIGKILL every process in `namespace` by pid and wait (bounded) until none is left."""
    deadline = time.monotonic() + KILL_WAIT_S
    while (found := pids(namespace)) and time.monotonic() < deadline:
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def remove(namespace: str) -> None:
    """Kill what runs in `namespace`, delete it and its /etc/netns directory (each if present)."""
    if (NETNS_RUN / namespace).exists():
        _kill_all_in(namespace)
        ip("netns", "delete", namespace)
    etc = NETNS_ETC / namespace
    if etc.is_dir():
        for f in etc.iterdir():
            f.unlink()
        etc.rmdir()


def sweep(prefix: str = RUN_PREFIX) -> list[str]:
    """Remove every namespace and /etc/netns directory starting with `prefix`; return their names.

    The safety net behind `Lab`'s own teardown (a test process killed mid-test leaves its lab).
    """
    names = sorted({Path(n).name for n in leftovers(prefix)})
    for name in names:
        remove(name)
    return names


class Lab:
    """A `Topology` built as network namespaces; a context manager that always tears it down.

    Nodes are addressed by index (node 0 hosts rank 0). Use `command` to wrap an argv yourself,
    `popen`/`run` to start it.
    """

    def __init__(self, topology: Topology, *, prefix: str = RUN_PREFIX) -> None:
        self.topology = topology
        self.prefix = f"{prefix}{next(_serial)}-"  # ends with "-": no lab's prefix is another's
        self.switch = f"{self.prefix}sw"
        self.made: list[str] = []  # namespaces created, in order
        self.started: list[subprocess.Popen[bytes]] = []
        self.made_etc = False

    def namespace(self, node: int) -> str:
        """The network namespace of node `node`."""
        return f"{self.prefix}n{node}"

    def hostname(self, node: int) -> str:
        """The host name of node `node`."""
        return self.topology.nodes[node].hostname

    def __enter__(self) -> Lab:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(raise_errors=exc is None)

    def _add_namespace(self, name: str) -> None:
        self.made.append(name)  # before: a half-made namespace is removed too
        ip("netns", "add", name)
        ip("link", "set", "lo", "up", namespace=name)

    def _build(self) -> None:
        self._add_namespace(self.switch)
        isolated = {net.name: net.isolated for net in self.topology.networks}
        for net in self.topology.networks:
            ip("link", "add", "name", net.name, "type", "bridge", namespace=self.switch)
            ip("link", "set", net.name, "up", namespace=self.switch)
        for index, node in enumerate(self.topology.nodes):
            ns = self.namespace(index)
            self._add_namespace(ns)
            etc = NETNS_ETC / ns
            if not NETNS_ETC.exists():
                self.made_etc = True  # /etc/netns itself: removed again if left empty
            etc.mkdir(parents=True)
            (etc / "hosts").write_text(node.hosts_file())
            (etc / "hostname").write_text(node.hostname + "\n")
            for slot, nic in enumerate(node.nics):
                if nic.network is None:
                    ip("link", "add", "name", nic.name, "type", "bridge", namespace=ns)
                else:
                    port = f"p{index}x{slot}"  # unique in the switch namespace
                    ip("link", "add", "name", nic.name, "type", "veth", "peer", "name", port,
                       "netns", self.switch, namespace=ns)  # fmt: skip
                    ip("link", "set", port, "master", nic.network, "up", namespace=self.switch)
                    if isolated[nic.network]:
                        ip("link", "set", "dev", port, "type", "bridge_slave", "isolated", "on",
                           namespace=self.switch)  # fmt: skip
                for each in (nic.address, *nic.more):
                    # No duplicate address detection: an IPv6 address is usable at once.
                    flags = ("nodad",) if ":" in each else ()
                    ip("addr", "add", each, "dev", nic.name, *flags, namespace=ns)
                ip("link", "set", nic.name, "up", namespace=ns)

    def command(self, node: int, argv: Sequence[str]) -> list[str]:
        """Return the argv that runs `argv` on node `node`: its namespace, /etc files, host name."""
        return [IP, "netns", "exec", self.namespace(node), "unshare", "--uts", "--",
                sys.executable, "-I", "-S", "-c", AS_HOST, self.hostname(node),
                *argv]  # fmt: skip

    def popen(
        self,
        node: int,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        stdout: int | IO[bytes] = subprocess.PIPE,
        stderr: int | IO[bytes] = subprocess.PIPE,
    ) -> subprocess.Popen[bytes]:
        """Start `argv` on node `node` in a session of its own (stdout and stderr piped by default)."""
        proc = subprocess.Popen(
            self.command(node, argv),
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        self.started.append(proc)
        return proc

    def run(
        self,
        node: int,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` on node `node` and return what it did; its session is killed at `timeout`."""
        proc = self.popen(node, argv, env=env)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_session(proc)
            try:
                out, err = proc.communicate(timeout=KILL_WAIT_S)
            except subprocess.TimeoutExpired:  # a process outside the session holds the pipes
                out, err = b"", b""
            err += f"\n[killed after {timeout:.0f}s]".encode()
        return subprocess.CompletedProcess(
            proc.args, proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")
        )

    def close(self, *, raise_errors: bool = False) -> None:
        """Kill every process started here or left in the lab, then remove all the lab made."""
        for proc in self.started:
            kill_session(proc)
        for name in self.made:  # processes that left their session (a launcher's ranks)
            _kill_all_in(name)
        for proc in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=KILL_WAIT_S)
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        errors = []
        for name in reversed(self.made):
            try:
                remove(name)
            except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
                errors.append(f"{name}: {exc}")
        self.made.clear()
        if self.made_etc:
            with contextlib.suppress(OSError):  # not empty: another lab's, or someone else's
                NETNS_ETC.rmdir()
        left = leftovers(self.prefix)
        if raise_errors and (errors or left):
            raise RuntimeError(f"netlab teardown left {left} ({'; '.join(errors)})")


def kill_session(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the session (process group) `proc` leads, if it still runs."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
