"""Choosing among launcher backends: ``auto`` detection and explicit names.

`choose` answers which launcher's layout describes this process, and what encloses it; where the
master is, is `distenv.master`'s question (`distenv.detection.pipeline` asks both). Detection asks the
launchers' types, never their names: a `Scheduler` is an outer layer, and an
`AllocationLauncher` (MPI) consults every scheduler that encloses it. Before it chooses,
`distenv.detection.agreement` refuses launcher variables left over from another job inside the step
this process belongs to; where nothing is detected, `distenv.detection.starters` refuses a task
whose launcher's variables a container stripped (the process tree, read by the pipeline, says who
started it). Every launcher is asked through its `distenv.detection.layer.Layer`, so each
answer is computed once and handed on in the `Choice`.

Reads the environment only: no torch, no mpi4py, no subprocess.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from distenv.detection.agreement import agrees, describe, refuse_leftovers
from distenv.detection.layer import Layer, Layers
from distenv.detection.signs import multi_process_signs
from distenv.detection.starters import Origin, refuse_stripped
from distenv.errors import (
    DistEnvError,
    InconsistentEnvironmentError,
    LauncherMismatchError,
    LauncherNotFoundError,
    shown,
)
from distenv.launchers import AllocationLauncher, Default, Launcher, Scheduler
from distenv.launchers.registry import NONE, auto_candidates, canonical_name, get_launcher
from distenv.launchers.torchrun import TorchrunLauncher
from distenv.rankinfo import RankInfo

__all__ = ["Choice", "choose"]

#: The verdict on a launcher none of whose variables is set (`distenv info` and `doctor` show
#: all such launchers on one line unless --verbose).
ABSENT = "not detected: no variables"


class Choice(NamedTuple):
    """Which launcher describes this process, and what it found.

    Attributes:
        layer: The backend chosen (the explicit name, or what auto chose), with its answers.
        info: The `RankInfo` of the layout used; its master fields hold only what the layout's
            owner states.
        owner: The layer whose layout `info` is: `layer`, or the scheduler whose tasks the MPI
            ranks are (``srun --mpi=pmix`` with ``--launcher mpi``). Its master rules apply.
        allocation: The enclosing scheduler's master, for a launcher started inside it (MPI).
        considered: One ``(launcher, verdict)`` line per backend looked at, innermost first.
    """

    layer: Layer
    info: RankInfo
    owner: Layer
    allocation: Default | None
    considered: tuple[tuple[str, str], ...]

    @property
    def launcher(self) -> Launcher:
        """The backend chosen."""
        return self.layer.launcher


def _seen(launcher: Launcher, env: Mapping[str, str], limit: int = 6) -> str:
    names = [v.name for v in launcher.variables if env.get(v.name)]
    listed = ", ".join(f"{n}={shown(env[n])}" for n in names[:limit])
    return listed + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def _alone(layer: Layer, notes: list[tuple[str, str]]) -> Choice:
    """The answer of a layer whose own layout describes this process."""
    return Choice(layer, layer.rank_info(), layer, None, tuple(notes))


def _enclosed(inner: Layer, detected: Sequence[Layer], notes: list[tuple[str, str]]) -> Choice:
    """Answer for ranks of `inner` (MPI): a scheduler's layout when it agrees, else its own."""
    inner_world = inner.world()
    outer = [s for s in detected if isinstance(s.launcher, Scheduler)]
    for scheduler in outer:
        world = scheduler.world()
        if agrees(inner_world, world):
            notes.append(
                (
                    scheduler.name,
                    f"agrees with {inner.name} ({describe(world)}): its layout and hosts used",
                )
            )
            return _alone(scheduler, notes)
        notes.append(
            (
                scheduler.name,
                f"outer layer: {describe(world)} vs {inner.name}'s {describe(inner_world)}",
            )
        )
    nodes = next((n for s in outer if (n := s.daemon_nodes()) is not None), None)
    info = inner.placed_rank_info(nodes)
    allocation = next((a for s in outer if (a := s.allocation_master()) is not None), None)
    return Choice(inner, info, inner, allocation, tuple(notes))


def choose(
    launcher: str, env: Mapping[str, str], origin: Callable[[], Origin] | None = None
) -> Choice:
    """Choose the launcher named (``auto``: the innermost detected) and read its layout.

    Args:
        launcher: ``auto`` or a launcher name.
        env: The environment to read.
        origin: Reads what the process tree says of this process, asked only where no launcher
            is detected (`distenv.detection.starters`); None: nothing is asked.

    Raises:
        DistEnvError: If the environment is incomplete, malformed, or contradicts the name given;
            its ``considered`` lists what detection looked at.
    """
    name = canonical_name(launcher)
    layers = Layers(env)
    candidates = [layers[c] for c in auto_candidates(env)]
    detected = [c for c in candidates if c.detected()]
    notes: list[tuple[str, str]] = [
        (
            c.name,
            f"detected ({_seen(c.launcher, env)})" if c in detected else ABSENT,
        )
        for c in candidates
    ]
    try:
        if name == "auto" and not detected:
            _refuse_signs([c.launcher for c in candidates], env)
            if origin is not None:
                refuse_stripped(origin())
        choice = _choose(name, layers, detected, notes, origin)
    except DistEnvError as exc:
        exc.considered = tuple(notes)
        raise
    # A restart at any layer counts: a requeued sbatch job restarts the torchrun, mpirun or
    # `distenv run` inside it, whose own count starts again at 0.
    counted = {id(c): c for c in (*detected, choice.layer, choice.owner)}
    restarts = sum(layer.restart_count() for layer in counted.values())
    if restarts != choice.info.restart_count:
        choice = choice._replace(info=choice.info.replace(restart_count=restarts))
    return choice


def _refuse_signs(launchers: Sequence[Launcher], env: Mapping[str, str]) -> None:
    """Refuse to run alone where the environment says this process is one of several."""
    signs = multi_process_signs(launchers, env)
    if not signs:
        return
    first = signs[0]
    seen = ", ".join(f"{s.name}={shown(s.value)} ({s.launcher})" for s in signs[:4])
    raise InconsistentEnvironmentError(
        "auto",
        f"no launcher distenv reads started this process, but {seen} say it is one of several "
        "processes of a job: run alone it would be rank 0 of 1, a separate training on every "
        "node",
        hint="start the ranks with a launcher distenv reads (torchrun, or one `distenv run "
        "--nnodes N --node-rank K --master-addr HOST --run-id ID` per node), or add a launcher "
        "plug-in for it (docs/plugins.md); to run this process alone on purpose, pass "
        "--launcher none (distenv run: --standalone)",
        variable=first.name,
        value=first.value,
    )


def _named_torchrun(layer: Layer) -> bool:
    """Whether ``--launcher pytorch`` names a contract that auto detection leaves to Azure ML."""
    launcher = layer.launcher
    return isinstance(launcher, TorchrunLauncher) and launcher.named_detect(layer.env)


def _choose(
    name: str,
    layers: Layers,
    detected: list[Layer],
    notes: list[tuple[str, str]],
    origin: Callable[[], Origin] | None = None,
) -> Choice:
    """Pick the launcher named (or auto's choice) among those `detected`, innermost first."""
    env = layers.env
    if name == "auto":
        if not detected:
            notes.append(("none", "chosen: no launcher detected, running as a single process"))
            return _alone(layers[NONE], notes)
        translated = refuse_leftovers(None, layers, detected, notes)
        detected = [d for d in detected if d is not translated]
        chosen = detected[0]
        notes.append((chosen.name, "chosen: innermost launcher detected"))
        if isinstance(chosen.launcher, AllocationLauncher):
            return _enclosed(chosen, detected[1:], notes)
        return _alone(chosen, notes)

    chosen = layers[get_launcher(name)]
    if chosen.launcher is NONE:
        return _alone(chosen, notes)
    if not chosen.detected() and not _named_torchrun(chosen):
        found = detected[0].name if detected else "none"
        if found == "none" and origin is not None:  # stripped by a container, or truly absent
            refuse_stripped(origin())
        start = chosen.launcher.how_to_start or f"start the job with {chosen.name}'s launcher"
        raise LauncherNotFoundError(
            chosen.name,
            f"none of its variables are set ({', '.join(v.name for v in chosen.launcher.variables[:3])}"
            f", ...); auto-detection finds {found!r}",
            # Nothing detected (a login node): starting the job is the fix, not --launcher none.
            hint=f"{start}; or use --launcher {found} (or auto) to run here as a single process"
            if found == "none"
            else f"use --launcher {found} (or auto), or {start}",
        )
    translated = refuse_leftovers(chosen, layers, detected, notes)
    detected = [d for d in detected if d is not translated]
    if chosen not in detected or detected[0] is chosen:  # a plug-in not opted in, or innermost
        if isinstance(chosen.launcher, AllocationLauncher):
            # The name asked for wins over an agreeing scheduler's: its layout, labelled as asked.
            outer = [d for d in detected if d is not chosen]
            answer = _enclosed(chosen, outer, notes)
            info = answer.info.replace(launcher=chosen.name)
            return Choice(chosen, info, answer.owner, answer.allocation, answer.considered)
        return _alone(chosen, notes)

    # The named launcher is an outer layer: acceptable only where the inner launcher's ranks are
    # the scheduler's own tasks (srun --mpi=pmix / pmi2, jsrun), which is when both layers agree.
    innermost = detected[0]
    inner_world, outer_world = innermost.world(), chosen.world()
    if (
        isinstance(innermost.launcher, AllocationLauncher)
        and isinstance(chosen.launcher, Scheduler)
        and agrees(inner_world, outer_world)
    ):
        return _alone(chosen, notes)
    raise LauncherMismatchError(
        chosen.name,
        f"its variables ({_seen(chosen.launcher, env, 4)}: {describe(outer_world)}) describe an "
        f"outer layer; this process was started by {innermost.name} "
        f"({_seen(innermost.launcher, env, 4)}: {describe(inner_world)})",
        hint=f"use --launcher {innermost.name} or --launcher auto",
    )
