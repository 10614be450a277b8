"""Each node's network path, as the roll call's probe found it: keep, switch or refuse.

gloo and NCCL each advertise one address per node, chosen blindly (`distenv.system.netpath`). In the roll
call every node offers its backends' default addresses and the first address of its interface
toward the master (`distenv.bootstrap.records.NetRecord`); rank 0 dials every other node's
addresses, and every other node dials rank 0's node's before it checks in
(`distenv.bootstrap.probe`). From those results rank 0 decides, per node and backend (`judge`):

- the default was reached: nothing changes (most jobs, the project's own one-host clusters on
  127.0.1.x over lo included: an address class never decides, the probe does);
- the default was not, an alternative was: the node's ranks export that interface
  (`distenv.system.netpath.export`), a `Switch` in the verdict that every rank of the node applies;
- neither: the verdict refuses the job (`distenv.bootstrap.problems.Unreachable`), before any
  rank calls ``init_process_group``.

What is proven: rank 0's node reaches every other node's chosen address, and every other node
reaches rank 0's node's. Two nodes other than rank 0's never dial each other; a node that reached
none of rank 0's addresses of one family (IPv6, say) is taken to reach no node's address of that
family (`_blind`), and gloo's addresses are kept to one family, which gloo requires
(`_one_family`).

The roll call's glue to the probe lives here too: which backends a rank probes
(`probed_backends`), its candidates (`predict`), its listener and offer (`offer`), its dial of
rank 0's node (`dial`), rank 0's dial of every other node and decision (`judged`), and the
variables a node's switch exports (`network_exports`). The sockets are `distenv.bootstrap.probe`'s
and the addresses `distenv.system.netpath`'s, both imported only where the job may span hosts.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from distenv.bootstrap.records import MAX_CANDIDATES, MAX_SHOWN, CheckIn, NetRecord, Switch
from distenv.bootstrap.verdict import Verdict
from distenv.errors import RendezvousError
from distenv.rankinfo import RankInfo
from distenv.timing import NET_PROBE_S

if TYPE_CHECKING:
    from distenv.bootstrap.probe import Listener
    from distenv.bootstrap.problems import Problem
    from distenv.system.netpath import Prediction

__all__ = [
    "dial",
    "judge",
    "judged",
    "network_exports",
    "offer",
    "predict",
    "probed_backends",
    "targets",
]


def targets(checkins: Sequence[CheckIn], host0: str) -> list[CheckIn]:
    """Return the record rank 0 dials on each other host: the first, in rank order, that listens."""
    seen = {host0}
    found = []
    for checkin in checkins:
        if checkin.net is not None and checkin.hostname not in seen:
            seen.add(checkin.hostname)
            found.append(checkin)
    return found


def judge(
    checkins: Sequence[CheckIn],
    own: CheckIn,
    dialled: Sequence[tuple[CheckIn, Sequence[str | None]]],
) -> tuple[list[Switch], list[Problem]]:
    """Return rank 0's decisions: the switches, and the nodes refused.

    `own` is rank 0's check-in; `dialled` pairs each of `targets` with what rank 0's probe of its
    addresses found (None: reached, else why not, `distenv.bootstrap.probe.REASONS`).
    """
    reports = [
        (c.hostname, c.net.reached)
        for c in checkins
        if c.net is not None and c.net.reached is not None and c.hostname != own.hostname
    ]
    blind = {} if own.net is None else _blind(own.net, reports)
    nodes: list[_Node] = []
    for checkin, results in dialled:
        assert checkin.net is not None
        net = checkin.net
        reasons = [result or "" for result in results]
        missed_by: dict[int, tuple[str, ...]] = dict.fromkeys(range(len(reasons)), (own.hostname,))
        for i, (address, _, _) in enumerate(net.addresses):
            hosts = blind.get(_family(address), ())
            if not reasons[i] and hosts and checkin.hostname not in hosts:
                reasons[i], missed_by[i] = "unreached", hosts
        nodes.append(_Node(checkin, reasons, [] if net.route is None else [net.route], missed_by))
    if own.net is not None and reports:
        count = len(own.net.addresses)
        everyone = (1 << count) - 1
        for _, mask in reports:
            everyone &= mask
        reasons = ["" if everyone >> i & 1 else "unreached" for i in range(count)]
        missed = {
            i: tuple(dict.fromkeys(h for h, mask in reports if not mask >> i & 1))[:MAX_SHOWN]
            for i in range(count)
        }
        nodes.append(_Node(own, reasons, list(range(count)), missed))
    chosen = {(n.checkin.hostname, b): _choose(n, d) for n in nodes for b, d in n.defaults}
    _one_family(nodes, chosen)
    return _decisions(nodes, chosen)


class _Node(NamedTuple):
    """One node as rank 0 judges it: its record, why each address failed (empty: it was reached),
    the addresses it may move to, in order, and who missed each address."""

    checkin: CheckIn
    reasons: list[str]
    alternatives: list[int]
    missed: dict[int, tuple[str, ...]]

    @property
    def defaults(self) -> tuple[tuple[str, int], ...]:
        assert self.checkin.net is not None
        return self.checkin.net.defaults

    def address(self, index: int) -> tuple[str, int, str | None]:
        assert self.checkin.net is not None
        return self.checkin.net.addresses[index]

    def usable(self, index: int) -> bool:
        """Whether the node can move to address `index`: reached, and its interface named."""
        return not self.reasons[index] and self.address(index)[2] is not None


def _choose(node: _Node, default: int) -> int | None:
    """Return the address a backend of `node` will advertise: its default if reached, else the
    first usable alternative; None if neither."""
    if not node.reasons[default]:
        return default
    return next((i for i in node.alternatives if i != default and node.usable(i)), None)


def _one_family(nodes: Sequence[_Node], chosen: dict[tuple[str, str], int | None]) -> None:
    """Make every node's gloo address one family, moving IPv6 ones to IPv4 where they can.

    gloo connects only addresses of one family (``ss1.ss_family == ss2.ss_family`` in its TCP
    device): a node on IPv6 among nodes on IPv4 fails however reachable. A node that cannot move
    is refused, its reached address named as of the other family.
    """
    picked = [
        (node, index)
        for node in nodes
        if (index := chosen.get((node.checkin.hostname, "gloo"))) is not None
    ]
    if len({_family(node.address(index)[0]) for node, index in picked}) < 2:
        return
    for node, index in picked:
        if _family(node.address(index)[0]) == 4:
            continue
        move = next(
            (i for i in node.alternatives if node.usable(i) and _family(node.address(i)[0]) == 4),
            None,
        )
        if move is None:
            node.reasons[index] = "family"
        chosen[(node.checkin.hostname, "gloo")] = move


def _decisions(
    nodes: Sequence[_Node], chosen: dict[tuple[str, str], int | None]
) -> tuple[list[Switch], list[Problem]]:
    """Return the switches (a backend moved off its default) and the refusals (no address)."""
    switches: list[Switch] = []
    problems: list[Problem] = []
    for node in nodes:
        host = node.checkin.hostname
        for backend, default in node.defaults:
            index = chosen[(host, backend)]
            if index == default:
                continue
            if index is not None:
                interface = node.address(index)[2]
                assert interface is not None
                switches.append(Switch(host, backend, interface))
                continue
            from distenv.bootstrap.problems import Unreachable

            tried = [default, *(i for i in node.alternatives if i != default)]
            problems.append(
                Unreachable(
                    host,
                    node.checkin.rank,
                    backend,
                    tuple((node.address(i)[0], node.address(i)[2], node.reasons[i]) for i in tried),
                    node.missed.get(default, ()),
                )
            )
    return switches, problems


def _family(address: str) -> int:
    return 6 if ":" in address else 4


def _blind(own: NetRecord, reports: Sequence[tuple[str, int]]) -> dict[int, tuple[str, ...]]:
    """Return, per address family, the hosts that reached none of rank 0's addresses of it.

    Such a host is taken to reach no node's address of that family either (a node with no IPv6
    route at all): the pairs of nodes the probe never dials (neither is rank 0's) are judged by
    it. Link-local addresses, which name an interface of their own node, and addresses rank 0
    could not listen on prove nothing and are left out.
    """
    blind: dict[int, tuple[str, ...]] = {}
    for family in (4, 6):
        offered = [
            i
            for i, (address, port, _) in enumerate(own.addresses)
            if port and _family(address) == family and not address.lower().startswith("fe80:")
        ]
        if offered:
            hosts = tuple(
                dict.fromkeys(h for h, mask in reports if not any(mask >> i & 1 for i in offered))
            )
            if hosts:
                blind[family] = hosts[:MAX_SHOWN]
    return blind


def probed_backends(info: RankInfo, backend: str, *, batched: bool = False) -> tuple[str, ...]:
    """Return the backends whose network path this rank's roll call probes (none: no probe).

    Only where the job may span hosts (its launcher does not say one node), only on rank 0 and
    each node's first rank (every rank where the launcher names no layout and no leader leads
    the node: `batched`), and never a backend whose path the user chose
    (`distenv.system.netpath.USER_CHOICE`).
    """
    if info.world_size == 1 or info.num_nodes == 1:
        return ()
    if info.rank != 0 and (info.layout_known or batched) and info.local_rank != 0:
        return ()
    from distenv.system.netpath import backends_to_probe

    return backends_to_probe(backend, os.environ)


def predict(info: RankInfo, backends: tuple[str, ...]) -> Prediction:
    """Return this node's candidates for the probe; refuse at once a node with no route at all.

    Raises:
        RendezvousError: The kernel knows no route to the master (ENETUNREACH): this node can
            reach neither rank 0's store nor any rank, however long it waits.
    """
    from distenv.system.netpath import predict as candidates

    master = str(info.master_addr)
    prediction = candidates(
        master,
        int(info.master_port or 0),
        backends,
        os.environ,
        limit=MAX_CANDIDATES,
        every_interface=info.rank == 0,
    )
    if prediction.unreachable is not None and info.rank != 0:
        offered = ", ".join(
            c.address + (f" on {c.interface}" if c.interface else "") for c in prediction.candidates
        )
        raise RendezvousError(
            info.launcher,
            f"{info.who} on {prediction.hostname!r} has no route to "
            f"the master {master!r} ({prediction.unreachable}); this node's addresses: "
            f"{offered or 'none but loopback'}",
            hint="this node shares no network with rank 0's node: check its interfaces "
            "(`distenv info --network`), or give MASTER_ADDR an address on a network every node "
            "reaches (DISTENV_MASTER_ADDR_FORMAT='{host}-ib' for -ib names)",
            variable="MASTER_ADDR",
            value=master,
        )
    return prediction


def offer(
    prediction: Prediction, checkin: CheckIn, reached: int | None
) -> tuple[Listener | None, CheckIn]:
    """Listen on this node's candidates; return the listener and `checkin` offering them."""
    if not prediction.defaults:
        return None, checkin
    from distenv.bootstrap.probe import Listener

    token = os.urandom(8).hex()
    listener = Listener([c.address for c in prediction.candidates], token.encode())
    addresses = tuple(
        (c.address, port, c.interface)
        for c, port in zip(prediction.candidates, listener.ports, strict=True)
    )
    net = NetRecord(token, addresses, prediction.defaults, prediction.route, reached)
    return listener, checkin._replace(net=net)


def dial(net: NetRecord) -> int:
    """Dial each address `net` offers; return the bit mask of those its owner answered on."""
    from distenv.bootstrap.probe import reach

    token = net.token.encode()
    results = reach([(a, port, token) for a, port, _ in net.addresses], NET_PROBE_S)
    return sum(1 << i for i, result in enumerate(results) if result is None)


def judged(verdict: Verdict, own: CheckIn) -> Verdict:
    """Return rank 0's verdict with the network probe's decisions (`distenv.bootstrap.paths`).

    The probe's sockets are imported here: a job on one host never pays for them.
    """
    from distenv.bootstrap.probe import reach

    dial = targets(verdict.checkins, own.hostname)
    flat = [
        (address, port, c.net.token.encode())
        for c in dial
        if c.net is not None
        for address, port, _ in c.net.addresses
    ]
    results = reach(flat, NET_PROBE_S) if flat else []
    dialled = []
    start = 0
    for c in dial:
        assert c.net is not None
        dialled.append((c, results[start : start + len(c.net.addresses)]))
        start += len(c.net.addresses)
    switches, problems = judge(verdict.checkins, own, dialled)
    if problems:
        return Verdict(False, tuple(problems), verdict.checkins, verdict.scope)
    return verdict._replace(paths=tuple(switches))


def network_exports(verdict: Verdict, checkin: CheckIn) -> dict[str, str]:
    """Return the variables this rank exports for its node's switches in `verdict`.

    Never a backend whose path the user chose: this rank's own environment is asked again.
    """
    place = verdict.place_of(checkin.hostname)
    if place is None or not place.paths:
        return {}
    from distenv.system.netpath import backends_to_probe, export

    probed = backends_to_probe(checkin.backend, os.environ)
    return dict(
        export(backend, interface) for backend, interface in place.paths if backend in probed
    )
