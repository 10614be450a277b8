"""``distenv run``: start N ranks of a script on this node, torchrun-style, without torchelastic.

    distenv run --nproc-per-node 4 train.py --lr 0.1
    srun --ntasks-per-node=1 distenv run -n 4 train.py     # one launcher per node, nodes from Slurm

Every child gets torchrun's environment contract (`RankInfo.to_env`), so it detects as the
``pytorch`` launcher. This module is the command line; what the ranks are is `distenv.local.plan`'s
decision (shared with `distenv.launch`), supervision (fail-fast, signal forwarding, no orphans)
is `distenv.local.supervise`'s, and the stop policy `distenv.local.stopping`'s.
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from distenv.errors import ConfigurationError, shown
from distenv.local.autopsy import HANG_STATUS
from distenv.local.output import tell
from distenv.local.plan import (
    LaunchOptions,
    NodePlan,
    check_processes_per_node,
    child_env,
    local_ranks,
    nproc_per_node,
    plan_node,
    scheduler_layout,
    thread_env,
    unrunnable,
)
from distenv.local.restarts import Restarts, reporting_program
from distenv.local.stopping import DEFAULT_GRACE_PERIOD, StopPolicy
from distenv.local.streams import add_log_options, check_log_options, hidden
from distenv.local.supervise import Child, Supervisor
from distenv.local.witness import RunDir
from distenv.master import DEFAULT_PORT, LOCAL_HOST
from distenv.ranklog import folder as log_folder
from distenv.settings import HANG_VAR, LOG_DIR_VAR, MAX_SECONDS, Settings
from distenv.variables import MAX_COUNT, decimal

__all__ = [
    "REFUSED_FLAGS",
    "RefusedFlag",
    "add_run_parser",
    "build_children",
    "plan_from_args",
    "run",
]

#: The subcommand's name, which its errors name as their source.
COMMAND = "run"
LOG_HINT = (
    "redirect distenv run's own output instead (e.g. `2>&1 | tee run.log`); --prefix-output marks "
    "each line with its rank and --ranks chooses whose output is shown"
)
RDZV_HINT = (
    "distenv run uses a static master: pass --master-addr/--master-port (or run it under srun/jsrun "
    "one per node); use torchrun for elastic rendezvous"
)


@dataclass(frozen=True)
class RefusedFlag:
    """A torchrun option that ``distenv run`` refuses, with the way to do without it.

    Attributes:
        flag: The option, dashed spelling (the underscore spelling is refused too).
        takes_value: Whether it takes an argument (so the script's arguments are parsed right).
        hint: What to do instead.
        short: A one-letter spelling, if torchrun has one.
    """

    flag: str
    takes_value: bool
    hint: str
    short: str | None = None


# torchrun (torch.distributed.run) options that distenv run does not implement. Data, so that the
# docs render the same list the parser refuses.
REFUSED_FLAGS: tuple[RefusedFlag, ...] = (
    RefusedFlag("--rdzv-backend", True, RDZV_HINT),
    RefusedFlag("--rdzv-endpoint", True, RDZV_HINT),
    RefusedFlag("--rdzv-conf", True, RDZV_HINT),
    RefusedFlag("--local-addr", True, "use --master-addr"),
    RefusedFlag("--role", True, "distenv run starts a single role; use torchrun for named roles"),
    RefusedFlag("--logs-specs", True, LOG_HINT),
    RefusedFlag("--duplicate-stdout-filters", True, LOG_HINT),
    RefusedFlag("--duplicate-stderr-filters", True, LOG_HINT),
    RefusedFlag("--event-log-handler", True, "use torchrun for torchelastic event logs"),
    RefusedFlag("--numa-binding", True, "bind in the script, or with numactl or srun --cpu-bind"),
    RefusedFlag(
        "--signals-to-handle",
        True,
        "distenv run always forwards SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2",
    ),
    RefusedFlag("--virtual-local-rank", False, "set CUDA_VISIBLE_DEVICES per rank in the script"),
    RefusedFlag("--run-path", False, "drop it: distenv run starts each rank in a fresh python"),
)


def _spellings(flag: str) -> list[str]:
    """Return a long option's dashed and underscore spellings (torchrun accepts both)."""
    underscored = "--" + flag[2:].replace("-", "_")
    return [flag] if underscored == flag else [flag, underscored]


def _bounded_int(text: str, low: int, high: int = MAX_COUNT) -> int:
    """Parse an argparse value as an integer in ``[low, high]`` (usage error otherwise).

    `decimal` never converts more digits than `high` has: ``int()`` of over 4300 raises.
    """
    value = decimal(text.strip(), high)
    if value is None or value < low:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not an integer in [{low}, {high}]")
    return value


def _positive_int(text: str) -> int:
    return _bounded_int(text, 1)


def _positive_seconds(text: str) -> float:
    """Parse a timeout: `_seconds`, but not zero."""
    value = _seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a positive number of seconds")
    return value


def _natural(text: str) -> int:
    return _bounded_int(text, 0)


def _port(text: str) -> int:
    return _bounded_int(text, 1, 65535)


def _seconds(text: str) -> float:
    """Parse a period: seconds in ``[0, MAX_SECONDS]`` (a longer one overflows Python's waits)."""
    try:
        value = float(text)  # '9' * 5000 reads as inf: refused below
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a number of seconds") from None
    if not 0 <= value <= MAX_SECONDS:  # also refuses NaN
        raise argparse.ArgumentTypeError(
            f"{shown(text)} is not a number of seconds in [0, {MAX_SECONDS:.0f}] (a year)"
        )
    return value


def _nproc(text: str) -> str:
    if text in ("auto", "cpu", "gpu"):
        return text
    return str(_positive_int(text))


def _nnodes(text: str) -> int:
    """Parse ``N`` or torchrun's ``MIN:MAX`` (accepted only when MIN == MAX: no elasticity)."""
    low, _, high = text.partition(":")
    if high and high != low:
        raise argparse.ArgumentTypeError(
            f"{text!r} is an elastic range; distenv run needs a fixed number of nodes (torchrun "
            "handles elastic jobs)"
        )
    return _positive_int(low)


def _ranks(text: str) -> tuple[range, ...]:
    """Parse ``0,2,4-7`` as ranges, never as a set of ranks: ``0-100000000000`` costs nothing.

    The world's size is not known yet: `_node` refuses a rank outside it.
    """
    ranges = []
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        first = decimal(low, sys.maxsize)
        last = decimal(high, sys.maxsize) if dash else first
        if first is None or last is None:
            raise argparse.ArgumentTypeError(f"{shown(text)} is not a list of ranks like '0,2,4-7'")
        if last < first:
            raise argparse.ArgumentTypeError(f"{shown(part)} in {shown(text)} is not a rank range")
        ranges.append(range(first, last + 1))
    return tuple(ranges)


def _epilog() -> str:
    refused = ", ".join(f.flag for f in REFUSED_FLAGS)
    return (
        "Every rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, "
        "GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR and MASTER_PORT. Inside a Slurm "
        "or LSF allocation, one distenv run per node takes the nodes and the master from the "
        f"scheduler. torchrun options refused (each says what to do instead): {refused}."
    )


def add_run_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``run`` subcommand to the ``distenv`` command's subparsers.

    Args:
        subparsers: What `argparse.ArgumentParser.add_subparsers` returned.

    Returns:
        The ``run`` parser (its ``func`` default runs the command).
    """
    parser: argparse.ArgumentParser = subparsers.add_parser(
        COMMAND,
        help="start N ranks of a script on this node (torchrun's env contract)",
        description="Start N ranks of a script on this node, with torchrun's environment.",
        epilog=_epilog(),
        allow_abbrev=False,  # `--nproc` must not silently mean --nproc-per-node
    )
    add = parser.add_argument
    add(
        "-n",
        *_spellings("--nproc-per-node"),
        dest="nproc_per_node",
        type=_nproc,
        default="1",
        metavar="N",
        help="ranks on this node: a number, auto (GPUs if any, else CPUs), gpu or cpu (default 1)",
    )
    add(
        "--nnodes",
        type=_nnodes,
        metavar="N",
        help="number of nodes (default: from Slurm/LSF/Flux, else 1)",
    )
    add(
        *_spellings("--node-rank"),
        dest="node_rank",
        type=_natural,
        metavar="K",
        help="index of this node (default: from Slurm/LSF/Flux, else 0)",
    )
    add(
        *_spellings("--master-addr"),
        dest="master_addr",
        metavar="HOST",
        help=f"rank 0's host (default: from Slurm/LSF, else {LOCAL_HOST})",
    )
    add(
        *_spellings("--master-port"),
        dest="master_port",
        type=_port,
        metavar="PORT",
        help="rank 0's store port (default: from Slurm/LSF; a free port on one node; else "
        f"{DEFAULT_PORT})",
    )
    add(
        *_spellings("--run-id"),
        *_spellings("--rdzv-id"),
        dest="run_id",
        metavar="ID",
        help="this run's identity, the same on every node (default: the job step of a scheduler that lays out several nodes, "
        "else random on one node; required for several nodes without a scheduler). Ranks of "
        "another run that reach this run's store are refused",
    )
    add(
        "--standalone",
        action="store_true",
        help="one node, 127.0.0.1 and a free port; ignore any scheduler",
    )
    add(
        *_spellings("--use-env"),
        dest="use_env",
        action="store_true",
        help="accepted for torch.distributed.launch scripts; the env contract is always set",
    )
    for spelling in ("--local-rank", "--local_rank"):
        add(
            spelling,
            dest="local_rank_flag",
            action="store_const",
            const=spelling,
            help="legacy scripts: pass `--local-rank=N` (as spelled here) before the script's "
            "arguments"
            if spelling == "--local-rank"
            else argparse.SUPPRESS,
        )
    add("-m", "--module", action="store_true", help="run SCRIPT as a module (python -m)")
    add(
        *_spellings("--no-python"),
        dest="no_python",
        action="store_true",
        help="run SCRIPT as a program, not with python",
    )
    add(
        *_spellings("--grace-period"),
        *_spellings("--shutdown-timeout"),
        dest="grace_period",
        type=_seconds,
        default=DEFAULT_GRACE_PERIOD,
        metavar="SECONDS",
        help=f"wait between SIGTERM and SIGKILL when stopping ranks (default "
        f"{DEFAULT_GRACE_PERIOD:g})",
    )
    add(
        *_spellings("--max-restarts"),
        dest="max_restarts",
        type=_natural,
        default=0,
        metavar="N",
        help="when any rank of the job fails, stop every rank on every node and start the "
        "whole job again, at most N times in the whole job; failures a restart would repeat "
        "(distenv refusing the environment, an import or usage error, a stop signal) are not "
        "retried (default 0)",
    )
    add(
        *_spellings("--hang-timeout"),
        dest="hang_timeout",
        type=_positive_seconds,
        default=None,
        metavar="SECONDS",
        help=f"when a rank makes no progress for SECONDS, dump every rank's stacks, name the "
        f"rank whose stack differs, stop the job and exit with status {HANG_STATUS} "
        f"(default: ${HANG_VAR}, else never)",
    )
    add(
        *_spellings("--restart-backoff"),
        dest="restart_backoff",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="with --max-restarts: wait between a failed attempt and the next (default 0)",
    )
    add(
        *_spellings("--monitor-interval"),
        dest="monitor_interval",
        type=_seconds,
        default=0.1,
        metavar="SECONDS",
        help="how often the ranks' state is checked (default 0.1)",
    )
    add(
        *_spellings("--start-method"),
        dest="start_method",
        choices=("spawn", "fork", "forkserver"),
        help="accepted for torchrun compatibility; scripts always start as new processes",
    )
    add(
        *_spellings("--prefix-output"),
        dest="prefix_output",
        action="store_true",
        help="prefix each output line with `[rank N] `",
    )
    add(
        "--ranks",
        type=_ranks,
        metavar="LIST",
        help="show only these global ranks' output, e.g. 0,2 or 0-3 (others go to /dev/null)",
    )
    add_log_options(add, _spellings)
    for refused in REFUSED_FLAGS:
        names = ([refused.short] if refused.short else []) + _spellings(refused.flag)
        add(
            *names,
            dest=f"refused:{refused.flag}",
            action="store" if refused.takes_value else "store_true",
            default=argparse.SUPPRESS,
            help=argparse.SUPPRESS,
        )
    add(
        "script", metavar="SCRIPT", help="the script (a module with -m, a program with --no-python)"
    )
    add("script_args", nargs=argparse.REMAINDER, metavar="...", help="the script's arguments")
    parser.set_defaults(func=run)
    return parser


def check_refused(args: argparse.Namespace) -> None:
    """Raise for the first refused torchrun option present in `args`.

    Raises:
        ConfigurationError: Naming the option and what to do instead.
    """
    for refused in REFUSED_FLAGS:
        if hasattr(args, f"refused:{refused.flag}"):
            raise ConfigurationError(
                COMMAND,
                f"{refused.flag} is not supported",
                hint=refused.hint,
                variable=refused.flag,
            )


def plan_from_args(
    args: argparse.Namespace, env: Mapping[str, str], nproc: int | None = None
) -> NodePlan:
    """Return this node's layout from the parsed options: flags, then Slurm/LSF, then one node.

    `nproc`, the number of ranks this node starts (`build_children` passes it), is checked
    against the count a launcher's job states (Kubeflow's ``PET_NPROC_PER_NODE``).

    Raises:
        ConfigurationError: For contradictory flags or a scheduler layout distenv run cannot use.
    """
    manual = args.nnodes is not None and args.node_rank is not None
    if args.standalone and (args.nnodes or 1) > 1:
        raise ConfigurationError(
            COMMAND, f"--standalone is one node, but --nnodes is {args.nnodes}", hint="drop one"
        )
    if args.master_addr is not None or args.master_port is not None:
        # The flags are the user's master, first in `plan_node`: detection sees them as it would
        # MASTER_ADDR/MASTER_PORT, so a scheduler that names no node's address (HTCondor) does
        # not refuse the node for lacking one.
        flags = {"MASTER_ADDR": args.master_addr, "MASTER_PORT": args.master_port}
        env = {**env, **{name: str(value) for name, value in flags.items() if value is not None}}
    layout = None if args.standalone or manual else scheduler_layout(COMMAND, env)
    if layout is not None and nproc is not None:
        check_processes_per_node(COMMAND, layout, env, nproc)
    options = LaunchOptions(
        who=COMMAND,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=args.master_port,
        option="--master-addr",
        hint="pass --master-addr (the host of node 0) on every node, or run under srun/jsrun",
        run_id=args.run_id,
    )
    return plan_node(options, layout)


def build_children(args: argparse.Namespace, env: Mapping[str, str]) -> list[Child]:
    """Return the local ranks to start, from parsed arguments and the launcher's environment.

    Raises:
        ConfigurationError: For refused or contradictory options.
    """
    return _node(args, env)[1]


def _node(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[NodePlan, list[Child]]:
    """Return this node's plan and the local ranks to start (`build_children`).

    Raises:
        ConfigurationError: For refused or contradictory options.
    """
    check_refused(args)
    if args.no_python and args.module:
        raise ConfigurationError(
            COMMAND, "--no-python and -m contradict each other", hint="drop one"
        )
    check_log_options(COMMAND, args, env)
    nproc = nproc_per_node(COMMAND, args.nproc_per_node)
    plan = plan_from_args(args, env, nproc)
    world_size = plan.nnodes * nproc
    outside = [max(r.start, world_size) for r in args.ranks or () if r[-1] >= world_size]
    if outside:
        raise ConfigurationError(
            COMMAND,
            f"--ranks names rank {min(outside)}, but the world has {world_size} ranks",
            hint=f"choose among 0 to {world_size - 1}",
        )
    settings = Settings.read(env)
    # Checked once here: every rank would refuse it in init_dist, each with its own traceback.
    settings.rendezvous_seconds(None)
    extra = thread_env(COMMAND, nproc, settings)
    # -u as torchrun does (inside `reporting_program`): ranks' output must not sit in a buffer
    # when a rank dies. Each rank tells its agent when, how and where it failed.
    python = reporting_program(args.module)
    program = [*([] if args.no_python else python), args.script]
    children = []
    for local_rank, info in enumerate(local_ranks(COMMAND, plan, nproc)):
        # torch.distributed.launch without --use-env put it right after the script, before the
        # script's own arguments.
        legacy = [f"{args.local_rank_flag}={local_rank}"] if args.local_rank_flag else []
        children.append(
            Child(
                rank=info.rank,
                command=[*program, *legacy, *args.script_args],
                env=child_env(env, info, plan, extra),
                show_output=(args.ranks is None or any(info.rank in r for r in args.ranks))
                and (args.local_ranks_filter is None or local_rank in args.local_ranks_filter),
                prefix_output=args.prefix_output,
                hidden_streams=hidden(args.redirects, args.tee, local_rank),
            )
        )
    return plan, children


def _check_port(plan: NodePlan, *, given: bool) -> None:
    """Refuse, before any rank starts, a master port that node 0 cannot listen on.

    Rank 0 (or, with --max-restarts, this node's agent) would find it taken only after every
    rank started, and its message could name only ``$MASTER_PORT``, not how the port was given.
    """
    if plan.node_rank != 0:
        return
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", plan.master_port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return  # rank 0 names any other problem, with the address it listens on
            source = "--master-port" if given else f"the port distenv run took from {plan.source}"
            raise ConfigurationError(
                COMMAND,
                f"port {plan.master_port} ({source}) is already in use on this host, where "
                "rank 0's store must listen",
                hint="pass another --master-port (on every node), or leave it out on one node "
                "for a free one",
                variable="--master-port",
                value=str(plan.master_port),
            ) from None


def run(args: argparse.Namespace) -> int:
    """Run the ``distenv run`` command; return the ranks' exit status.

    Raises:
        ConfigurationError: For refused or contradictory options, or an unusable scheduler layout.
    """
    check_refused(args)  # a refused option is named first, whatever else is wrong
    # Not a module (-m): looking one up imports its parent packages; its rank reports the
    # ImportError instead, which --max-restarts does not retry.
    refused = None if args.module else unrunnable(COMMAND, args.script, python=not args.no_python)
    if refused is not None:  # one line, not one failure per rank (and per attempt)
        error, status = refused
        tell(f"distenv: {error}")
        return status
    plan, children = _node(args, os.environ)
    _check_port(plan, given=args.master_port is not None)
    # The supervisor keeps the ranks' logs itself, from their first line: they do not again.
    logs = log_folder(
        args.log_dir, Settings.read(os.environ).log_dir, launcher=COMMAND, option="--log-dir "
    )
    for child in children:
        child.env.pop(LOG_DIR_VAR, None)
    run_dir = RunDir(logs) if logs is not None else RunDir()
    policy = StopPolicy(args.grace_period)
    hang = _hang_timeout(args)
    if args.max_restarts:
        return Restarts(
            children,
            plan,
            max_restarts=args.max_restarts,
            backoff=args.restart_backoff,
            policy=policy,
            poll_interval=args.monitor_interval,
            timeout=Settings.read(os.environ).rendezvous_seconds(None),
            _run_dir=run_dir,
        ).run()
    supervisor = Supervisor(
        children,
        policy=policy,
        poll_interval=args.monitor_interval,
        world_size=plan.nnodes * len(children),
        hang_timeout=hang,
        run_dir=run_dir,
    )
    return supervisor.run()


def _hang_timeout(args: argparse.Namespace) -> float | None:
    """Return the hang timeout (``--hang-timeout``, else ``$DISTENV_HANG_TIMEOUT``), or refuse it.

    Raises:
        ConfigurationError: For a bad ``$DISTENV_HANG_TIMEOUT``, or a hang timeout with
            ``--no-python`` (no watchdog in the ranks) or ``--max-restarts`` (not yet).
    """
    hang = Settings.read(os.environ).hang_seconds(args.hang_timeout)
    source = "--hang-timeout" if args.hang_timeout is not None else f"${HANG_VAR}"
    if hang is not None and args.no_python:
        raise ConfigurationError(
            COMMAND,
            f"{source} needs Python ranks (its watchdog runs in distenv's rank wrapper), but "
            "--no-python was given",
            hint="drop one; a program that is not Python is not watched",
            variable=source,
        )
    if hang is not None and args.max_restarts:
        raise ConfigurationError(
            COMMAND,
            f"{source} does not work with --max-restarts yet",
            hint=f"drop one (unset ${HANG_VAR} if it came from there)",
            variable=source,
        )
    return hang
