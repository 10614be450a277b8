"""``distenv run``: start N ranks of a script on this node, torchrun-style, without torchelastic.

    distenv run --nproc-per-node 4 train.py --lr 0.1
    srun --ntasks-per-node=1 distenv run -n 4 train.py     # one launcher per node, nodes from Slurm

Every child gets torchrun's environment contract (`RankInfo.to_env`), so it detects as the
``pytorch`` launcher. This module runs the command: its options are `distenv.local.options`'s,
what the ranks are is `distenv.local.plan`'s
decision (shared with `distenv.launch`), supervision (fail-fast, signal forwarding, no orphans)
is `distenv.local.supervise`'s, and the stop policy `distenv.local.stopping`'s.
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
from collections.abc import Mapping

from distenv.errors import ConfigurationError
from distenv.local.cpus import rank_cpus
from distenv.local.options import COMMAND, check_arguments, check_refused
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
    unrunnable,
)
from distenv.local.restarts import Restarts, reporting_program
from distenv.local.stopping import StopPolicy
from distenv.local.streams import check_log_options, hidden
from distenv.local.supervise import Child, Supervisor
from distenv.local.witness import RunDir
from distenv.placement.apply import chosen_mode
from distenv.postmortem.ranklog import folder as log_folder
from distenv.settings import CPU_BINDING_VAR, HANG_VAR, LOG_DIR_VAR, Settings

__all__ = [
    "build_children",
    "plan_from_args",
    "run",
]


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
    mode = chosen_mode(COMMAND, args.numa_binding, settings.cpu_binding)
    placed = rank_cpus(COMMAND, nproc, settings, mode, env)
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
                env=_without_binding(child_env(env, info, plan, placed[local_rank].env), mode),
                cpus=placed[local_rank].cpus,
                show_output=(args.ranks is None or any(info.rank in r for r in args.ranks))
                and (args.local_ranks_filter is None or local_rank in args.local_ranks_filter),
                prefix_output=args.prefix_output,
                hidden_streams=hidden(args.redirects, args.tee, local_rank),
            )
        )
    return plan, children


def _without_binding(env: dict[str, str], mode: str | None) -> dict[str, str]:
    """Return `env` without ``DISTENV_CPU_BINDING`` where distenv run bound the rank itself: its
    init_dist has nothing left to bind."""
    if mode is not None:
        env.pop(CPU_BINDING_VAR, None)
    return env


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
    check_arguments(args)
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
