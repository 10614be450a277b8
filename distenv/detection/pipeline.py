"""From the environment to a resolved `RankInfo`: the one pipeline every entry point calls.

    choose the launcher (distenv.detection.choice) -> its layout -> the master (distenv.master) -> RankInfo

`locate` is that pipeline; `init_dist`, `setup`, ``distenv info/export/doctor`` and
``distenv run`` all call it. `explain` and `detect` are its pure part (the environment only: no
torch, no mpi4py, no subprocess, no socket); `resolve` completes a `RankInfo` whose master is
still unknown (a free port, or rank 0's host over MPI).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from distenv._hosts import host_files
from distenv.detection.choice import Choice, choose
from distenv.detection.starters import COMMANDS_OF, Origin
from distenv.errors import DistEnvError
from distenv.exits import one_line
from distenv.launchers import Launcher
from distenv.launchers.mpi import MpiLauncher
from distenv.launchers.registry import MPI
from distenv.master import FORMAT_VAR, MasterQuery, addr_origin, find_master, scheduler_port
from distenv.rankinfo import RankInfo
from distenv.settings import Settings
from distenv.system.containers import container
from distenv.system.processes import PROC, ancestors, cgroup

if TYPE_CHECKING:  # distenv.deadline brings threading and signal: not for a plain detect()
    from distenv.deadline import Deadline

__all__ = ["Detection", "detect", "explain", "locate", "master_query", "origin", "resolve"]


@dataclass(frozen=True)
class Detection:
    """The outcome of detection, with the reasons, for `distenv info` and `distenv doctor`.

    Attributes:
        info: The answer.
        launcher: The backend whose answer it is (the explicit name, or what auto chose).
        job_tag: The export tag: the job step distenv's exports name (``DISTENV_SCOPE``,
            `distenv.master.scope_tag`), also the rendezvous scope's starting point.
        considered: One ``(launcher, verdict)`` line per backend looked at, innermost first.
        mpi_token: The job's 16 random bytes that rank 0 sent with its master over MPI (the
            same on every rank), when this rank took part in that exchange; else None.
        master_from: Where the master address came from (`distenv.master.addr_origin`):
            ``MASTER_ADDR``, ``SLURM_STEP_NODELIST``, ...; errors about the address name it.
    """

    info: RankInfo
    launcher: Launcher
    job_tag: str
    considered: tuple[tuple[str, str], ...]
    mpi_token: bytes | None = None
    master_from: str = "MASTER_ADDR"

    @property
    def scope(self) -> str:
        """`job_tag`, by the name callers of the public `Detection` read it under."""
        return self.job_tag


def master_query(choice: Choice) -> MasterQuery:
    """Return what detection knows that bears on the master (`distenv.master.find_master`)."""
    owner, info = choice.owner, choice.info
    return MasterQuery(
        source=owner.name,
        env=owner.env,
        job_tag=owner.job_tag(),
        explicit=owner.launcher.honours_master_vars,
        stated=(info.master_addr, info.master_port),
        default=owner.default_master(),
        allocation=choice.allocation,
        world_size=info.world_size,
        node_port=_node_port(owner.launcher, info, owner.env),
    )


def origin(env: Mapping[str, str], proc: str = PROC, root: str = "/") -> Origin:
    """Read what the process tree says of this process: its ancestors, cgroup and container.

    Bounded reads of `proc` (a recorded tree in tests) and marker checks under `root`; no
    subprocess. Well under a millisecond on Linux; empty where there is no /proc.
    """
    return Origin(
        tuple(ancestors(proc, commands_of=COMMANDS_OF)), cgroup(proc), container(env, root)
    )


def _node_port(
    launcher: Launcher, info: RankInfo, env: Mapping[str, str]
) -> Callable[[], int | None] | None:
    """Return how an MPI job on one node derives its port without mpi4py (None: not one).

    Every rank is on this host (the local size is the world size), so 127.0.0.1 serves and only
    the port must be agreed: from the launch's identity (`MpiLauncher.launch_port`), else,
    under Hydra, which exports none, from the PMI proxy that every rank of the node talks to
    over ``PMI_FD`` (its pid, alike through any wrapper shell). Where mpi4py imports, the function
    answers None and the MPI exchange runs as on several nodes (it also draws the job's random
    token, `distenv.detection.exchange`), with rank 0 sending 127.0.0.1.
    """
    if not isinstance(launcher, MpiLauncher) or info.num_nodes != 1 or info.world_size < 2:
        return None

    def port() -> int | None:
        if _mpi4py_installed():
            return None
        return launcher.launch_port(env) or _pmi_server_port(launcher.reader(env).get("PMI_FD"))

    return port


def _mpi4py_installed() -> bool:
    """Return whether mpi4py can be found, without importing it (`distenv info` must not)."""
    from importlib.util import find_spec

    try:
        return find_spec("mpi4py") is not None
    except (ImportError, ValueError):  # a broken entry in sys.modules or on the path
        return False


def _pmi_server_port(fd: str | None) -> int | None:
    """Return the port derived from the pid of the PMI server behind ``PMI_FD``, if any."""
    if fd is None or not (fd.isascii() and fd.isdigit()) or len(fd) > 9:
        return None
    from distenv.system.processes import socket_peer  # here: a plain detect() never needs it

    peer = socket_peer(int(fd))
    return None if peer is None else scheduler_port(f"pmi-server-{peer}", "mpi")


class _LazyMpi:
    """The MPI exchange for one rank, loaded only if a job with no master calls it.

    ``token`` is the job's token from rank 0 once the exchange ran (`distenv.detection.exchange`).
    """

    def __init__(
        self, info: RankInfo, comm: Any, deadline: Deadline | None, env: Mapping[str, str]
    ) -> None:
        self.info, self.comm, self.deadline, self.env = info, comm, deadline, env
        self.token: bytes | None = None

    def __call__(self, rank0_master: Callable[[], tuple[str, int]]) -> tuple[str, int]:
        from distenv.detection.exchange import mpi_exchange

        exchange = mpi_exchange(
            self.info, self.comm, deadline=self.deadline, settings=Settings.read(self.env)
        )
        try:
            return exchange(rank0_master)
        finally:
            self.token = exchange.token


def locate(
    launcher: str = "auto",
    env: Mapping[str, str] | None = None,
    *,
    master_addr_format: str | None = None,
    runtime: bool = True,
    mpi: bool = True,
    comm: Any = None,
    deadline: Deadline | None = None,
    proc: str | None = None,
    root: str = "/",
) -> Detection:
    """Run the pipeline: choose the launcher, read its layout, find the master.

    Args:
        launcher: As in `explain`.
        env: As in `explain`.
        master_addr_format: As in `explain`.
        runtime: Also pick a free port (one node) or ask rank 0 over MPI; False reads the
            environment only, and an MPI job's master may stay unresolved.
        mpi: With `runtime`, whether an MPI job with no master may ask rank 0 over MPI (a
            collective call, and MPI_Init if MPI is not initialised yet); False leaves that
            master unresolved.
        comm: An mpi4py communicator to use instead of ``MPI.COMM_WORLD``.
        deadline: When the MPI exchange must end; None: the
            rendezvous timeout (``DISTENV_TIMEOUT`` of `env`) plus
            `distenv.timing.GRACE_S`, from the start of the exchange.
        proc: The /proc whose process tree says who started this process where its
            environment names no launcher (`distenv.detection.starters`). Default: the real
            one when `env` is None (this process's own environment); none for a given `env`,
            which may be recorded elsewhere.
        root: The root directory whose marker files name the container runtime (with `proc`).

    Raises:
        DistEnvError: If the environment is incomplete, malformed, or contradicts the name given,
            or (runtime) the master cannot be found.
    """
    if proc is None and env is None:
        proc = PROC
    # One copy: the pipeline looks up about a hundred names, and os.environ encodes each one.
    env = dict(os.environ) if env is None else env
    if master_addr_format is not None:
        env = {**env, FORMAT_VAR: master_addr_format}
    # Read only if nothing is detected: the tree is the last word, never the first.
    tree = None if proc is None else functools.partial(origin, env, proc, root)
    # The layout and the master may each read a host file (jsrun's rank file): each is read once,
    # all within one bound.
    with host_files():
        choice = choose(launcher, env, tree)
        try:
            query = master_query(choice)
            exchange = _LazyMpi(choice.info, comm, deadline, env) if runtime and mpi else None
            master = find_master(query, runtime=runtime, exchange=exchange)
        except DistEnvError as exc:
            # The reasons of the choice explain a master error too (distenv doctor prints them).
            exc.considered = exc.considered or choice.considered
            raise
    notes = choice.considered
    if master.addr_rule == "allocation" and choice.allocation is not None:
        notes += ((choice.allocation.source, f"master taken from its allocation: {master.addr}"),)
    info = choice.info.replace(master_addr=master.addr, master_port=master.port)
    token = None if exchange is None else exchange.token
    return Detection(
        info, choice.launcher, choice.layer.job_tag(), notes, token, addr_origin(query, master)
    )


def explain(
    launcher: str = "auto",
    env: Mapping[str, str] | None = None,
    *,
    master_addr_format: str | None = None,
) -> Detection:
    """Detect this process's place in the job and say why (the environment only).

    Args:
        launcher: ``auto`` or a launcher name (``pytorch``/``torchrun``, ``mpi``, ``slurm``,
            ``lsf``, ``none``, or a plug-in's name).
        env: The environment to read; `os.environ` by default.
        master_addr_format: Maps the default master host to the address to use, e.g.
            ``"{host}-ib"``; overrides ``$DISTENV_MASTER_ADDR_FORMAT``.

    Raises:
        DistEnvError: If the environment is incomplete, malformed, or contradicts the name given.
    """
    return locate(launcher, env, master_addr_format=master_addr_format, runtime=False)


@one_line
def detect(
    launcher: str = "auto",
    env: Mapping[str, str] | None = None,
    *,
    master_addr_format: str | None = None,
) -> RankInfo:
    """Return this process's `RankInfo`, from the environment alone.

    No torch, no mpi4py, no subprocess: safe on a login node. The master of an MPI job may be
    unresolved (``master_addr is None``); `distenv.resolve` fills it.

    Args:
        launcher: ``auto`` (the innermost launcher detected, else ``none``) or a launcher name.
        env: The environment to read; `os.environ` by default.
        master_addr_format: Maps the default master host, e.g. ``"{host}-ib"`` (see `explain`).

    Raises:
        DistEnvError: If the environment is incomplete, malformed, or contradicts the name given.
    """
    return explain(launcher, env, master_addr_format=master_addr_format).info


@one_line
def resolve(
    info: RankInfo,
    *,
    env: Mapping[str, str] | None = None,
    comm: Any = None,
    deadline: Deadline | None = None,
) -> RankInfo:
    """Return `info` with its master address and port known.

    A resolved `info` is returned as is. A single process gets 127.0.0.1 and a free port. An MPI
    job without MASTER_ADDR gets rank 0's host name (mapped by DISTENV_MASTER_ADDR_FORMAT) and a
    free port picked on rank 0, broadcast over MPI with mpi4py (``pip install 'distenv[mpi]'``).
    This is a collective call for MPI jobs: every rank must make it.

    Args:
        info: What detection found.
        env: The environment (for DISTENV_MASTER_ADDR_FORMAT); `os.environ` by default.
        comm: An mpi4py communicator to use instead of ``MPI.COMM_WORLD``.
        deadline: As in `locate`.

    Raises:
        MasterResolutionError: If mpi4py is missing or sees a different world than the launcher.
    """
    if info.is_resolved:
        return info
    env = os.environ if env is None else env
    query = MasterQuery(
        source=info.launcher,
        env=env,
        stated=(info.master_addr, info.master_port),
        world_size=info.world_size,
        # Only the launcher's name comes with a bare RankInfo: the built-in MPI launcher's rule.
        node_port=_node_port(MPI, info, env) if info.launcher == MPI.name else None,
    )
    master = find_master(query, runtime=True, exchange=_LazyMpi(info, comm, deadline, env))
    return info.replace(master_addr=master.addr, master_port=master.port)
