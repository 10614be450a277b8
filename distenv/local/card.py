"""The first-failure card: the few lines ``distenv run`` prints last when a rank of the job failed.

One card per job, from the `Witness` of the node where the first failure happened::

    distenv run: rank 2 failed first: raised ValueError: bad batch at step 3 (exit status 1)
      rank:    2 of 4, local rank 2 on node-a, pid 3045, at 17:30:26, 5.1 s after the start
      where:   train.py:31 in inject: raise ValueError(f"bad batch at step {step}")
      from:    train.py:43 in train: inject(mode, step)
      output:  rank 2 at step 3
      others:  ranks 0-1,3 failed within 0.3 s after it (RuntimeError: Connection closed by peer)
      log:     /tmp/distenv-run-t9hw/output.log holds every rank's output; held back here: 39
               lines of ranks 0-1,3 (tracebacks: 3, closed connections: 3); DISTENV_DEBUG=1 ...

"First" is by when a rank failed (its report's time, its crash), not by when its process exited: a
survivor whose collective broke because of it fails later, and is counted among the others.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Protocol

from distenv.exits import DEBUG_VAR
from distenv.local.ends import CONSEQUENCES, End
from distenv.local.stopping import describe_exit
from distenv.local.witness import Witness
from distenv.postmortem.failure import PEER_WORDS
from distenv.postmortem.stacks import rank_ranges

__all__ = ["Seen", "card", "elsewhere_card", "log_line", "rank_ranges"]

#: The longest text of one card line's value.
WIDTH = 160
#: Signals whose death is a crash in native code, which the card says in words.
_CRASHES = {"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT"}


class Seen(Protocol):
    """What a card is made of: how the ranks ended, and what was held back of the console.

    A node's `Witness` under ``distenv run``; the records of a log folder for ``distenv why``.
    """

    started_at: float
    stop_at: float | None
    held: Counter[str]
    held_ranks: set[int]

    def ends(self, *, everyone: bool = False) -> list[End]:
        """Return how each rank that failed (or, `everyone`, ended) ended, the cause first."""
        ...


def _ranks(ranks: Iterable[int]) -> str:
    ranks = sorted(set(ranks))
    return f"rank{'s' * (len(ranks) > 1)} {rank_ranges(ranks)}"


def _clean(text: str | bytes, width: int = WIDTH) -> str:
    """Return `text` on one line, unprintable characters escaped, cut at `width`."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text.strip())
    return shown if len(shown) <= width else shown[: width - 3] + "..."


def _what(end: End) -> str:
    """Return a failure in a few words: a peer-broken collective by torch's words for it."""
    if end.report is None:
        return describe_exit(end.returncode)
    what = end.report.what
    kind = what.partition(":")[0]
    if end.report.peer:
        words = [w for w in PEER_WORDS if w in what]
        return f"{kind}: {words[0]}" if words else kind
    return _clean(what, 60)


def how(end: End, stopper: str = "distenv run") -> str:
    """Return ``raised ValueError: bad batch (exit status 1)`` or ``was killed by SIGSEGV``."""
    if end.report is not None:
        what = _clean(end.report.what, 120)
        ended = describe_exit(end.returncode)
        if what.startswith("SystemExit"):
            return f"{ended} ({what})"
        if end.returncode < 0:  # stopped while it was exiting
            return f"raised {what} (then {ended})"
        return f"raised {what} (exit status {end.returncode})"
    said = describe_exit(end.returncode)
    if end.oom:
        return f"{said}: killed by the kernel's OOM killer"
    if said.endswith(tuple(_CRASHES)):
        return f"{said} (a crash in native code)"
    if said.endswith("SIGKILL"):
        return f"{said}, sent from outside {stopper} (the OOM killer was not seen)"
    return said


def _others(cause: End, others: Sequence[End], stop_at: float | None, stopper: str) -> str:
    """Return what the other local ranks did after `cause` failed."""
    parts = []
    peer = [e for e in others if e.report is not None and e.report.peer and not e.stopped]
    broke = [e for e in others if e.failed and not e.stopped and (e.at >= cause.at or e in peer)]
    if broke:
        whats = {_what(e) for e in broke}
        why = f" ({whats.pop()})" if len(whats) == 1 else ""
        delay = max(0.0, max(e.at for e in broke) - cause.at)
        parts.append(f"{_ranks(e.rank for e in broke)} failed within {delay:.1f} s after it{why}")
    earlier = [e for e in others if e.failed and not e.stopped and e not in broke]
    if earlier:  # a crash by signal outranks them: a peer's failure makes a rank raise, not crash
        parts.append(f"{_ranks(e.rank for e in earlier)} failed before it was seen dead")
    finished = [e for e in others if not e.failed and not e.stopped]
    if finished:
        parts.append(f"{_ranks(e.rank for e in finished)} had finished")
    stopped = [e.rank for e in others if e.stopped and e not in broke + earlier]
    if stopped:
        when = "" if stop_at is None else f" {max(0.0, stop_at - cause.at):.1f} s"
        parts.append(f"{_ranks(stopped)} stopped by {stopper}{when} after rank {cause.rank} failed")
    return "; ".join(parts) if parts else "no other rank ran here"


def _held(witness: Seen) -> str | None:
    held = witness.held
    if not held["lines"]:
        return None
    kinds = [f"{kind}: {held[kind]}" for kind in CONSEQUENCES if held[kind]]
    lines = f"{held['lines']} line{'s' * (held['lines'] != 1)}"
    detail = f" ({', '.join(kinds)})" if kinds else ""
    return f"{lines} of {_ranks(witness.held_ranks)}{detail}"


def card(
    witness: Seen,
    cause: End,
    world_size: int,
    host: str,
    log: str,
    *,
    title: str = "distenv run",
    stopper: str = "distenv run",
) -> list[str]:
    """Return the card's lines for `cause`, the job's first failure, which happened on this node.

    Args:
        witness: This node's witness once every local rank has ended, or a log folder's records.
        cause: The failure the card is about.
        world_size: The job's number of ranks.
        host: The host name of `cause`.
        log: The card's last line: where the whole output is (`log_line`).
        title: Who prints the card (its first word).
        stopper: Who stopped the ranks that ended after `cause` failed.
    """
    started = max(0.0, cause.at - witness.started_at)
    clock = time.strftime("%H:%M:%S", time.localtime(cause.at))
    lines = [
        f"{title}: rank {cause.rank} failed first: {how(cause, stopper)}",
        f"  rank:    {cause.rank} of {world_size}, local rank {cause.local_rank} on {_clean(host, 80)}, "
        f"pid {cause.pid}, at {clock}, {started:.1f} s after the start",
    ]
    frames = cause.report.frames if cause.report is not None else cause.fault
    if cause.report is not None and cause.report.kind != "exception":
        frames = frames[-1:]  # a refusal, an import or usage error: its own line says the rest
    for i, frame in enumerate(reversed(frames)):  # innermost first: where it failed
        lines.append(f"  {'where:' if i == 0 else 'from:':<8} {_clean(frame)}")
    if not frames and cause.report is None:
        why = "nothing is written at SIGKILL" if cause.returncode == -9 else "it raised nothing"
        lines.append(f"  where:   not recorded ({why})")
    for i, text in enumerate(cause.last):
        lines.append(f"  {'output:' if i == 0 else '':<8} {_clean(text)}")
    others = [e for e in witness.ends(everyone=True) if e.rank != cause.rank]
    lines.append(f"  others:  {_others(cause, others, witness.stop_at, stopper)}")
    return [*lines, log]


def elsewhere_card(witness: Witness, first: str | None) -> list[str]:
    """Return the card of a node whose ranks failed only as consequences of another node's rank.

    Args:
        witness: This node's witness, once every local rank has ended.
        first: The job's first failure, as the agents recorded it, if known.
    """
    broke = [e for e in witness.ends() if e.report is not None and e.report.peer]
    cause = f"the first failure: {first}" if first else "the cause is on another node: see its card"
    lines = [f"distenv run: no rank on this node failed first; {cause}"]
    if broke:
        whats = {_what(e) for e in broke}
        why = f" ({whats.pop()})" if len(whats) == 1 else ""
        lines.append(
            f"  here:    {_ranks(e.rank for e in broke)} failed in a collective a peer broke{why}"
        )
    return [*lines, log_line(witness)]


def log_line(witness: Witness) -> str:
    """Return the line naming the log, with what was held back of the console."""
    held = _held(witness)
    kept = f"; held back here: {held}" if held else ""
    return (
        f"  log:     {witness.run_dir.log} holds every rank's output{kept}; "
        f"{DEBUG_VAR}=1 shows it all"
    )
