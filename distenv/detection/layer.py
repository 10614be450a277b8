"""One launcher layer over one environment, each of its answers computed at most once.

One detection asks a launcher the same questions from several places: whether it is present,
how it numbers this process (`Launcher.world`), its layout (`Launcher.rank_info`), its export
tag, its default master. `distenv.detection.agreement`, `distenv.detection.choice` and `distenv.detection.pipeline` ask a
`Layer` instead: it asks the launcher once and keeps the answer, or the `DistEnvError` the
launcher raised, for the rest of the detection. `Layers` holds one `Layer` per launcher, so
that every part of a detection shares the same answers.

Reads the environment only: no torch, no mpi4py, no subprocess.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar, cast

from distenv.errors import DistEnvError, InconsistentEnvironmentError
from distenv.launchers import AllocationLauncher, Default, Launcher, Nodes, Scheduler, World
from distenv.rankinfo import RankInfo

__all__ = ["Layer", "Layers"]

_T = TypeVar("_T")


class Layer:
    """One launcher's answers about one environment, each asked of it at most once.

    Attributes:
        launcher: The backend asked.
        env: The environment it reads.
    """

    __slots__ = ("_answers", "env", "launcher")

    def __init__(self, launcher: Launcher, env: Mapping[str, str]) -> None:
        self.launcher = launcher
        self.env = env
        self._answers: dict[str, tuple[bool, object]] = {}

    def __repr__(self) -> str:
        return f"Layer({self.launcher.name!r})"

    @property
    def name(self) -> str:
        """The launcher's name."""
        return self.launcher.name

    def _once(self, hook: str, ask: Callable[[], _T]) -> _T:
        """Return `ask`'s answer, asked on the first call only; its `DistEnvError` is raised again."""
        if hook not in self._answers:
            try:
                self._answers[hook] = (True, ask())
            except DistEnvError as exc:
                self._answers[hook] = (False, exc)
        answered, value = self._answers[hook]
        if not answered:
            raise cast(DistEnvError, value)
        return cast(_T, value)

    def detected(self) -> bool:
        """Whether the launcher's variables are present (`Launcher.detect`)."""
        return self._once("detect", lambda: self.launcher.detect(self.env))

    def world(self) -> World | None:
        """``(rank, size)`` as this layer states them (`Launcher.world`).

        Raises:
            InconsistentEnvironmentError: The rank is not below the size (naming both variables):
                a layer that contradicts itself cannot tell nested launchers apart.
        """
        return self._once("world", self._checked_world)

    def _checked_world(self) -> World | None:
        world = self.launcher.world(self.env)
        if world is not None and world[1] is not None and not 0 <= world[0] < world[1]:
            raise InconsistentEnvironmentError(
                self.name,
                f"{self.named(world)} number this process rank {world[0]} of {world[1]}, "
                "outside its world",
                hint="let the launcher set its variables; unset any inherited from another job "
                "or set by hand",
                variable=self.named(world).split("=", 1)[0],
                value=str(world[0]),
            )
        return world

    def named(self, world: World) -> str:
        """Return ``VAR=value`` for the declared variables that hold `world`'s rank and size."""
        parts = []
        for field, value in zip(("rank", "world_size"), world, strict=True):
            if value is None:
                continue
            name = next(
                (
                    v.name
                    for v in self.launcher.variables
                    if v.field == field and (self.env.get(v.name) or "").strip() == str(value)
                ),
                field,
            )
            parts.append(f"{name}={value}")
        return " ".join(parts)

    def rank_info(self) -> RankInfo:
        """This layer's layout (`Launcher.rank_info`)."""
        return self._once("rank_info", lambda: self.launcher.rank_info(self.env))

    def placed_rank_info(self, nodes: Nodes | None) -> RankInfo:
        """The layout of an `AllocationLauncher`, its nodes numbered by a daemon step's `nodes`.

        Without `nodes` it is the launcher's own layout (`rank_info`, kept: the agreement check
        may have read it); with them it is asked once per detection, by
        `distenv.detection.choice` alone, and not kept.
        """
        launcher = self.launcher
        if not isinstance(launcher, AllocationLauncher) or nodes is None:
            return self.rank_info()
        return launcher.placed_rank_info(self.env, nodes)

    def job_tag(self) -> str:
        """The export tag of this layer's job step (`Launcher.scope`)."""
        return self._once("scope", lambda: self.launcher.scope(self.env))

    def restart_count(self) -> int:
        """How many times this layer restarted the job or rank (`Launcher.restart_count`)."""
        return self._once("restart_count", lambda: self.launcher.restart_count(self.env))

    def default_master(self) -> Default | None:
        """Where this layer puts rank 0's store when nobody says (`Launcher.default_master`)."""
        return self._once("default_master", lambda: self.launcher.default_master(self.env))

    def daemon_nodes(self) -> Nodes | None:
        """A `Scheduler`'s node numbering of an MPI daemon step; None for other launchers."""
        launcher = self.launcher
        if not isinstance(launcher, Scheduler):
            return None
        return self._once("daemon_nodes", lambda: launcher.daemon_nodes(self.env))

    def allocation_master(self) -> Default | None:
        """A `Scheduler`'s master for a launcher inside its allocation; None for others."""
        launcher = self.launcher
        if not isinstance(launcher, Scheduler):
            return None
        return self._once("allocation_master", lambda: launcher.allocation_master(self.env))


class Layers:
    """The layers of one environment: one `Layer` per launcher, made when first asked for."""

    __slots__ = ("_made", "env")

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self._made: dict[int, Layer] = {}

    def __getitem__(self, launcher: Launcher) -> Layer:
        layer = self._made.get(id(launcher))
        if layer is None:
            layer = self._made[id(launcher)] = Layer(launcher, self.env)
        return layer
