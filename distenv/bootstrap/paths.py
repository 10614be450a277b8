"""Each node's network path, as the roll call's probe found it: keep, switch or refuse.

gloo and NCCL each advertise one address per node, chosen blindly (`distenv.netpath`). In the roll
call every node offers its backends' default addresses and the first address of its interface
toward the master (`distenv.bootstrap.records.NetRecord`); rank 0 dials every other node's
addresses, and every other node dials rank 0's node's before it checks in
(`distenv.bootstrap.probe`). From those results rank 0 decides, per node and backend (`judge`):

- the default was reached: nothing changes (most jobs, the project's own one-host clusters on
  127.0.1.x over lo included: an address class never decides, the probe does);
- the default was not, an alternative was: the node's ranks export that interface
  (`distenv.netpath.export`), a `Switch` in the verdict that every rank of the node applies;
- neither: the verdict refuses the job (`distenv.bootstrap.problems.Unreachable`), before any
  rank calls ``init_process_group``.

What is proven: rank 0's node reaches every other node's chosen address, and every other node
reaches rank 0's node's. Two nodes other than rank 0's never dial each other. Pure: no socket,
no store.
"""

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from distenv.bootstrap.records import MAX_SHOWN, CheckIn, NetRecord, Switch

if TYPE_CHECKING:
    from distenv.bootstrap.problems import Problem

__all__ = ["judge", "targets"]


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
) -> tuple[list[Switch], list["Problem"]]:
    """Return rank 0's decisions: the switches, and the nodes refused.

    `own` is rank 0's check-in; `dialled` pairs each of `targets` with what rank 0's probe of its
    addresses found (None: reached, else why not, `distenv.bootstrap.probe.REASONS`).
    """
    switches: list[Switch] = []
    problems: list[Problem] = []

    def rank0(_: int) -> tuple[str, ...]:
        return (own.hostname,)

    for checkin, results in dialled:
        assert checkin.net is not None
        route = checkin.net.route
        reasons = [result or "" for result in results]
        _decide(checkin, reasons, [] if route is None else [route], rank0, switches, problems)
    if own.net is None:
        return switches, problems
    reports = [
        (c.hostname, c.net.reached)
        for c in checkins
        if c.net is not None and c.net.reached is not None and c.hostname != own.hostname
    ]
    if not reports:
        return switches, problems
    count = len(own.net.addresses)
    everyone = (1 << count) - 1
    for _, mask in reports:
        everyone &= mask

    def missed(index: int) -> tuple[str, ...]:
        missing = dict.fromkeys(host for host, mask in reports if not mask >> index & 1)
        return tuple(missing)[:MAX_SHOWN]

    reasons = ["" if everyone >> i & 1 else "unreached" for i in range(count)]
    _decide(own, reasons, list(range(count)), missed, switches, problems)
    return switches, problems


def _decide(
    checkin: CheckIn,
    reasons: Sequence[str],
    alternatives: list[int],
    missed: Callable[[int], tuple[str, ...]],
    switches: list[Switch],
    problems: list["Problem"],
) -> None:
    """Decide each backend of one node: keep its default, switch, or refuse (appended).

    `reasons[i]` is why address `i` was not reached (empty: it was); `missed(i)` names the hosts
    whose probe of it failed.
    """
    net: NetRecord | None = checkin.net
    assert net is not None
    for backend, default in net.defaults:
        if not reasons[default]:
            continue
        chosen = next(
            (i for i in alternatives if i != default and not reasons[i] and net.addresses[i][2]),
            None,
        )
        interface = None if chosen is None else net.addresses[chosen][2]
        if interface is not None:
            switches.append(Switch(checkin.hostname, backend, interface))
            continue
        from distenv.bootstrap.problems import Unreachable

        tried = [default, *(i for i in alternatives if i != default)]
        problems.append(
            Unreachable(
                checkin.hostname,
                checkin.rank,
                backend,
                tuple((net.addresses[i][0], net.addresses[i][2], reasons[i]) for i in tried),
                missed(default),
            )
        )
