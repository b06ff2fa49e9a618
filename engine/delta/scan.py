"""Reading chosen files of a table as one Spark DataFrame (what Delta's TahoeBatchFileIndex scan gives).

Partition columns are not stored in the files: their values come from the log, joined in by file path from a
small broadcast DataFrame (one row per file; cheap for thousands of files, unlike a CASE over paths). The join
is checked: a row whose file path does not map back fails the query instead of vanishing.

Rows a file's deletion vector deletes never leave the scan (PROTOCOL.md "Reader Requirements for Deletion
Vectors"). Files without a vector are read as before; files with one are read with their log path and Parquet
row index, and their deleted rows dropped there: a plan-inline ``row_index IN (...)`` per file while the scan's
vectors hold few rows (Spark turns each list into a hash set), and beyond that an anti-join with a side table
of (file number, row index) built from Arrow, so a vector of millions of rows costs a hash probe per row, not a
plan of millions of literals.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Literal
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
from pyroaring import BitMap64
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from engine.delta.actions import AddFile
from engine.delta.column_mapping import is_mapped, logical_columns, physical_schema
from engine.delta.deletion_vectors import read_deletion_vector
from engine.delta.errors import DeltaError
from engine.delta.names import quote_identifier
from engine.delta.paths import SPARK_FILE_PATH_TO_LOCAL_SQL, spark_read_path
from engine.delta.snapshot import Snapshot
from engine.delta.values import parse_partition_value

FILE_NAME_COL = "_file_name_"
ROW_INDEX_COL = "_row_index_"
FILE_PATH_COL = "_file_path_"
_LOCAL_PATH_COL = "__delta_local_path"
_UNMAPPED_MARKER = "DELTA_SCAN_UNMAPPED_FILE"
_PLAIN_PATH = re.compile(r"/[A-Za-z0-9/._=-]*")
_FILE_NUMBER_COL = "__delta_dv_file"
_DELETED_ROW_COL = "__delta_dv_row"
_ROW_BITS = 40
"""Row indexes below 2**40 (every Parquet file there is) share one long key with their file's number."""

INLINE_DELETED_ROWS = 5_000
"""Up to this many deleted rows in one scan, the row indexes go in the plan; beyond it, in a side table."""

BROADCAST_DELETED_ROWS = 4_000_000
"""Up to this many deleted rows the side table is broadcast (about 12 bytes a row), so the scan is not shuffled."""


def scan_schema(snapshot: Snapshot) -> T.StructType:
    """The scan's columns: the table's, in table order, then ``_file_name_`` and ``_row_index_``."""
    return T.StructType(
        [
            *snapshot.spark_schema.fields,
            T.StructField(FILE_NAME_COL, T.StringType(), False),
            T.StructField(ROW_INDEX_COL, T.LongType(), False),
        ]
    )


FileColumns = Literal["name_and_row_index", "path", "none"]


def scan_files(
    spark: SparkSession, snapshot: Snapshot, files: Sequence[AddFile], *, file_columns: bool = True
) -> DataFrame:
    """The rows of ``files`` with the table's columns, ``_file_name_`` (the AddFile's log path) and
    ``_row_index_`` (the row's position in its file). Columns the files lack (added later by schema
    evolution) read as NULL. Without ``file_columns`` only the table's columns are read, and an unpartitioned
    table is then a plain Parquet read."""
    return _scan(spark, snapshot, files, "name_and_row_index" if file_columns else "none")


def scan_files_with_path(spark: SparkSession, snapshot: Snapshot, files: Sequence[AddFile]) -> DataFrame:
    """The rows of ``files`` with the table's columns and ``_file_path_``, the reader's own name of the file
    each row comes from. It costs nothing per row, where ``_file_name_`` costs a new string per row: for
    plans that only collect the names of a few files, which ``files_at_paths`` maps back."""
    return _scan(spark, snapshot, files, "path")


def files_at_paths(snapshot: Snapshot, files: Sequence[AddFile], paths: Iterable[str]) -> list[AddFile]:
    """The files among ``files`` that ``_file_path_`` values name, in ``files``' order. ``unquote`` is Spark's
    ``url_decode`` of ``SPARK_FILE_PATH_TO_LOCAL_SQL`` less its reading of ``+`` as a space."""
    by_name = {add.path: add for add in files}
    by_local = {add.absolute_path(snapshot.root): add for add in files}
    found: set[str] = set()
    for path in paths:
        # A partitioned scan names its files by log path already; a plain one by Spark's ``file:`` URI.
        add = by_name.get(path) or by_local.get(unquote(re.sub(r"^file:(//)?", "", path)))
        if add is None:
            raise DeltaError(f"[{_UNMAPPED_MARKER}] scanned file not in the request: {path}")
        found.add(add.path)
    return [f for f in files if f.path in found]


def _scan(spark: SparkSession, snapshot: Snapshot, files: Sequence[AddFile], file_columns: FileColumns) -> DataFrame:
    unique = list({f.path: f for f in files}.values())
    with_vectors = [f for f in unique if f.deletion_vector is not None]
    if not with_vectors:
        return _scan_stored(spark, snapshot, unique, file_columns)
    live = _drop_deleted_rows(
        spark, snapshot, _scan_stored(spark, snapshot, with_vectors, "name_and_row_index"), with_vectors
    )
    table_columns = [F.col(f"`{f.name}`") for f in snapshot.spark_schema.fields]
    if file_columns == "none":
        live = live.select(*table_columns)
    elif file_columns == "path":
        # files_at_paths maps log paths back as well as Spark's URIs.
        live = live.select(*table_columns, F.col(FILE_NAME_COL).alias(FILE_PATH_COL))
    without = [f for f in unique if f.deletion_vector is None]
    if not without:
        return live
    return _scan_stored(spark, snapshot, without, file_columns).unionByName(live)


def _drop_deleted_rows(spark: SparkSession, snapshot: Snapshot, scan: DataFrame, files: Sequence[AddFile]) -> DataFrame:
    """``scan`` (with ``_file_name_`` and ``_row_index_``) without the rows the files' deletion vectors delete."""
    vectors = []
    for add in files:
        assert add.deletion_vector is not None
        vectors.append((add.path, read_deletion_vector(add.deletion_vector, snapshot.root)))
    total = sum(len(rows) for _, rows in vectors)
    if total == 0:
        return scan
    if total <= INLINE_DELETED_ROWS:
        # One CASE over the files (few: only those with vectors), each branch a hash set of row indexes.
        deleted = F.lit(False)
        for path, rows in reversed(vectors):
            if rows:
                deleted = F.when(F.col(FILE_NAME_COL) == path, F.col(ROW_INDEX_COL).isin(list(rows))).otherwise(deleted)
        return scan.where(~deleted)
    numbers = spark.createDataFrame(
        [(path, number) for number, (path, _) in enumerate(vectors)],
        T.StructType(
            [
                T.StructField(FILE_NAME_COL, T.StringType(), False),
                T.StructField(_FILE_NUMBER_COL, T.LongType(), False),
            ]
        ),
    )
    numbered = scan.join(F.broadcast(numbers), on=FILE_NAME_COL, how="inner")
    side = spark.createDataFrame(_deleted_rows_table(vectors))
    broadcast = total <= BROADCAST_DELETED_ROWS
    widest = max((rows.max() for _, rows in vectors if rows), default=0)
    if widest < 1 << _ROW_BITS and len(vectors) < 1 << (63 - _ROW_BITS):
        # One long key (file number, row index) hashes and compares faster than the pair.
        keyed = numbered.withColumn(
            _DELETED_ROW_COL, F.shiftleft(F.col(_FILE_NUMBER_COL), _ROW_BITS) + F.col(ROW_INDEX_COL)
        )
        keys = side.select(
            (F.shiftleft(F.col(_FILE_NUMBER_COL), _ROW_BITS) + F.col(_DELETED_ROW_COL)).alias(_DELETED_ROW_COL)
        )
        kept = keyed.join(F.broadcast(keys) if broadcast else keys, on=_DELETED_ROW_COL, how="left_anti")
    else:
        side = F.broadcast(side) if broadcast else side
        kept = numbered.join(
            side,
            (numbered[_FILE_NUMBER_COL] == side[_FILE_NUMBER_COL])
            & (numbered[ROW_INDEX_COL] == side[_DELETED_ROW_COL]),
            how="left_anti",
        )
    return kept.select(*[F.col(f"`{c}`") for c in scan.columns])


def _deleted_rows_table(vectors: Sequence[tuple[str, BitMap64]]) -> pa.Table:
    """(file number, row index) for every deleted row, built column-wise without a Python object per row."""
    numbers = []
    rows = []
    for number, (_, bitmap) in enumerate(vectors):
        values = np.frombuffer(bitmap.to_array(), dtype=np.uint64).astype(np.int64)
        rows.append(values)
        numbers.append(np.full(len(values), number, dtype=np.int64))
    return pa.table(
        {
            _FILE_NUMBER_COL: pa.array(np.concatenate(numbers), pa.int64()),
            _DELETED_ROW_COL: pa.array(np.concatenate(rows), pa.int64()),
        }
    )


def _scan_stored(
    spark: SparkSession, snapshot: Snapshot, unique: Sequence[AddFile], file_columns: FileColumns
) -> DataFrame:
    """The rows of distinct ``unique`` files as stored, deletion vectors not applied."""
    schema = snapshot.spark_schema
    partition_names = {c.lower() for c in snapshot.partition_columns}
    partition_fields = [f for f in schema.fields if f.name.lower() in partition_names]
    data_schema = T.StructType([f for f in schema.fields if f.name.lower() not in partition_names])
    # Column mapping: the files hold physical names (ids in id mode); the scan answers logical names.
    mapped = is_mapped(snapshot.configuration)
    read_schema = physical_schema(data_schema, snapshot.configuration)
    data_columns = (
        logical_columns(data_schema) if mapped else [F.col(quote_identifier(f.name)) for f in data_schema.fields]
    )
    if not unique:
        empty = spark.createDataFrame([], scan_schema(snapshot))
        if file_columns == "path":
            return empty.select(
                *[F.col(quote_identifier(f.name)) for f in schema.fields], F.col(FILE_NAME_COL).alias(FILE_PATH_COL)
            )
        if file_columns == "none":
            return empty.select(*[F.col(quote_identifier(f.name)) for f in schema.fields])
        return empty
    if not partition_fields:
        local = [snapshot.file_path(add) for add in unique]
        plain = spark.read.schema(read_schema).parquet(*(spark_read_path(p) for p in local))
        if file_columns == "none":
            return plain.select(*data_columns) if mapped else plain
        if file_columns == "path":
            return plain.select(*data_columns, F.col("_metadata.file_path").alias(FILE_PATH_COL))
        prefix = "file:" + snapshot.root.rstrip("/") + "/"
        if all(
            _PLAIN_PATH.fullmatch(p) and "file:" + p == prefix + add.path for p, add in zip(local, unique, strict=True)
        ):
            # Every log path is the file's plain path under the root, which Spark reports verbatim after
            # ``file:``: the log path is a substring, with no per-row lookup.
            return plain.select(
                *data_columns,
                F.expr(f"substring(_metadata.file_path, {len(prefix) + 1})").alias(FILE_NAME_COL),
                F.col("_metadata.row_index").alias(ROW_INDEX_COL),
            )

    mapping_rows = []
    for add in unique:
        values = {k.lower(): v for k, v in add.partition_values.items()}
        mapping_rows.append(
            (
                snapshot.file_path(add),
                add.path,
                *(parse_partition_value(values.get(f.name.lower()), f.dataType) for f in partition_fields),
            )
        )
    mapping_schema = T.StructType(
        [
            T.StructField(_LOCAL_PATH_COL, T.StringType(), False),
            T.StructField(FILE_NAME_COL, T.StringType(), False),
            *[T.StructField(f.name, f.dataType, True) for f in partition_fields],
        ]
    )

    data = spark.read.schema(read_schema).parquet(*(spark_read_path(p[0]) for p in mapping_rows))
    if all(_PLAIN_PATH.fullmatch(row[0]) for row in mapping_rows):
        # Spark reports such paths verbatim as ``file:<path>``: joining on the raw column spares decoding every
        # row (a regex, a replace and a URL-decode per row cost more than reading the file).
        mapping_rows = [("file:" + row[0], *row[1:]) for row in mapping_rows]
        local_path = F.col("_metadata.file_path")
    else:
        local_path = F.expr(SPARK_FILE_PATH_TO_LOCAL_SQL.format(col="_metadata.file_path"))
    data = data.select(
        *data_columns,
        local_path.alias(_LOCAL_PATH_COL),
        F.col("_metadata.row_index").alias(ROW_INDEX_COL),
    )
    mapping = spark.createDataFrame(mapping_rows, mapping_schema)
    joined = data.join(F.broadcast(mapping), on=_LOCAL_PATH_COL, how="left")
    checked_name = F.when(
        F.col(FILE_NAME_COL).isNull(),
        F.raise_error(
            F.concat(F.lit(f"[{_UNMAPPED_MARKER}] scanned file not in the request: "), F.col(_LOCAL_PATH_COL))
        ),
    ).otherwise(F.col(FILE_NAME_COL))
    table_columns = [F.col(quote_identifier(f.name)) for f in schema.fields]
    if file_columns == "none":
        return joined.select(*table_columns)
    if file_columns == "path":
        return joined.select(*table_columns, checked_name.alias(FILE_PATH_COL))
    return joined.select(*table_columns, checked_name.alias(FILE_NAME_COL), F.col(ROW_INDEX_COL))
