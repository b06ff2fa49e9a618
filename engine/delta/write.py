"""Writing data and change-data files with Spark, and the ``add``/``cdc`` actions that describe them.

Over Spark Connect no API returns the files a write produced, so each write goes to a folder of its own under
the table root (``<write_id>/`` for data, ``_change_data/<write_id>/`` for CDF) and this process lists it
afterwards; the storage is shared with Spark. Statistics come from the Parquet footers (pyarrow), which is
far cheaper than a Spark aggregation.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from engine.delta import row_tracking
from engine.delta.actions import AddCDCFile, AddFile, parse_schema
from engine.delta.column_mapping import (
    has_physical_names,
    is_mapped,
    physical_columns,
    physical_name,
    rename_partition_values,
)
from engine.delta.constraints import Constraint, table_constraints
from engine.delta.errors import InvalidWriteError, InvariantViolationError, WriteSchemaMismatchError
from engine.delta.internal_columns import internal_column
from engine.delta.names import quote_identifier, quote_path
from engine.delta.paths import encode_log_path, parse_partition_dir
from engine.delta.snapshot import Snapshot
from engine.delta.stats import stats_from_footer
from engine.delta.values import field_at, normalize_partition_text, strip_nullability
from engine.errors import raised_message

CHANGE_DATA_DIR = "_change_data"
CHANGE_TYPE_COL = "_change_type"
CDC_PARTITION_COL = internal_column("is_cdc")
CDC_RESERVED_COLUMNS = (CHANGE_TYPE_COL, "_commit_version", "_commit_timestamp")
TARGET_FILE_BYTES = 128 * 1024 * 1024
NOT_NULL_MARKER = "DELTA_NOT_NULL_CONSTRAINT_VIOLATED"
CHECK_MARKER = "DELTA_VIOLATE_CONSTRAINT_WITH_VALUES"
LENGTH_MARKER = "DELTA_EXCEED_CHAR_VARCHAR_LIMIT"

_WRITE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=-]{0,200}$")


def target_partitions(estimated_bytes: int, target_file_bytes: int = TARGET_FILE_BYTES) -> int:
    """How many output partitions (files per partition value) give files near ``target_file_bytes``."""
    return max(1, math.ceil(max(0, estimated_bytes) / max(1, target_file_bytes)))


def _check_write_id(write_id: str) -> None:
    if not _WRITE_ID.match(write_id) or write_id == CHANGE_DATA_DIR:
        raise InvalidWriteError(
            f"write_id {write_id!r} must be one folder name of letters, digits, '_', '-', '.', '=' that does not "
            "start with '_' or '.' (Delta treats those folders as hidden)"
        )


def _resolve_schema(snapshot: Snapshot, schema: T.StructType | str | dict[str, Any] | None) -> T.StructType:
    if schema is None:
        return snapshot.spark_schema
    if isinstance(schema, T.StructType):
        return schema
    if isinstance(schema, str):
        return parse_schema(schema)
    return T.StructType.fromJson(schema)


def _not_null_checks(column: Column, dtype: T.DataType, path: str, guard: Column | None) -> list[tuple[Column, str]]:
    """(violation condition, column path) for every NOT NULL struct field under a column."""
    checks: list[tuple[Column, str]] = []
    if isinstance(dtype, T.StructType):
        for f in dtype.fields:
            child = column.getField(f.name)
            child_path = f"{path}.{f.name}"
            parent_present = column.isNotNull() if guard is None else (guard & column.isNotNull())
            if not f.nullable:
                checks.append((parent_present & child.isNull(), child_path))
            checks.extend(_not_null_checks(child, f.dataType, child_path, parent_present))
    return checks


def _shown(value: Column) -> Column:
    return F.coalesce(value.cast("string"), F.lit("null"))


def _violation(constraint: Constraint) -> tuple[Column, Column]:
    """(the row breaks it, the error Delta raises for it): NULL breaks it as false does."""
    broken = ~F.coalesce(F.expr(constraint.expression), F.lit(False))
    values = [F.col(quote_path(path)) for path in constraint.columns]
    if constraint.kind == "length":
        message = F.concat(
            F.lit(f'[{LENGTH_MARKER}] Value "'),
            *[_shown(v) for v in values[:1]],
            F.lit(f'" exceeds char/varchar type length limitation. Failed check: {constraint.shown}.'),
        )
    else:
        lines = sorted(zip((".".join(p) for p in constraint.columns), values, strict=True), key=lambda c: c[0])
        message = F.concat(
            F.lit(
                f"[{CHECK_MARKER}] CHECK constraint {constraint.name} {constraint.shown} violated by row with values:"
            ),
            *[part for name, value in lines for part in (F.lit(f"\n - {name} : "), _shown(value))],
        )
    return broken, message


def _conform(
    df: DataFrame,
    target: T.StructType,
    extra: Sequence[T.StructField] = (),
    constraints: Sequence[Constraint] = (),
    checked_rows: Column | None = None,
) -> DataFrame:
    """``df`` with exactly the target's columns in table order under the table's names, types checked, and
    Delta's constraints enforced while Spark writes (an error, never a silent NULL or a skipped row): CHECK
    constraints, NOT NULL, column invariants and CHAR/VARCHAR lengths, in Delta's order, on ``checked_rows``."""
    by_name = {f.name.lower(): f for f in df.schema.fields}
    wanted = [*target.fields, *extra]
    problems = []
    for f in wanted:
        source = by_name.get(f.name.lower())
        if source is None:
            problems.append(f"missing column {f.name!r}")
        elif strip_nullability(source.dataType) != strip_nullability(f.dataType):
            problems.append(
                f"column {f.name!r} is {source.dataType.simpleString()}, the table has {f.dataType.simpleString()}"
            )
    known = {f.name.lower() for f in wanted}
    problems += [f"unexpected column {f.name!r}" for f in df.schema.fields if f.name.lower() not in known]
    if problems:
        raise WriteSchemaMismatchError("Data to write does not match the table schema: " + "; ".join(problems))

    columns = [F.col(quote_identifier(by_name[f.name.lower()].name)).alias(f.name) for f in wanted]
    out = df.select(*columns)
    not_null: list[tuple[Column, Column]] = []
    for f in target.fields:
        column = F.col(quote_identifier(f.name))
        paths = [(column.isNull(), f.name)] if not f.nullable else []
        paths += _not_null_checks(column, f.dataType, f.name, None)
        not_null += [
            (cond, F.lit(f"[{NOT_NULL_MARKER}] NOT NULL constraint violated for column: {path}."))
            for cond, path in paths
        ]
    checks = [
        *[_violation(c) for c in constraints if c.kind == "check"],
        *not_null,
        *[_violation(c) for c in constraints if c.kind != "check"],
    ]
    if checks:
        condition: Any = F
        for broken, message in checks:
            condition = condition.when(
                broken if checked_rows is None else checked_rows & broken, F.raise_error(message)
            )
        out = out.where(condition.otherwise(F.lit(True)))
    return out


def check_no_reserved_cdc_columns(schema: T.StructType) -> None:
    """Change Data Feed readers add these columns: a table that has CDF on cannot hold them itself."""
    reserved = [f.name for f in schema.fields if f.name.lower() in CDC_RESERVED_COLUMNS]
    if reserved:
        raise WriteSchemaMismatchError(
            f"The write contains reserved columns {reserved} that are used internally as metadata for Change Data "
            "Feed. To write to the table either rename/drop these columns or disable Change Data Feed on the table "
            "by setting delta.enableChangeDataFeed to false."
        )


def _check_fresh(out_dir: str) -> None:
    """Refuse a folder that holds files: they may belong to another (even committed) write."""
    if os.path.exists(out_dir) and os.listdir(out_dir):
        raise InvalidWriteError(f"{out_dir} already holds files: every write needs a new write_id")


def _write(spark: SparkSession, df: DataFrame, out_dir: str, partition_columns: Sequence[str]) -> None:
    writer = df.write.mode("overwrite").format("parquet")
    if partition_columns:
        writer = writer.partitionBy(*partition_columns)
    try:
        writer.save("file:" + out_dir)
    except Exception as exc:
        text = str(exc)
        for marker in (NOT_NULL_MARKER, CHECK_MARKER, LENGTH_MARKER):
            if marker in text:
                raise InvariantViolationError(raised_message(text, marker)) from exc
        raise


def _list_written(
    root: str, rel_dir: str, partition_types: dict[str, T.DataType], session_tz: str
) -> list[tuple[str, str, dict[str, str | None], os.stat_result]]:
    """(relative path, absolute path, partition values, stat) of each Parquet file Spark left in the folder."""
    out = []
    base = os.path.join(root, *rel_dir.split("/"))
    lowered = {name.lower(): name for name in partition_types}
    for folder, dirs, names in os.walk(base):
        dirs[:] = sorted(d for d in dirs if _partition_folder(d, lowered) or not d.startswith(("_", ".")))
        for name in sorted(names):
            if name.startswith(("_", ".")) or not name.endswith(".parquet"):
                continue
            absolute = os.path.join(folder, name)
            relative = os.path.relpath(absolute, root).replace(os.sep, "/")
            segments = os.path.relpath(folder, base).replace(os.sep, "/")
            values: dict[str, str | None] = {}
            for segment in [] if segments == "." else segments.split("/"):
                key, raw = parse_partition_dir(segment)
                column = lowered.get(key.lower())
                if column is None:
                    raise InvalidWriteError(f"Unexpected partition directory {segment!r} in {folder}")
                values[column] = normalize_partition_text(raw, partition_types[column], session_tz)
            if set(values) != set(partition_types):
                raise InvalidWriteError(f"{absolute} is not under one directory per partition column")
            ordered = {c: values[c] for c in partition_types}
            out.append((relative, absolute, ordered, os.stat(absolute)))
    # A data file outside the partition folders would be left out of the commit, its rows lost: refuse instead.
    every = sum(
        1
        for _folder, _dirs, names in os.walk(base)
        for name in names
        if name.endswith(".parquet") and not name.startswith(("_", "."))
    )
    if every != len(out):
        raise InvalidWriteError(f"Spark wrote {every} Parquet files under {base}, {len(out)} of them in its partitions")
    return out


def _partition_folder(folder: str, lowered: Mapping[str, str]) -> bool:
    """Whether ``folder`` is a partition column's ``k=v`` folder: one of a column named ``_x`` or ``.x`` is not
    one of the hidden folders (``_temporary``, ``.hive-staging``) a write's files are never in."""
    return "=" in folder and parse_partition_dir(folder)[0].lower() in lowered


def _partition_types(schema: T.StructType, partition_columns: Sequence[str]) -> dict[str, T.DataType]:
    types: dict[str, T.DataType] = {}
    for column in partition_columns:
        f = field_at(schema, [column])
        if f is None:
            raise WriteSchemaMismatchError(f"Partition column {column!r} is not in the table schema")
        types[f.name] = f.dataType
    return types


def _session_tz(spark: SparkSession) -> str:
    try:
        return spark.conf.get("spark.sql.session.timeZone") or "UTC"
    except Exception:
        return "UTC"


Written = list[tuple[str, str, dict[str, str | None], os.stat_result]]


class _StoredNames:
    """Column mapping on the write side: the rows go out under the physical names (with field ids) and the
    partition directories are named by physical names; the files' partition values come back by logical name.
    Without column mapping every step is the identity."""

    def __init__(self, target: T.StructType, configuration: Mapping[str, str]) -> None:
        self.target = target
        self.configuration = configuration
        self.mapped = is_mapped(configuration)
        unnamed = [f.name for f in target.fields if self.mapped and not has_physical_names(T.StructType([f]))]
        if unnamed:
            raise InvalidWriteError(f"Columns {unnamed} have no physical name on a column-mapped table")

    def frame(self, df: DataFrame, *internal: str) -> DataFrame:
        if not self.mapped:
            return df
        return df.select(*physical_columns(self.target, self.configuration), *[F.col(c) for c in internal])

    def partitions(self, parts: dict[str, T.DataType]) -> dict[str, T.DataType]:
        if not self.mapped:
            return parts
        return {_physical_name_of(self.target, name): dtype for name, dtype in parts.items()}

    def logical(self, written: Written) -> Written:
        if not self.mapped:
            return written
        return [
            (relative, absolute, rename_partition_values(values, self.target, to_physical=False), stat)
            for relative, absolute, values, stat in written
        ]


def _physical_name_of(schema: T.StructType, column: str) -> str:
    field = field_at(schema, [column])
    return column if field is None else physical_name(field)


def _adds(
    snapshot: Snapshot, written: list[tuple[str, str, dict[str, str | None], os.stat_result]], data_schema: T.StructType
) -> list[AddFile]:
    adds = []
    for relative, absolute, values, stat in written:
        footer = pq.read_metadata(absolute)
        if footer.num_rows == 0:
            os.remove(absolute)  # Spark writes an empty file for an empty input; Delta needs none.
            continue
        adds.append(
            AddFile(
                path=encode_log_path(relative),
                size=stat.st_size,
                partition_values=values,
                modification_time=int(stat.st_mtime * 1000),
                data_change=True,
                stats=stats_from_footer(footer, data_schema, snapshot.configuration),
            )
        )
    return adds


def _cdcs(written: list[tuple[str, str, dict[str, str | None], os.stat_result]]) -> list[AddCDCFile]:
    cdcs = []
    for relative, absolute, values, stat in written:
        if pq.read_metadata(absolute).num_rows == 0:
            os.remove(absolute)
            continue
        cdcs.append(AddCDCFile(path=encode_log_path(relative), partition_values=values, size=stat.st_size))
    return cdcs


def materialized_row_tracking_fields(snapshot: Snapshot) -> list[T.StructField]:
    """The hidden columns that hold preserved row ids and row commit versions (row tracking enabled), which a
    write carries after the table's columns; none otherwise."""
    names = row_tracking.materialized_columns(snapshot.protocol, snapshot.metadata)
    return [] if names is None else [T.StructField(n, T.LongType(), True) for n in names]


def write_data_files(
    spark: SparkSession,
    df: DataFrame,
    snapshot: Snapshot,
    *,
    write_id: str,
    partition_columns: Sequence[str] | None = None,
    schema: T.StructType | str | dict[str, Any] | None = None,
    materialized_row_tracking: bool = False,
) -> list[AddFile]:
    """Write ``df`` (the table's columns, any order) as Parquet under ``<root>/<write_id>/`` and answer the
    ``add`` actions, with statistics, for the files written. ``schema`` overrides the table schema (after
    schema evolution). With ``materialized_row_tracking`` ``df`` also holds the table's materialized row id and
    row commit version columns, written with the data. Nothing is committed; on failure the folder is
    removed."""
    _check_write_id(write_id)
    target = _resolve_schema(snapshot, schema)
    parts = _partition_types(target, snapshot.partition_columns if partition_columns is None else partition_columns)
    extra = materialized_row_tracking_fields(snapshot) if materialized_row_tracking else []
    conformed = _conform(df, target, extra=extra, constraints=table_constraints(snapshot.metadata))
    out_dir = os.path.join(snapshot.root, write_id)
    _check_fresh(out_dir)
    stored = _StoredNames(target, snapshot.configuration)
    try:
        _write(spark, stored.frame(conformed, *(f.name for f in extra)), out_dir, list(stored.partitions(parts)))
        written = stored.logical(_list_written(snapshot.root, write_id, stored.partitions(parts), _session_tz(spark)))
        return _adds(snapshot, written, T.StructType([f for f in target.fields if f.name not in parts]))
    except BaseException:
        snapshot.storage.delete(write_id)
        raise


def write_data_and_cdc_files(
    spark: SparkSession,
    df: DataFrame,
    snapshot: Snapshot,
    *,
    write_id: str,
    schema: T.StructType | str | dict[str, Any] | None = None,
    materialized_row_tracking: bool = False,
) -> tuple[list[AddFile], list[AddCDCFile]]:
    """Write table rows and Change Data Feed rows in one Spark write: ``df`` has the table's columns plus
    ``_change_type``, NULL on the rows of the new table version. Delta's own ``__is_cdc`` partition (here
    ``CDC_PARTITION_COL``, under the internal prefix): the rows are split by it as the first partition column,
    then the change files move to ``_change_data/<write_id>/`` and the data files up to ``<write_id>/``. The data
    files keep the all-NULL ``_change_type`` column, as Delta's do; readers skip columns outside the table schema
    (the materialized row tracking columns with ``materialized_row_tracking`` too). Answers the ``add`` and
    ``cdc`` actions."""
    _check_write_id(write_id)
    target = _resolve_schema(snapshot, schema)
    check_no_reserved_cdc_columns(target)
    parts = _partition_types(target, snapshot.partition_columns)
    tracking = materialized_row_tracking_fields(snapshot) if materialized_row_tracking else []
    # Change rows hold table rows as they were or as the data rows hold them: only the data rows are checked.
    conformed = _conform(
        df,
        target,
        extra=[T.StructField(CHANGE_TYPE_COL, T.StringType(), True), *tracking],
        constraints=table_constraints(snapshot.metadata),
        checked_rows=F.col(CHANGE_TYPE_COL).isNull(),
    )
    # Change files hold physical names too, and ``_change_type`` (and the materialized row tracking columns) under
    # their own names: Delta's internal columns.
    stored = _StoredNames(target, snapshot.configuration)
    split = stored.frame(conformed, CHANGE_TYPE_COL, *(f.name for f in tracking))
    split = split.withColumn(CDC_PARTITION_COL, F.col(CHANGE_TYPE_COL).isNotNull())
    stored_parts = stored.partitions(parts)
    cdc_rel = f"{CHANGE_DATA_DIR}/{write_id}"
    out_dir = os.path.join(snapshot.root, write_id)
    cdc_dir = os.path.join(snapshot.root, CHANGE_DATA_DIR, write_id)
    _check_fresh(out_dir)
    _check_fresh(cdc_dir)
    try:
        _write(spark, split, out_dir, [CDC_PARTITION_COL, *stored_parts])
        _move_tree(os.path.join(out_dir, f"{CDC_PARTITION_COL}=true"), cdc_dir)
        _move_tree(os.path.join(out_dir, f"{CDC_PARTITION_COL}=false"), out_dir)
        tz = _session_tz(spark)
        adds = _adds(
            snapshot,
            stored.logical(_list_written(snapshot.root, write_id, stored_parts, tz)),
            T.StructType([f for f in target.fields if f.name not in parts]),
        )
        cdcs = _cdcs(stored.logical(_list_written(snapshot.root, cdc_rel, stored_parts, tz)))
    except BaseException:
        snapshot.storage.delete(write_id)
        snapshot.storage.delete(cdc_rel)
        raise
    return adds, cdcs


def _move_tree(source: str, destination: str) -> None:
    """Move the Parquet files under ``source`` to the same relative places under ``destination``, then drop
    ``source``. A rename on one file system: no data is copied."""
    if not os.path.isdir(source):
        return
    for folder, _dirs, names in os.walk(source):
        relative = os.path.relpath(folder, source)
        target_folder = os.path.normpath(os.path.join(destination, relative))
        for name in names:
            if name.startswith(("_", ".")):
                continue  # Spark's _SUCCESS and .crc files stay behind and go with the folder.
            os.makedirs(target_folder, exist_ok=True)
            os.replace(os.path.join(folder, name), os.path.join(target_folder, name))
    shutil.rmtree(source)


def discard_write(snapshot: Snapshot, write_id: str) -> None:
    """Best-effort removal of an uncommitted write's data and change-data folders. Never call it for a write
    whose commit may have landed."""
    _check_write_id(write_id)
    storage = snapshot.storage
    storage.delete(write_id)
    storage.delete(f"{CHANGE_DATA_DIR}/{write_id}")
