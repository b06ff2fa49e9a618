"""Reading chosen files of a table as one Spark DataFrame (what Delta's TahoeBatchFileIndex scan gives).

Partition columns are not stored in the files: their values come from the log, joined in by file path from a
small broadcast DataFrame (one row per file; cheap for thousands of files, unlike a CASE over paths). The join
is checked: a row whose file path does not map back fails the query instead of vanishing.

Rows a file's deletion vector deletes never leave the scan: files without a vector are read as before; files with
one are read with their log path and Parquet row index, and ``scan_deleted_rows`` drops their deleted rows.

On a table whose row tracking is enabled a scan can also give each row its stable row id and row commit version
(``ROW_ID_COL``, ``ROW_COMMIT_VERSION_COL``: the materialized columns where not NULL, else the file's ``baseRowId``
plus the row's index and its ``defaultRowCommitVersion``), which a rewrite carries into the materialized
columns of the files it writes.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from urllib.parse import unquote

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from engine.delta.actions import AddFile
from engine.delta.column_mapping import is_mapped, read_columns
from engine.delta.errors import DeltaError
from engine.delta.names import quote_identifier
from engine.delta.paths import PLAIN_PATH, spark_read_path
from engine.delta.scan_columns import (
    FILE_NAME_COL,
    FILE_NUMBER_COL,
    FILE_PATH_COL,
    ROW_COMMIT_VERSION_COL,
    ROW_ID_COL,
    ROW_INDEX_COL,
    ROW_TRACKING_COLS,
    UNMAPPED_MARKER,
    FileColumns,
    Prefilter,
    file_metadata,
    join_file_values,
    partition_values,
    select_scan_columns,
)
from engine.delta.scan_deleted_rows import live_rows
from engine.delta.scan_row_tracking import scan_with_row_tracking
from engine.delta.snapshot import Snapshot

PER_FILE_SCAN_FILES = 32
"""Up to this many files with deletion vectors, their scan reads each file on its own and gives it its log path as
a literal: naming the file from ``_metadata.file_path`` costs a new string per row (0.7 s a million rows here, twice
the read itself), and the vector's filter on a literal name folds to the row index alone. Not where bitmaps drop
the rows of an unpartitioned table's files: those are read together and joined to their bitmaps by the reader's
path (``scan_deleted_rows``). Files without vectors are read together: many small files share tasks."""


def scan_schema(snapshot: Snapshot) -> T.StructType:
    """The scan's columns: the table's, in table order, then ``FILE_NAME_COL`` and ``ROW_INDEX_COL``."""
    return T.StructType(
        [
            *snapshot.spark_schema.fields,
            T.StructField(FILE_NAME_COL, T.StringType(), False),
            T.StructField(ROW_INDEX_COL, T.LongType(), False),
        ]
    )


def scan_files(
    spark: SparkSession,
    snapshot: Snapshot,
    files: Sequence[AddFile],
    *,
    file_columns: bool = True,
    row_tracking: bool = False,
    prefilter: Prefilter | None = None,
) -> DataFrame:
    """The rows of ``files`` with the table's columns, ``FILE_NAME_COL`` (the AddFile's log path) and
    ``ROW_INDEX_COL`` (the row's position in its file). Columns the files lack (added later by schema
    evolution) read as NULL. Without ``file_columns`` only the table's columns are read, and an unpartitioned
    table is then a plain Parquet read. With ``row_tracking`` (a table whose row tracking is enabled), the
    stable ``ROW_ID_COL`` and ``ROW_COMMIT_VERSION_COL`` of every row follow. ``prefilter``: see ``Prefilter``."""
    return _scan(spark, snapshot, files, "name_and_row_index" if file_columns else "none", row_tracking, prefilter)


def scan_files_with_path(spark: SparkSession, snapshot: Snapshot, files: Sequence[AddFile]) -> DataFrame:
    """The rows of ``files`` with the table's columns and ``FILE_PATH_COL``, the reader's own name of the file
    each row comes from. It costs nothing per row, where ``FILE_NAME_COL`` costs a new string per row: for
    plans that only collect the names of a few files, which ``files_at_paths`` maps back."""
    return _scan(spark, snapshot, files, "path")


def files_at_paths(snapshot: Snapshot, files: Sequence[AddFile], paths: Iterable[str]) -> list[AddFile]:
    """The files among ``files`` that ``FILE_PATH_COL`` values name, in ``files``' order. ``unquote`` is Spark's
    ``url_decode`` of ``local_file_path`` less its reading of ``+`` as a space."""
    by_name = {add.path: add for add in files}
    by_local = {add.absolute_path(snapshot.root): add for add in files}
    found: set[str] = set()
    for path in paths:
        # A partitioned scan names its files by log path already; a plain one by Spark's ``file:`` URI.
        add = by_name.get(path) or by_local.get(unquote(re.sub(r"^file:(//)?", "", path)))
        if add is None:
            raise DeltaError(f"[{UNMAPPED_MARKER}] scanned file not in the request: {path}")
        found.add(add.path)
    return [f for f in files if f.path in found]


def _scan(
    spark: SparkSession,
    snapshot: Snapshot,
    files: Sequence[AddFile],
    file_columns: FileColumns,
    row_tracking: bool = False,
    prefilter: Prefilter | None = None,
) -> DataFrame:
    keep = prefilter or (lambda rows: rows)
    unique = list({f.path: f for f in files}.values())
    with_vectors = [f for f in unique if f.deletion_vector is not None]
    if not with_vectors:
        return keep(_scan_stored(spark, snapshot, unique, file_columns, row_tracking))
    live = live_rows(
        spark,
        snapshot,
        with_vectors,
        stored=lambda: _scan_stored(
            spark, snapshot, with_vectors, "name_and_row_index", row_tracking, per_file=True, numbered=True
        ),
        read_together=not row_tracking,
        prefilter=keep,
    )
    table_columns = [F.col(f"`{f.name}`") for f in snapshot.spark_schema.fields]
    tracking = [F.col(c) for c in ROW_TRACKING_COLS] if row_tracking else []
    if file_columns == "none":
        live = live.select(*table_columns, *tracking)
    elif file_columns == "path":
        # files_at_paths maps log paths back as well as Spark's URIs.
        live = live.select(*table_columns, F.col(FILE_NAME_COL).alias(FILE_PATH_COL), *tracking)
    without = [f for f in unique if f.deletion_vector is None]
    if not without:
        return live
    return keep(_scan_stored(spark, snapshot, without, file_columns, row_tracking)).unionByName(live)


def _scan_stored(
    spark: SparkSession,
    snapshot: Snapshot,
    unique: Sequence[AddFile],
    file_columns: FileColumns,
    row_tracking: bool = False,
    *,
    per_file: bool = False,
    numbered: bool = False,
) -> DataFrame:
    """The rows of distinct ``unique`` files as stored, deletion vectors not applied; ``per_file``: up to
    ``PER_FILE_SCAN_FILES`` files each read on its own (see there); ``numbered``: with ``FILE_NUMBER_COL`` after
    ``ROW_INDEX_COL`` (the position of the row's file in ``unique``)."""
    schema = snapshot.spark_schema
    partition_names = {c.lower() for c in snapshot.partition_columns}
    partition_fields = [f for f in schema.fields if f.name.lower() in partition_names]
    data_schema = T.StructType([f for f in schema.fields if f.name.lower() not in partition_names])
    if not unique:
        return _scan_nothing(spark, snapshot, file_columns, row_tracking)
    if row_tracking:
        return scan_with_row_tracking(
            spark, snapshot, unique, file_columns, partition_fields, data_schema, numbered=numbered
        )
    if not partition_fields:
        plain = _scan_by_plain_paths(
            spark, snapshot, unique, data_schema, file_columns, per_file=per_file, numbered=numbered
        )
        if plain is not None:
            return plain
    return _scan_by_mapped_paths(spark, snapshot, unique, partition_fields, data_schema, file_columns, numbered)


def _scan_nothing(spark: SparkSession, snapshot: Snapshot, file_columns: FileColumns, row_tracking: bool) -> DataFrame:
    schema = snapshot.spark_schema
    tracking = [T.StructField(c, T.LongType(), True) for c in ROW_TRACKING_COLS] if row_tracking else []
    empty = spark.createDataFrame([], T.StructType([*scan_schema(snapshot).fields, *tracking]))
    table_columns = [F.col(quote_identifier(f.name)) for f in schema.fields]
    tracking_columns = [F.col(c) for c in ROW_TRACKING_COLS] if row_tracking else []
    if file_columns == "path":
        return empty.select(*table_columns, F.col(FILE_NAME_COL).alias(FILE_PATH_COL), *tracking_columns)
    if file_columns == "none":
        return empty.select(*table_columns, *tracking_columns)
    return empty


def _data_columns(snapshot: Snapshot, data_schema: T.StructType) -> tuple[bool, T.StructType, list[Column]]:
    """Column mapping: whether the files hold physical names (ids in id mode), the schema to read them with, and
    the columns that answer the table's logical names."""
    return (is_mapped(snapshot.configuration), *read_columns(data_schema, snapshot.configuration))


def _scan_by_plain_paths(
    spark: SparkSession,
    snapshot: Snapshot,
    unique: Sequence[AddFile],
    data_schema: T.StructType,
    file_columns: FileColumns,
    *,
    per_file: bool = False,
    numbered: bool = False,
) -> DataFrame | None:
    """An unpartitioned table's files read with no lookup of their log paths; None when a log path must be
    looked up per file, or a file's number (``numbered``) joined in."""
    mapped, read_schema, data_columns = _data_columns(snapshot, data_schema)
    local = [snapshot.file_path(add) for add in unique]
    plain = spark.read.schema(read_schema).parquet(*(spark_read_path(p) for p in local))
    if file_columns == "none":
        return plain.select(*data_columns) if mapped else plain
    if file_columns == "path":
        return plain.select(*data_columns, file_metadata(plain).getField("file_path").alias(FILE_PATH_COL))
    if per_file and len(unique) <= PER_FILE_SCAN_FILES:
        reads = [
            read.select(
                *data_columns,
                F.lit(add.path).alias(FILE_NAME_COL),
                file_metadata(read).getField("row_index").alias(ROW_INDEX_COL),
                *([F.lit(number).cast("long").alias(FILE_NUMBER_COL)] if numbered else []),
            )
            for number, (read, add) in enumerate(
                (spark.read.schema(read_schema).parquet(spark_read_path(path)), add)
                for path, add in zip(local, unique, strict=True)
            )
        ]
        return functools.reduce(DataFrame.union, reads)
    prefix = "file:" + snapshot.root.rstrip("/") + "/"
    paths = zip(local, unique, strict=True)
    verbatim = all(PLAIN_PATH.fullmatch(p) and "file:" + p == prefix + add.path for p, add in paths)
    if verbatim and not numbered:
        # Every log path is the file's plain path under the root, which Spark reports verbatim after
        # ``file:``: the log path is a substring, with no per-row lookup.
        return plain.select(
            *data_columns,
            F.substr(file_metadata(plain).getField("file_path"), F.lit(len(prefix) + 1)).alias(FILE_NAME_COL),
            file_metadata(plain).getField("row_index").alias(ROW_INDEX_COL),
        )
    return None


def _scan_by_mapped_paths(
    spark: SparkSession,
    snapshot: Snapshot,
    unique: Sequence[AddFile],
    partition_fields: list[T.StructField],
    data_schema: T.StructType,
    file_columns: FileColumns,
    numbered: bool = False,
) -> DataFrame:
    """The files' rows joined with a broadcast mapping from each file to its log path and partition values
    (``join_file_values``); ``numbered``: see ``_scan_stored``."""
    values = [(add.path, *partition_values(add, partition_fields)) for add in unique]
    fields = [
        T.StructField(FILE_NAME_COL, T.StringType(), False),
        *[T.StructField(f.name, f.dataType, True) for f in partition_fields],
    ]
    _, read_schema, data_columns = _data_columns(snapshot, data_schema)
    local = [(snapshot.file_path(add), add) for add in unique]
    data = spark.read.schema(read_schema).parquet(*(spark_read_path(p) for p, _ in local))
    joined = join_file_values(spark, data, data_columns, local, fields, values)
    return select_scan_columns(joined, snapshot.spark_schema, file_columns, numbered=numbered)


__all__ = [
    "FILE_NAME_COL",
    "FILE_PATH_COL",
    "ROW_COMMIT_VERSION_COL",
    "ROW_ID_COL",
    "ROW_INDEX_COL",
    "ROW_TRACKING_COLS",
    "files_at_paths",
    "scan_files",
    "scan_files_with_path",
    "scan_schema",
]
