"""Identity columns (PROTOCOL.md "Identity Columns"): values a writer generates for rows inserted without one.

A generated value is ``start + k * step`` for some k >= 0, beyond ``delta.identity.highWaterMark`` and not in the
column yet; overflow fails the write (ANSI arithmetic). Delta on Spark generates ``base + step * (partition +
partitions * i)`` per task; over Spark Connect no expression sees the task's partition count, so the engine
takes ``base + step * monotonically_increasing_id()`` (the partition in the upper 31 bits, the row in the lower
33): unique within one write, in the step's direction, with gaps between partitions as Delta's values have.

The commit raises the high-water mark as Delta's does (``IdentityColumn.updateSchema``): to the largest value
(smallest for a negative step) in the files the write added, rounded to the next value of the column's
sequence, never lowered, never before ``start``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import types as T

START_KEY = "delta.identity.start"
STEP_KEY = "delta.identity.step"
HIGH_WATER_MARK_KEY = "delta.identity.highWaterMark"
ALLOW_EXPLICIT_INSERT_KEY = "delta.identity.allowExplicitInsert"


@dataclass(frozen=True)
class IdentityColumn:
    name: str
    start: int
    step: int
    high_water_mark: int | None
    allow_explicit_insert: bool

    @property
    def next_value(self) -> int:
        """The first value this write may generate (Delta's ``base``)."""
        return self.start if self.high_water_mark is None else self.high_water_mark + self.step

    def generated_values_sql(self, lanes: int = 1, lane: int = 0) -> str:
        """Spark SQL giving each row a new value (see the module docstring). Each of ``lanes`` expressions that
        generate values in one write (one per INSERT clause: each counts only the rows it is evaluated for) takes
        its own ``lane`` of the sequence, so no two give the same value."""
        k = "monotonically_increasing_id()" if lanes == 1 else f"(monotonically_increasing_id() * {lanes} + {lane})"
        return f"(CAST({self.next_value} AS BIGINT) + CAST({self.step} AS BIGINT) * {k})"

    def round_to_next(self, value: int) -> int:
        """Delta's ``roundToNext``: ``value`` if it is in the sequence, else the next value of the sequence."""
        offset = value - self.start
        if offset % self.step == 0:
            return value
        quotient = abs(offset) // abs(self.step) * (1 if (offset >= 0) == (self.step > 0) else -1)
        same_direction = (offset > 0) == (self.step > 0)
        return self.start + self.step * (quotient + 1 if same_direction else quotient)

    def new_high_water_mark(self, candidate: int) -> int | None:
        """Delta's ``updateToValidHighWaterMark``: the mark after a write whose largest value (in the step's
        direction) is ``candidate``, or None when the mark stays as it is."""
        ahead = (lambda a, b: a > b) if self.step > 0 else (lambda a, b: a < b)
        before_start = ahead(self.start, candidate)
        rounded = self.round_to_next(candidate)
        new = rounded if self.high_water_mark is None or ahead(rounded, self.high_water_mark) else self.high_water_mark
        bad_mark = self.high_water_mark is not None and ahead(self.start, self.high_water_mark)
        if bad_mark or (not before_start and new != self.high_water_mark):
            return new
        return None


def identity_column(field: T.StructField) -> IdentityColumn | None:
    """The identity column a field is (``delta.identity.start`` and ``.step`` in its metadata), or None."""
    meta: Mapping[str, Any] = field.metadata or {}
    if START_KEY not in meta or STEP_KEY not in meta:
        return None
    step = int(meta[STEP_KEY])
    if step == 0:
        raise ValueError(f"Identity column {field.name!r} has step 0")
    mark = meta.get(HIGH_WATER_MARK_KEY)
    return IdentityColumn(
        name=field.name,
        start=int(meta[START_KEY]),
        step=step,
        high_water_mark=None if mark is None else int(mark),
        allow_explicit_insert=str(meta.get(ALLOW_EXPLICIT_INSERT_KEY, False)).lower() == "true",
    )


def identity_columns(schema: T.StructType) -> dict[str, IdentityColumn]:
    """The schema's identity columns by lower-case name (top-level only: Delta allows no nested ones)."""
    found = {}
    for f in schema.fields:
        column = identity_column(f)
        if column is not None:
            found[f.name.lower()] = column
    return found


def written_extreme(paths: Iterable[str], column: IdentityColumn) -> int | None:
    """The largest value (smallest for a negative step) of the column in the Parquet files, or None."""
    best: int | None = None
    for path in paths:
        names = pq.read_schema(path).names
        name = next((n for n in names if n.lower() == column.name.lower()), None)
        if name is None:
            continue
        extremes = pc.min_max(pq.read_table(path, columns=[name]).column(0))
        value = extremes["max" if column.step > 0 else "min"].as_py()
        if value is not None and (best is None or (value > best if column.step > 0 else value < best)):
            best = int(value)
    return best


def with_high_water_marks(
    schema: T.StructType, generated: Sequence[str], written_files: Sequence[str]
) -> T.StructType | None:
    """``schema`` with the high-water marks of the ``generated`` identity columns raised past the values in the
    written files, or None when no mark moves."""
    columns = identity_columns(schema)
    fields = list(schema.fields)
    changed = False
    for name in generated:
        column = columns.get(name.lower())
        if column is None:
            continue
        candidate = written_extreme(written_files, column)
        mark = None if candidate is None else column.new_high_water_mark(candidate)
        if mark is None:
            continue
        index = next(i for i, f in enumerate(fields) if f.name.lower() == name.lower())
        field = fields[index]
        fields[index] = T.StructField(
            field.name, field.dataType, field.nullable, {**(field.metadata or {}), HIGH_WATER_MARK_KEY: mark}
        )
        changed = True
    return T.StructType(fields) if changed else None
