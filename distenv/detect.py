"""Choosing among launcher backends: ``auto`` detection and explicit names.

Reads the environment only: no torch, no mpi4py, no subprocess.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from distenv._master import FORMAT_VAR
from distenv.errors import DistEnvError, LauncherMismatchError, LauncherNotFoundError
from distenv.launchers import (
    LSF,
    MPI,
    NONE,
    SLURM,
    Launcher,
    World,
    auto_candidates,
    canonical_name,
    get_launcher,
)
from distenv.rankinfo import RankInfo

__all__ = ["Detection", "detect", "explain"]

SCHEDULERS = (SLURM, LSF)


@dataclass(frozen=True)
class Detection:
    """The outcome of detection, with the reasons, for `distenv info` and `distenv doctor`.

    Attributes:
        info: The answer.
        launcher: The backend whose answer it is (the explicit name, or what auto chose).
        scope: The job/step identity distenv tags its exports with.
        considered: One ``(launcher, verdict)`` line per backend looked at, innermost first.
    """

    info: RankInfo
    launcher: Launcher
    scope: str
    considered: tuple[tuple[str, str], ...]


def _seen(launcher: Launcher, env: Mapping[str, str], limit: int = 6) -> str:
    names = [v.name for v in launcher.variables if env.get(v.name)]
    shown = ", ".join(f"{n}={env[n]!r}" for n in names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def _agrees(inner: World | None, outer: World | None) -> bool:
    """Whether an MPI layer and an enclosing scheduler step describe the same ranks."""
    if inner is None or outer is None or inner[0] != outer[0]:
        return False
    return inner[1] is None or outer[1] is None or inner[1] == outer[1]


def _describe(world: World | None) -> str:
    if world is None:
        return "no rank"
    return f"rank {world[0]} of {world[1] if world[1] is not None else '?'}"


def _mpi_answer(env: Mapping[str, str], notes: list[tuple[str, str]]) -> tuple[Launcher, RankInfo]:
    """Answer for MPI ranks: the scheduler's layout when it agrees, else MPI's own."""
    mpi_world = MPI.world(env)
    outer = [s for s in SCHEDULERS if s.detect(env)]
    for scheduler in outer:
        world = scheduler.world(env)
        if _agrees(mpi_world, world):
            notes.append(
                (scheduler.name, f"agrees with mpi ({_describe(world)}): its layout and hosts used")
            )
            return scheduler, scheduler.rank_info(env)
        notes.append(
            (scheduler.name, f"outer layer: {_describe(world)} vs mpi's {_describe(mpi_world)}")
        )
    nodes = next((n for s in outer if (n := s.daemon_nodes(env)) is not None), None)
    info = MPI.rank_info(env, nodes)
    if info.master_addr is None:
        for scheduler in outer:
            found = scheduler.allocation_master(env)
            if found is not None:
                port = found[1] if info.master_port is None else info.master_port
                info = info.replace(master_addr=found[0], master_port=port)
                notes.append((scheduler.name, f"master taken from its allocation: {found[0]}"))
                break
    return MPI, info


def explain(
    launcher: str = "auto",
    env: Mapping[str, str] | None = None,
    *,
    master_addr_format: str | None = None,
) -> Detection:
    """Detect this process's place in the job and say why.

    Args:
        launcher: ``auto`` or a launcher name (``pytorch``/``torchrun``, ``mpi``, ``slurm``,
            ``lsf``, ``none``, or a plug-in's name).
        env: The environment to read; `os.environ` by default.
        master_addr_format: Maps the default master host to the address to use, e.g.
            ``"{host}-ib"``; overrides ``$DISTENV_MASTER_ADDR_FORMAT``.

    Raises:
        DistEnvError: If the environment is incomplete, malformed, or contradicts the name given.
    """
    env = os.environ if env is None else env
    if master_addr_format is not None:
        env = {**env, FORMAT_VAR: master_addr_format}
    name = canonical_name(launcher)
    candidates = auto_candidates(env)
    detected = [c for c in candidates if c.detect(env)]
    notes: list[tuple[str, str]] = [
        (c.name, f"detected ({_seen(c, env)})" if c in detected else "not detected: no variables")
        for c in candidates
    ]

    try:
        return _choose(name, env, detected, notes)
    except DistEnvError as exc:
        exc.considered = tuple(notes)
        raise


def _choose(
    name: str,
    env: Mapping[str, str],
    detected: list[Launcher],
    notes: list[tuple[str, str]],
) -> Detection:
    """Pick the launcher named (or auto's choice) among those `detected`, innermost first."""
    chosen: Launcher
    if name == "auto":
        if not detected:
            chosen, info = NONE, NONE.rank_info(env)
            notes.append(("none", "chosen: no launcher detected, running as a single process"))
        else:
            chosen = detected[0]
            notes.append((chosen.name, "chosen: innermost launcher detected"))
            if chosen is MPI:
                chosen, info = _mpi_answer(env, notes)
            else:
                info = chosen.rank_info(env)
        return Detection(info, chosen, chosen.scope(env), tuple(notes))

    chosen = get_launcher(name)
    if chosen is NONE:
        return Detection(NONE.rank_info(env), NONE, NONE.scope(env), tuple(notes))
    if not chosen.detect(env):
        found = detected[0].name if detected else "none"
        raise LauncherNotFoundError(
            chosen.name,
            f"none of its variables are set ({', '.join(v.name for v in chosen.variables[:3])}"
            f", ...); auto-detection finds {found!r}",
            hint=f"use --launcher {found} (or auto), or start the job with {chosen.name}'s launcher",
        )
    if chosen not in detected or detected[0] is chosen:  # a plug-in not opted in, or innermost
        if chosen is MPI:
            _, info = _mpi_answer(env, notes)
            info = info.replace(launcher=MPI.name)
        else:
            info = chosen.rank_info(env)
        return Detection(info, chosen, chosen.scope(env), tuple(notes))

    # The named launcher is an outer layer: acceptable only where MPI ranks are the scheduler's own
    # tasks (srun --mpi=pmix / pmi2, jsrun), which is when both layers agree.
    innermost = detected[0]
    inner_world, outer_world = innermost.world(env), chosen.world(env)
    if innermost is MPI and chosen in SCHEDULERS and _agrees(inner_world, outer_world):
        return Detection(chosen.rank_info(env), chosen, chosen.scope(env), tuple(notes))
    raise LauncherMismatchError(
        chosen.name,
        f"its variables ({_seen(chosen, env, 4)}: {_describe(outer_world)}) describe an outer "
        f"layer; this process was started by {innermost.name} ({_seen(innermost, env, 4)}: "
        f"{_describe(inner_world)})",
        hint=f"use --launcher {innermost.name} or --launcher auto",
    )


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
