"""The bootstrap's protocol, written down once: every store key and every node-socket message.

Rank 0's store holds the job's claim under the key root (`scope_key`) and each phase's keys under
that phase's prefix (`prefix`: ``distenv/<scope>/<phase>/<attempt>``). Each `Key` says who writes
it, who reads it and what it holds (`KEYS`; docs/architecture.md shows them as a table, checked
against this module). The bootstrap's modules and the scale benchmark
(``benchmarks/bench_rendezvous_scale.py``) take every key's name from here.

``distenv doctor`` holds its roll call under the phase ``doctor``; ``pg`` is torch's own
(``init_process_group``'s keys); ``hang`` holds the in-process hang autopsy's keys
(`distenv.bootstrap.hang`), written only once the job hangs. Where node leaders batch the bootstrap, a member speaks to its
leader over the node's Unix socket (`distenv.bootstrap.leaders`) in lines of tab-separated
fields, each a `Message`. Pure: no torch, no store, no socket.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

__all__ = [
    "ACK",
    "ALARM",
    "ALARM_EXIT",
    "ALARM_HUNG",
    "ALL",
    "BATCHES",
    "CARD",
    "CHECKIN",
    "CLOSED",
    "COLLIDED",
    "COUNT",
    "CUT",
    "DOCTOR",
    "ENDED",
    "EXTRA",
    "EXTRAS",
    "HANG",
    "HUNG",
    "KEYS",
    "KEY_ROOT",
    "PG",
    "PLACE",
    "READ",
    "RELEASE",
    "ROLLCALL",
    "SEEN",
    "SIZES",
    "STACK",
    "STATE",
    "STATES",
    "UP",
    "VERDICT",
    "WRITTEN",
    "Key",
    "Message",
    "prefix",
    "scope_key",
]

KEY_ROOT = "distenv"
#: The phases, each with its own keys (`prefix`).
ROLLCALL, DOCTOR, PG, UP, HANG = "rollcall", "doctor", "pg", "up", "hang"
#: What rank 0 writes under an absent rank's check-in key when it stops waiting (never a record:
#: JSON).
CLOSED = b"closed"
#: What rank 0 writes under a rank's group-up acknowledgement (or the group's release) instead of
#: its token (or the verdict's release value) when a second process of this job's identity
#: claimed a key after the verdict (docs/security.md).
COLLIDED = b"collided"
#: What rank 0 adds to the count of checked-in ranks when it stops waiting: a leader whose own
#: addition returns at least this came too late, and knows it (the flat roll call's `CLOSED`).
CUT = 1 << 40
#: A rank's states, in order; a signal's name replaces the state of a rank that was stopped.
STATES = ("joining", "up", "SIGINT", "SIGTERM", "failed")


class Key(NamedTuple):
    """One store key of the bootstrap: its name (`stem`, then a `slot` for a number, if any),
    the phase it lies under, who writes it, who reads it, and what it holds."""

    stem: str
    slot: str
    phase: str
    writer: str
    reader: str
    format: str

    @property
    def name(self) -> str:
        """Return the key as the docs write it (``checkin/<rank>``); a fixed key's own name."""
        return self.stem + (f"<{self.slot}>" if self.slot else "")

    def of(self, part: int | str) -> str:
        """Return the key of one `slot` value (``checkin/5``)."""
        return f"{self.stem}{part}"


CHECKIN = Key(
    "checkin/",
    "rank",
    ROLLCALL,
    "that rank (compare_set); rank 0 closes an absent one",
    "rank 0",
    "CheckIn JSON, or CLOSED",
)
EXTRA = Key(
    "extra/", "n", ROLLCALL, "a rank that found its rank's key taken", "rank 0", "CheckIn JSON"
)
EXTRAS = Key(
    "extras",
    "",
    ROLLCALL,
    "the ranks that write an extra claim (add 1)",
    "rank 0, again before it acknowledges the group",
    "counter",
)
WRITTEN = Key(
    "written",
    "",
    ROLLCALL,
    "every rank (add 1) or node leader (add its node's ranks)",
    "rank 0",
    "counter; rank 0 adds CUT when it stops waiting for batches",
)
BATCHES = Key(
    "batches/",
    "shard",
    f"{ROLLCALL}, {UP}",
    "node leaders (append)",
    "rank 0",
    "Batch lines (the up phase: UpBatch lines)",
)
PLACE = Key(
    "place/", "rank", ROLLCALL, "rank 0, before the verdict", "that rank (or leader)", "Place JSON"
)
VERDICT = Key(
    "verdict", "", ROLLCALL, "rank 0 (compare_set)", "every rank (or leader) but 0", "Verdict JSON"
)
SIZES = Key(
    "sizes",
    "",
    ROLLCALL,
    "a rank of this job's identity started for another world size (append), under rank 0's scope",
    "rank 0, once the count reaches CUT",
    "lines of <world size>@<host>; the writer adds CUT to rank 0's written count",
)
READ = Key(
    "read",
    "",
    ROLLCALL,
    "the readers of a negative (or doctor's) verdict (add 1)",
    "rank 0, before it may exit",
    "counter",
)
STATE = Key(
    "state/",
    "rank",
    UP,
    "that rank",
    "rank 0 and any rank naming the absent",
    "<state>@<host>[#<token>]",
)
COUNT = Key(
    "count", "", UP, "every rank (add 1) or node leader (add its node's ranks)", "rank 0", "counter"
)
ALL = Key(
    "all",
    "",
    f"{ROLLCALL}, {UP}",
    "every rank (or node leader) whose addition brings the phase's count (WRITTEN, COUNT) to the "
    "world size or past it; in the roll call also a rank that adds CUT for another world size",
    "rank 0 (a wait in the store), which then reads the count and the records: it says when to look",
    "the count that rank's addition found",
)
ACK = Key(
    "ack/",
    "rank",
    UP,
    "rank 0",
    "that rank (or leader)",
    "its token, or its node's tokens (UpBatch.echo), or COLLIDED",
)
RELEASE = Key(
    "release",
    "",
    UP,
    "rank 0, once its init_process_group returned, where the backend proves the group",
    "every rank (or leader) but 0",
    "the release value of rank 0's verdict, or COLLIDED",
)
SEEN = Key(
    "seen",
    "",
    UP,
    "the readers of a COLLIDED acknowledgement (add 1)",
    "rank 0, before it may exit",
    "counter",
)
HUNG = Key(
    "hung",
    "",
    HANG,
    "the first rank whose watchdog found it stuck (compare_set)",
    "every rank's hang thread",
    "Hung JSON",
)
ALARM = Key(
    "alarm/",
    "rank",
    HANG,
    "the rank that wrote hung (multi_set); that rank itself at its exit",
    "that rank's hang thread (wait)",
    "hung (ALARM_HUNG), or exit (ALARM_EXIT)",
)
STACK = Key(
    "stack/",
    "rank",
    HANG,
    "that rank, once alarmed",
    "the collector: rank 0, else the lowest rank that posted",
    "JSON: its host, its main thread's stack in faulthandler's format",
)
CARD = Key(
    "card",
    "",
    HANG,
    "the collector (compare_set), as it prints the card",
    "every rank that answered, before it ends with status 124",
    "the collector's rank, a space, the count of ranks that answered",
)
ENDED = Key(
    "ended",
    "",
    HANG,
    "every rank that answered (add 1), once its output is closed",
    "every rank that answered, before it ends (all ended, or 2 s)",
    "counter",
)
#: What a rank's `ALARM` key holds: the job hung, or the rank is exiting (its hang thread ends).
ALARM_HUNG, ALARM_EXIT = b"hung", b"exit"
#: Every key under a phase's prefix (the claim's lies under the root: `scope_key`).
KEYS = (
    CHECKIN,
    EXTRA,
    EXTRAS,
    WRITTEN,
    BATCHES,
    PLACE,
    VERDICT,
    SIZES,
    READ,
    STATE,
    COUNT,
    ALL,
    ACK,
    RELEASE,
    SEEN,
    HUNG,
    ALARM,
    STACK,
    CARD,
    ENDED,
)


def scope_key(restart: str) -> str:
    """Return the key naming the job that owns the store in torchrun attempt `restart`.

    Written by rank 0 (compare_set), read by every other rank: the claim's JSON
    (`distenv.bootstrap.records.claim`).
    """
    # torchrun's agent store outlives a worker restart: each attempt claims its own key.
    return f"{KEY_ROOT}/scope/{restart}"


def prefix(scope: str, phase: str, restart: str) -> str:
    """Return the prefix of one phase's keys (`ROLLCALL`, `PG`, `UP`, `DOCTOR`)."""
    return f"{KEY_ROOT}/{scope}/{phase}/{restart}"


class Message(enum.Enum):
    """A line on a node's socket: its kind, then its fields, separated by tabs.

    A member's first line is its check-in, untagged (`CHECKIN`); every other line starts with
    its kind. No field holds a tab (JSON escapes it).
    """

    #: member → leader: its check-in record (JSON), the first line it sends, untagged.
    CHECKIN = "checkin"
    #: leader → member: rank 0's verdict (JSON) and the member's place (JSON, or empty).
    VERDICT = "verdict"
    #: leader → member: the leader had reported its node (or rank 0 had cut) before it arrived.
    LATE = "late"
    #: leader → member: its check-in is of another scope or world.
    REFUSED = "refused"
    #: member → leader: the process group is up here, with this rank's fresh token.
    UP = "up"
    #: leader → member: rank 0 saw the whole job up; the member's token echoed.
    ACK = "ack"
    #: leader → member: rank 0 released the group (the verdict's release value, or "collided").
    RELEASE = "release"

    def encode(self, *fields: str) -> str:
        """Return the line of this message with `fields` (without its newline)."""
        if self is Message.CHECKIN:
            (record,) = fields
            return record
        return "\t".join((self.value, *fields))

    @classmethod
    def decode(cls, line: str) -> tuple[Message | None, str, str]:
        """Return a tagged line's kind (None: no kind of the protocol), its tag as read, and the
        rest of the line (its fields, still tab-separated)."""
        tag, _, rest = line.partition("\t")
        kind = _TAGGED.get(tag)
        return kind, tag, rest


_TAGGED = {m.value: m for m in Message if m is not Message.CHECKIN}
