"""Reading chosen files of a table as one Spark DataFrame (what Delta's TahoeBatchFileIndex scan gives).

Partition columns are not stored in the files: their values come from the log, joined in by file path from a
small broadcast DataFrame (one row per file; cheap for thousands of files, unlike a CASE over paths). The join
is checked: a row whose file path does not map back fails the query instead of vanishing.

Rows a file's deletion vector deletes never leave the scan (PROTOCOL.md "Reader Requirements for Deletion
Vectors"). Files without a vector are read as before; files with one are read with their log path and Parquet
row index, and their deleted rows dropped there: a plan-inline ``row_index IN (...)`` per file while the scan's
vectors hold few rows (Spark turns each list into a hash set); beyond that each file's vector as a plain bitmap
(an array of longs, one bit a row) in a one-row-per-file table broadcast to the scan, a few MB for tens of millions
of rows, met by the reader's own path where Spark reports it verbatim; and for vectors wider still an anti-join
with a side table of (file number, row index) built from Arrow.
A side table of many rows is slow: Spark Connect carries it in every plan built on the scan, and converts it at
every analysis (about 2 s per 100,000 rows).

On a table whose row tracking is enabled a scan can also give each row its stable row id and row commit version
(``_row_id_``, ``_row_commit_version_``: the materialized columns where not NULL, else the file's ``baseRowId``
plus the row's index and its ``defaultRowCommitVersion``), which a rewrite carries into the materialized
columns of the files it writes.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
from pyroaring import BitMap64
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from engine.delta.actions import AddFile
from engine.delta.column_mapping import is_mapped, read_columns
from engine.delta.deletion_vectors import read_deletion_vector
from engine.delta.errors import DeltaError
from engine.delta.names import quote_identifier
from engine.delta.paths import SPARK_FILE_PATH_TO_LOCAL_SQL, spark_read_path
from engine.delta.scan_columns import (
    FILE_NAME_COL,
    FILE_PATH_COL,
    LOCAL_PATH_COL,
    ROW_COMMIT_VERSION_COL,
    ROW_ID_COL,
    ROW_INDEX_COL,
    ROW_TRACKING_COLS,
    UNMAPPED_MARKER,
    FileColumns,
    checked_file_name,
)
from engine.delta.scan_row_tracking import scan_with_row_tracking
from engine.delta.snapshot import Snapshot
from engine.delta.values import parse_partition_value

_PLAIN_PATH = re.compile(r"/[A-Za-z0-9/._=-]*")
_FILE_NUMBER_COL = "__delta_dv_file"
_DELETED_ROW_COL = "__delta_dv_row"
_ROW_BITS = 40
"""Row indexes below 2**40 (every Parquet file there is) share one long key with their file's number."""

INLINE_DELETED_ROWS = 500
"""Up to this many deleted rows in one scan, the row indexes go in the plan; beyond it, as bitmaps or in a side
table. Every analysis and run of a plan pays for each listed row (about 0.2 s per 1,000 rows for a merge's six
analyses and one job), where the broadcast bitmaps cost the same at any count: they are even at about 500 rows."""

BITMAP_WORDS = 4_000_000
"""Up to this many 64-bit words (32 MB) of plain bitmaps in one scan, deleted rows are dropped by bitmap; beyond it,
by the side table. A file's bitmap reaches its last deleted row: 15,625 words for a million rows."""
_BITMAP_COL = "__delta_dv_bitmap"
_BITMAP_FILE_COL = "__delta_dv_bitmap_file"
_LAST_DELETED_COL = "__delta_dv_last"
_WORD_COL = "__delta_dv_word"

PER_FILE_SCAN_FILES = 32
"""Up to this many files with deletion vectors, their scan reads each file on its own and gives it its log path as
a literal: naming the file from ``_metadata.file_path`` costs a new string per row (0.7 s a million rows here, twice
the read itself), and the vector's filter on a literal name folds to the row index alone. Not where bitmaps drop
the rows of an unpartitioned table's files: those are read together and joined to their bitmaps by the reader's
path (``_drop_by_bitmaps_in_one_read``). Files without vectors are read together: many small files share tasks."""

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


def scan_files(
    spark: SparkSession,
    snapshot: Snapshot,
    files: Sequence[AddFile],
    *,
    file_columns: bool = True,
    row_tracking: bool = False,
) -> DataFrame:
    """The rows of ``files`` with the table's columns, ``_file_name_`` (the AddFile's log path) and
    ``_row_index_`` (the row's position in its file). Columns the files lack (added later by schema
    evolution) read as NULL. Without ``file_columns`` only the table's columns are read, and an unpartitioned
    table is then a plain Parquet read. With ``row_tracking`` (a table whose row tracking is enabled), the
    stable ``_row_id_`` and ``_row_commit_version_`` of every row follow."""
    return _scan(spark, snapshot, files, "name_and_row_index" if file_columns else "none", row_tracking)


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
            raise DeltaError(f"[{UNMAPPED_MARKER}] scanned file not in the request: {path}")
        found.add(add.path)
    return [f for f in files if f.path in found]


def _scan(
    spark: SparkSession,
    snapshot: Snapshot,
    files: Sequence[AddFile],
    file_columns: FileColumns,
    row_tracking: bool = False,
) -> DataFrame:
    unique = list({f.path: f for f in files}.values())
    with_vectors = [f for f in unique if f.deletion_vector is not None]
    if not with_vectors:
        return _scan_stored(spark, snapshot, unique, file_columns, row_tracking)
    live = _live_rows(spark, snapshot, with_vectors, row_tracking)
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
    return _scan_stored(spark, snapshot, without, file_columns, row_tracking).unionByName(live)


def _live_rows(spark: SparkSession, snapshot: Snapshot, files: Sequence[AddFile], row_tracking: bool) -> DataFrame:
    """The rows of ``files`` (each with a deletion vector) that their vectors keep, with ``_file_name_`` and
    ``_row_index_``."""
    vectors = []
    for add in files:
        assert add.deletion_vector is not None
        vectors.append((add.path, read_deletion_vector(add.deletion_vector, snapshot.root)))
    total = sum(len(rows) for _, rows in vectors)
    by_bitmaps = total > INLINE_DELETED_ROWS and sum(_word_count(rows) for _, rows in vectors) <= BITMAP_WORDS
    read_once = (
        _drop_by_bitmaps_in_one_read(spark, snapshot, files, vectors) if by_bitmaps and not row_tracking else None
    )
    if read_once is not None:
        return read_once
    stored = _scan_stored(spark, snapshot, files, "name_and_row_index", row_tracking, per_file=True)
    return _drop_deleted_rows(spark, stored, vectors)


def _drop_deleted_rows(spark: SparkSession, scan: DataFrame, vectors: Sequence[tuple[str, BitMap64]]) -> DataFrame:
    """``scan`` (with ``_file_name_`` and ``_row_index_``) without the rows the files' deletion vectors delete."""
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
    if sum(_word_count(rows) for _, rows in vectors) <= BITMAP_WORDS:
        return _drop_by_bitmaps(spark, scan, vectors)
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


def _word_count(rows: BitMap64) -> int:
    """64-bit words of a bitmap that reaches the vector's last deleted row."""
    return (rows.max() >> 6) + 1 if rows else 0


def _drop_by_bitmaps_in_one_read(
    spark: SparkSession, snapshot: Snapshot, files: Sequence[AddFile], vectors: Sequence[tuple[str, BitMap64]]
) -> DataFrame | None:
    """An unpartitioned table's files read together, each row joined to its file's bitmap by the reader's own
    path: reading the files one by one (to name each by a literal) costs some 25 ms a file in planning and
    tasks, and the join by the reader's path needs no new string per row. The row's log path comes from the
    bitmap's row. None: a file's path is not one Spark reports verbatim, or the table has partition columns."""
    if snapshot.partition_columns:
        return None
    local = [snapshot.file_path(add) for add in files]
    if not all(_PLAIN_PATH.fullmatch(p) for p in local):
        return None
    _, read_schema, data_columns = _data_columns(snapshot, snapshot.spark_schema)
    scan = (
        spark.read.schema(read_schema)
        .parquet(*(spark_read_path(p) for p in local))
        .select(
            *data_columns,
            F.col("_metadata.file_path").alias(LOCAL_PATH_COL),
            F.col("_metadata.row_index").alias(ROW_INDEX_COL),
        )
    )
    bitmaps = _bitmaps_table(["file:" + p for p in local], vectors).append_column(
        FILE_NAME_COL, pa.array([add.path for add in files], pa.string())
    )
    on = F.col(LOCAL_PATH_COL) == F.col(_BITMAP_FILE_COL)
    joined = scan.join(F.broadcast(spark.createDataFrame(bitmaps)), on, how="left")
    unmapped = F.raise_error(
        F.concat(F.lit(f"[{UNMAPPED_MARKER}] scanned file not in the request: "), F.col(LOCAL_PATH_COL))
    )
    kept = _with_word(joined).where(F.when(F.col(_BITMAP_FILE_COL).isNull(), unmapped).otherwise(_kept_by_word()))
    table_columns = [F.col(quote_identifier(f.name)) for f in snapshot.spark_schema.fields]
    return kept.select(*table_columns, F.col(FILE_NAME_COL), F.col(ROW_INDEX_COL))


def _drop_by_bitmaps(spark: SparkSession, scan: DataFrame, vectors: Sequence[tuple[str, BitMap64]]) -> DataFrame:
    """Each file's deleted rows as a plain bitmap (an array of longs up to its last deleted row, one bit a row),
    one row per file broadcast to the scan: a row is dropped by one array read and a shift, with no per-row hash
    and no side table as long as the scan has rows."""
    bitmaps = _bitmaps_table([path for path, _ in vectors], vectors)
    # A join on an expression keeps the scan's columns first and in order, so dropping the bitmap's columns gives
    # the scan's back without asking the server for them.
    on = F.col(FILE_NAME_COL) == F.col(_BITMAP_FILE_COL)
    joined = scan.join(F.broadcast(spark.createDataFrame(bitmaps)), on, how="inner")
    kept = _with_word(joined).where(_kept_by_word())
    return kept.drop(_BITMAP_FILE_COL, _LAST_DELETED_COL, _BITMAP_COL, _WORD_COL)


def _with_word(joined: DataFrame) -> DataFrame:
    """The bitmap's word that holds the row's bit; NULL past the file's last deleted row."""
    row = F.col(ROW_INDEX_COL)
    word = F.get(F.col(_BITMAP_COL), F.shiftright(row, 6).cast("int"))
    return joined.withColumn(_WORD_COL, F.when(row <= F.col(_LAST_DELETED_COL), word))


def _kept_by_word() -> Column:
    bit = F.expr(f"shiftright(`{_WORD_COL}`, cast(`{ROW_INDEX_COL}` & 63 AS INT)) & 1")
    return F.col(_WORD_COL).isNull() | (bit == 0)


def _bitmaps_table(keys: Sequence[str], vectors: Sequence[tuple[str, BitMap64]]) -> pa.Table:
    """One row per file: its key, its last deleted row and its plain bitmap."""
    lasts, lengths, words = [], [], []
    for _, rows in vectors:
        count = _word_count(rows)
        bits = np.zeros(count * 64, dtype=np.bool_)
        bits[np.frombuffer(rows.to_array(), dtype=np.uint64)] = True
        words.append(np.packbits(bits, bitorder="little").view("<i8"))
        lasts.append(rows.max() if rows else -1)
        lengths.append(count)
    return pa.table(
        {
            _BITMAP_FILE_COL: pa.array(list(keys), pa.string()),
            _LAST_DELETED_COL: pa.array(lasts, pa.int64()),
            _BITMAP_COL: pa.ListArray.from_arrays(
                pa.array(np.concatenate([[0], np.cumsum(lengths)]), pa.int32()),
                pa.array(np.concatenate(words) if words else np.empty(0, np.int64), pa.int64()),
            ),
        }
    )


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
    spark: SparkSession,
    snapshot: Snapshot,
    unique: Sequence[AddFile],
    file_columns: FileColumns,
    row_tracking: bool = False,
    *,
    per_file: bool = False,
) -> DataFrame:
    """The rows of distinct ``unique`` files as stored, deletion vectors not applied; ``per_file``: up to
    ``PER_FILE_SCAN_FILES`` files each read on its own (see there)."""
    schema = snapshot.spark_schema
    partition_names = {c.lower() for c in snapshot.partition_columns}
    partition_fields = [f for f in schema.fields if f.name.lower() in partition_names]
    data_schema = T.StructType([f for f in schema.fields if f.name.lower() not in partition_names])
    if not unique:
        return _scan_nothing(spark, snapshot, file_columns, row_tracking)
    if row_tracking:
        return scan_with_row_tracking(spark, snapshot, unique, file_columns, partition_fields, data_schema)
    if not partition_fields:
        plain = _scan_by_plain_paths(spark, snapshot, unique, data_schema, file_columns, per_file=per_file)
        if plain is not None:
            return plain
    return _scan_by_mapped_paths(spark, snapshot, unique, partition_fields, data_schema, file_columns)


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
) -> DataFrame | None:
    """An unpartitioned table's files read with no lookup of their log paths; None when a log path must be
    looked up per file."""
    mapped, read_schema, data_columns = _data_columns(snapshot, data_schema)
    local = [snapshot.file_path(add) for add in unique]
    plain = spark.read.schema(read_schema).parquet(*(spark_read_path(p) for p in local))
    if file_columns == "none":
        return plain.select(*data_columns) if mapped else plain
    if file_columns == "path":
        return plain.select(*data_columns, F.col("_metadata.file_path").alias(FILE_PATH_COL))
    if per_file and len(unique) <= PER_FILE_SCAN_FILES:
        reads = [
            spark.read.schema(read_schema)
            .parquet(spark_read_path(path))
            .select(
                *data_columns,
                F.lit(add.path).alias(FILE_NAME_COL),
                F.col("_metadata.row_index").alias(ROW_INDEX_COL),
            )
            for path, add in zip(local, unique, strict=True)
        ]
        return functools.reduce(DataFrame.union, reads)
    prefix = "file:" + snapshot.root.rstrip("/") + "/"
    if all(_PLAIN_PATH.fullmatch(p) and "file:" + p == prefix + add.path for p, add in zip(local, unique, strict=True)):
        # Every log path is the file's plain path under the root, which Spark reports verbatim after
        # ``file:``: the log path is a substring, with no per-row lookup.
        return plain.select(
            *data_columns,
            F.expr(f"substring(_metadata.file_path, {len(prefix) + 1})").alias(FILE_NAME_COL),
            F.col("_metadata.row_index").alias(ROW_INDEX_COL),
        )
    return None


def _scan_by_mapped_paths(
    spark: SparkSession,
    snapshot: Snapshot,
    unique: Sequence[AddFile],
    partition_fields: list[T.StructField],
    data_schema: T.StructType,
    file_columns: FileColumns,
) -> DataFrame:
    """The files' rows joined with a broadcast mapping from each file's path to its log path and partition
    values."""
    schema = snapshot.spark_schema
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
            T.StructField(LOCAL_PATH_COL, T.StringType(), False),
            T.StructField(FILE_NAME_COL, T.StringType(), False),
            *[T.StructField(f.name, f.dataType, True) for f in partition_fields],
        ]
    )

    _, read_schema, data_columns = _data_columns(snapshot, data_schema)
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
        local_path.alias(LOCAL_PATH_COL),
        F.col("_metadata.row_index").alias(ROW_INDEX_COL),
    )
    mapping = spark.createDataFrame(mapping_rows, mapping_schema)
    joined = data.join(F.broadcast(mapping), on=LOCAL_PATH_COL, how="left")
    checked_name = checked_file_name()
    table_columns = [F.col(quote_identifier(f.name)) for f in schema.fields]
    if file_columns == "none":
        return joined.select(*table_columns)
    if file_columns == "path":
        return joined.select(*table_columns, checked_name.alias(FILE_PATH_COL))
    return joined.select(*table_columns, checked_name.alias(FILE_NAME_COL), F.col(ROW_INDEX_COL))


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
