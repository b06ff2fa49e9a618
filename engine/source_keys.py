"""Data skipping from the source's join keys, beyond Delta on Spark: ``target_key BETWEEN min AND max`` of each
ON equality's source side (an IN list for partition columns), the bounds taken from the source's own statistics
where it has them (inline rows, a Delta source's log), else from one Spark aggregation."""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DoubleType,
    FloatType,
    StringType,
    TimestampType,
)
from sqlglot import exp

from engine.delta import INTEGRAL_TYPES, Snapshot
from engine.expressions import quote_identifier
from engine.inline_rows import rows_to_arrow
from engine.merge_condition import MergeCondition, Sides
from engine.spec import MergeSpec, RowsSource, TableSource

MAX_PARTITION_VALUES_FOR_SKIPPING = 200


def _bound_literal(value: Any) -> exp.Expression | None:
    """A SQL literal for a statistics bound; None for values data skipping cannot compare."""
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, (int, decimal.Decimal)):
        return exp.Literal.number(str(value))
    if isinstance(value, float):
        return exp.Literal.number(repr(value)) if value == value and abs(value) != float("inf") else None
    if isinstance(value, str):
        return exp.Literal.string(value)
    if isinstance(value, dt.datetime):
        stamp = value.astimezone(dt.UTC).replace(tzinfo=None) if value.tzinfo else value
        return exp.cast(exp.Literal.string(stamp.isoformat(sep=" ")), exp.DataType.build("timestamp"))
    if isinstance(value, dt.date):
        return exp.cast(exp.Literal.string(value.isoformat()), exp.DataType.build("date"))
    return None


EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _as_is(column: Column) -> Column:
    return column


def _instant(micros: int | None) -> dt.datetime | None:
    """A TIMESTAMP from its microseconds since the epoch, in UTC."""
    return None if micros is None else EPOCH + dt.timedelta(microseconds=micros)


@dataclass
class _KeyRange:
    low: Any = None
    high: Any = None
    nulls: int = 0
    values: list[Any] | None = None


_STATS_RANGE_TYPES = (*INTEGRAL_TYPES, DateType, StringType)
"""Types whose Delta statistics bound the values exactly enough: timestamps are truncated to milliseconds,
floats may hold NaN and some writers (delta-rs) round decimals through doubles, so those ranges come from
Spark."""


def _comparable(source: DataType | None, target: DataType | None) -> bool:
    if source is None or target is None:
        return False
    if isinstance(source, INTEGRAL_TYPES) and isinstance(target, INTEGRAL_TYPES):
        return True
    return type(source) is type(target) and not isinstance(source, (FloatType, DoubleType, BinaryType, BooleanType))


def _ranges_from_spark(
    source: DataFrame,
    source_types: dict[str, DataType],
    keys: list[tuple[str, str]],
    missing: list[int],
    partition_cols: set[str],
    ranges: list[_KeyRange],
) -> None:
    """Fill ``ranges[i]`` for each ``missing`` key from one aggregation of the source."""
    aggs = []
    instants = set()
    for i in missing:
        value = F.col(quote_identifier(keys[i][1]))
        # Spark Connect hands TIMESTAMP values over as naive datetimes in this process's time zone;
        # microseconds since the epoch cross over exactly.
        if isinstance(source_types.get(keys[i][1].lower()), TimestampType):
            instants.add(i)
        crossed = F.unix_micros if i in instants else _as_is
        aggs += [
            crossed(F.min(value)).alias(f"min{i}"),
            crossed(F.max(value)).alias(f"max{i}"),
            F.count(F.when(value.isNull(), 1)).alias(f"nulls{i}"),
        ]
        if keys[i][0].lower() in partition_cols:
            values = F.slice(F.collect_set(value), 1, MAX_PARTITION_VALUES_FOR_SKIPPING + 1)
            aggs.append((F.transform(values, crossed) if i in instants else values).alias(f"values{i}"))
    row = source.agg(*aggs).collect()[0].asDict()
    for i in missing:
        low, high, found = row[f"min{i}"], row[f"max{i}"], row.get(f"values{i}")
        if i in instants:
            low, high = _instant(low), _instant(high)
            found = None if found is None else [_instant(v) for v in found]
        ranges[i] = _KeyRange(low, high, int(row[f"nulls{i}"] or 0), found)


def _range_predicate(column: str, rng: _KeyRange, *, has_nulls: bool) -> exp.Expression | None:
    """The target column's predicate for the source's range of it; None when a bound has no SQL literal."""
    col = exp.column(column, quoted=True)
    lo, hi = _bound_literal(rng.low), _bound_literal(rng.high)
    if rng.low is None:
        return exp.Is(this=col, expression=exp.Null()) if has_nulls else exp.false()
    if lo is None or hi is None:
        return None
    pred: exp.Expression = exp.Between(this=col, low=lo, high=hi)
    if rng.values is not None and len(rng.values) <= MAX_PARTITION_VALUES_FOR_SKIPPING:
        literals = [_bound_literal(v) for v in rng.values if v is not None]
        if literals and all(lit is not None for lit in literals):
            pred = exp.In(this=col.copy(), expressions=literals)
    if has_nulls:
        pred = exp.Or(this=pred, expression=exp.Is(this=col.copy(), expression=exp.Null()))
    return pred


class SourceKeyRanges:
    """The source's key ranges for one merge: the skipping predicates they give, and the ranges themselves, by
    target column (lower case), for the single pass to estimate the matches per file."""

    def __init__(self, spec: MergeSpec, on: MergeCondition, source_snapshot: Callable[[], Snapshot]) -> None:
        self.spec = spec
        self.on = on
        self._source_snapshot = source_snapshot
        self.ranges: dict[str, tuple[Any, Any]] = {}

    def source_key_predicates(
        self, snapshot: Snapshot, source: DataFrame, sides: Sides, *, without_spark: bool = False
    ) -> list[exp.Expression]:
        """``target_key BETWEEN min AND max`` of each ON equality's source side (an IN list for partition
        columns), from the source's own statistics where it has them, else from one Spark aggregation;
        ``without_spark``: only the keys whose range is known without one."""
        source_types = {f.name.lower(): f.dataType for f in source.schema.fields}
        keys = self._comparable_keys(snapshot, source_types, sides)
        if not keys:
            return []
        partition_cols = {c.lower() for c in snapshot.partition_columns}
        ranges = [_KeyRange() for _ in keys]
        missing = [
            i
            for i, (column, name) in enumerate(keys)
            if not self._range_from_source_stats(name, ranges[i], want_values=column.lower() in partition_cols)
        ]
        if missing and without_spark:
            keys = [key for i, key in enumerate(keys) if i not in missing]
            ranges = [rng for i, rng in enumerate(ranges) if i not in missing]
        elif missing:
            _ranges_from_spark(source, source_types, keys, missing, partition_cols, ranges)
        null_safe_columns = self.on.null_safe_columns()
        predicates: list[exp.Expression] = []
        for (column, _), rng in zip(keys, ranges, strict=True):
            self.ranges[column.lower()] = (rng.low, rng.high)
            pred = _range_predicate(column, rng, has_nulls=rng.nulls > 0 and column.lower() in null_safe_columns)
            if pred is not None:
                predicates.append(pred)
        return predicates

    def _comparable_keys(
        self, snapshot: Snapshot, source_types: dict[str, DataType], sides: Sides
    ) -> list[tuple[str, str]]:
        """(target column, source column) of each ON equality whose bounds compare in the target's type."""
        target_types = {f.name.lower(): f.dataType for f in snapshot.spark_schema.fields}
        keys = []
        for column, source_expr in self.on.equi_join_keys(sides):
            # Bounds are compared in the target column's type: only keys of the same kind of type are safe.
            if isinstance(source_expr, exp.Column) and _comparable(
                source_types.get(str(source_expr.name).lower()), target_types.get(column.lower())
            ):
                keys.append((column, str(source_expr.name)))
        return keys

    def _range_from_source_stats(self, name: str, rng: _KeyRange, *, want_values: bool) -> bool:
        """Fill ``rng`` without a Spark job: inline rows are at hand, and a Delta source's log has per-file
        min, max and null counts (lower and upper bounds, which is all skipping needs)."""
        source = self.spec.source
        if isinstance(source, RowsSource):
            table = rows_to_arrow(source.rows, source.schema)
            match = next((n for n in table.column_names if n.lower() == name.lower()), None)
            if match is None:
                return False
            column = table.column(match)
            bounds = pc.min_max(column).as_py() if len(column) else {"min": None, "max": None}
            rng.low, rng.high, rng.nulls = bounds["min"], bounds["max"], column.null_count
            if want_values:
                rng.values = pc.unique(column.drop_null()).to_pylist()[: MAX_PARTITION_VALUES_FOR_SKIPPING + 1]
            return True
        if not (isinstance(source, TableSource) and source.reads_snapshot) or want_values:
            return False
        snap = self._source_snapshot()
        if name.lower() in {c.lower() for c in snap.partition_columns}:
            return False
        dtype = next((f.dataType for f in snap.spark_schema.fields if f.name.lower() == name.lower()), None)
        if not isinstance(dtype, _STATS_RANGE_TYPES):
            return False
        low = high = None
        nulls = 0
        for f in snap.files:
            st = f.stats
            if st is None or st.num_records is None:
                return False
            file_nulls = st.value("null_count", [name])
            if file_nulls is None:
                return False
            nulls += int(file_nulls)
            if file_nulls == st.num_records:
                continue
            fmin, fmax = st.value("min_values", [name]), st.value("max_values", [name])
            if fmin is None or fmax is None:
                return False
            low = fmin if low is None or fmin < low else low
            high = fmax if high is None or fmax > high else high
        rng.low, rng.high, rng.nulls = low, high, nulls
        return True
