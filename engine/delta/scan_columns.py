"""The columns a scan adds to a table's rows, by name: where each row came from, and its stable row identity."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Literal

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from engine.delta.actions import AddFile
from engine.delta.internal_columns import internal_column
from engine.delta.names import quote_identifier
from engine.delta.paths import PLAIN_PATH
from engine.delta.values import parse_partition_value

FILE_NAME_COL = internal_column("file_name")
"""The row's file, as its AddFile's log path."""
ROW_INDEX_COL = internal_column("row_index")
"""The row's position in its file."""
FILE_NUMBER_COL = internal_column("file_number")
"""The row's file's position among the files a scan was given, where the scan is asked for it: a long to join
per-file values on, where the log path would be hashed for every row."""
FILE_PATH_COL = internal_column("file_path")
ROW_ID_COL = internal_column("row_id")
ROW_COMMIT_VERSION_COL = internal_column("row_commit_version")
ROW_TRACKING_COLS = (ROW_ID_COL, ROW_COMMIT_VERSION_COL)
LOCAL_PATH_COL = internal_column("local_path")
LOCAL_SIZE_COL = internal_column("local_size")
UNMAPPED_MARKER = "DELTA_SCAN_UNMAPPED_FILE"
_MAPPED_PATH_COL = internal_column("mapped_path")
_MAPPED_SIZE_COL = internal_column("mapped_size")

Prefilter = Callable[[DataFrame], DataFrame]
"""A filter a scan applies to its files' rows as stored, before their deletion vectors meet them (so a vector's
per-row work is done only for the rows it keeps): it may only drop rows, keeps every column, and reads only the
table's columns."""

FileColumns = Literal["name_and_row_index", "path", "none"]
"""What a scan gives besides the table's columns: the file and row index, the file path, or nothing."""


def checked_file_name() -> Column:
    """The row's log path after a join from Spark's file path; a file Spark read that the scan did not ask for
    (no log path) fails the query rather than passing as a row of no file."""
    return F.when(
        F.col(FILE_NAME_COL).isNull(),
        F.raise_error(F.concat(F.lit(f"[{UNMAPPED_MARKER}] scanned file not in the request: "), F.col(LOCAL_PATH_COL))),
    ).otherwise(F.col(FILE_NAME_COL))


def file_metadata(read: DataFrame) -> Column:
    """Spark's hidden ``_metadata`` column of a Parquet read, asked of the read itself: a table column named
    ``_metadata`` takes the name ``F.col`` would find."""
    return read.metadataColumn("_metadata")


def local_file_path(read: DataFrame) -> Column:
    """Each row's file as a local path (``/a b/c``), from Spark's ``_metadata.file_path`` (``file:/a%20b/c``).
    ``+`` is literal in those URIs, but ``url_decode`` would read it as a space."""
    uri = file_metadata(read).getField("file_path")
    return F.url_decode(F.replace(F.regexp_replace(uri, "^file:(//)?", ""), F.lit("+"), F.lit("%2B")))


def _shared_sizes(sizes: Iterable[int]) -> list[int]:
    """The sizes that more than one of the files have."""
    return sorted(size for size, count in Counter(sizes).items() if count > 1)


def among_longs(column: Column, values: Iterable[int]) -> Column:
    """Whether ``column`` (a long) is one of ``values``, which generated code takes by reference, as one array
    literal: listed (``IN``, up to Spark's ``inSetConversionThreshold`` of ten), each value would be written into the
    code, and every new set of values would compile the scan's code anew (20-100 ms). Linear in the values: for few."""
    return F.array_contains(F.array(*[F.lit(v).cast("long") for v in values]), column)


def _file_key(size: str, path: str, shared: Sequence[int]) -> Column:
    """The file's size (a long Spark fills in once per file, cheap to hash; hashing the reader's path instead costs
    every row over a quarter of a full scan's time), or a hash of the path where the size is one of ``shared``
    (``among_longs``: a new set of shared sizes does not compile the scan anew)."""
    if not shared:
        return F.col(size)
    return F.when(among_longs(F.col(size), shared), F.xxhash64(F.col(path))).otherwise(F.col(size))


def file_join(sizes: Iterable[int], their_size: str, their_path: str) -> tuple[Column, Column]:
    """How a plain read's rows (``LOCAL_SIZE_COL``, ``LOCAL_PATH_COL``) meet a per-file table's row, given the
    files' sizes: the join condition, and a guard to finish with ``.otherwise(kept)`` that fails the query for a
    row left without its file's row, or met with another file's (keys may meet by chance)."""
    shared = _shared_sizes(sizes)
    on = _file_key(LOCAL_SIZE_COL, LOCAL_PATH_COL, shared) == _file_key(their_size, their_path, shared)
    unmet = F.col(their_path).isNull() | (F.col(LOCAL_PATH_COL) != F.col(their_path))
    return on, F.when(unmet, _unmapped_file(F.col(LOCAL_PATH_COL)))


def _unmapped_file(path: Column) -> Column:
    """Fails the query for a row of a file the scan did not ask for, or met with another file's row."""
    message = f"[{UNMAPPED_MARKER}] scanned file not in the request, or not of the size its log entry gives: "
    return F.raise_error(F.concat(F.lit(message), path))


def partition_values(add: AddFile, partition_fields: Sequence[T.StructField]) -> tuple[object, ...]:
    """The file's typed value of each of ``partition_fields``, its log entry's keys matched without case."""
    by_name = {k.lower(): v for k, v in add.partition_values.items()}
    return tuple(parse_partition_value(by_name.get(f.name.lower()), f.dataType) for f in partition_fields)


def join_file_values(
    spark: SparkSession,
    read: DataFrame,
    columns: Sequence[Column],
    files: Sequence[tuple[str, AddFile]],
    fields: Sequence[T.StructField],
    values: Sequence[tuple[object, ...]],
) -> DataFrame:
    """``read``'s ``columns`` with ``ROW_INDEX_COL``, each row joined to its file's ``values`` (of ``fields``) and
    ``FILE_NUMBER_COL`` from a broadcast table of one row per file. ``files``: each file's local path (as ``read``
    was given it) and AddFile.
    Where Spark reports every path verbatim (``file:<path>``) rows meet their file's row by its size (file_join),
    comparing the raw path: a regex, a replace and a URL-decode per row cost more than reading the file. Else by
    the path Spark reports, decoded."""
    plain = all(PLAIN_PATH.fullmatch(path) for path, _ in files)
    metadata = file_metadata(read)
    rows = read.select(
        *columns,
        (metadata.getField("file_path") if plain else local_file_path(read)).alias(LOCAL_PATH_COL),
        metadata.getField("row_index").alias(ROW_INDEX_COL),
        metadata.getField("file_size").alias(LOCAL_SIZE_COL),
    )
    schema = T.StructType(
        [
            T.StructField(_MAPPED_PATH_COL if plain else LOCAL_PATH_COL, T.StringType(), False),
            *fields,
            T.StructField(_MAPPED_SIZE_COL, T.LongType(), False),
            T.StructField(FILE_NUMBER_COL, T.LongType(), False),
        ]
    )
    table_rows = [
        ("file:" + path if plain else path, *row, add.size, number)
        for number, ((path, add), row) in enumerate(zip(files, values, strict=True))
    ]
    table = F.broadcast(spark.createDataFrame(table_rows, schema))
    if not plain:
        return rows.join(table, on=LOCAL_PATH_COL, how="left")
    on, guard = file_join((add.size for _, add in files), _MAPPED_SIZE_COL, _MAPPED_PATH_COL)
    return rows.join(table, on, how="left").where(guard.otherwise(F.lit(True)))


def select_scan_columns(
    joined: DataFrame,
    schema: T.StructType,
    file_columns: FileColumns,
    *,
    numbered: bool = False,
    after: Sequence[Column] = (),
) -> DataFrame:
    """``join_file_values``' rows as a scan gives them: the table's columns (``schema``), what ``file_columns``
    asks for (the log path checked by ``checked_file_name``), ``FILE_NUMBER_COL`` where ``numbered``, then
    ``after``."""
    table_columns = [F.col(quote_identifier(f.name)) for f in schema.fields]
    if file_columns == "none":
        return joined.select(*table_columns, *after)
    if file_columns == "path":
        return joined.select(*table_columns, checked_file_name().alias(FILE_PATH_COL), *after)
    number = [F.col(FILE_NUMBER_COL)] if numbered else []
    return joined.select(
        *table_columns, checked_file_name().alias(FILE_NAME_COL), F.col(ROW_INDEX_COL), *number, *after
    )
