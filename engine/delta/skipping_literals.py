"""SQL literals as data skipping reads them: a literal expression's Python value (a literal CAST evaluated as
Spark would), and how Spark compares a column of a given type with that value."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, date, datetime
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any

from pyspark.sql import types as T
from sqlglot import exp

from engine.delta.values import (
    FLOAT_TYPES,
    INTEGRAL_TYPES,
    parse_timestamp,
    round_float32,
    to_utc,
)

# --- literals --------------------------------------------------------------------------------------------------

NO_LITERAL = object()


def _number(text: str) -> int | Decimal | float:
    lowered = text.lower()
    if "e" in lowered:
        return float(text)
    if "." in text:
        return Decimal(text)
    return int(text)


def _cast_literal(value: Any, to: exp.DataType) -> Any:
    """A literal CAST evaluated as Spark would, or NO_LITERAL when we do not model it."""
    if value is None:
        return None
    kind = to.this
    D = exp.DataType.Type
    try:
        if kind in (D.TINYINT, D.SMALLINT, D.INT, D.BIGINT):
            return _cast_to_integer(value)
        if kind in (D.DOUBLE, D.FLOAT):
            return _cast_to_floating(value, single=kind == D.FLOAT)
        if kind == D.DECIMAL:
            return _cast_to_decimal(value, to)
        if kind in (D.VARCHAR, D.CHAR, D.TEXT, D.NVARCHAR, D.NCHAR):
            return value if isinstance(value, str) else NO_LITERAL
        if kind == D.DATE:
            return _cast_to_date(value)
        if kind in (D.TIMESTAMP, D.TIMESTAMPTZ, D.TIMESTAMPLTZ):
            return _cast_to_timestamp(value)
        if kind == D.TIMESTAMPNTZ:
            return _cast_to_timestamp_ntz(value)
        if kind == D.BOOLEAN:
            return _cast_to_boolean(value)
    except (ValueError, TypeError, InvalidOperation, OverflowError):
        return NO_LITERAL
    return NO_LITERAL


def _cast_to_integer(value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, str):
        return int(value.strip())
    if isinstance(value, (int, Decimal)):
        return int(value)
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    return NO_LITERAL


def _cast_to_floating(value: Any, *, single: bool) -> Any:
    if isinstance(value, (str, int, Decimal, float)) and not isinstance(value, bool):
        number = float(value)
        return round_float32(number) if single else number
    return NO_LITERAL


def _cast_to_decimal(value: Any, to: exp.DataType) -> Any:
    if isinstance(value, bool) or not isinstance(value, (str, int, Decimal, float)):
        return NO_LITERAL
    params = [p.this for p in to.expressions] if to.expressions else []
    scale = int(params[1].name) if len(params) > 1 else 0
    number = Decimal(str(value).strip()) if not isinstance(value, float) else Decimal(repr(value))
    return number.quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_UP)


def _cast_to_date(value: Any) -> Any:
    if isinstance(value, datetime):
        return to_utc(value).date() if value.tzinfo else value.date()
    if isinstance(value, date):
        return value
    if isinstance(value, str):
        return _parse_date_text(value)
    return NO_LITERAL


def _cast_to_timestamp(value: Any) -> Any:
    if isinstance(value, datetime):
        return to_utc(value)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day, tzinfo=UTC)
    if isinstance(value, str):
        return parse_timestamp(value, ntz=False)
    return NO_LITERAL


def _cast_to_timestamp_ntz(value: Any) -> Any:
    if isinstance(value, datetime):
        return value if value.tzinfo is None else value.astimezone(UTC).replace(tzinfo=None)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day)
    if isinstance(value, str):
        return parse_timestamp(value, ntz=True)
    return NO_LITERAL


def _cast_to_boolean(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return NO_LITERAL


def _parse_date_text(text: str) -> date:
    text = text.strip()
    if len(text) > 10 and text[10] not in (" ", "T"):
        raise ValueError(text)
    return date.fromisoformat(text[:10])


def literal_value(node: exp.Expression) -> Any:
    """The Python value of a literal expression; NO_LITERAL for anything else."""
    if isinstance(node, exp.Paren):
        return literal_value(node.this)
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
            return NO_LITERAL
    if isinstance(node, exp.Neg):
        inner = literal_value(node.this)
        if isinstance(inner, (int, Decimal, float)) and not isinstance(inner, bool):
            return -inner
        return None if inner is None else NO_LITERAL
    if isinstance(node, (exp.Cast, exp.TryCast)):
        inner = literal_value(node.this)
        if inner is NO_LITERAL:
            return NO_LITERAL
        return _cast_literal(inner, node.args["to"])
    return NO_LITERAL


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


def coerce(dtype: T.DataType, literal: Any) -> tuple[Key, Any] | None:
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
