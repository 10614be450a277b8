"""``distenv run --log-dir`` and torchrun's ``--redirects``, ``--tee``, ``--local-ranks-filter``.

torchrun (``torch.distributed.run --help``, ``Std.from_str`` in
torch/distributed/elastic/multiprocessing/api.py) writes a stream spec as one number for every
local rank (``3``) or as ``local_rank:number`` pairs (``0:1,1:2``), the number meaning 0 none,
1 stdout, 2 stderr, 3 both. ``--redirects`` sends those streams to the log files only,
``--tee`` to the log files and the console; ``--local-ranks-filter 0,1`` shows only those local
ranks on the console. Under ``distenv run --log-dir DIR`` every rank's two streams are always in
``DIR/rank-N.log`` (the record ``distenv why`` reads); these options decide only what the console
shows, as torchrun's do.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from distenv.errors import ConfigurationError, shown
from distenv.settings import LOG_DIR_VAR
from distenv.variables import decimal

__all__ = [
    "Streams",
    "add_log_options",
    "check_log_options",
    "hidden",
    "local_rank_list",
    "streams",
]

#: A parsed stream spec: one number for every local rank, or one per local rank named.
Streams = int | Mapping[int, int]
#: The descriptors each number names.
_FDS = {0: frozenset(), 1: frozenset({1}), 2: frozenset({2}), 3: frozenset({1, 2})}


def _number(text: str, whole: str) -> int:
    value = decimal(text.strip(), 3)
    if value is None:
        raise argparse.ArgumentTypeError(
            f"{shown(text)} in {shown(whole)} is not 0 (none), 1 (stdout), 2 (stderr) or 3 (both)"
        )
    return value


def streams(text: str) -> Streams:
    """Parse torchrun's stream spec: ``3``, or ``0:1,1:2`` (argparse type)."""
    if ":" not in text:
        return _number(text, text)
    found: dict[int, int] = {}
    for part in text.split(","):
        rank, sep, number = part.partition(":")
        local = decimal(rank.strip())
        if not sep or local is None:
            raise argparse.ArgumentTypeError(
                f"{shown(part)} in {shown(text)} is not LOCAL_RANK:STREAMS, e.g. 0:3"
            )
        found[local] = _number(number, text)
    return found


def local_rank_list(text: str) -> frozenset[int]:
    """Parse ``--local-ranks-filter``: local ranks separated by commas (argparse type)."""
    found = set()
    for part in text.split(","):
        local = decimal(part.strip())
        if local is None:
            raise argparse.ArgumentTypeError(
                f"{shown(part)} in {shown(text)} is not a local rank; expected e.g. 0,1,2"
            )
        found.add(local)
    return frozenset(found)


def _fds(spec: Streams | None, local_rank: int) -> frozenset[int]:
    if spec is None:
        return frozenset()
    number = spec if isinstance(spec, int) else spec.get(local_rank, 0)
    return _FDS[number]


def hidden(redirects: Streams | None, tee: Streams | None, local_rank: int) -> frozenset[int]:
    """Return the descriptors of `local_rank` kept off the console: redirected and not teed."""
    return _fds(redirects, local_rank) - _fds(tee, local_rank)


def add_log_options(add: Callable[..., Any], spellings: Callable[[str], list[str]]) -> None:
    """Add ``--log-dir``, ``--redirects``, ``--tee`` and ``--local-ranks-filter`` to a parser.

    Args:
        add: The parser's ``add_argument``.
        spellings: A long option's spellings (dashes, and torchrun's underscores).
    """
    add(
        *spellings("--log-dir"),
        dest="log_dir",
        type=Path,
        metavar="DIR",
        help="keep each rank's output in DIR/rank-N.log, its failure in rank-N.report and "
        "rank-N.fault (read by `distenv why DIR`), and all output in DIR/output.log "
        "(default: $DISTENV_LOG_DIR)",
    )
    add(
        "-r",
        *spellings("--redirects"),
        dest="redirects",
        type=streams,
        metavar="SPEC",
        help="with --log-dir: keep these streams off the console, in the logs only (torchrun's: "
        "3 both, 1 stdout, 2 stderr, 0 none, or per local rank as 0:1,1:2)",
    )
    add(
        "-t",
        *spellings("--tee"),
        dest="tee",
        type=streams,
        metavar="SPEC",
        help="with --log-dir: show these streams on the console too (torchrun's; the default)",
    )
    add(
        *spellings("--local-ranks-filter"),
        dest="local_ranks_filter",
        type=local_rank_list,
        metavar="LIST",
        help="show only these local ranks' output on the console, e.g. 0,1 (torchrun's)",
    )


def check_log_options(command: str, args: argparse.Namespace, env: Mapping[str, str]) -> None:
    """Refuse ``--redirects`` or ``--tee`` without a log folder to send the streams to.

    Raises:
        ConfigurationError: Naming the option and the fix.
    """
    given = [name for name in ("redirects", "tee") if getattr(args, name) is not None]
    if given and args.log_dir is None and LOG_DIR_VAR not in env:
        raise ConfigurationError(
            command,
            f"--{given[0]} needs --log-dir: it says which streams go to the log files only",
            hint="add --log-dir DIR (a folder for rank-N.log), as with torchrun",
            variable=f"--{given[0]}",
        )
