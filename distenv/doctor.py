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
from typing import TextIO

from distenv.args import add_launcher_option
from distenv.errors import DistEnvError
from distenv.rankinfo import RankInfo
from distenv.resolve import detect_resolved
from distenv.rollcall import CheckIn, Verdict, roll_call

__all__ = ["add_doctor_parser", "doctor"]

DEFAULT_TIMEOUT = 60.0


def _explanation(considered: tuple[tuple[str, str], ...], out: TextIO) -> None:
    if not considered:
        return
    out.write("how the launcher was chosen:\n")
    for name, verdict in considered:
        out.write(f"  {name:<8} {verdict}\n")


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
        status = "ok" if verdict.ok else ("DUPLICATE" if claimed[rank] > 1 else "see verdict")
        rows.append(
            (
                str(rank),
                c.hostname,
                str(c.local_rank),
                str(c.node_rank),
                c.device or "cpu",
                c.launcher,
                status,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        out.write("\n")


def _checkin(info: RankInfo) -> tuple[CheckIn, str]:
    import torch

    from distenv.device import choose_backend, select_device, visible_device_count
    from distenv.init import make_checkin

    device = select_device(info.local_rank, info.local_world_size, visible_device_count())
    backend = choose_backend(
        cuda_available=torch.cuda.is_available(), has_device=device is not None, explicit=None
    )
    return make_checkin(info, backend, device), backend


def doctor(
    launcher: str = "auto", *, timeout: float | None = None, out: TextIO = sys.stdout
) -> int:
    """Check this job's start-up on every rank; print the report on rank 0; return the exit status.

    Args:
        launcher: ``auto`` or a launcher name.
        timeout: Seconds to wait for every rank; default ``$DISTENV_TIMEOUT``, else 60.
        out: Where rank 0 writes the report.

    Returns:
        0 when every rank checked in and nothing is wrong, else 1.
    """
    from distenv.init import rendezvous_seconds

    try:
        seconds = rendezvous_seconds(timeout, DEFAULT_TIMEOUT)
        detection, info = detect_resolved(launcher)
    except DistEnvError as exc:
        _explanation(exc.considered, out)
        out.write(f"verdict: FAIL: {exc}\n")
        return 1

    checkin, backend = _checkin(info)
    if info.world_size == 1:
        verdict = Verdict(True, (), (checkin,))
    else:
        from torch._C._distributed_c10d import PrefixStore

        from distenv.init import AGENT_STORE_VAR, connect_store

        try:
            agent = os.environ.get(AGENT_STORE_VAR) == str(True)
            store = connect_store(info, seconds, agent_store=agent)
            verdict = roll_call(
                PrefixStore("distenv/doctor", store), info, checkin, timeout=seconds, check=False
            )
        except DistEnvError as exc:
            if info.rank == 0:
                out.write(f"verdict: FAIL: {exc}\n")
            return 1
    if info.rank != 0:
        return 0 if verdict.ok else 1

    out.write(
        f"distenv doctor: launcher={info.launcher} world_size={info.world_size} "
        f"nodes={info.num_nodes} master={checkin.master} backend={backend} "
        f"torch={checkin.torch_version}\n"
    )
    _explanation(detection.considered, out)
    _table(info, verdict, out)
    if verdict.ok:
        out.write(f"verdict: OK: {info.world_size} of {info.world_size} ranks checked in\n")
        return 0
    out.write("verdict: FAIL\n")
    for problem in verdict.problems:
        out.write(f"  - {problem}\n")
    return 1


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
        help=f"seconds to wait for every rank (default: $DISTENV_TIMEOUT or {DEFAULT_TIMEOUT:g})",
    )
    parser.set_defaults(func=lambda args: doctor(args.launcher, timeout=args.timeout))
