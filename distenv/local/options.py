"""``distenv run``'s command line: its options, their value types, and the torchrun options it refuses.

`add_run_parser` builds the parser; `check_refused` and `check_arguments` refuse, before any rank
starts, what argparse alone accepts: a torchrun option distenv run does not implement, two
different rank counts (``-n 2 --nproc-per-node 3``), or ``python`` given as the script (the
mpirun habit: distenv run starts Python itself). What the options mean for the node is
`distenv.local.run`'s and `distenv.local.plan`'s.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from dataclasses import dataclass
from typing import Any

from distenv.errors import ConfigurationError, shown
from distenv.local.autopsy import HANG_STATUS
from distenv.local.stopping import DEFAULT_GRACE_PERIOD
from distenv.local.streams import add_log_options
from distenv.master import DEFAULT_PORT, LOCAL_HOST
from distenv.placement.binding import MODES, OFF
from distenv.settings import CPU_BINDING_VAR, HANG_VAR, MAX_SECONDS
from distenv.variables import MAX_COUNT, decimal

__all__ = [
    "COMMAND",
    "REFUSED_FLAGS",
    "RefusedFlag",
    "add_run_parser",
    "check_arguments",
    "check_refused",
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


class _Count(argparse.Action):
    """Store the rank count, and remember each spelling given with its value.

    argparse keeps the last of ``-n 2 --nproc-per-node 3`` silently; `check_arguments` refuses
    two different counts instead.
    """

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        given = [*getattr(namespace, "nproc_given", ()), (option_string or "-n", values)]
        namespace.nproc_given = given
        setattr(namespace, self.dest, values)


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
        action=_Count,
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
        *_spellings("--numa-binding"),
        dest="numa_binding",
        choices=(*MODES, OFF),
        default=None,
        help="bind each rank to the CPUs near its accelerator, with torchrun's modes, or auto "
        "(each rank a share of its accelerator's NUMA node); never narrows a binding the "
        f"launcher set (default: ${CPU_BINDING_VAR}, else none; docs: placement)",
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


# A Python interpreter given where the script goes: ``python``, ``python3``, ``python3.11``.
_PYTHON = re.compile(r"python[0-9.]*")


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse, once and before any rank starts, what argparse accepts but cannot be meant.

    - Two different rank counts (``-n 2 --nproc-per-node 3``): argparse would keep the last.
    - ``python`` as the script (``distenv run -n 2 python train.py``, the mpirun habit): every
      rank would run ``python python train.py`` and fail with "can't open file".

    Raises:
        ConfigurationError: Naming the options as given and the command line meant.
    """
    given: list[tuple[str, str]] = getattr(args, "nproc_given", [])
    counts = {value for _, value in given}
    if len(counts) > 1:
        spelled = " and ".join(f"{flag} {value}" for flag, value in given)
        raise ConfigurationError(
            COMMAND,
            f"{spelled} give different numbers of ranks on this node",
            hint=f"give the number once: -n {given[-1][1]} (or -n {given[0][1]})",
            variable=given[-1][0],
            value=given[-1][1],
        )
    if args.no_python or args.module or not _PYTHON.fullmatch(os.path.basename(args.script)):
        return
    if os.path.isfile(args.script) and not os.access(args.script, os.X_OK):
        return  # a script that happens to be called python: python can run it
    meant = shlex.join(["distenv", "run", "-n", args.nproc_per_node, *args.script_args])
    raise ConfigurationError(
        COMMAND,
        f"the script is {shown(args.script)}, a Python interpreter: distenv run starts Python "
        "itself, so every rank would run it as a script",
        hint=f"drop it: {meant} (--no-python runs a program as given)",
        variable="SCRIPT",
        value=args.script,
    )
