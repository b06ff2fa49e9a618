"""Per-file statistics for ``add`` actions from Parquet footers, by Delta's rules (StatisticsCollection):

- only the first ``delta.dataSkippingNumIndexedCols`` (default 32, -1 = all) leaf columns of the data schema
  (partition columns excluded), or exactly ``delta.dataSkippingStatsColumns`` when set;
- ``nullCount`` for every indexed leaf; ``minValues``/``maxValues`` for numeric, date, timestamp and string
  leaves (not boolean, binary or complex types);
- strings truncated to 32 characters: the min to a prefix, the max to a prefix plus a tie-breaker character so
  it stays an upper bound (truncateMaxStringAgg);
- timestamps at millisecond precision (floored).

Footer statistics are aggregated over row groups. Where any row group with non-null values lacks min/max (or
a float column's bound is NaN), min/max are omitted for that column: a missing statistic is never wrong.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import types as T

from engine.delta.column_mapping import is_mapped, physical_path
from engine.delta.file_stats import FileStats
from engine.delta.names import parse_column_path
from engine.delta.values import (
    FLOAT_TYPES,
    INTEGRAL_TYPES,
    is_skipping_eligible,
    leaf_fields,
    put_at_path,
    round_float32,
    to_utc,
)

DEFAULT_NUM_INDEXED_COLS = 32
STRING_PREFIX_LENGTH = 32
ASCII_MAX_CHARACTER = "\x7f"
UTF8_MAX_CHARACTER = "\U0010ffff"


def truncate_min_string(value: str, prefix_length: int = STRING_PREFIX_LENGTH) -> str:
    """Delta's truncateMinStringAgg: a prefix is never greater than the value."""
    return value if len(value) <= prefix_length else value[:prefix_length]


def truncate_max_string(value: str, prefix_length: int = STRING_PREFIX_LENGTH) -> str | None:
    """Delta's truncateMaxStringAgg (in code points): a prefix followed by a character greater than the one it
    replaces, so the result stays >= the value; None when no short upper bound exists."""
    if len(value) <= prefix_length:
        return value
    current = prefix_length
    while current <= 2 * prefix_length:
        if current >= len(value):
            return value
        if value[current] == UTF8_MAX_CHARACTER:
            current += 1
        elif value[current] < ASCII_MAX_CHARACTER:
            return value[:current] + ASCII_MAX_CHARACTER
        else:
            return value[:current] + UTF8_MAX_CHARACTER
    return None


def _split_column_list(text: str) -> list[tuple[str, ...]]:
    """``delta.dataSkippingStatsColumns``: comma-separated column paths, backquotes (a backtick doubled inside) for
    odd names; a comma inside backquotes is part of the name."""
    columns = []
    for item in re.findall(r"(?:`[^`]*`|[^,`])+", text):
        item = item.strip()
        if not item:
            continue
        columns.append(parse_column_path(item))
    return columns


def indexed_leaves(
    data_schema: T.StructType, configuration: Mapping[str, str]
) -> list[tuple[tuple[str, ...], T.DataType]]:
    """The leaf columns Delta collects statistics for."""
    leaves = list(leaf_fields(data_schema))
    stats_columns = configuration.get("delta.dataSkippingStatsColumns")
    if stats_columns:
        wanted = [tuple(p.lower() for p in path) for path in _split_column_list(stats_columns)]
        return [
            (path, dtype)
            for path, dtype in leaves
            if any(tuple(p.lower() for p in path[: len(w)]) == w for w in wanted)
        ]
    try:
        num = int(configuration.get("delta.dataSkippingNumIndexedCols", DEFAULT_NUM_INDEXED_COLS))
    except ValueError:
        num = DEFAULT_NUM_INDEXED_COLS
    return leaves if num < 0 else leaves[:num]


def _convert(value: Any, dtype: T.DataType) -> Any:
    """A footer statistic as this layer's typed value; None if it cannot be trusted."""
    if value is None:
        return None
    if isinstance(dtype, INTEGRAL_TYPES):
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else None
    if isinstance(dtype, FLOAT_TYPES):
        number = float(value)
        if not math.isfinite(number):
            return None  # JSON has no NaN or infinities; a missing bound is always safe
        return round_float32(number) if isinstance(dtype, T.FloatType) else number
    if isinstance(dtype, T.DecimalType):
        if isinstance(value, Decimal):
            return value
        if isinstance(value, int):
            return Decimal(value).scaleb(-dtype.scale)
        return None
    if isinstance(dtype, T.StringType):
        if isinstance(value, bytes):
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError:
                return None
        return value if isinstance(value, str) else None
    if isinstance(dtype, T.DateType):
        if isinstance(value, datetime):
            return value.date()
        if isinstance(value, date):
            return value
        if isinstance(value, int):
            return date.fromordinal(date(1970, 1, 1).toordinal() + value)
        return None
    if isinstance(dtype, (T.TimestampType, T.TimestampNTZType)):
        if isinstance(value, datetime):
            if isinstance(dtype, T.TimestampType):
                return to_utc(value)
            return value if value.tzinfo is None else value.astimezone(UTC).replace(tzinfo=None)
        return None
    return None


def _type_leaves(dtype: pa.DataType, path: tuple[str, ...]) -> list[tuple[str, ...]]:
    if pa.types.is_struct(dtype):
        return [
            leaf
            for i in range(dtype.num_fields)
            for leaf in _type_leaves(dtype.field(i).type, (*path, dtype.field(i).name))
        ]
    if pa.types.is_map(dtype):
        return [
            *_type_leaves(dtype.key_type, (*path, "key_value", "key")),
            *_type_leaves(dtype.item_type, (*path, "key_value", "value")),
        ]
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype) or pa.types.is_fixed_size_list(dtype):
        return _type_leaves(dtype.value_type, (*path, "list", "element"))
    return [path]


def _column_paths(metadata: pq.FileMetaData) -> list[tuple[str, ...]]:
    """Each Parquet leaf column's path as names: ``path_in_schema`` joins them with dots, which a name may
    hold (a column ``a.b`` is not the field ``b`` of ``a``), so the paths come from the schema's tree."""
    try:
        paths = [leaf for f in metadata.schema.to_arrow_schema() for leaf in _type_leaves(f.type, (f.name,))]
    except (pa.ArrowException, ValueError):
        paths = []
    if len(paths) != metadata.num_columns:
        paths = [tuple(metadata.schema.column(i).path.split(".")) for i in range(metadata.num_columns)]
    return paths


def stats_from_footer(
    metadata: pq.FileMetaData, data_schema: T.StructType, configuration: Mapping[str, str]
) -> FileStats:
    """Delta statistics for one Parquet file from its footer, keyed by the columns' logical names. Under
    column mapping the file's columns are found by their physical names."""
    num_rows = metadata.num_rows
    columns, lowered = _chunks_by_path(metadata)
    mapped = is_mapped(configuration)
    min_values: dict[str, Any] = {}
    max_values: dict[str, Any] = {}
    null_count: dict[str, Any] = {}
    for path, dtype in indexed_leaves(data_schema, configuration):
        if isinstance(dtype, (T.ArrayType, T.MapType)):
            continue  # Parquet counts null elements there, not null values of the column.
        stored = physical_path(data_schema, path) if mapped else path
        chunks = columns.get(stored) or columns.get(lowered.get(tuple(p.lower() for p in stored), ()))
        if chunks is None:
            put_at_path(null_count, path, num_rows)  # a column the file lacks reads as NULL in every row
            continue
        nulls, low, high = _column_stats(chunks, dtype)
        if nulls < 0:
            continue
        put_at_path(null_count, path, nulls)
        if low is not None and high is not None:
            if isinstance(dtype, T.StringType):
                low = truncate_min_string(low)
                high = truncate_max_string(high)
                if high is None:
                    continue
            put_at_path(min_values, path, low)
            put_at_path(max_values, path, high)
    return FileStats(num_records=num_rows, min_values=min_values, max_values=max_values, null_count=null_count)


def _chunks_by_path(
    metadata: pq.FileMetaData,
) -> tuple[dict[tuple[str, ...], list[Any]], dict[tuple[str, ...], tuple[str, ...]]]:
    """Each leaf column's (rows, statistics) per row group, by path; and the paths by their lower-case form."""
    columns: dict[tuple[str, ...], list[Any]] = {}
    lowered: dict[tuple[str, ...], tuple[str, ...]] = {}
    paths = _column_paths(metadata)
    for rg_index in range(metadata.num_row_groups):
        rg = metadata.row_group(rg_index)
        for col_index in range(rg.num_columns):
            chunk = rg.column(col_index)
            path = paths[col_index]
            columns.setdefault(path, []).append((rg.num_rows, chunk.statistics))
            lowered.setdefault(tuple(p.lower() for p in path), path)
    return columns, lowered


def _column_stats(chunks: list[Any], dtype: T.DataType) -> tuple[int, Any, Any]:
    """One column's null count (-1 when a row group does not say) and its bounds (None when not exact)."""
    nulls = 0
    low: Any = None
    high: Any = None
    bounds_ok = is_skipping_eligible(dtype)
    for rows, stats in chunks:
        if stats is None or not stats.has_null_count:
            return -1, None, None
        nulls += stats.null_count
        if not bounds_ok or stats.null_count >= rows:
            continue
        if not stats.has_min_max:
            bounds_ok = False
            continue
        if getattr(stats, "is_min_value_exact", None) is False or getattr(stats, "is_max_value_exact", None) is False:
            bounds_ok = False
            continue
        lo = _convert(stats.min, dtype)
        hi = _convert(stats.max, dtype)
        if lo is None or hi is None:
            bounds_ok = False
            continue
        low = lo if low is None or lo < low else low
        high = hi if high is None or hi > high else high
    return (nulls, low, high) if bounds_ok else (nulls, None, None)
