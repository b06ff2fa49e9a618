"""A scan of a table whose row tracking is enabled, with each row's stable row id and row commit version
(PROTOCOL.md "Reader Requirements for Row Tracking")."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from engine.delta import row_tracking as rt
from engine.delta.actions import AddFile
from engine.delta.column_mapping import read_columns
from engine.delta.errors import DeltaError
from engine.delta.internal_columns import internal_column
from engine.delta.names import quote_identifier
from engine.delta.paths import spark_read_path
from engine.delta.scan_columns import (
    FILE_NAME_COL,
    ROW_COMMIT_VERSION_COL,
    ROW_ID_COL,
    ROW_INDEX_COL,
    FileColumns,
    join_file_values,
    partition_values,
    select_scan_columns,
)
from engine.delta.snapshot import Snapshot

_BASE_ROW_ID_COL = internal_column("base_row_id")
_DEFAULT_ROW_COMMIT_VERSION_COL = internal_column("default_row_commit_version")


def scan_with_row_tracking(
    spark: SparkSession,
    snapshot: Snapshot,
    unique: Sequence[AddFile],
    file_columns: FileColumns,
    partition_fields: Sequence[T.StructField],
    data_schema: T.StructType,
    *,
    numbered: bool = False,
) -> DataFrame:
    """The rows of ``unique`` with their stable row ids and row commit versions: the materialized columns are
    read with the data (NULL where a file lacks them), and each file's ``baseRowId`` and
    ``defaultRowCommitVersion`` are joined in with its partition values. ``numbered``: with ``FILE_NUMBER_COL``
    after ``ROW_INDEX_COL`` (the position of the row's file in ``unique``)."""
    names = rt.materialized_columns(snapshot.protocol, snapshot.metadata)
    if names is None:
        raise DeltaError(f"Table {snapshot.root} does not have row tracking enabled: no stable row ids to read")
    row_id_name, version_name = names
    stored_schema, data_columns = read_columns(data_schema, snapshot.configuration)
    read_schema = T.StructType(
        [
            *stored_schema.fields,
            T.StructField(row_id_name, T.LongType(), True),
            T.StructField(version_name, T.LongType(), True),
        ]
    )
    fields, values = _file_values(unique, partition_fields)
    local = [(snapshot.file_path(add), add) for add in unique]
    data = spark.read.schema(read_schema).parquet(*(spark_read_path(p) for p, _ in local))
    materialized = [F.col(quote_identifier(row_id_name)), F.col(quote_identifier(version_name))]
    joined = join_file_values(spark, data, [*data_columns, *materialized], local, fields, values)
    tracking = _stable_row_columns(row_id_name, version_name)
    return select_scan_columns(joined, snapshot.spark_schema, file_columns, numbered=numbered, after=tracking)


def _file_values(
    unique: Sequence[AddFile], partition_fields: Sequence[T.StructField]
) -> tuple[list[T.StructField], list[tuple[object, ...]]]:
    """Each file's log path, ``baseRowId``, ``defaultRowCommitVersion`` and partition values, and their fields."""
    values: list[tuple[object, ...]] = []
    for add in unique:
        if add.base_row_id is None or add.default_row_commit_version is None:
            raise DeltaError(
                f"File {add.path} has no baseRowId or defaultRowCommitVersion although the table's row tracking "
                "is enabled"
            )
        values.append(
            (add.path, add.base_row_id, add.default_row_commit_version, *partition_values(add, partition_fields))
        )
    fields = [
        T.StructField(FILE_NAME_COL, T.StringType(), False),
        T.StructField(_BASE_ROW_ID_COL, T.LongType(), False),
        T.StructField(_DEFAULT_ROW_COMMIT_VERSION_COL, T.LongType(), False),
        *[T.StructField(f.name, f.dataType, True) for f in partition_fields],
    ]
    return fields, values


def _stable_row_columns(row_id_name: str, version_name: str) -> list[Column]:
    """A row's materialized row id and commit version where not NULL, else its file's base id plus its index and
    the file's default commit version."""
    return [
        F.coalesce(F.col(quote_identifier(row_id_name)), F.col(_BASE_ROW_ID_COL) + F.col(ROW_INDEX_COL)).alias(
            ROW_ID_COL
        ),
        F.coalesce(F.col(quote_identifier(version_name)), F.col(_DEFAULT_ROW_COMMIT_VERSION_COL)).alias(
            ROW_COMMIT_VERSION_COL
        ),
    ]
