"""The local launcher's plan: this node's place, its ranks, and each rank's environment.

``distenv run`` (`distenv.local.run`) and `distenv.launch` (`distenv.local.spawn`) both start N ranks on this
node with torchrun's environment contract; this module decides for both what those ranks are:

- `plan_node`: the number of nodes, this node's index and the master, from the options given,
  else the scheduler's layout (one ``distenv run`` per node under ``srun``/``jsrun``), else one
  local node; the master itself is `distenv.master`'s decision;
- `local_ranks`: one `RankInfo` per rank of this node;
- `run_id`: the run's identity, which its ranks receive as ``DISTENV_RUN_ID`` and use as their
  rendezvous scope;
- `child_env`: a rank's environment (inherited, minus stale launcher state, plus its contract);
  its CPUs and ``OMP_NUM_THREADS`` are `distenv.local.cpus`'s.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
from collections.abc import Mapping
from dataclasses import dataclass

from distenv.detection.pipeline import Detection, locate
from distenv.errors import ConfigurationError, LauncherNotFoundError, NotLaunchedError, shown
from distenv.launchers import Scheduler
from distenv.launchers.registry import get_launcher
from distenv.local.output import tell
from distenv.master import (
    RUN_ID_PATTERN,
    RUN_ID_VAR,
    SCOPE_VAR,
    Default,
    LocalLaunch,
    MasterQuery,
    find_master,
)
from distenv.rankinfo import RankInfo
from distenv.system.processes import PROC
from distenv.variables import decimal

__all__ = [
    "LaunchOptions",
    "NodePlan",
    "check_processes_per_node",
    "child_env",
    "is_stale",
    "local_ranks",
    "nproc_per_node",
    "plan_node",
    "run_id",
    "scheduler_layout",
    "unrunnable",
]

PER_NODE_HINT = (
    "start one distenv run per node (srun --ntasks-per-node=1, jsrun --tasks_per_rs 1 "
    "--rs_per_host 1, flux run --tasks-per-node=1) and let it start the ranks with "
    "--nproc-per-node"
)


@dataclass(frozen=True)
class LaunchOptions:
    """What the user said about the nodes of a local launch (None: not said).

    Attributes:
        who: The launcher's name in messages (``run``, ``launch``).
        nnodes: Number of nodes.
        node_rank: This node's index.
        master_addr: Rank 0's host.
        master_port: Rank 0's store port.
        option: How the user gives the master's address (``--master-addr``, ``master_addr``).
        hint: What to do when several nodes have no master address.
        run_id: The job identity every node shares (``--run-id``).
        run_id_option: How the user gives it (``--run-id``, ``run_id``).
    """

    who: str
    nnodes: int | None
    node_rank: int | None
    master_addr: str | None
    master_port: int | None
    option: str
    hint: str
    run_id: str | None = None
    run_id_option: str = "--run-id"


@dataclass(frozen=True)
class NodePlan:
    """Where this node stands: what every local rank's `RankInfo` shares.

    Attributes:
        nnodes: Number of nodes (one local launcher each).
        node_rank: This node's index.
        master_addr: Rank 0's host.
        master_port: Rank 0's store port.
        source: Where the layout came from (``flags``, ``slurm``, ``lsf``, ``local``).
        run_id: The job identity handed to the ranks as ``DISTENV_RUN_ID``: their rendezvous
            scope (`distenv.bootstrap.scope`), so that no rank of another run joins this one's store.
    """

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    source: str
    run_id: str


def scheduler_layout(who: str, env: Mapping[str, str]) -> Detection | None:
    """Return the scheduler's view of this launcher task, or None to run as a single node.

    Raises:
        ConfigurationError: If this process is not alone on its node or not a scheduler's task.
    """
    try:
        # The real process tree: a srun task whose container stripped SLURM_* is refused.
        detection = locate("auto", env, runtime=False, proc=PROC)
    except NotLaunchedError as exc:
        agent = _node_agent(exc, env)
        if agent is not None:
            return agent
        # A batch script or salloc shell, not an srun step: this node alone, like torchrun would.
        tell(
            f"distenv {who}: not started by srun/jsrun: running on this node only (for several "
            "nodes, start one distenv run per node with srun --ntasks-per-node=1)"
        )
        return None
    info = detection.info
    if info.world_size == 1:
        return None
    if not isinstance(detection.launcher, Scheduler):
        raise ConfigurationError(
            who,
            f"this distenv run is itself {info.who} started by "
            f"{info.launcher}; it takes the nodes only from a scheduler (Slurm, LSF, Flux)",
            hint=f"{PER_NODE_HINT}, or pass --nnodes, --node-rank and --master-addr",
        )
    if info.local_world_size != 1:
        started = (
            f"{info.local_world_size} tasks on this node"
            if info.local_world_size is not None
            else f"{info.world_size} tasks on {info.num_nodes or 'several'} nodes"
        )
        raise ConfigurationError(
            who,
            f"{info.launcher} started {started} (task {info.rank} of {info.world_size}); "
            "distenv run starts the ranks itself and needs exactly one task per node",
            hint=PER_NODE_HINT,
        )
    return detection


def _node_agent(refusal: NotLaunchedError, env: Mapping[str, str]) -> Detection | None:
    """Return the refusing launcher's view of this process as its node's agent, if it has one.

    A Kubeflow pod with nprocPerNode > 1 is no rank itself, but ``distenv run`` there is the
    node's launcher: `Launcher.node_agent` gives its node index, the node count and the master.
    """
    try:
        launcher = get_launcher(refusal.source)
    except LauncherNotFoundError:
        return None
    info = launcher.node_agent(env)
    if info is None:
        return None
    note = (launcher.name, f"node agent: node {info.node_rank} of {info.num_nodes}")
    considered = (*refusal.considered, note)
    origin = f"the {launcher.name} job's master"
    return Detection(info, launcher, launcher.scope(env), considered, master_from=origin)


def check_processes_per_node(
    who: str, layout: Detection, env: Mapping[str, str], nproc: int
) -> None:
    """Refuse a count of local ranks other than the one the node's launcher states for its job.

    A Kubeflow job states ``nprocPerNode`` (``PET_NPROC_PER_NODE``): the operator sized the
    pods, and v1's ``WORLD_SIZE``, for it. Only a number is compared; ``auto``, ``gpu`` or ``cpu``
    is what the pod resolves.

    Raises:
        ConfigurationError: Naming the variable, its value and the option to pass.
    """
    stated = layout.launcher.processes_per_node(env)
    if stated is None:
        return
    variable, value = stated
    # A plug-in's text, unchecked: decimal() never converts more digits than a count may have.
    if not (value.isascii() and value.isdigit()) or decimal(value) == nproc:
        return
    raise ConfigurationError(
        who,
        f"--nproc-per-node gives {nproc} rank(s) on this node, but the {layout.launcher.name} "
        f"job runs ${variable}={shown(value)} per node",
        hint=f"start the ranks the job states: `distenv {who} --nproc-per-node {value} ...` "
        f"(or change the job's own count, which sets ${variable})",
        variable=variable,
        value=value,
    )


def run_id(options: LaunchOptions, layout: Detection | None, nnodes: int) -> str:
    """Return the run's identity: the option, else the scheduler's job step, else a random one.

    Several nodes cannot each draw their own: without a scheduler they must be told one.

    Raises:
        ConfigurationError: For a malformed id, or several nodes with neither id nor scheduler.
    """
    if options.run_id is not None:
        if not re.fullmatch(RUN_ID_PATTERN, options.run_id):
            raise ConfigurationError(
                options.who,
                f"{options.run_id_option} is {options.run_id!r}, expected 1 to 128 letters, "
                "digits or ._:/@+- (starting with a letter or digit)",
                hint="name the run, e.g. with the job's name and date",
                variable=options.run_id_option,
                value=options.run_id,
            )
        return options.run_id
    if layout is not None:
        return layout.job_tag
    if nnodes == 1:
        return secrets.token_hex(8)
    raise ConfigurationError(
        options.who,
        f"{nnodes} nodes without a scheduler need {options.run_id_option}: each node would "
        "draw its own run id, and the ranks of one run could not tell it from another's",
        hint=f"pass the same {options.run_id_option} on every node (any name unique to this run)",
        variable=options.run_id_option,
    )


def plan_node(options: LaunchOptions, layout: Detection | None) -> NodePlan:
    """Return this node's layout: the options first, then the scheduler's `layout`, then one node.

    Raises:
        ConfigurationError: For a node rank outside the nodes, several nodes with no master, or
            several nodes with no run id.
    """
    scheduled = None if layout is None else layout.info
    source = scheduled.launcher if scheduled is not None else "local"
    if options.nnodes is not None or options.node_rank is not None:
        source = "flags"
    nnodes = options.nnodes or (scheduled.num_nodes if scheduled else 1)
    node_rank = options.node_rank
    if node_rank is None:
        node_rank = scheduled.node_rank if scheduled else 0
    if nnodes is None or node_rank is None:
        raise ConfigurationError(
            options.who,
            f"the {source} launcher names no node layout (node index and node count), which "
            "a local launcher needs before any rank starts",
            hint="pass --nnodes and --node-rank (nnodes= and node_rank=)",
        )
    if not 0 <= node_rank < nnodes:
        raise ConfigurationError(
            options.who,
            f"--node-rank is {node_rank}, outside [0, {nnodes}) for {nnodes} node(s)",
            hint="number the nodes 0 to nnodes-1",
        )
    query = MasterQuery(
        source=options.who,
        env={},  # the scheduler's layout already applied MASTER_* and the address format
        flags=(options.master_addr, options.master_port),
        default=None
        if scheduled is None
        else Default(scheduled.master_addr, scheduled.master_port),
        local=LocalLaunch(nnodes, options.option, options.hint),
    )
    master = find_master(query, runtime=True)
    # Rule 6 of distenv.master always answers a local launch.
    assert master.addr is not None
    assert master.port is not None
    return NodePlan(
        nnodes, node_rank, master.addr, master.port, source, run_id(options, layout, nnodes)
    )


def local_ranks(launcher: str, plan: NodePlan, nproc: int) -> list[RankInfo]:
    """Return the RankInfo of each of the `nproc` ranks a local launcher starts on this node."""
    return [
        RankInfo(
            launcher=launcher,
            rank=plan.node_rank * nproc + local_rank,
            world_size=plan.nnodes * nproc,
            local_rank=local_rank,
            local_world_size=nproc,
            node_rank=plan.node_rank,
            num_nodes=plan.nnodes,
            master_addr=plan.master_addr,
            master_port=plan.master_port,
        )
        for local_rank in range(nproc)
    ]


def nproc_per_node(who: str, spec: str) -> int:
    """Return the number of ranks for ``--nproc-per-node`` (a number, auto, gpu or cpu)."""
    if spec.isdigit():
        return int(spec)
    if spec in ("auto", "gpu"):
        try:
            import torch

            gpus = int(torch.cuda.device_count())
        except ImportError:
            gpus = 0
        if gpus or spec == "gpu":
            if not gpus:
                raise ConfigurationError(
                    who, "--nproc-per-node is 'gpu' but no GPU is visible", hint="use a number"
                )
            return gpus
    # The CPUs this process may run on (a Slurm step or taskset narrows them), not the machine's.
    return len(os.sched_getaffinity(0))


def is_stale(name: str) -> bool:
    """Return whether an inherited variable must not reach a rank a local launcher starts."""
    # Without the export tag, the rank's RANK/... count as a launch (see launchers/torchrun.py);
    # inherited TORCHELASTIC_* would describe some other torchrun's job.
    return name in (SCOPE_VAR, RUN_ID_VAR) or name.startswith("TORCHELASTIC_")


def child_env(
    base: Mapping[str, str], info: RankInfo, plan: NodePlan, extra: Mapping[str, str]
) -> dict[str, str]:
    """Return a rank's environment: `base`, minus stale launcher state, plus its contract.

    The contract is torchrun's, plus ``DISTENV_RUN_ID``: the run's identity, which also marks the
    RANK/WORLD_SIZE/... as a local launcher's own inside a scheduler step.
    """
    env = {key: value for key, value in base.items() if not is_stale(key)}
    env.update(info.to_env())
    env[RUN_ID_VAR] = plan.run_id
    env.update(extra)
    return env


def unrunnable(who: str, script: str, *, python: bool) -> tuple[ConfigurationError, int] | None:
    """Return why the ranks' program cannot start, and the status each rank would end with.

    A script python cannot open (`python`), or a program not found (``--no-python``), would end
    every rank, and every attempt of ``--max-restarts``, the same way before anything ran: it is
    refused once, with the status of ``python SCRIPT`` (2) or of a shell (127).

    Returns:
        The error and the status, or None when the program can start.
    """
    if not python:
        if shutil.which(script) is not None:
            return None
        problem, status = f"cannot execute {shown(script)}: no such executable program", 127
    else:
        try:
            os.stat(script)
        except OSError as exc:
            problem, status = f"cannot open the script {shown(script)}: {exc.strerror}", 2
        else:
            return None
    error = ConfigurationError(
        who,
        problem,
        hint="check the path (a relative one starts from the directory distenv run runs in); "
        "every rank would fail the same way",
        variable="SCRIPT",
        value=script,
    )
    return error, status
