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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any

import sqlglot
from pyspark.sql import types as T
from sqlglot import exp

from engine.delta.actions import AddFile
from engine.delta.values import (
    FLOAT_TYPES,
    INTEGRAL_TYPES,
    MILLISECOND,
    parse_partition_value,
    parse_timestamp,
    round_float32,
    to_utc,
)
from engine.errors import MergeSpecError

# --- the compiled tree -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Col:
    path: tuple[str, ...]
    dtype: T.DataType
    is_partition: bool


@dataclass(frozen=True)
class Unknown:
    """Any expression we do not model: may be TRUE."""


@dataclass(frozen=True)
class Const:
    value: bool | None  # TRUE, FALSE or NULL for every row


@dataclass(frozen=True)
class Cmp:
    op: str  # one of = != < <= > >=
    col: Col
    value: Any  # never None


@dataclass(frozen=True)
class IsNull:
    col: Col


@dataclass(frozen=True)
class IsNotNull:
    col: Col


@dataclass(frozen=True)
class NullSafeEq:
    col: Col
    value: Any  # never None


@dataclass(frozen=True)
class NotNullSafeEq:
    col: Col
    value: Any  # never None


@dataclass(frozen=True)
class InList:
    col: Col
    values: tuple[Any, ...]  # non-null literals


@dataclass(frozen=True)
class NotInList:
    col: Col
    values: tuple[Any, ...]  # non-null literals (a NULL in the list makes NOT IN never TRUE: Const(None))


@dataclass(frozen=True)
class And:
    children: tuple[Node, ...]


@dataclass(frozen=True)
class Or:
    children: tuple[Node, ...]


Node = Unknown | Const | Cmp | IsNull | IsNotNull | NullSafeEq | NotNullSafeEq | InList | NotInList | And | Or

_NEGATED_OP = {"=": "!=", "!=": "=", "<": ">=", ">=": "<", "<=": ">", ">": "<="}
_FLIPPED_OP = {"=": "=", "!=": "!=", "<": ">", ">": "<", "<=": ">=", ">=": "<="}
_UNKNOWN = Unknown()


def negate(node: Node) -> Node:
    """The node that is TRUE exactly where ``node`` is FALSE (SQL NOT)."""
    if isinstance(node, Cmp):
        return Cmp(_NEGATED_OP[node.op], node.col, node.value)
    if isinstance(node, IsNull):
        return IsNotNull(node.col)
    if isinstance(node, IsNotNull):
        return IsNull(node.col)
    if isinstance(node, NullSafeEq):
        return NotNullSafeEq(node.col, node.value)
    if isinstance(node, NotNullSafeEq):
        return NullSafeEq(node.col, node.value)
    if isinstance(node, InList):
        return NotInList(node.col, node.values)
    if isinstance(node, NotInList):
        return InList(node.col, node.values)
    if isinstance(node, And):
        return Or(tuple(negate(c) for c in node.children))
    if isinstance(node, Or):
        return And(tuple(negate(c) for c in node.children))
    if isinstance(node, Const):
        return Const(None if node.value is None else not node.value)
    return _UNKNOWN


# --- literals --------------------------------------------------------------------------------------------------

_NO_LITERAL = object()


def _number(text: str) -> int | Decimal | float:
    lowered = text.lower()
    if "e" in lowered:
        return float(text)
    if "." in text:
        return Decimal(text)
    return int(text)


def _cast_literal(value: Any, to: exp.DataType) -> Any:
    """A literal CAST evaluated as Spark would, or _NO_LITERAL when we do not model it."""
    if value is None:
        return None
    kind = to.this
    D = exp.DataType.Type
    try:
        if kind in (D.TINYINT, D.SMALLINT, D.INT, D.BIGINT):
            if isinstance(value, bool):
                return int(value)
            if isinstance(value, str):
                return int(value.strip())
            if isinstance(value, (int, Decimal)):
                return int(value)
            if isinstance(value, float) and math.isfinite(value):
                return int(value)
            return _NO_LITERAL
        if kind in (D.DOUBLE, D.FLOAT):
            if isinstance(value, (str, int, Decimal, float)) and not isinstance(value, bool):
                number = float(value)
                return round_float32(number) if kind == D.FLOAT else number
            return _NO_LITERAL
        if kind == D.DECIMAL:
            if isinstance(value, bool) or not isinstance(value, (str, int, Decimal, float)):
                return _NO_LITERAL
            params = [p.this for p in to.expressions] if to.expressions else []
            scale = int(params[1].name) if len(params) > 1 else 0
            number = Decimal(str(value).strip()) if not isinstance(value, float) else Decimal(repr(value))
            return number.quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_UP)
        if kind in (D.VARCHAR, D.CHAR, D.TEXT, D.NVARCHAR, D.NCHAR):
            return value if isinstance(value, str) else _NO_LITERAL
        if kind == D.DATE:
            if isinstance(value, datetime):
                return to_utc(value).date() if value.tzinfo else value.date()
            if isinstance(value, date):
                return value
            if isinstance(value, str):
                return _parse_date_text(value)
            return _NO_LITERAL
        if kind in (D.TIMESTAMP, D.TIMESTAMPTZ, D.TIMESTAMPLTZ):
            if isinstance(value, datetime):
                return to_utc(value)
            if isinstance(value, date):
                return datetime(value.year, value.month, value.day, tzinfo=UTC)
            if isinstance(value, str):
                return parse_timestamp(value, ntz=False)
            return _NO_LITERAL
        if kind == D.TIMESTAMPNTZ:
            if isinstance(value, datetime):
                return value if value.tzinfo is None else value.astimezone(UTC).replace(tzinfo=None)
            if isinstance(value, date):
                return datetime(value.year, value.month, value.day)
            if isinstance(value, str):
                return parse_timestamp(value, ntz=True)
            return _NO_LITERAL
        if kind == D.BOOLEAN:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in ("true", "false"):
                return value.strip().lower() == "true"
            return _NO_LITERAL
    except (ValueError, TypeError, InvalidOperation, OverflowError):
        return _NO_LITERAL
    return _NO_LITERAL


def _parse_date_text(text: str) -> date:
    text = text.strip()
    if len(text) > 10 and text[10] not in (" ", "T"):
        raise ValueError(text)
    return date.fromisoformat(text[:10])


def _literal(node: exp.Expression) -> Any:
    """The Python value of a literal expression; _NO_LITERAL for anything else."""
    if isinstance(node, exp.Paren):
        return _literal(node.this)
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Boolean):
        return bool(node.this)
    if isinstance(node, exp.Literal):
        if node.is_string:
            return node.this
        try:
            return _number(node.this)
        except (ValueError, InvalidOperation):
            return _NO_LITERAL
    if isinstance(node, exp.Neg):
        inner = _literal(node.this)
        if isinstance(inner, (int, Decimal, float)) and not isinstance(inner, bool):
            return -inner
        return None if inner is None else _NO_LITERAL
    if isinstance(node, (exp.Cast, exp.TryCast)):
        inner = _literal(node.this)
        if inner is _NO_LITERAL:
            return _NO_LITERAL
        return _cast_literal(inner, node.args["to"])
    return _NO_LITERAL


# --- comparing column values with literals --------------------------------------------------------------------


def _identity(value: Any) -> Any:
    return value


def _date_to_utc(value: Any) -> datetime:
    if isinstance(value, datetime):
        return to_utc(value)
    return datetime(value.year, value.month, value.day, tzinfo=UTC)


def _naive_datetime(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value
    return datetime(value.year, value.month, value.day)


Key = Callable[[Any], Any]


def _coerce(dtype: T.DataType, literal: Any) -> tuple[Key, Any] | None:
    """How Spark compares a column of ``dtype`` with ``literal``: (monotonic map of column values into the
    comparison domain, the literal in that domain), or None when we do not model the comparison."""
    try:
        if isinstance(dtype, (*INTEGRAL_TYPES, *FLOAT_TYPES, T.DecimalType)):
            if isinstance(literal, bool) or not isinstance(literal, (int, Decimal, float)):
                return None
            if isinstance(dtype, FLOAT_TYPES) or isinstance(literal, float):
                number = float(literal)
                return None if math.isnan(number) else (float, number)
            return _identity, literal
        if isinstance(dtype, T.StringType):
            return (_identity, literal) if isinstance(literal, str) else None
        if isinstance(dtype, T.BooleanType):
            return (_identity, literal) if isinstance(literal, bool) else None
        if isinstance(dtype, T.DateType):
            if isinstance(literal, datetime):
                return _date_to_utc, to_utc(literal)
            if isinstance(literal, date):
                return _identity, literal
            if isinstance(literal, str):
                return _identity, _parse_date_text(literal)
            return None
        if isinstance(dtype, T.TimestampType):
            if isinstance(literal, datetime):
                return to_utc, to_utc(literal)
            if isinstance(literal, date):
                return to_utc, _date_to_utc(literal)
            if isinstance(literal, str):
                return to_utc, parse_timestamp(literal, ntz=False)
            return None
        if isinstance(dtype, T.TimestampNTZType):
            if isinstance(literal, str):
                parsed = datetime.fromisoformat(literal.strip())
                literal = parsed
            if isinstance(literal, datetime):
                if literal.tzinfo is None:
                    return _naive_datetime, literal
                return to_utc, to_utc(literal)
            if isinstance(literal, date):
                return _naive_datetime, _naive_datetime(literal)
            return None
    except (ValueError, TypeError, InvalidOperation, OverflowError):
        return None
    return None


# --- compiling -------------------------------------------------------------------------------------------------


class _Compiler:
    def __init__(self, schema: T.StructType, partition_columns: Sequence[str]) -> None:
        self.schema = schema
        self.partitions = {c.lower() for c in partition_columns}

    def column(self, node: exp.Expression) -> Col | None:
        parts: list[str]
        if isinstance(node, exp.Paren):
            return self.column(node.this)
        if isinstance(node, exp.Column):
            parts = [p.name for p in node.parts]
        elif isinstance(node, exp.Dot):
            base = self.column_parts(node)
            if base is None:
                return None
            parts = base
        else:
            return None
        current: T.DataType = self.schema
        resolved: list[str] = []
        for name in parts:
            if not isinstance(current, T.StructType):
                return None
            lowered = name.lower()
            match = next((f for f in current.fields if f.name == name), None) or next(
                (f for f in current.fields if f.name.lower() == lowered), None
            )
            if match is None:
                return None
            resolved.append(match.name)
            current = match.dataType
        if isinstance(current, (T.StructType, T.ArrayType, T.MapType)):
            return None
        is_partition = len(resolved) == 1 and resolved[0].lower() in self.partitions
        return Col(tuple(resolved), current, is_partition)

    def column_parts(self, node: exp.Expression) -> list[str] | None:
        if isinstance(node, exp.Column):
            return [p.name for p in node.parts]
        if isinstance(node, exp.Dot):
            left = self.column_parts(node.this)
            if left is None or not isinstance(node.expression, exp.Identifier):
                return None
            return [*left, node.expression.name]
        return None

    def comparison(self, op: str, left: exp.Expression, right: exp.Expression, null_safe: bool = False) -> Node:
        column, literal = self.column(left), _literal(right)
        if column is None or literal is _NO_LITERAL:
            column, literal = self.column(right), _literal(left)
            op = _FLIPPED_OP[op]
        if column is None or literal is _NO_LITERAL:
            return _UNKNOWN
        if literal is None:
            if null_safe:
                return IsNull(column) if op == "=" else IsNotNull(column)
            return Const(None)
        if _coerce(column.dtype, literal) is None:
            return _UNKNOWN
        if null_safe:
            return NullSafeEq(column, literal) if op == "=" else NotNullSafeEq(column, literal)
        return Cmp(op, column, literal)

    def compile(self, node: exp.Expression) -> Node:
        simple_ops: list[tuple[type[exp.Expression], str]] = [
            (exp.EQ, "="),
            (exp.NEQ, "!="),
            (exp.LT, "<"),
            (exp.LTE, "<="),
            (exp.GT, ">"),
            (exp.GTE, ">="),
        ]
        if isinstance(node, exp.Paren):
            return self.compile(node.this)
        if isinstance(node, exp.And):
            return And((self.compile(node.this), self.compile(node.expression)))
        if isinstance(node, exp.Or):
            return Or((self.compile(node.this), self.compile(node.expression)))
        if isinstance(node, exp.Not):
            return negate(self.compile(node.this))
        for cls, op in simple_ops:
            if type(node) is cls:
                return self.comparison(op, node.this, node.expression)
        if isinstance(node, exp.NullSafeEQ):
            return self.comparison("=", node.this, node.expression, null_safe=True)
        null_safe_neq = getattr(exp, "NullSafeNEQ", None)
        if null_safe_neq is not None and isinstance(node, null_safe_neq):
            return self.comparison("!=", node.this, node.expression, null_safe=True)
        if isinstance(node, exp.Is):
            column = self.column(node.this)
            if column is None:
                return _UNKNOWN
            target = node.expression
            if isinstance(target, exp.Null):
                return IsNull(column)
            if isinstance(target, exp.Boolean) and isinstance(column.dtype, T.BooleanType):
                return NullSafeEq(column, bool(target.this))
            return _UNKNOWN
        if isinstance(node, exp.In):
            column = self.column(node.this)
            if column is None or node.args.get("query") or node.args.get("unnest") or node.args.get("field"):
                return _UNKNOWN
            values = [_literal(item) for item in node.expressions]
            if any(v is _NO_LITERAL for v in values):
                return _UNKNOWN
            present = tuple(v for v in values if v is not None)
            if any(_coerce(column.dtype, v) is None for v in present):
                return _UNKNOWN
            if not present:
                return Const(None)
            in_list = InList(column, present)
            # x IN (1, NULL) is TRUE or NULL; its NOT is never TRUE: keep that through negation.
            return Or((in_list, Const(None))) if len(present) < len(values) else in_list
        if isinstance(node, exp.Between):
            if node.args.get("symmetric"):
                return _UNKNOWN
            return And(
                (
                    self.comparison(">=", node.this, node.args["low"]),
                    self.comparison("<=", node.this, node.args["high"]),
                )
            )
        if isinstance(node, exp.Boolean):
            return Const(bool(node.this))
        if isinstance(node, exp.Null):
            return Const(None)
        if isinstance(node, (exp.Column, exp.Dot)):
            column = self.column(node)
            if column is not None and isinstance(column.dtype, T.BooleanType):
                return Cmp("=", column, True)
            return _UNKNOWN
        return _UNKNOWN


def parse_predicate(predicate: str | exp.Expression) -> exp.Expression:
    if isinstance(predicate, exp.Expression):
        return predicate
    try:
        parsed = sqlglot.parse_one(predicate, read="spark")
    except sqlglot.errors.ParseError as exc:
        raise MergeSpecError(f"Cannot parse predicate {predicate!r}: {exc}") from exc
    if parsed is None:
        raise MergeSpecError(f"Empty predicate {predicate!r}")
    return parsed


# --- evaluating against one file -------------------------------------------------------------------------------


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
    coerced = _coerce(col.dtype, literal)
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
    coerced = [_coerce(col.dtype, v) for v in values]
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
        self.tree: Node = _Compiler(schema, partition_columns).compile(parse_predicate(predicate))
        lowered = {c.lower() for c in partition_columns}
        self.partition_types = {f.name: f.dataType for f in schema.fields if f.name.lower() in lowered}

    def might_match(self, add: AddFile) -> bool:
        return _may_be_true(self.tree, _FileView(add, self.partition_types))


def prune_files(snapshot: Any, files: Sequence[AddFile], predicate: str | exp.Expression) -> list[AddFile]:
    """The files that may hold a row satisfying ``predicate`` (Spark SQL over the table's columns), in input
    order. Conservative: a file is dropped only when its partition values or statistics prove it."""
    compiled = FilePredicate(predicate, snapshot.spark_schema, snapshot.partition_columns)
    return [f for f in files if compiled.might_match(f)]
