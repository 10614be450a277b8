"""The `none` launcher backend: a single process, no launcher at all."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from distenv.launchers.base import Launcher
from distenv.rankinfo import RankInfo
from distenv.variables import Var

__all__ = ["NoneLauncher"]


class NoneLauncher(Launcher):
    """A single process: rank 0 of 1 on 127.0.0.1, what ``auto`` finds when nothing else is there.

    It reads no variable, so inherited MASTER_ADDR/MASTER_PORT do not count. The master port is
    left unresolved; `distenv.resolve` (and so `init_dist`) picks a free one, so the same script
    runs unchanged on a laptop.
    """

    name = "none"
    variables: ClassVar[tuple[Var, ...]] = ()

    def detect(self, env: Mapping[str, str]) -> bool:
        return True

    def rank_info(self, env: Mapping[str, str]) -> RankInfo:
        return RankInfo.single(self.name)
