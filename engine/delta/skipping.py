"""Data skipping: which files a predicate may need (Delta's DataSkippingReader, in Python).

A predicate (Spark SQL text or a sqlglot expression, unqualified column names) is compiled once into a small
tree in negation normal form, then evaluated per file against partition values (exact) and min/max/nullCount
statistics (bounds). The question asked of each file is "can the predicate be TRUE for some row?" under SQL's
three-valued logic; every answer we cannot prove is "yes". NOT is pushed down by exact 3VL duals
(NOT a = b  ->  a != b, NOT (a IS NULL) -> a IS NOT NULL, De Morgan), never by complement.

Statistics are treated as bounds, widened where writers lose precision: timestamps are stored truncated to
milliseconds (+-1 ms), float maxima may hide NaN (Spark orders NaN above all values: no upper bound), string
maxima of 32+ characters may be truncated (bounded by the successor of their prefix).
"""

from __future__ import annotations

import bisect
import contextlib
import math
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from pyspark.sql import types as T
from sqlglot import exp

from engine.delta.actions import AddFile
from engine.delta.skipping_literals import Key, coerce
from engine.delta.skipping_tree import (
    And,
    Cmp,
    Col,
    Const,
    InList,
    IsNotNull,
    IsNull,
    Node,
    NotInList,
    NotNullSafeEq,
    NullSafeEq,
    Or,
    PredicateCompiler,
    parse_predicate,
)
from engine.delta.values import (
    FLOAT_TYPES,
    MILLISECOND,
    parse_partition_value,
)

DOUBLE_DIGITS = 17


def _string_successor(prefix: str) -> str | None:
    """The least string greater than every string that starts with ``prefix`` (None if none exists)."""
    chars = list(prefix)
    while chars:
        last = ord(chars[-1])
        if last < 0x10FFFF:
            nxt = last + 1
            if 0xD800 <= nxt <= 0xDFFF:
                nxt = 0xE000
            chars[-1] = chr(nxt)
            return "".join(chars)
        chars.pop()
    return None


_TIE_BREAKERS = ("\x7f", "\ufffd", "\U0010ffff")


def _possibly_truncated(value: str) -> bool:
    """Delta truncates string statistics to 32 UTF-16 code units (plus a tie-breaker for maxima)."""
    return len(value.encode("utf-16-le")) // 2 >= 32


def _string_upper_bound(value: str) -> str | None:
    if not _possibly_truncated(value):
        return value
    prefix = value[:-1] if value.endswith(_TIE_BREAKERS) else value
    return _string_successor(prefix)


class _FileView:
    """One file's facts for a predicate: typed partition values and statistics bounds."""

    def __init__(self, add: AddFile, partition_types: dict[str, T.DataType]) -> None:
        self.add = add
        self.partition_types = partition_types
        self._partitions: dict[str, Any] | None = None

    def partition_value(self, col: Col) -> tuple[bool, Any]:
        """(known, typed value) of a partition column in this file."""
        if self._partitions is None:
            lowered = {k.lower(): v for k, v in self.add.partition_values.items()}
            typed: dict[str, Any] = {}
            for name, dtype in self.partition_types.items():
                if name.lower() not in lowered:
                    continue
                with contextlib.suppress(ValueError, TypeError, InvalidOperation):
                    typed[name.lower()] = parse_partition_value(lowered[name.lower()], dtype)
            self._partitions = typed
        name = col.path[0].lower()
        if name not in self._partitions:
            return False, None
        return True, self._partitions[name]

    def null_facts(self, col: Col) -> tuple[int | None, int | None]:
        """(numRecords, nullCount) or Nones when unknown."""
        stats = self.add.stats
        if stats is None or stats.num_records is None:
            return None, None
        count = stats.value("null_count", col.path)
        return stats.num_records, count if isinstance(count, int) else None

    def bounds(self, col: Col) -> tuple[Any, Any]:
        """(lower, upper) bounds of the column's non-null values; None where unbounded."""
        stats = self.add.stats
        if stats is None:
            return None, None
        low = stats.value("min_values", col.path)
        high = stats.value("max_values", col.path)
        dtype = col.dtype
        try:
            if isinstance(dtype, (T.TimestampType, T.TimestampNTZType)):
                low = low - MILLISECOND if isinstance(low, datetime) else None
                high = high + MILLISECOND if isinstance(high, datetime) else None
            elif isinstance(dtype, FLOAT_TYPES):
                high = None
                low = low if isinstance(low, float) and not math.isnan(low) else None
            elif isinstance(dtype, T.StringType):
                low = low if isinstance(low, str) else None
                high = _string_upper_bound(high) if isinstance(high, str) else None
            elif isinstance(dtype, T.DecimalType):
                low, high = _decimal_bound(low, -1), _decimal_bound(high, 1)
        except OverflowError:
            return None, None
        return low, high


def _decimal_bound(value: Any, direction: int) -> Decimal | None:
    """A decimal statistic widened by what a trip through a double may have cost it: some writers (delta-rs)
    record decimal bounds as doubles, and a double prints with at most 17 significant digits, so a bound with
    more digits was written exactly."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = Decimal(value)
    if not isinstance(value, Decimal) or not value.is_finite():
        return None
    if len(value.normalize().as_tuple().digits) > DOUBLE_DIGITS:
        return value
    return value + direction * 2 * Decimal(math.ulp(float(value)))


def _cmp(op: str, left: Any, right: Any) -> bool:
    if op == "=":
        return bool(left == right)
    if op == "!=":
        return bool(left != right)
    if op == "<":
        return bool(left < right)
    if op == "<=":
        return bool(left <= right)
    if op == ">":
        return bool(left > right)
    return bool(left >= right)


def _range_may_hold(op: str, low: Any, high: Any, literal: Any, key: Key) -> bool:
    """Can some value v with low <= v <= high satisfy ``v op literal``? (None bounds are unbounded)"""
    lo = None if low is None else key(low)
    hi = None if high is None else key(high)
    if op == "=":
        return (lo is None or lo <= literal) and (hi is None or literal <= hi)
    if op == "<":
        return lo is None or lo < literal
    if op == "<=":
        return lo is None or lo <= literal
    if op == ">":
        return hi is None or hi > literal
    if op == ">=":
        return hi is None or hi >= literal
    # "!=": only a file whose every value equals the literal is excluded
    return not (lo is not None and hi is not None and lo == literal and hi == literal)


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _may_compare(view: _FileView, op: str, col: Col, literal: Any) -> bool:
    coerced = coerce(col.dtype, literal)
    if coerced is None:
        return True
    key, lit = coerced
    if col.is_partition:
        known, value = view.partition_value(col)
        if not known or _is_nan(value):
            return True
        if value is None:
            return False
        return _cmp(op, key(value), lit)
    rows, nulls = view.null_facts(col)
    if rows is not None and (rows == 0 or (nulls is not None and nulls >= rows)):
        return False  # no non-null value: a comparison is never TRUE
    low, high = view.bounds(col)
    return _range_may_hold(op, low, high, lit, key)


def _may_be_null(view: _FileView, col: Col) -> bool:
    if col.is_partition:
        known, value = view.partition_value(col)
        return not known or value is None
    rows, nulls = view.null_facts(col)
    if rows == 0:
        return False
    return nulls is None or nulls > 0


def _may_be_not_null(view: _FileView, col: Col) -> bool:
    if col.is_partition:
        known, value = view.partition_value(col)
        return not known or value is not None
    rows, nulls = view.null_facts(col)
    if rows is None or nulls is None:
        return True
    return nulls < rows


def _may_be_in(view: _FileView, col: Col, values: tuple[Any, ...]) -> bool:
    coerced = [coerce(col.dtype, v) for v in values]
    if any(c is None for c in coerced):
        return True
    keys = {id(c[0]) for c in coerced if c is not None}
    if len(coerced) > 8 and len(keys) == 1 and not col.is_partition:
        key = coerced[0][0]  # type: ignore[index]
        rows, nulls = view.null_facts(col)
        if rows is not None and (rows == 0 or (nulls is not None and nulls >= rows)):
            return False
        low, high = view.bounds(col)
        try:
            ordered = sorted(c[1] for c in coerced if c is not None)
            start = 0 if low is None else bisect.bisect_left(ordered, key(low))
            return start < len(ordered) and (high is None or ordered[start] <= key(high))
        except TypeError:
            return True
    return any(_may_compare(view, "=", col, v) for v in values)


def _may_be_not_in(view: _FileView, col: Col, values: tuple[Any, ...]) -> bool:
    return all(_may_compare(view, "!=", col, v) for v in values)


def _may_be_true(node: Node, view: _FileView) -> bool:
    try:
        if isinstance(node, And):
            return all(_may_be_true(c, view) for c in node.children)
        if isinstance(node, Or):
            return any(_may_be_true(c, view) for c in node.children)
        if isinstance(node, Const):
            return node.value is True
        if isinstance(node, Cmp):
            return _may_compare(view, node.op, node.col, node.value)
        if isinstance(node, IsNull):
            return _may_be_null(view, node.col)
        if isinstance(node, IsNotNull):
            return _may_be_not_null(view, node.col)
        if isinstance(node, NullSafeEq):
            return _may_compare(view, "=", node.col, node.value)
        if isinstance(node, NotNullSafeEq):
            return _may_be_null(view, node.col) or _may_compare(view, "!=", node.col, node.value)
        if isinstance(node, InList):
            return _may_be_in(view, node.col, node.values)
        if isinstance(node, NotInList):
            return _may_be_not_in(view, node.col, node.values)
    except (TypeError, ValueError, ArithmeticError):
        return True
    return True


class FilePredicate:
    """A predicate compiled for one table schema; ``might_match(add)`` is False only when the file provably
    has no row for which the predicate is TRUE."""

    def __init__(self, predicate: str | exp.Expression, schema: T.StructType, partition_columns: Sequence[str]) -> None:
        self.text = predicate if isinstance(predicate, str) else predicate.sql(dialect="spark")
        self.tree: Node = PredicateCompiler(schema, partition_columns).compile(parse_predicate(predicate))
        lowered = {c.lower() for c in partition_columns}
        self.partition_types = {f.name: f.dataType for f in schema.fields if f.name.lower() in lowered}

    def might_match(self, add: AddFile) -> bool:
        return _may_be_true(self.tree, _FileView(add, self.partition_types))


def prune_files(snapshot: Any, files: Sequence[AddFile], predicate: str | exp.Expression) -> list[AddFile]:
    """The files that may hold a row satisfying ``predicate`` (Spark SQL over the table's columns), in input
    order. Conservative: a file is dropped only when its partition values or statistics prove it."""
    compiled = FilePredicate(predicate, snapshot.spark_schema, snapshot.partition_columns)
    return [f for f in files if compiled.might_match(f)]
