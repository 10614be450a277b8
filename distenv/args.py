"""`add_launcher_argument`: the ``--launcher`` option, and tolerance of legacy ``--local_rank``."""

from __future__ import annotations

import argparse

from distenv.launchers.registry import CHOICES, checked_name

__all__ = ["add_launcher_argument", "add_launcher_option"]

LOCAL_RANK_OPTIONS = ("--local-rank", "--local_rank")


def add_launcher_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--launcher NAME`` (default ``auto``; built-in names, aliases and plug-ins) to `parser`.

    An unknown name is a usage error (exit 2) that lists the choices.
    """
    parser.add_argument(
        "--launcher",
        default="auto",
        type=checked_name,
        metavar="NAME",
        help=f"how this process was started: {', '.join(CHOICES)}, or a plug-in's name "
        "(default: auto, detected)",
    )


def add_launcher_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--launcher NAME`` (default ``auto``) to `parser`, and accept a legacy ``--local_rank``.

    ``python -m torch.distributed.launch`` (deprecated, still in many job scripts) appends
    ``--local_rank=N`` (torch < 2.0) or ``--local-rank=N`` to the script's arguments. Unless the
    parser already has such an option, a hidden one (``dest="local_rank"``, int, default None)
    swallows it; distenv reads the rank from LOCAL_RANK, which that launcher sets too.

    Args:
        parser: The script's parser.
    """
    add_launcher_option(parser)
    # argparse has no public way to ask for an option; its lookup table is stable since 2.7.
    known = parser._option_string_actions
    if not any(option in known for option in LOCAL_RANK_OPTIONS):
        parser.add_argument(
            *LOCAL_RANK_OPTIONS, dest="local_rank", type=int, default=None, help=argparse.SUPPRESS
        )
