"""What `init_dist` or `setup` decided for this process: read by the helpers, kept for a retry.

The only module-level state of distenv. It is written once per successful `setup`/`init_dist`
(`remember`) and never by anything else.
"""

from typing import NamedTuple

from distenv.rankinfo import LAYOUT_FIELDS, RankInfo

__all__ = [
    "State",
    "current",
    "current_device",
    "current_info",
    "gpu_sharing_allowed",
    "kept",
    "remember",
    "same_rank",
]


# A NamedTuple, not a frozen dataclass (~0.6 ms to create, paid inside every bootstrap), and without
# string annotations (typing compiles each one when the class is made).
class State(NamedTuple):
    """What the last `setup` or `init_dist` of this process decided."""

    info: RankInfo
    scope: str
    device: int | None
    allow_gpu_sharing: bool


_state: State | None = None


def current() -> State | None:
    """Return the last `State` remembered, if any."""
    return _state


def remember(state: State | None) -> None:
    """Record `state` as this process's (None forgets it: tests, a destroyed group)."""
    global _state
    _state = state


def current_info() -> RankInfo | None:
    """Return the `RankInfo` the last `init_dist` or `setup` of this process used, if any."""
    return None if _state is None else _state.info


def current_device() -> int | None:
    """Return the CUDA device index `init_dist`/`setup` selected for this rank (None: CPU)."""
    return None if _state is None else _state.device


def gpu_sharing_allowed() -> bool:
    """Return the ``allow_gpu_sharing`` given to the last `init_dist`/`setup` (False if none)."""
    return _state is not None and _state.allow_gpu_sharing


def same_rank(a: RankInfo, b: RankInfo) -> bool:
    """Whether two answers describe the same rank (the master port may differ: `none` picks anew).

    A node layout the launcher left unknown (None) matches the one the roll call filled in.
    """
    unknown = tuple(name for name in LAYOUT_FIELDS if getattr(b, name) is None)
    ignore = ("master_addr", "master_port", *unknown)
    return {k: v for k, v in a.to_dict().items() if k not in ignore} == {
        k: v for k, v in b.to_dict().items() if k not in ignore
    }


def kept(info: RankInfo) -> RankInfo:
    """Return the remembered `RankInfo` when `info` describes the same rank, else `info`.

    A second `init_dist`/`setup` keeps the first answer, so MASTER_PORT (a fresh free port for
    `none`) does not change under a group that already uses it.
    """
    if _state is not None and same_rank(_state.info, info):
        return _state.info
    return info
