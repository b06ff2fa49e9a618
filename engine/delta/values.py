"""Typed values and the Delta protocol's text forms of them: partition values, statistics, schema walking.

Typed Python values used across the layer (partition values, min/max statistics, predicate literals):
int (byte/short/int/long), float (float/double; float32 values exact as doubles), Decimal, str, bool, bytes,
date, datetime (TIMESTAMP: timezone-aware UTC; TIMESTAMP_NTZ: naive).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator, Sequence
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

import pyarrow as pa
from pyspark.sql import types as T

INTEGRAL_TYPES = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
FLOAT_TYPES = (T.FloatType, T.DoubleType)


def leaf_fields(schema: T.StructType, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], T.DataType]]:
    """Leaf columns depth-first, as Delta counts them for statistics: struct fields recurse, arrays and maps are
    one leaf each."""
    for f in schema.fields:
        path = (*prefix, f.name)
        if isinstance(f.dataType, T.StructType):
            yield from leaf_fields(f.dataType, path)
        else:
            yield path, f.dataType


def field_at(schema: T.StructType, path: tuple[str, ...] | list[str]) -> T.StructField | None:
    """The field at a nested path, names matched case-insensitively (Spark's default)."""
    current: T.DataType = schema
    found: T.StructField | None = None
    for name in path:
        if not isinstance(current, T.StructType):
            return None
        lowered = name.lower()
        found = next((f for f in current.fields if f.name == name), None) or next(
            (f for f in current.fields if f.name.lower() == lowered), None
        )
        if found is None:
            return None
        current = found.dataType
    return found


def is_skipping_eligible(dtype: T.DataType) -> bool:
    """Delta's SkippingEligibleDataType: the types that get min/max statistics."""
    return isinstance(
        dtype,
        (*INTEGRAL_TYPES, *FLOAT_TYPES, T.DecimalType, T.DateType, T.TimestampType, T.TimestampNTZType, T.StringType),
    )


def strip_nullability(dtype: T.DataType, keep_metadata: bool = False) -> T.DataType:
    """The type with every field, element and value nullable: for comparing writes to the table (metadata
    dropped), or, metadata kept, for a type a schema evolution adds to the table, which Delta adds nullable."""

    def strip(inner: T.DataType) -> T.DataType:
        return strip_nullability(inner, keep_metadata)

    if isinstance(dtype, T.StructType):
        return T.StructType(
            [
                T.StructField(f.name, strip(f.dataType), True, f.metadata if keep_metadata else None)
                for f in dtype.fields
            ]
        )
    if isinstance(dtype, T.ArrayType):
        return T.ArrayType(strip(dtype.elementType), True)
    if isinstance(dtype, T.MapType):
        return T.MapType(strip(dtype.keyType), strip(dtype.valueType), True)
    return dtype


def to_arrow_type(dtype: T.DataType) -> pa.DataType:
    """The Arrow type Delta readers (delta-rs) use for a Spark/Delta type."""
    simple: dict[type, pa.DataType] = {
        T.ByteType: pa.int8(),
        T.ShortType: pa.int16(),
        T.IntegerType: pa.int32(),
        T.LongType: pa.int64(),
        T.FloatType: pa.float32(),
        T.DoubleType: pa.float64(),
        T.StringType: pa.string(),
        T.BinaryType: pa.binary(),
        T.BooleanType: pa.bool_(),
        T.DateType: pa.date32(),
        T.TimestampType: pa.timestamp("us", tz="UTC"),
        T.TimestampNTZType: pa.timestamp("us"),
    }
    for cls, arrow in simple.items():
        if type(dtype) is cls:
            return arrow
    if isinstance(dtype, T.DecimalType):
        return pa.decimal128(dtype.precision, dtype.scale)
    if isinstance(dtype, T.StructType):
        return pa.struct([pa.field(f.name, to_arrow_type(f.dataType), f.nullable) for f in dtype.fields])
    if isinstance(dtype, T.ArrayType):
        return pa.list_(pa.field("element", to_arrow_type(dtype.elementType), dtype.containsNull))
    if isinstance(dtype, T.MapType):
        return pa.map_(to_arrow_type(dtype.keyType), to_arrow_type(dtype.valueType))
    raise TypeError(f"No Arrow type for {dtype.simpleString()}")


def to_arrow_schema(schema: T.StructType) -> pa.Schema:
    return pa.schema([pa.field(f.name, to_arrow_type(f.dataType), f.nullable) for f in schema.fields])


# --- timestamps ------------------------------------------------------------------------------------------------


def to_utc(value: datetime) -> datetime:
    """An aware UTC datetime; naive input is read as UTC (the session time zone the engine sets)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def floor_millis(value: datetime) -> datetime:
    return value.replace(microsecond=value.microsecond - value.microsecond % 1000)


def parse_timestamp(text: str, *, ntz: bool) -> datetime:
    """A Delta timestamp text (``2024-01-01 00:00:00[.ffffff]``, ISO-8601 with ``T``/``Z``/offset)."""
    value = datetime.fromisoformat(text.strip())
    if ntz:
        return value if value.tzinfo is None else value.astimezone(UTC).replace(tzinfo=None)
    return to_utc(value)


def round_float32(value: float) -> float:
    """The float32 value a decimal text denotes, as a double: statistics of FLOAT columns are written as the
    shortest text of the float32, which parses to a slightly different double."""
    if math.isnan(value) or math.isinf(value):
        return value
    try:
        return float(struct.unpack("f", struct.pack("f", value))[0])
    except OverflowError:
        return math.copysign(math.inf, value)


# --- partition values ------------------------------------------------------------------------------------------


def parse_partition_value(raw: str | None, dtype: T.DataType) -> Any:
    """A typed partition value from Delta's serialized form (None stays None)."""
    if raw is None:
        return None
    if isinstance(dtype, T.StringType):
        return raw
    if raw == "":
        return None
    if isinstance(dtype, INTEGRAL_TYPES):
        return int(raw)
    if isinstance(dtype, T.DoubleType):
        return float(raw)
    if isinstance(dtype, T.FloatType):
        return round_float32(float(raw))
    if isinstance(dtype, T.DecimalType):
        return Decimal(raw)
    if isinstance(dtype, T.BooleanType):
        return raw.strip().lower() == "true"
    if isinstance(dtype, T.DateType):
        return date.fromisoformat(raw.strip()[:10])
    if isinstance(dtype, T.TimestampType):
        return parse_timestamp(raw, ntz=False)
    if isinstance(dtype, T.TimestampNTZType):
        return parse_timestamp(raw, ntz=True)
    if isinstance(dtype, T.BinaryType):
        return raw.encode("latin-1", errors="replace")
    raise TypeError(f"Unsupported partition column type {dtype.simpleString()}")


def serialize_partition_value(value: Any, dtype: T.DataType) -> str | None:
    """Delta's partition value text for a typed value."""
    if value is None:
        return None
    if isinstance(dtype, T.TimestampType):
        return to_utc(value).strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(dtype, T.TimestampNTZType):
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(dtype, T.DateType):
        return value.isoformat()
    if isinstance(dtype, T.BooleanType):
        return "true" if value else "false"
    if isinstance(dtype, T.DecimalType):
        return format(Decimal(value), "f")
    if isinstance(dtype, T.BinaryType):
        return bytes(value).decode("latin-1")
    return str(value)


def normalize_partition_text(raw: str | None, dtype: T.DataType, session_tz: str = "UTC") -> str | None:
    """Spark's directory text for a partition value (its CAST to string) in Delta's form. Spark writes
    timestamps in the session time zone; Delta's partition values for TIMESTAMP are UTC."""
    if raw is None:
        return None
    if isinstance(dtype, T.TimestampType):
        value = datetime.fromisoformat(raw)
        if value.tzinfo is None and session_tz.upper() not in ("UTC", "Z", "GMT", "+00:00", "ETC/UTC"):
            from zoneinfo import ZoneInfo

            value = value.replace(tzinfo=ZoneInfo(session_tz))
        return serialize_partition_value(to_utc(value), dtype)
    if isinstance(dtype, T.TimestampNTZType):
        return serialize_partition_value(datetime.fromisoformat(raw), dtype)
    return raw


# --- statistics values -----------------------------------------------------------------------------------------


def normalize_stat_value(value: Any, dtype: T.DataType) -> Any:
    """A typed min/max statistic from what a log's JSON (parsed with Decimal floats) or deltalake holds.
    Answers None when the value cannot be understood: a missing statistic is always safe."""
    if value is None:
        return None
    try:
        if isinstance(dtype, INTEGRAL_TYPES):
            if isinstance(value, bool):
                return None
            number = Decimal(value) if not isinstance(value, int) else value
            return int(number) if number == int(number) else None
        if isinstance(dtype, FLOAT_TYPES):
            floating = float(value)
            if math.isnan(floating):
                return None
            return round_float32(floating) if isinstance(dtype, T.FloatType) else floating
        if isinstance(dtype, T.DecimalType):
            if isinstance(value, float):
                return Decimal(repr(value))
            return Decimal(value)
        if isinstance(dtype, T.StringType):
            return value if isinstance(value, str) else None
        if isinstance(dtype, T.DateType):
            if isinstance(value, datetime):
                return value.date()
            if isinstance(value, date):
                return value
            return date.fromisoformat(str(value)[:10])
        if isinstance(dtype, T.TimestampType):
            if isinstance(value, datetime):
                return to_utc(value)
            return parse_timestamp(str(value), ntz=False)
        if isinstance(dtype, T.TimestampNTZType):
            if isinstance(value, datetime):
                return value if value.tzinfo is None else value.astimezone(UTC).replace(tzinfo=None)
            return parse_timestamp(str(value), ntz=True)
        if isinstance(dtype, T.BooleanType):
            return value if isinstance(value, bool) else None
    except (ValueError, TypeError, InvalidOperation, OverflowError):
        return None
    return None


def stat_value_json(value: Any) -> str:
    """One statistic value as JSON text in Delta's format (decimals as numbers, timestamps ISO-8601 at
    millisecond precision, dates ``YYYY-MM-DD``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            return '"' + floor_millis(value).isoformat(timespec="milliseconds") + '"'
        utc = floor_millis(to_utc(value))
        return '"' + utc.replace(tzinfo=None).isoformat(timespec="milliseconds") + 'Z"'
    if isinstance(value, date):
        return '"' + value.isoformat() + '"'
    if isinstance(value, str):
        import json

        return json.dumps(value, ensure_ascii=False)
    raise TypeError(f"No JSON statistic for {type(value).__name__}")


MILLISECOND = timedelta(milliseconds=1)


def put_at_path(target: dict[str, Any], path: Sequence[str], value: Any) -> None:
    """``target[path[0]][path[1]]... = value``, making the nested dicts on the way: statistics' JSON shape."""
    for name in path[:-1]:
        target = target.setdefault(name, {})
    target[path[-1]] = value
