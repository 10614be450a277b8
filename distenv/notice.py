"""Warnings that detection prints (logger ``distenv``), with logging imported only when needed.

Detection warns in rare cases only (a batch script running as rank 0 of 1, stale exported
MASTER_*); importing `logging` for them would cost every ``import distenv`` about 2 ms.
"""

from __future__ import annotations

__all__ = ["LOGGER", "warn"]

LOGGER = "distenv"


def warn(message: str, *args: object) -> None:
    """Log `message` % `args` as a warning on the ``distenv`` logger."""
    import logging

    logging.getLogger(LOGGER).warning(message, *args)
