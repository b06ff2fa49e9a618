"""Where a job's time went: from submission to the moment its end is recorded, cut into segments that follow one
another, so that they add up to the job's wall time (``finished_at - submitted_at``).

The segments, in order: ``queued`` (submitted until first claimed), ``retrying`` (earlier attempts and their
back-off, for a job that needed more than one), ``starting`` (the attempt's claim, its spec checked, the Spark
session and the table's snapshot, until the engine reports its first phase), the engine's phases
(``preparing_source``, ``finding_touched_files``, ``writing``, ``committing``; a phase entered twice, as after
a lost commit race, counts once with both stretches), and ``recording`` (the engine done until the job's end is
written). The last segment is closed by the job store with the same clock that writes ``finished_at``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from datetime import UTC, datetime

SEGMENTS: tuple[str, ...] = (
    "queued",
    "retrying",
    "starting",
    "preparing_source",
    "finding_touched_files",
    "writing",
    "committing",
    "recording",
)


class Timeline:
    """The segment marks of one attempt: each mark starts a segment that the next one ends."""

    def __init__(self, submitted_at: datetime, first_started_at: datetime, attempt: int, claimed_at: datetime) -> None:
        self._marks: list[tuple[str, datetime]] = [("queued", submitted_at)]
        if attempt > 1:
            self._marks += [("retrying", first_started_at), ("starting", claimed_at)]
        else:
            self._marks.append(("starting", first_started_at))
        self._lock = threading.Lock()

    def mark(self, segment: str, at: datetime | None = None) -> None:
        if segment not in SEGMENTS:
            raise ValueError(f"{segment} is not a segment of a job's time")
        with self._lock:
            self._marks.append((segment, at or datetime.now(UTC)))

    def marks(self) -> list[tuple[str, datetime]]:
        with self._lock:
            return list(self._marks)


def close(marks: list[tuple[str, datetime]], end: datetime) -> dict[str, int]:
    """Milliseconds by segment, the last mark's segment ending at ``end``; the values add up to the time from the
    first mark to ``end`` (each rounded from the running total, so no rounding is lost)."""
    totals: dict[str, int] = {}
    origin = marks[0][1]
    done_ms = 0
    for (segment, _), (_, until) in zip(marks, [*marks[1:], ("", end)], strict=True):
        upto_ms = round((until - origin).total_seconds() * 1000)
        totals[segment] = totals.get(segment, 0) + upto_ms - done_ms
        done_ms = upto_ms
    return in_order(totals)


def in_order(timings: Mapping[str, int]) -> dict[str, int]:
    """The segments in the order they happen (a JSONB column keeps its own key order)."""
    return {name: int(timings[name]) for name in SEGMENTS if name in timings}
