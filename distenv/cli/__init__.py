"""The ``distenv`` command: info, export, template, run (`distenv.local.run`,
`distenv.local.options`), doctor (`distenv.cli.doctor`) and why (`distenv.cli.why`)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from distenv import __version__
from distenv.args import add_launcher_option
from distenv.cli import templates
from distenv.cli.doctor import add_doctor_parser, add_verbose_option, write_considered
from distenv.cli.topology import add_topology_options, show_topology
from distenv.cli.why import add_why_parser
from distenv.detection.pipeline import Detection, locate
from distenv.device import (
    VENDOR_VISIBILITY_VARIABLES,
    device_name,
    rank_backend,
    rank_device_reason,
    visible_device_count,
)
from distenv.errors import DistEnvError, MasterResolutionError
from distenv.hints import reword
from distenv.local.options import add_run_parser
from distenv.local.run import run
from distenv.master import SCOPE_VAR
from distenv.rankinfo import RankInfo
from distenv.settings import Settings
from distenv.system.containers import container

if TYPE_CHECKING:  # distenv.system.netpath is imported only for --network
    from distenv.system.netpath import Path

__all__ = ["main"]


# What the text of `distenv info` says for a master that only the MPI exchange at init can find.
AT_INIT = {
    "master_addr": "rank 0's host over MPI at init (pass --mpi to ask now)",
    "master_port": "rank 0's free port over MPI at init (pass --mpi to ask now)",
}
# What it says for a node layout the launcher does not name (`RankInfo.layout_known`).
FROM_ROLL_CALL = {
    "node_rank": "from the roll call at init (this host's place among the ranks' hosts)",
    "num_nodes": "from the roll call at init (the number of the ranks' hosts)",
    "local_world_size": "from the roll call at init (the ranks on this host)",
}


def _write_whole(text: str) -> None:
    """Write `text` to stdout in one system call.

    Hydra interleaves other ranks' output between two writes of one line (seen with ``print``
    after MPI_Init).
    """
    sys.stdout.flush()
    sys.stdout.write(text)
    sys.stdout.flush()


def _detect(args: argparse.Namespace, *, resolved: bool) -> Detection:
    # MPI only when asked: the exchange is collective and initialises MPI (issue #13).
    return locate(
        args.launcher,
        master_addr_format=args.master_addr_format,
        runtime=resolved,
        mpi=args.mpi,
    )


def _device_fields(info: RankInfo, check: bool) -> tuple[dict[str, object], str | None]:
    """Return the device fields of `distenv info` and why that device; torch only if `check`.

    The device rule is init_dist's (`distenv.device`); asking it imports torch, seconds on a
    login node, so `distenv info` does only with --device. AMD's and Intel's visibility
    variables are shown where they are set.
    """
    visible_env = os.environ.get("CUDA_VISIBLE_DEVICES")
    fields: dict[str, object] = {"cuda_visible_devices": visible_env}
    for name in VENDOR_VISIBILITY_VARIABLES:
        if name in os.environ:
            fields[name.lower()] = os.environ[name]
    if not check:
        return fields, None
    device, why = rank_device_reason(info, visible_env)
    fields.update(
        device=device, visible_devices=visible_device_count(), backend=rank_backend(device)
    )
    return fields, why


def _cmd_info(args: argparse.Namespace) -> int:
    if args.topology or args.sysfs:
        return show_topology(args)
    # What init_dist and doctor would refuse, info refuses too: it says what they will see.
    Settings.read(os.environ).rendezvous_seconds(None)
    resolved = not args.no_resolve
    detection = _detect(args, resolved=resolved)
    info = detection.info
    device, why = _device_fields(info, args.device)
    network = None
    if args.network:
        from distenv.system.netpath import path

        network = path(info.master_addr, info.master_port, os.environ)
    # Which container runtime this runs in: named, so a stripped environment or a small /dev/shm
    # is read against it (distenv.system.containers).
    inside = container(os.environ)
    if args.json:
        extra: dict[str, object] = {"container": None if inside is None else inside.runtime.name}
        if why is not None:
            extra["device_reason"] = why
        if network is not None:
            extra["network"] = _network_json(network)
        _write_whole(json.dumps({**info.to_dict(), **device, **extra}) + "\n")
        return 0
    # Resolved at runtime and still unknown: only rank 0, over MPI, can say (find_master rule 7).
    at_init = resolved and not args.mpi

    def shown(name: str, value: object) -> str:
        if value is None and name in FROM_ROLL_CALL:
            return FROM_ROLL_CALL[name]
        if value is None:
            return AT_INIT.get(name, "-") if at_init else "-"
        return str(value)

    rows = [(name, shown(name, value)) for name, value in info.to_dict().items()]
    visible_env = device["cuda_visible_devices"]
    rows.append(("cuda_visible_devices", "unset" if visible_env is None else repr(visible_env)))
    rows += [
        (name.lower(), repr(device[name.lower()]))
        for name in VENDOR_VISIBILITY_VARIABLES
        if name.lower() in device
    ]
    rows.append(
        ("container", "none" if inside is None else f"{inside.runtime.label} ({inside.evidence})")
    )
    if why is None:
        rows.append(("device", "not checked: pass --device (imports torch)"))
    else:
        index = device["device"]
        rows.append(("device", device_name(index if isinstance(index, int) else None)))
        rows += [(name, str(device[name])) for name in ("visible_devices", "backend")]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    if network is not None:
        _write_network(network)
    print("\nhow it was chosen:")
    device_row = () if why is None else (("device", why),)
    write_considered((*detection.considered, *device_row), sys.stdout, verbose=args.verbose)
    return 0


def _network_json(found: Path) -> dict[str, object]:
    """Return the network fields of `distenv info --network --json`."""
    return {
        "hostname": found.hostname,
        "hostname_resolves_to": list(found.resolved),
        "gloo_address": found.gloo[0],
        "gloo_why": found.gloo[1],
        "nccl_interface": found.nccl[0],
        "nccl_why": found.nccl[1],
        "route_to_master": None if found.route is None else found.route._asdict(),
        "route_error": found.route_error,
        "interfaces": [i._asdict() for i in found.interfaces],
        "warnings": found.warnings(),
    }


def _write_network(found: Path) -> None:
    """Print the network section of `distenv info --network`."""
    if found.route is not None:
        on = f" on {found.route.interface}" if found.route.interface else ""
        reach = f"from {found.route.address}{on}"
    else:
        reach = f"unknown ({found.route_error or 'no master address yet'})"
    rows = [
        ("host name", f"{found.hostname} -> {', '.join(found.resolved) or 'nothing'}"),
        ("gloo advertises", f"{found.gloo[0]} ({found.gloo[1]})"),
        ("NCCL uses", f"{found.nccl[0] or '-'} ({found.nccl[1]})"),
        ("master reached", reach),
    ]
    print("\nnetwork:")
    for name, value in rows:
        print(f"  {name:<16}{value}")
    for warning in found.warnings():
        print(f"  warning: {warning}")


def _cmd_export(args: argparse.Namespace) -> int:
    detection = _detect(args, resolved=True)
    info = detection.info
    if not info.is_resolved:
        raise MasterResolutionError(
            info.launcher,
            f"{info.who} has no MASTER_ADDR: rank 0 sends its master over MPI at init",
            hint="pass --mpi to ask now (on every rank: it is collective), or export MASTER_ADDR "
            "and MASTER_PORT",
        )
    lines = [
        f"export {name}={shlex.quote(value)}\n"
        for name, value in {**info.to_env(), SCOPE_VAR: detection.job_tag}.items()
    ]
    _write_whole("".join(lines))
    return 0


_LIST_WIDTH = 100  # the template list's lines, names included


def _cmd_template(args: argparse.Namespace) -> int:
    if args.name is None:
        import textwrap

        known = templates.names()
        width = max(len(name) for name in known)
        for name in known:
            # Whole summaries, wrapped under their column: a cut one hides what it is for.
            lines = textwrap.wrap(templates.summary(name), max(_LIST_WIDTH - width - 2, 30))
            print(f"{name:<{width}}  {lines[0] if lines else ''}")
            for line in lines[1:]:
                print(" " * (width + 2) + line)
        print("\nprint one with `distenv template NAME > job.sh`; every one needs TRAIN set")
        return 0
    _write_whole(templates.read(args.name))
    return 0


def _add_mpi_option(parser: argparse.ArgumentParser | argparse._MutuallyExclusiveGroup) -> None:
    parser.add_argument(
        "--mpi",
        action="store_true",
        help="under an MPI launcher with no MASTER_ADDR, ask rank 0 for its master now over "
        "MPI (initialises MPI; every rank must run the command)",
    )


def _add_format_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--master-addr-format",
        metavar="TEMPLATE",
        help="map the default master host to the address to use, e.g. '{host}-ib' "
        "(default: $DISTENV_MASTER_ADDR_FORMAT)",
    )


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``distenv`` command."""
    parser = argparse.ArgumentParser(
        prog="distenv",
        description="Start PyTorch distributed jobs correctly under any launcher.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    info = sub.add_parser("info", help="show what this process is in the job, and why")
    add_launcher_option(info)
    _add_format_option(info)
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.add_argument(
        "--network",
        action="store_true",
        help="also show this node's host name and addresses, the address gloo and the interface "
        "NCCL would use by default, and the route to the master (resolves names)",
    )
    info.add_argument(
        "--device",
        action="store_true",
        help="also show the CUDA device init_dist would select, the visible device count, the "
        "backend and why (imports torch: seconds on some login nodes)",
    )
    add_verbose_option(info)
    how = info.add_mutually_exclusive_group()
    _add_mpi_option(how)
    how.add_argument(
        "--no-resolve",
        action="store_true",
        help="read the environment only: pick no free port either (the master may be null)",
    )
    add_topology_options(info)
    info.set_defaults(func=_cmd_info)

    export = sub.add_parser("export", help="print `export VAR=value` lines for eval")
    add_launcher_option(export)
    _add_format_option(export)
    _add_mpi_option(export)
    export.set_defaults(func=_cmd_export)

    template = sub.add_parser(
        "template",
        help="list the job-script templates (sbatch, bsub, qsub, flux batch, mpirun), or print one",
        description="List the job-script templates shipped with distenv (the repository's "
        "scripts/), or print one to copy: `distenv template single_node > job.sbatch`.",
    )
    template.add_argument(
        "name",
        nargs="?",
        metavar="NAME",
        help="a template's name as listed (slurm/single_node.sbatch), or its file name or stem "
        "when unique (single_node)",
    )
    template.set_defaults(func=_cmd_template)

    add_run_parser(sub).set_defaults(func=run)
    add_doctor_parser(sub)
    add_why_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``distenv`` command; return its exit status (1 for a DistEnvError, 2 for usage).

    A reader that stops early (``distenv info | head -1``) ends a report command quietly with
    status 0: it read what it wanted. `distenv run` is not a report: its ranks' output going
    nowhere is the job's business, and its status stays the job's.
    """
    args = build_parser().parse_args(argv)
    try:
        status: int = args.func(args)
        if args.command != "run":
            sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
    except DistEnvError as exc:
        reword(exc, (), os.environ)  # the job's size in an mpirun example; no script to quote
        print(f"distenv: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        if args.command == "run":
            raise
        # Python flushes stdout once more at exit: point it at /dev/null so that it cannot fail.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 0
    return status
