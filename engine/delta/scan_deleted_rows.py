"""Dropping the rows a file's deletion vector deletes from a scan (PROTOCOL.md "Reader Requirements for Deletion
Vectors"), by Parquet row index: a plan-inline set of row indexes per file while the scan's vectors hold few rows
(an array literal for up to ten, else ``IN``, which Spark turns into a hash set); beyond that each file's vector as
a plain bitmap (an array of longs, one bit a row) in a one-row-per-file table broadcast to the scan, a few MB for tens
of millions of rows, met by the file's size where Spark reports its path verbatim (one file's bitmap crossed with its
own read), else by the file's number in the scan; and for vectors wider still an anti-join with a side table of
(file number, row index) built from Arrow. A side table of many rows is slow: Spark Connect carries it in every plan
built on the scan, and converts it at every analysis (about 2 s per 100,000 rows)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
from pyroaring import BitMap64
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from engine.delta.actions import AddFile
from engine.delta.column_mapping import read_columns
from engine.delta.deletion_vectors import read_deletion_vector
from engine.delta.internal_columns import internal_column
from engine.delta.names import quote_identifier
from engine.delta.paths import PLAIN_PATH, spark_read_path
from engine.delta.scan_columns import (
    FILE_NAME_COL,
    FILE_NUMBER_COL,
    LOCAL_PATH_COL,
    LOCAL_SIZE_COL,
    ROW_INDEX_COL,
    Prefilter,
    among_longs,
    file_join,
    file_metadata,
)
from engine.delta.snapshot import Snapshot

_SIDE_FILE_COL = internal_column("dv_file")
_DELETED_ROW_COL = internal_column("dv_row")
_ROW_BITS = 40
"""Row indexes below 2**40 (every Parquet file there is) share one long key with their file's number."""

INLINE_DELETED_ROWS = 500
"""Up to this many deleted rows in one scan, the row indexes go in the plan; beyond it, as bitmaps or in a side
table. Every analysis and run of a plan pays for each listed row (about 0.2 s per 1,000 rows for a merge's six
analyses and one job), where the broadcast bitmaps cost the same at any count: they are even at about 500 rows."""

IN_SET_CONVERSION_THRESHOLD = 10
"""Spark's ``spark.sql.optimizer.inSetConversionThreshold``: longer ``IN`` lists of literals become a hash set."""

BITMAP_WORDS = 4_000_000
"""Up to this many 64-bit words (32 MB) of plain bitmaps in one scan, deleted rows are dropped by bitmap; beyond it,
by the side table. A file's bitmap reaches its last deleted row: 15,625 words for a million rows."""
_BITMAP_COL = internal_column("dv_bitmap")
_BITMAP_FILE_COL = internal_column("dv_bitmap_file")
_BITMAP_NUMBER_COL = internal_column("dv_bitmap_number")
_LAST_DELETED_COL = internal_column("dv_last")
_WORD_COL = internal_column("dv_word")
_BITMAP_SIZE_COL = internal_column("dv_bitmap_size")

BROADCAST_DELETED_ROWS = 4_000_000
"""Up to this many deleted rows the side table is broadcast (about 12 bytes a row), so the scan is not shuffled."""


def live_rows(
    spark: SparkSession,
    snapshot: Snapshot,
    files: Sequence[AddFile],
    *,
    stored: Callable[[], DataFrame],
    read_together: bool,
    prefilter: Prefilter,
) -> DataFrame:
    """The rows of ``files`` (each with a deletion vector) that their vectors keep, with ``FILE_NAME_COL`` and
    ``ROW_INDEX_COL``. ``stored``: the files' rows as stored, each file read on its own where few, with those
    columns and ``FILE_NUMBER_COL`` (the file's position in ``files``); ``read_together``: whether bitmaps may
    read the files in one read of their own (a scan with row tracking needs the stored read's columns);
    ``prefilter``: applied to the stored rows before their vectors meet them."""
    vectors = []
    for add in files:
        assert add.deletion_vector is not None
        vectors.append((add.path, read_deletion_vector(add.deletion_vector, snapshot.root)))
    total = sum(len(rows) for _, rows in vectors)
    by_bitmaps = total > INLINE_DELETED_ROWS and sum(_word_count(rows) for _, rows in vectors) <= BITMAP_WORDS
    # One file's bitmap needs no join by path: its own read meets the bitmap's one row (see _drop_by_bitmaps).
    one_read = by_bitmaps and read_together and len(vectors) > 1
    read_once = _drop_by_bitmaps_in_one_read(spark, snapshot, files, vectors, prefilter) if one_read else None
    if read_once is not None:
        return read_once
    return _drop_deleted_rows(spark, prefilter(stored()), vectors)


def _drop_deleted_rows(spark: SparkSession, scan: DataFrame, vectors: Sequence[tuple[str, BitMap64]]) -> DataFrame:
    """``scan`` (with ``ROW_INDEX_COL`` and ``FILE_NUMBER_COL``, the position of the row's file in ``vectors``)
    without the rows the files' deletion vectors delete, and without ``FILE_NUMBER_COL``."""
    total = sum(len(rows) for _, rows in vectors)
    if total == 0:
        return scan.drop(FILE_NUMBER_COL)
    if total <= INLINE_DELETED_ROWS:
        # One CASE over the files (few: only those with vectors), each branch a hash set of row indexes.
        deleted = F.lit(False)
        for number, (_, rows) in reversed(list(enumerate(vectors))):
            if rows:
                deleted = F.when(F.col(FILE_NUMBER_COL) == number, _deleted_row(rows)).otherwise(deleted)
        return scan.where(~deleted).drop(FILE_NUMBER_COL)
    if sum(_word_count(rows) for _, rows in vectors) <= BITMAP_WORDS:
        return _drop_by_bitmaps(spark, scan, vectors)
    side = spark.createDataFrame(_deleted_rows_table(vectors))
    broadcast = total <= BROADCAST_DELETED_ROWS
    widest = max((rows.max() for _, rows in vectors if rows), default=0)
    if widest < 1 << _ROW_BITS and len(vectors) < 1 << (63 - _ROW_BITS):
        # One long key (file number, row index) hashes and compares faster than the pair.
        keyed = scan.withColumn(_DELETED_ROW_COL, F.shiftleft(F.col(FILE_NUMBER_COL), _ROW_BITS) + F.col(ROW_INDEX_COL))
        keys = side.select(
            (F.shiftleft(F.col(_SIDE_FILE_COL), _ROW_BITS) + F.col(_DELETED_ROW_COL)).alias(_DELETED_ROW_COL)
        )
        kept = keyed.join(F.broadcast(keys) if broadcast else keys, on=_DELETED_ROW_COL, how="left_anti")
        return kept.drop(_DELETED_ROW_COL, FILE_NUMBER_COL)
    side = F.broadcast(side) if broadcast else side
    kept = scan.join(
        side,
        (scan[FILE_NUMBER_COL] == side[_SIDE_FILE_COL]) & (scan[ROW_INDEX_COL] == side[_DELETED_ROW_COL]),
        how="left_anti",
    )
    return kept.drop(FILE_NUMBER_COL)


def _deleted_row(rows: BitMap64) -> Column:
    """Whether the row's index is one of ``rows``, in a form generated code takes by reference, so that a new small
    vector does not compile the scan's code anew: an array literal for a few, ``IN`` (a hash set to Spark) beyond."""
    values = list(rows)
    if len(values) > IN_SET_CONVERSION_THRESHOLD:
        return F.col(ROW_INDEX_COL).isin(values)
    return among_longs(F.col(ROW_INDEX_COL), values)


def _word_count(rows: BitMap64) -> int:
    """64-bit words of a bitmap that reaches the vector's last deleted row."""
    return (rows.max() >> 6) + 1 if rows else 0


def _drop_by_bitmaps_in_one_read(
    spark: SparkSession,
    snapshot: Snapshot,
    files: Sequence[AddFile],
    vectors: Sequence[tuple[str, BitMap64]],
    prefilter: Prefilter,
) -> DataFrame | None:
    """An unpartitioned table's files read together, each row joined to its file's bitmap: reading the files one
    by one (to name each by a literal) costs some 25 ms a file in planning and tasks. The join's key is the file's
    size (``_metadata.file_size``): a join by the reader's path hashes that string for every row, over a quarter of
    a full scan's time. Only the rows of files whose size another of them shares are keyed by a hash of their path.
    Each row's path is then checked against its bitmap's, and its log path comes from the bitmap's row. None: a
    file's path is not one Spark reports verbatim, or the table has partition columns."""
    if snapshot.partition_columns:
        return None
    local = [snapshot.file_path(add) for add in files]
    if not all(PLAIN_PATH.fullmatch(p) for p in local):
        return None
    read_schema, data_columns = read_columns(snapshot.spark_schema, snapshot.configuration)
    read = spark.read.schema(read_schema).parquet(*(spark_read_path(p) for p in local))
    metadata = file_metadata(read)
    scan = prefilter(
        read.select(
            *data_columns,
            metadata.getField("file_path").alias(LOCAL_PATH_COL),
            metadata.getField("row_index").alias(ROW_INDEX_COL),
            metadata.getField("file_size").alias(LOCAL_SIZE_COL),
        )
    )
    bitmaps = (
        _bitmaps_table(_BITMAP_FILE_COL, pa.array(["file:" + p for p in local], pa.string()), vectors)
        .append_column(FILE_NAME_COL, pa.array([add.path for add in files], pa.string()))
        .append_column(_BITMAP_SIZE_COL, pa.array([add.size for add in files], pa.int64()))
    )
    on, guard = file_join((add.size for add in files), _BITMAP_SIZE_COL, _BITMAP_FILE_COL)
    joined = scan.join(F.broadcast(spark.createDataFrame(bitmaps)), on, how="left")
    # No bitmap, or another file's (a key shared by chance): the query fails rather than keep a deleted row.
    kept = _with_word(joined).where(guard.otherwise(_kept_by_word()))
    table_columns = [F.col(quote_identifier(f.name)) for f in snapshot.spark_schema.fields]
    return kept.select(*table_columns, F.col(FILE_NAME_COL), F.col(ROW_INDEX_COL))


def _drop_by_bitmaps(spark: SparkSession, scan: DataFrame, vectors: Sequence[tuple[str, BitMap64]]) -> DataFrame:
    """Each file's deleted rows as a plain bitmap (an array of longs up to its last deleted row, one bit a row),
    one row per file broadcast to the scan: a row is dropped by one array read and a shift, with no per-row hash
    and no side table as long as the scan has rows."""
    numbers = pa.array(range(len(vectors)), pa.int64())
    bitmaps = spark.createDataFrame(_bitmaps_table(_BITMAP_NUMBER_COL, numbers, vectors))
    if len(vectors) == 1:
        # Every row of the scan is of the one file: each meets the bitmap's one row with no hash of its file name
        # (a 1,000,000-row file with 1,000 rows deleted, scanned and semi-joined with 1,000 keys: 0.27-0.38 s
        # against 0.39-0.45 s joined by name, 0.21-0.29 s without a vector).
        joined = scan.crossJoin(F.broadcast(bitmaps))
    else:
        # By the file's number, a long: by its log path, the string would be hashed for every row (half of a full
        # scan's time over a partitioned table's files).
        on = F.col(FILE_NUMBER_COL) == F.col(_BITMAP_NUMBER_COL)
        joined = scan.join(F.broadcast(bitmaps), on, how="inner")
    kept = _with_word(joined).where(_kept_by_word())
    return kept.drop(FILE_NUMBER_COL, _BITMAP_NUMBER_COL, _LAST_DELETED_COL, _BITMAP_COL, _WORD_COL)


def _with_word(joined: DataFrame) -> DataFrame:
    """The bitmap's word that holds the row's bit; NULL past the file's last deleted row."""
    row = F.col(ROW_INDEX_COL)
    word = F.get(F.col(_BITMAP_COL), F.shiftright(row, 6).cast("int"))
    return joined.withColumn(_WORD_COL, F.when(row <= F.col(_LAST_DELETED_COL), word))


def _kept_by_word() -> Column:
    bit = F.expr(f"shiftright(`{_WORD_COL}`, cast(`{ROW_INDEX_COL}` & 63 AS INT)) & 1")
    return F.col(_WORD_COL).isNull() | (bit == 0)


def _bitmaps_table(key_name: str, keys: pa.Array, vectors: Sequence[tuple[str, BitMap64]]) -> pa.Table:
    """One row per file: its key (as ``key_name``), its last deleted row and its plain bitmap."""
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
            key_name: keys,
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
            _SIDE_FILE_COL: pa.array(np.concatenate(numbers), pa.int64()),
            _DELETED_ROW_COL: pa.array(np.concatenate(rows), pa.int64()),
        }
    )
