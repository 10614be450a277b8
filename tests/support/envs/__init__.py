"""Environments captured from real launches (and recorded from documentation), and how to compare them."""

from __future__ import annotations

from distenv.rankinfo import RankInfo

# rank, world, local rank, local size, node, nodes (None: left to the roll call)
Layout = tuple[int, int, int, int | None, int | None, int | None]


def layout(info: RankInfo) -> Layout:
    """Return the numbering part of `info`, as the fixtures' expected answers write it."""
    return (
        info.rank,
        info.world_size,
        info.local_rank,
        info.local_world_size,
        info.node_rank,
        info.num_nodes,
    )
