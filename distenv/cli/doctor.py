"""`distenv doctor`: every rank reports, rank 0 prints one table and a verdict.

Runs under any launcher (``srun distenv doctor``, ``mpirun -np 4 distenv doctor``,
``distenv run -n 4 -m distenv doctor``) or alone on a login node. It goes as far as `init_dist`
goes before the process group (detection, resolution, the device, the store, the roll call) and
stops there, so it is safe to run anywhere and fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from distenv import state
from distenv.args import add_launcher_option
from distenv.bootstrap.protocol import DOCTOR
from distenv.bootstrap.records import CheckIn
from distenv.bootstrap.rollcall import fill_layout, make_checkin, meet
from distenv.bootstrap.session import Bootstrap, Session
from distenv.bootstrap.verdict import Verdict
from distenv.detection.choice import ABSENT
from distenv.detection.pipeline import locate
from distenv.device import rank_backend, rank_device, rank_device_reason
from distenv.errors import DistEnvError
from distenv.placement.apply import far_socket
from distenv.placement.topology import read_topology
from distenv.rankinfo import RankInfo
from distenv.settings import Settings
from distenv.system.containers import SHM, container, shm_bytes

__all__ = ["add_doctor_parser", "add_verbose_option", "doctor", "write_considered"]

#: How long doctor waits for every rank unless told: shorter than init_dist's 300 s, because
#: doctor is run by hand and waited for, and a rank that is missing is what it looks for; its
#: ranks import no training code. ``$DISTENV_TIMEOUT`` and ``--timeout`` set it as for init_dist.
DEFAULT_TIMEOUT = 60.0
NOT_DETECTED = "not detected"
MIB = 1 << 20
#: The /dev/shm below which doctor warns: NCCL's troubleshooting page asks containers for
#: ``--shm-size=1g`` (its shared-memory transport), and DataLoader workers pass every batch
#: through /dev/shm too. Docker's and podman's default is 64 MiB.
SHM_NEEDED = 1024 * MIB


def write_considered(
    rows: Sequence[tuple[str, str]], out: TextIO, *, verbose: bool = False
) -> None:
    """Write detection's (launcher, verdict) rows, the verdicts aligned past the longest name.

    Unless `verbose`, the launchers none of whose variables are set share one line where the
    first of them stood: on a laptop they are 16 of 17 rows, and say one thing.
    """
    absent = [name for name, verdict in rows if verdict == ABSENT] if not verbose else []
    if len(absent) > 1:
        first = next(i for i, (_, verdict) in enumerate(rows) if verdict == ABSENT)
        kept = [row for row in rows if row[1] != ABSENT]
        summary = (f"{NOT_DETECTED}:", f"{', '.join(absent)} (no variables; --verbose lists each)")
        rows = [*kept[:first], summary, *kept[first:]]
    width = max((len(name) for name, _ in rows if name != f"{NOT_DETECTED}:"), default=0)
    for name, verdict in rows:
        out.write(f"  {name:<{width}} {verdict}\n")


def _explanation(
    considered: tuple[tuple[str, str], ...], out: TextIO, *, verbose: bool = False
) -> None:
    if not considered:
        return
    out.write("how the launcher was chosen:\n")
    write_considered(considered, out, verbose=verbose)


def _table(info: RankInfo, verdict: Verdict, out: TextIO) -> None:
    by_rank = {c.rank: c for c in verdict.checkins}
    claimed: dict[int, int] = {}
    for c in verdict.checkins:
        claimed[c.rank] = claimed.get(c.rank, 0) + 1
    rows = [("rank", "host", "local", "node", "device", "launcher", "status")]
    for rank in range(info.world_size):
        if rank not in by_rank:
            rows.append((str(rank), "-", "-", "-", "-", "-", "MISSING"))
            continue
        c = by_rank[rank]
        # A node the launcher did not name is the roll call's number for the host.
        node = c.node_rank if c.node_rank is not None else verdict.node_of(c.hostname)
        status = "ok" if verdict.ok else ("DUPLICATE" if claimed[rank] > 1 else "see verdict")
        rows.append(
            (
                str(rank),
                c.hostname,
                str(c.local_rank),
                "-" if node is None else str(node),
                c.device or "cpu",
                c.launcher,
                status,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        out.write("\n")


def _checkin(session: Session) -> tuple[CheckIn, str, int | None]:
    # The same device and backend rule as init_dist's, never a copy of it.
    device = rank_device(session.info)
    backend = rank_backend(device)
    checkin = make_checkin(session, backend, device, allow_gpu_sharing=state.gpu_sharing_allowed())
    return checkin, backend, device


def doctor(
    launcher: str = "auto",
    *,
    timeout: float | None = None,
    out: TextIO = sys.stdout,
    verbose: bool = False,
) -> int:
    """Check this job's start-up on every rank; print the report on rank 0; return the exit status.

    Args:
        launcher: ``auto`` or a launcher name.
        timeout: Seconds to wait for every rank; default ``$DISTENV_TIMEOUT``, else 60
            (`DEFAULT_TIMEOUT`: why it is not init_dist's 300).
        out: Where rank 0 writes the report.
        verbose: Whether to list each launcher not detected on its own line.

    Returns:
        0 when every rank checked in and nothing is wrong, else 1.
    """
    try:
        settings = Settings.read(os.environ)
        seconds = settings.rendezvous_seconds(timeout, DEFAULT_TIMEOUT)
        deadline = Bootstrap.deadline_for(seconds)
        detection = locate(launcher, deadline=deadline)
        info = detection.info
    except DistEnvError as exc:
        _explanation(exc.considered, out, verbose=verbose)
        out.write(f"verdict: FAIL: {exc}\n")
        return 1

    session = Session.of(detection, info, settings)
    checkin, backend, device = _checkin(session)
    far = far_socket(read_topology(), os.environ, device)
    if far is not None:  # each rank names itself: its affinity is its own to read
        sys.stderr.write(f"distenv doctor: warning: rank {info.rank}: {far}\n")
    if info.world_size == 1:
        verdict = Verdict(True, (), (checkin,), session.scope)
    else:
        try:
            boot = Bootstrap(session, seconds, deadline)
            verdict = boot.run(lambda boot: meet(boot, checkin, DOCTOR, check=False))
        except DistEnvError as exc:
            if info.rank == 0:
                out.write(f"verdict: FAIL: {exc}\n")
            return 1
    if info.rank != 0:
        return 0 if verdict.ok else 1
    info = fill_layout(info, verdict, checkin)

    out.write(
        f"distenv doctor: launcher={info.launcher} world_size={info.world_size} "
        f"nodes={'-' if info.num_nodes is None else info.num_nodes} master={checkin.master} backend={backend} "
        f"torch={checkin.torch_version}\n"
    )
    _explanation(detection.considered, out, verbose=verbose)
    # Why rank 0 got its device (each rank's own is in the table), e.g. a CPU-only torch build.
    out.write(
        f"rank 0's device: {rank_device_reason(info, os.environ.get('CUDA_VISIBLE_DEVICES'))[1]}\n"
    )
    _table(info, verdict, out)
    _network(verdict, out)
    _shared_memory(out)
    if verdict.ok:
        out.write(f"verdict: OK: {info.world_size} of {info.world_size} ranks checked in\n")
        return 0
    out.write("verdict: FAIL\n")
    for problem in verdict.describe(seconds):
        out.write(f"  - {problem}\n")
    return 1


def _shared_memory(out: TextIO, path: str = SHM) -> None:
    """Warn where rank 0's /dev/shm is smaller than its host's ranks need (a container's default)."""
    size = shm_bytes(path)
    if size is None or size >= SHM_NEEDED:
        return
    inside = container(os.environ)
    runtime = "" if inside is None else f" in {inside.runtime.label}"
    out.write(
        f"warning: {path} is {size / MIB:.0f} MiB{runtime}, under the {SHM_NEEDED // MIB} MiB "
        "that the ranks' NCCL shared-memory transport and DataLoader workers need (Docker's and "
        "podman's default is 64 MiB): they fail with bus errors or NCCL shm errors that never "
        "name it. Hint: start the container with `--shm-size=1g` (docker/podman run), or "
        "`--ipc=host` to share the host's\n"
    )


def _network(verdict: Verdict, out: TextIO) -> None:
    """Write what the roll call's network probe found, where it dialled another host."""
    offered = {c.hostname for c in verdict.checkins if c.net is not None}
    if len(offered) < 2:  # one host, or a path every node's user chose: nothing was dialled
        return
    from distenv.system.netpath import export

    if verdict.ok and not verdict.paths:
        out.write(
            f"network: the default address of each of {len(offered)} hosts passed the probe; "
            "nothing to change\n"
        )
    for switch in verdict.paths:
        name, value = export(switch.backend, switch.interface)
        out.write(
            f"network: {switch.host!r}: {switch.backend}'s default address did not pass the "
            f"probe, {switch.interface}'s did: init_dist exports {name}={value} there\n"
        )


def add_doctor_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``distenv doctor`` on the CLI's subcommands."""
    parser = sub.add_parser(
        "doctor",
        help="check every rank's start-up; rank 0 prints a table and a verdict",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    add_launcher_option(parser)
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"seconds to wait for every rank (default: $DISTENV_TIMEOUT, else "
        f"{DEFAULT_TIMEOUT:g}: shorter than init_dist's 300 s, because doctor is waited for "
        "by hand and a missing rank is what it looks for)",
    )
    add_verbose_option(parser)
    parser.set_defaults(
        func=lambda args: doctor(args.launcher, timeout=args.timeout, verbose=args.verbose)
    )


def add_verbose_option(parser: argparse.ArgumentParser) -> None:
    """Add ``-v/--verbose``: every launcher not detected on its own line (`write_considered`)."""
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="list each launcher not detected on its own line (default: one line names them)",
    )
