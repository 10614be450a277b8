"""The hang autopsy of ``init_dist(hang_timeout=S)``: over the job's store, under any launcher.

``distenv run --hang-timeout`` has a supervisor on the node that asks its ranks for their stacks
(`distenv.local.autopsy`). Under srun, mpirun or torchrun nobody is there, so the job's store is
the channel (its keys: `distenv.bootstrap.protocol`, phase ``hang``). After `init_dist`, each rank
runs

- the watchdog of `distenv.postmortem.progress`, which samples its rank's progress; when the rank made none
  for S seconds, it writes `HUNG` (compare_set: the first stuck rank wins) and then every rank's
  `ALARM` key in one multi_set;
- one daemon thread that waits on its rank's `ALARM` key in the store, over a connection of its
  own (a wait holds its connection): nothing is sent while training runs.

Once alarmed, each rank posts its main thread's stack (`STACK`, faulthandler's format, bounded:
`distenv.postmortem.stacks.thread_text`) and, with ``$DISTENV_LOG_DIR``, appends every thread's stack to
``DIR/rank-N.fault`` (faulthandler's own dump, which ``distenv why`` reads). Rank 0 collects the
stacks for `DUMP_WAIT` at most, groups them (`distenv.postmortem.stacks`) and prints the card once to stderr::

    distenv: the job hung: rank 2's stack differs from the other ranks'
      first:   rank 2 on n2 made no progress for 3 s, since 18:01:22, at train.py:54 in train
      differs: rank 2 at train.py:54 in train: time.sleep(600)
      others:  ranks 0-1,3 waiting in all_reduce at train.py:88 in train: dist.all_reduce(x)
      stopped: every rank that answered ends itself with status 124, as timeout(1)

as it writes `CARD`; where rank 0 wrote none `DUMP_WAIT` + `CARD_WAIT` later (its process is
gone under torchrun's agent store), the lowest rank that posted a stack collects instead. Every
rank that answered then flushes its output and points its stdout and stderr at /dev/null (once
one rank ends, its peers' collectives break and their main threads raise: their tracebacks
would bury the card), counts itself in `ENDED`, waits for the others (`CARD_WAIT` at most) and
ends with status `HANG_STATUS` (``os._exit``): the launcher ends the job now, not at the
collective timeout. A main thread that raised meanwhile waits at exit for its hang thread to
end the process. A rank that exits normally wakes its own thread (`ALARM_EXIT`) and joins it,
so that no thread of distenv's waits in C++ while the interpreter finalises
(`distenv.bootstrap.teardown` says why that aborts).
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import faulthandler
import json
import os
import sys
import threading
import time
from typing import Any, NamedTuple

from distenv._hosts import this_host
from distenv.bootstrap.protocol import (
    ALARM,
    ALARM_EXIT,
    ALARM_HUNG,
    CARD,
    ENDED,
    HANG,
    HUNG,
    STACK,
)
from distenv.bootstrap.records import Fields, ForeignRecordError, load_json
from distenv.bootstrap.session import Session
from distenv.bootstrap.waits import peek, read_many, wait_count, wait_keys, wait_value
from distenv.deadline import Deadline
from distenv.postmortem import progress
from distenv.postmortem.ranklog import current
from distenv.postmortem.stacks import (
    DUMP_WAIT,
    HANG_STATUS,
    Frame,
    clip,
    main_stack,
    summary,
    suspects,
    thread_text,
)

__all__ = ["CARD_WAIT", "Hung", "arm", "card"]

#: How long a rank waits for the card beyond `DUMP_WAIT` before the lowest rank that posted
#: collects in rank 0's place, and how long a collector waits for the others to end first.
CARD_WAIT = 2.0
#: The store requests of the hang thread and the watchdog time out after this (not the waits).
REQUEST_S = 10.0
#: One wait of the hang thread on its alarm; it waits again at once (a bounded wait, no polling).
ALARM_WAIT_S = 3600.0
#: How long the hang thread pauses after finding its alarm key holding what distenv never writes.
FOREIGN_PAUSE_S = 1.0
#: The most bytes of a `HUNG` record, and the latest time it may name (the year 5138).
MAX_HUNG_BYTES, MAX_TIME = 4096, 1e11
#: The most bytes of a posted stack (`distenv.postmortem.stacks.thread_text` writes at most 100 frames).
MAX_POST_BYTES = 64 << 10
_HUNG_FIELDS = frozenset(("rank", "host", "where", "since"))
_POST_FIELDS = frozenset(("host", "stack"))


class Hung(NamedTuple):
    """The `HUNG` record: the first rank found stuck, its host, where and since when."""

    rank: int
    host: str
    where: str
    since: float

    def encode(self) -> str:
        """Return the record's JSON."""
        return json.dumps(self._asdict(), ensure_ascii=True)

    @classmethod
    def parse(cls, raw: bytes) -> Hung:
        """Return the record in `raw`, validated (`ForeignRecordError` if distenv did not write it)."""
        fields = Fields(HUNG.name, load_json(HUNG.name, raw, MAX_HUNG_BYTES), _HUNG_FIELDS)
        where, since = fields.data["where"], fields.data["since"]
        if type(where) is not str or type(since) is not float or not 0 <= since < MAX_TIME:
            raise ForeignRecordError(HUNG.name, "field 'where' or 'since' is not of its type")
        return cls(fields.integer("rank"), fields.text("host", "hostname"), where, since)


def _post(raw: bytes, key: str) -> tuple[str, tuple[Frame, ...]]:
    """Return the host and main-thread stack of a `STACK` record (`ForeignRecordError` if not ours)."""
    fields = Fields(key, load_json(key, raw, MAX_POST_BYTES), _POST_FIELDS)
    stack = fields.data["stack"]
    if type(stack) is not str:
        raise ForeignRecordError(key, "field 'stack' is not a string")
    return fields.text("host", "hostname"), main_stack(stack.encode("utf-8", "replace"))


def card(
    hung: Hung | None,
    timeout: float,
    stacks: dict[int, tuple[Frame, ...]],
    missing: list[int],
    log_dir: str | None,
) -> str:
    """Return the hang card: the suspects, the first stuck rank, the grouped stacks, the end."""
    if hung is None:
        first = "  first:   (the stuck rank's record was unreadable)"
    else:
        clock = time.strftime("%H:%M:%S", time.localtime(hung.since))
        first = (
            f"  first:   rank {hung.rank} on {hung.host} made no progress for {timeout:g} s, "
            f"since {clock}, at {clip(hung.where)}"
        )
    lines = [f"distenv: the job hung: {suspects(stacks)}", first, *summary(stacks, missing)]
    if log_dir is not None:
        lines.append(f"  stacks:  {clip(log_dir)}/rank-N.fault hold every thread's stack")
    lines.append(
        f"  stopped: every rank that answered ends itself with status {HANG_STATUS}, as timeout(1)"
    )
    return "\n".join(lines) + "\n"


class _Autopsy:
    """One rank's side of the in-process autopsy (module docstring)."""

    def __init__(self, session: Session, timeout: float, log_dir: str | None) -> None:
        from torch._C._distributed_c10d import PrefixStore

        keys = session.keys(HANG)
        self.info = session.info
        self.timeout, self.log_dir = timeout, log_dir
        self.host = this_host()  # as the records carry it (distenv._hosts.record_host)
        # Two connections of this rank's own: the hang thread's waits hold the first.
        self.waiter: Any = PrefixStore(keys, session.connection(REQUEST_S))
        self.poster: Any = PrefixStore(keys, session.connection(REQUEST_S))
        self.thread = threading.Thread(target=self._wait, name="distenv-hang", daemon=True)
        self.alarmed = threading.Event()

    def stuck(self, where: str, since: float) -> None:
        """The watchdog's call: post `HUNG` if no rank did, then alarm every rank."""
        record = Hung(self.info.rank, self.host, where, since).encode()
        with contextlib.suppress(Exception):  # the store is gone: the job is ending anyway
            if bytes(self.poster.compare_set(HUNG.name, "", record)) != record.encode():
                return  # another rank was found stuck first: it alarms everyone
            ranks = range(self.info.world_size)
            self.poster.multi_set([ALARM.of(r) for r in ranks], [ALARM_HUNG] * len(ranks))

    def close(self) -> None:
        """At exit: wake this rank's hang thread and let it end before finalisation, or, once
        the job hung (the main thread raised from a broken collective), let it end the process
        with `HANG_STATUS` first."""
        if self.alarmed.is_set():
            self.thread.join(3 * (DUMP_WAIT + CARD_WAIT))  # it calls os._exit within that
            return
        if not self.thread.is_alive():
            return
        with contextlib.suppress(Exception):  # the store may be gone already: the wait ended too
            self.poster.set(ALARM.of(self.info.rank), ALARM_EXIT)
        self.thread.join(CARD_WAIT)

    def _wait(self) -> None:
        """Wait on this rank's alarm for as long as the process lives; run the autopsy on it."""
        key = ALARM.of(self.info.rank)
        try:
            while True:
                value = wait_value(self.waiter, key, Deadline.after(ALARM_WAIT_S))
                if value == ALARM_EXIT:
                    return
                if value == ALARM_HUNG:
                    break
                if value is not None:  # not distenv's: look again later, never spin on it
                    time.sleep(FOREIGN_PAUSE_S)
        except Exception:  # the store is gone: the job is ending, there is nobody to tell
            return
        self.alarmed.set()
        with contextlib.suppress(Exception):
            self._autopsy()
        _silence()
        os._exit(HANG_STATUS)

    def _autopsy(self) -> None:
        """Post this rank's stack; collect (rank 0, or in its place) or wait for the card; then
        close this rank's output and end together with the others that answered."""
        main = threading.main_thread().ident or 0
        text = thread_text(main, sys._current_frames().get(main))
        post = json.dumps({"host": self.host, "stack": text}, ensure_ascii=True)
        self.waiter.set(STACK.of(self.info.rank), post)
        self._write_fault()
        wait = Deadline.after(DUMP_WAIT + CARD_WAIT)
        printed = None if self.info.rank == 0 else wait_value(self.waiter, CARD.name, wait)
        if printed is None and (self.info.rank == 0 or self._lowest()):
            printed = self._collect()
        elif printed is None:  # the lowest rank that posted collects: give it the time
            printed = wait_value(self.waiter, CARD.name, Deadline.after(DUMP_WAIT + CARD_WAIT))
        # Once a rank ends, its peers' collectives break and their main threads raise: silenced
        # first, they cannot bury the card under tracebacks, whatever order they end in.
        _silence()
        self.waiter.add(ENDED.name, 1)
        wait_count(self.waiter, ENDED.name, _answered(printed), Deadline.after(CARD_WAIT))

    def _lowest(self) -> bool:
        """Return whether no rank below this one posted its stack (this one collects)."""
        return not any(self.waiter.check([STACK.of(r)]) for r in range(self.info.rank))

    def _collect(self) -> bytes:
        """Read every rank's stack (within `DUMP_WAIT`), print the card once; return `CARD`."""
        world = self.info.world_size
        keys = [STACK.of(r) for r in range(world)]
        wait_keys(self.waiter, keys, Deadline.after(DUMP_WAIT))
        stacks: dict[int, tuple[Frame, ...]] = {}
        for rank, raw in enumerate(read_many(self.waiter, keys)):
            with contextlib.suppress(ForeignRecordError):
                if raw is not None:
                    stacks[rank] = _post(raw, keys[rank])[1]
        hung = None
        with contextlib.suppress(ForeignRecordError):
            raw_hung = peek(self.waiter, HUNG.name)
            hung = None if raw_hung is None else Hung.parse(raw_hung)
        missing = [r for r in range(world) if r not in stacks]
        mine = f"{self.info.rank} {len(stacks)}".encode()
        printed = bytes(self.waiter.compare_set(CARD.name, "", mine))
        if printed == mine:
            text = card(hung, self.timeout, stacks, missing, self.log_dir).encode()
            log = current()
            if log is not None:  # to the console at once, not after the log's pipe: muted next
                log.write_stderr(text)
            else:
                with contextlib.suppress(OSError):
                    os.write(2, text)
        return printed

    def _write_fault(self) -> None:
        """Append every thread's stack to ``$DISTENV_LOG_DIR/rank-N.fault`` (faulthandler's)."""
        if self.log_dir is None:
            return
        with contextlib.suppress(OSError):
            os.makedirs(self.log_dir, exist_ok=True)
            path = os.path.join(self.log_dir, f"rank-{self.info.rank}.fault")
            with open(path, "ab") as file:
                faulthandler.dump_traceback(file, all_threads=True)


def _answered(printed: bytes | None) -> int:
    """Return how many ranks answered, from the `CARD` record (0 if none, or not distenv's)."""
    words = (printed or b"").split()
    return int(words[1]) if len(words) == 2 and all(w.isdigit() for w in words) else 0


def _silence() -> None:
    """Flush this process's output (within a second: the stuck main thread may hold a stream's
    lock), then point its stdout and stderr (and a per-rank log's console) at /dev/null for the
    moments it has left; the per-rank log keeps what is written."""

    def flush() -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()

    flusher = threading.Thread(target=flush, daemon=True)
    flusher.start()
    flusher.join(1.0)
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
    log = current()
    if log is not None:  # its streams write to the console's own duplicates: those too
        log.mute_console()


def arm(session: Session, timeout: float, log_dir: str | None) -> bool:
    """Start this rank's watchdog and hang thread; False where a watchdog runs already.

    Under ``distenv run --hang-timeout`` its rank wrapper started the watchdog and its supervisor
    does the autopsy: nothing more is started here (one card per hang).

    Args:
        session: The bootstrap's session (rank 0's store address, this rank, the job's keys).
        timeout: Seconds without progress after which the job is found hung.
        log_dir: ``$DISTENV_LOG_DIR``: where each rank appends its dump, or None.
    """
    if progress.watching():
        return False
    autopsy = _Autopsy(session, timeout, log_dir)
    autopsy.waiter.set_timeout(datetime.timedelta(seconds=REQUEST_S))
    autopsy.thread.start()
    # After init_dist's own handler (`distenv.bootstrap.teardown`), so it runs before it.
    atexit.register(autopsy.close)
    return progress.start(timeout, autopsy.stuck)
