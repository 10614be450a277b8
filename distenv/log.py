"""`get_logger`: a logger that speaks on chosen ranks only and says which rank is speaking."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from distenv import comm

__all__ = ["FORMAT", "RankFilter", "get_logger"]

FORMAT = "%(asctime)s rank%(rank)s %(levelname)s %(name)s: %(message)s"


class RankFilter(logging.Filter):
    """Pass records on the chosen ranks only, and give every record a ``rank`` attribute.

    The rank is looked up per record, so a logger made before `init_dist` is right after it.

    Attributes:
        ranks: The global ranks whose records pass; None for every rank.
    """

    def __init__(self, ranks: Iterable[int] | None) -> None:
        super().__init__()
        self.ranks = None if ranks is None else frozenset(ranks)

    def filter(self, record: logging.LogRecord) -> bool:
        """Return whether `record` is on a chosen rank, after stamping its ``rank``."""
        rank = comm.known_rank()
        record.rank = rank
        return self.ranks is None or rank in self.ranks


def get_logger(
    name: str, ranks: Iterable[int] | None = (0,), *, level: int = logging.INFO
) -> logging.Logger:
    """Return the logger `name`, printing to stderr on `ranks` only, with the rank in each line.

    Calling it again for the same name changes its ranks and level and adds no second handler.
    Records do not propagate to the root logger, so a ``logging.basicConfig`` does not print
    them twice (or on every rank).

    Args:
        name: The logger's name (``"distenv"`` shows distenv's own messages).
        ranks: Global ranks whose records are shown; None for all. Before `init_dist` or `setup`
            every process counts as rank 0.
        level: The logger's level.
    """
    logger = logging.getLogger(name)
    logger.setLevel(level)
    logger.propagate = False
    ours = [f for f in logger.filters if isinstance(f, RankFilter)]
    for old in ours:
        logger.removeFilter(old)
    rank_filter = RankFilter(ranks)
    # On the logger: it stops the record before any handler (and propagation) sees it.
    logger.addFilter(rank_filter)
    handler = next((h for h in logger.handlers if getattr(h, "_distenv", False)), None)
    if handler is None:
        handler = logging.StreamHandler()
        handler._distenv = True  # type: ignore[attr-defined]
        handler.setFormatter(logging.Formatter(FORMAT))
        logger.addHandler(handler)
    for old in [f for f in handler.filters if isinstance(f, RankFilter)]:
        handler.removeFilter(old)
    # On the handler too: records of child loggers reach it without the logger's filter.
    handler.addFilter(rank_filter)
    return logger
