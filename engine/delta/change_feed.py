"""A table's Change Data Feed between two versions, as Delta's CDCReader gives it: the table's columns and
``_change_type``, ``_commit_version``, ``_commit_timestamp``.

A commit with ``cdc`` actions gives the rows of its change files (each row's ``_change_type`` is stored in the
file). A commit without them gives the rows of the files it adds as ``insert`` and of the files it removes as
``delete`` (each read under its own deletion vector), where the action changes data; a file removed and added
again in one commit with another deletion vector gives the rows its new vector deletes as ``delete`` and those it
no longer deletes as ``insert``. Every commit in the range must have the feed on. The columns are the latest
version's (the ending version's under column mapping), and every schema the range saw must read as them: a column
dropped, renamed or retyped within the range is refused, as Delta refuses it."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from pyroaring import BitMap64
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from engine.delta.actions import AddCDCFile, AddFile, RemoveFile
from engine.delta.column_mapping import is_mapped, physical_name
from engine.delta.commits import CommitEntry, parse_commit
from engine.delta.deletion_vectors import DeletionVectorDescriptor, read_deletion_vector
from engine.delta.errors import DeltaError
from engine.delta.features import check_readable
from engine.delta.names import quote_identifier
from engine.delta.scan import ROW_INDEX_COL, scan_files
from engine.delta.snapshot import Snapshot, load_snapshot
from engine.delta.time_travel import check_version, commit_timestamps, version_at, version_from
from engine.delta.write import CHANGE_TYPE_COL

PICKED_ROWS = 10_000
"""Up to this many rows a re-added file's changed rows are picked by row index (a hash set in the plan); more
would make a large plan, and the difference of the two vectors' reads is taken instead."""
COMMIT_VERSION_COL = "_commit_version"
COMMIT_TIMESTAMP_COL = "_commit_timestamp"


class ChangeFeedError(DeltaError):
    """The table cannot give its changes over the range asked for."""


def change_feed_versions(
    latest: Snapshot,
    start: int | None,
    end: int | None,
    *,
    start_us: int | None = None,
    end_us: int | None = None,
) -> tuple[int, int] | None:
    """The versions a read covers, from ``start`` (or the first commit at or after ``start_us``, microseconds since
    the epoch) to ``end`` (or the last commit at or before ``end_us``; neither, or past the latest version: the
    latest). None where both timestamps fall between the same two commits: no version, no change."""
    if start is None:
        assert start_us is not None
        start = version_from(latest, start_us)
    if end is None and end_us is not None:
        end = version_at(latest, end_us)
        if start_us is not None:
            if start_us > end_us:
                raise _invalid_range(start, end)
            if end == start - 1:
                return None
    if start > latest.version:
        raise ChangeFeedError(
            f"[DELTA_CDC_START_VERSION_AFTER_LATEST] Start version {start} for change data feed exceeds the latest "
            f"table version {latest.version}."
        )
    if end is not None and end < start:
        raise _invalid_range(start, end)
    return start, latest.version if end is None else min(end, latest.version)


def _invalid_range(start: int, end: int) -> ChangeFeedError:
    return ChangeFeedError(
        f"[DELTA_INVALID_CDC_RANGE] CDC range from start {start} to end {end} was invalid. End cannot be before start."
    )


def read_change_feed(spark: SparkSession, latest: Snapshot, start: int, end: int) -> DataFrame:
    """The changes of versions ``start`` to ``end`` (a range ``change_feed_versions`` gave) of the table whose
    latest snapshot is ``latest``."""
    check_version(latest.root, start)
    start_snapshot = _at(latest, start)
    if not start_snapshot.cdf_enabled:
        raise _not_recorded(start, start, end)
    end_snapshot = _at(latest, end)
    mapped = any(is_mapped(s.configuration) for s in (latest, start_snapshot, end_snapshot))
    read = end_snapshot if mapped else latest
    check_readable(read)
    commits = []
    for version in range(start, end + 1):
        entry = _commit(read, version)
        if entry.metadata is not None:
            if not entry.metadata.cdf_enabled:
                raise _not_recorded(version, start, end)
            if version > start and not _read_compatible(entry.metadata.schema, read.spark_schema):
                raise _incompatible(read, start, end, version, "schema change")
        commits.append(entry)
    if not _read_compatible(start_snapshot.spark_schema, read.spark_schema):
        raise _incompatible(read, start, end, start, "data schema")
    times = commit_timestamps(latest)
    frames = [frame for entry in commits for frame in _changes(spark, read, entry, times[entry.version])]
    if not frames:
        return spark.createDataFrame([], change_feed_schema(read))
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result


def _at(latest: Snapshot, version: int) -> Snapshot:
    return latest if version == latest.version else load_snapshot(latest.root, version, lake_roots=latest.lake_roots)


def change_feed_schema(snapshot: Snapshot) -> T.StructType:
    return T.StructType(
        [
            *snapshot.spark_schema.fields,
            T.StructField(CHANGE_TYPE_COL, T.StringType(), True),
            T.StructField(COMMIT_VERSION_COL, T.LongType(), True),
            T.StructField(COMMIT_TIMESTAMP_COL, T.TimestampType(), True),
        ]
    )


def _not_recorded(version: int, start: int, end: int) -> ChangeFeedError:
    return ChangeFeedError(
        f"[DELTA_MISSING_CHANGE_DATA] Error getting change data for range [{start} , {end}] as change data was not "
        f"recorded for version [{version}]. If you've enabled change data feed on this table, use `DESCRIBE "
        "HISTORY` to see when it was first enabled. Otherwise, to start recording change data, use `ALTER TABLE "
        "table_name SET TBLPROPERTIES (delta.enableChangeDataFeed=true)`."
    )


def _commit(read: Snapshot, version: int) -> CommitEntry:
    path = os.path.join(read.root, "_delta_log", f"{version:020d}.json")
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        raise ChangeFeedError(
            f"[DELTA_LOG_FILE_NOT_FOUND] The commit of version {version} is no longer in the log of {read.root}: "
            "its changes cannot be read."
        ) from None
    return parse_commit(version, text, read.spark_schema)


def _read_compatible(existing: T.DataType, read: T.DataType) -> bool:
    """Whether data written with ``existing`` reads as ``read`` (Delta's ``isReadCompatible``, and under column
    mapping its check for renames and drops): every field is still there under its name and physical name, with
    its type, and no longer refuses NULL where it took them."""
    if isinstance(existing, T.StructType) and isinstance(read, T.StructType):
        fields = {f.name.lower(): f for f in read.fields}
        for f in existing.fields:
            kept = fields.get(f.name.lower())
            if (
                kept is None
                or physical_name(kept) != physical_name(f)
                or (f.nullable and not kept.nullable)
                or not _read_compatible(f.dataType, kept.dataType)
            ):
                return False
        return True
    if isinstance(existing, T.ArrayType) and isinstance(read, T.ArrayType):
        return (read.containsNull or not existing.containsNull) and _read_compatible(
            existing.elementType, read.elementType
        )
    if isinstance(existing, T.MapType) and isinstance(read, T.MapType):
        return (
            (read.valueContainsNull or not existing.valueContainsNull)
            and _read_compatible(existing.keyType, read.keyType)
            and _read_compatible(existing.valueType, read.valueType)
        )
    return existing == read


def _incompatible(read: Snapshot, start: int, end: int, version: int, what: str) -> ChangeFeedError:
    code = "SCHEMA_CHANGE" if what == "schema change" else "DATA_SCHEMA"
    advice = (
        f" If possible, please query table changes separately from version {start} to {version} - 1, and from "
        f"version {version} to {end}."
        if what == "schema change"
        else ""
    )
    return ChangeFeedError(
        f"[DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_{code}] Retrieving table changes between version {start} and {end} "
        f"failed because of an incompatible {what}. Your read schema is {read.metadata.schema_string} at version "
        f"{read.version}, but we found an incompatible {what} at version {version}.{advice}"
    )


def _skips_files(entry: CommitEntry) -> bool:
    """A merge that changed no row yet rewrote files (Delta's ``shouldSkipFileActionsInCommit``): no change."""
    info = entry.commit_info or {}
    metrics = info.get("operationMetrics") or {}
    counts = ("numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted")
    return info.get("operation") == "MERGE" and all(str(metrics.get(name)) == "0" for name in counts)


def _changes(spark: SparkSession, read: Snapshot, entry: CommitEntry, commit_ms: int) -> list[DataFrame]:
    """The commit's changes, one frame per kind of file read."""
    if entry.cdc:
        frames = [_change_files(spark, read, entry.cdc)]
    elif _skips_files(entry):
        frames = []
    else:
        adds = [a for a in entry.adds if a.data_change]
        removes = [r for r in entry.removes if r.data_change]
        re_added = {a.path for a in adds} & {r.path for r in removes}
        frames = []
        added = [a for a in adds if a.path not in re_added]
        if added:
            frames.append(_labelled(scan_files(spark, read, added, file_columns=False), "insert"))
        removed = [_as_add(r) for r in removes if r.path not in re_added]
        if removed:
            frames.append(_labelled(scan_files(spark, read, removed, file_columns=False), "delete"))
        for add in (a for a in adds if a.path in re_added):
            remove = next(r for r in removes if r.path == add.path)
            frames.extend(_vector_changes(spark, read, add, remove))
    return [
        frame.select(
            *[F.col(quote_identifier(f.name)) for f in read.spark_schema.fields],
            F.col(CHANGE_TYPE_COL),
            F.lit(entry.version).cast("long").alias(COMMIT_VERSION_COL),
            F.timestamp_millis(F.lit(commit_ms)).alias(COMMIT_TIMESTAMP_COL),
        )
        for frame in frames
    ]


def _change_files(spark: SparkSession, read: Snapshot, cdc: Sequence[AddCDCFile]) -> DataFrame:
    """The rows of change files, read as data files of a table that has ``_change_type`` as its last column."""
    schema = T.StructType([*read.spark_schema.fields, T.StructField(CHANGE_TYPE_COL, T.StringType(), True)])
    with_type = dataclasses.replace(read, metadata=dataclasses.replace(read.metadata, schema_string=schema.json()))
    files = [AddFile(c.path, c.size, c.partition_values, 0, data_change=False) for c in cdc]
    return scan_files(spark, with_type, files, file_columns=False)


def _as_add(remove: RemoveFile) -> AddFile:
    return AddFile(
        remove.path,
        remove.size or 0,
        remove.partition_values,
        0,
        deletion_vector=remove.deletion_vector,
    )


def _vector_changes(spark: SparkSession, read: Snapshot, add: AddFile, remove: RemoveFile) -> list[DataFrame]:
    """A file re-added with another deletion vector: rows the new vector deletes and the old did not (``delete``),
    and rows the old deleted and the new does not (``insert``). A few rows are picked by row index from the stored
    file; more are the rows one vector keeps less those the other keeps, each read under its vector."""
    before = _deleted(read, remove.deletion_vector)
    after = _deleted(read, add.deletion_vector)
    frames = []
    for rows, change, kept, dropped in (
        (after - before, "delete", remove.deletion_vector, add.deletion_vector),
        (before - after, "insert", add.deletion_vector, remove.deletion_vector),
    ):
        if not rows:
            continue
        if len(rows) <= PICKED_ROWS:
            stored = scan_files(spark, read, [dataclasses.replace(add, deletion_vector=None)])
            changed = stored.where(F.col(ROW_INDEX_COL).isin([int(r) for r in rows]))
        else:
            live = scan_files(spark, read, [dataclasses.replace(add, deletion_vector=kept)])
            still = scan_files(spark, read, [dataclasses.replace(add, deletion_vector=dropped)])
            changed = live.join(still.select(ROW_INDEX_COL), on=ROW_INDEX_COL, how="left_anti")
        frames.append(_labelled(changed, change))
    return frames


def _deleted(read: Snapshot, descriptor: DeletionVectorDescriptor | None) -> BitMap64:
    return BitMap64() if descriptor is None else read_deletion_vector(descriptor, read.root)


def _labelled(frame: DataFrame, change: str) -> DataFrame:
    return frame.withColumn(CHANGE_TYPE_COL, F.lit(change))


__all__ = [
    "COMMIT_TIMESTAMP_COL",
    "COMMIT_VERSION_COL",
    "ChangeFeedError",
    "change_feed_schema",
    "change_feed_versions",
    "read_change_feed",
]
