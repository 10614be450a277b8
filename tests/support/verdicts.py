"""A verdict as a rank other than 0 reads it: published by rank 0, then parsed with its own place."""

from __future__ import annotations

from distenv.bootstrap.records import CheckIn
from distenv.bootstrap.verdict import Verdict, parse_place, parse_verdict


def as_read(verdict: Verdict, checkin: CheckIn) -> Verdict:
    """Return rank 0's `verdict` as the rank of `checkin` reads it from the store: the published
    outcome, and, where it places ranks, the place rank 0 writes for that rank's host."""
    published, placed = parse_verdict(
        "verdict", verdict.to_json(), scope=verdict.scope, world_size=checkin.world_size
    )
    if not placed:
        return published
    place = verdict.place_of(checkin.hostname)
    assert place is not None, f"rank 0 places no rank on {checkin.hostname!r}"
    raw = place.to_json(verdict.scope)
    read = parse_place(
        f"place/{checkin.rank}", raw, scope=verdict.scope, world_size=checkin.world_size
    )
    return published._replace(place=read)
