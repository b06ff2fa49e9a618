"""The merge's source as a Spark DataFrame: a table read by path, inline rows (``engine.inline_rows``), or a
query over tables read by path."""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from engine import delta
from engine.delta import ReadScope, Snapshot
from engine.errors import SourceError
from engine.expression_rules import source_query_sql
from engine.inline_rows import rows_to_arrow
from engine.source_options import ChangeFeedRange
from engine.spec import FrameSource, QuerySource, RowsSource, Source, TableSource

GLOB_CHARACTERS = frozenset("*?[]{}\\")
"""Characters Hadoop expands in a path Spark reads: a glob could reach through a symlink out of the lake."""


def read_table_source(spark: SparkSession, source: TableSource, lake_roots: Sequence[str] = ()) -> DataFrame:
    """The source's rows; its files are read only from its own path and ``lake_roots``."""
    if source.format == "delta":
        change_feed = source.delta_read().change_feed
        if change_feed is not None:
            return read_change_feed_source(spark, source.path, change_feed, lake_roots)
        snapshot = delta_source_snapshot(spark, source, lake_roots)
        delta.check_readable(snapshot)
        return delta.scan_files(spark, snapshot, snapshot.files, file_columns=False)
    check_file_source_path(source.path, lake_roots)
    reader = spark.read.format(source.format)
    if source.format == "csv" and "header" not in source.options:
        reader = reader.option("header", "true")
    for key, value in source.options.items():
        reader = reader.option(key, value)
    try:
        df = reader.load(source.path)
        df.schema  # noqa: B018 - resolve now, so a missing path fails as a source error
    except Exception as exc:
        raise SourceError(
            f"source: cannot read {source.format} at {source.path}: {_first_line(exc)}", field="source"
        ) from None
    return df


def delta_source_snapshot(spark: SparkSession, source: TableSource, lake_roots: Sequence[str] = ()) -> Snapshot:
    """A Delta source's snapshot at the version its time travel names, else its latest."""
    version, timestamp = source.time_travel()
    try:
        if timestamp is not None:
            latest = delta.load_snapshot(source.path, lake_roots=lake_roots)
            version = delta.version_at(latest, _timestamp_micros(spark, timestamp))
            if version == latest.version:
                return latest
        elif version is not None:
            delta.check_version(source.path, version)
    except delta.TimeTravelError as exc:
        raise SourceError(f"source.options: {exc}", field="options") from None
    return delta.load_snapshot(source.path, version, lake_roots=lake_roots)


def read_change_feed_source(
    spark: SparkSession, path: str, change_feed: ChangeFeedRange, lake_roots: Sequence[str] = ()
) -> DataFrame:
    """A Delta table's Change Data Feed over the range its options name (timestamps resolved as Delta does)."""
    latest = delta.load_snapshot(path, lake_roots=lake_roots)
    start_us = end_us = None
    if change_feed.starting_version is None and change_feed.starting_timestamp is not None:
        start_us = _timestamp_micros(spark, change_feed.starting_timestamp)
    if change_feed.ending_version is None and change_feed.ending_timestamp is not None:
        end_us = _timestamp_micros(spark, change_feed.ending_timestamp)
    try:
        versions = delta.change_feed_versions(
            latest, change_feed.starting_version, change_feed.ending_version, start_us=start_us, end_us=end_us
        )
        if versions is None:
            return spark.createDataFrame([], delta.change_feed_schema(latest))
        return delta.read_change_feed(spark, latest, *versions)
    except (delta.TimeTravelError, delta.ChangeFeedError) as exc:
        raise SourceError(f"source.options: {exc}", field="options") from None


SPECIAL_TIMESTAMPS = frozenset({"epoch", "now", "today", "yesterday", "tomorrow"})
"""Strings Spark's optimizer turns into timestamps (``SpecialDatetimeValues``) where Delta's cast of a
``timestampAsOf`` does not: Delta finds them invalid."""


def _timestamp_micros(spark: SparkSession, text: str) -> int:
    """``timestampAsOf`` as Delta reads it: cast to a timestamp in the session's time zone."""
    special = text.strip().split(" ", 1)[0].lower() in SPECIAL_TIMESTAMPS
    micros = None
    if not special:
        micros = spark.sql("SELECT unix_micros(try_cast(:text AS TIMESTAMP))", args={"text": text}).collect()[0][0]
    if micros is None:
        raise SourceError(
            f"source.options: [DELTA_TIMESTAMP_INVALID] The provided timestamp ({text!r}) cannot be converted to a "
            "valid timestamp.",
            field="options",
        )
    return int(micros)


def check_file_source_path(path: str, lake_roots: Sequence[str] = ()) -> None:
    """A file source Spark may read: no glob characters (Hadoop would expand them), and no symlink under it
    that leads out of its own path and the lake roots (Spark lists a directory's files through symlinks)."""
    found = sorted(GLOB_CHARACTERS.intersection(path))
    if found:
        raise SourceError(
            f"source.path: {path!r} contains the glob character(s) {' '.join(found)}; globs are not supported: "
            "name a file or a directory.",
            field="source.path",
        )
    scope = ReadScope(path, lake_roots)
    if not scope.contains(path):
        raise SourceError(f"source.path: {path!r} lies outside the lake; it is not read.", field="source.path")
    for parent, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            entry = os.path.join(parent, name)
            if os.path.islink(entry) and not scope.contains(entry):
                raise SourceError(
                    f"source.path: {entry!r} under {path!r} is a symlink out of the lake; it is not read.",
                    field="source.path",
                )


def source_dataframe(
    spark: SparkSession, source: Source, views: list[str] | None = None, lake_roots: Sequence[str] = ()
) -> DataFrame:
    """The source as Spark sees it, before any merge column is added. Temporary views it creates for a
    query source are appended to ``views`` for the caller to drop. Files are read only from each source's own
    path and ``lake_roots``."""
    if isinstance(source, TableSource):
        return read_table_source(spark, source, lake_roots)
    if isinstance(source, RowsSource):
        table = rows_to_arrow(source.rows, source.schema)
        if not table.num_rows:  # Spark infers a schema from the rows, so none are sent
            return spark.createDataFrame([], schema=from_arrow_schema(table.schema))
        return spark.createDataFrame(table)
    if isinstance(source, QuerySource):
        suffix = uuid.uuid4().hex[:12]
        names: dict[str, str] = {}
        for name, relation in source.relations.items():
            view = f"{name}_{suffix}"
            read_table_source(spark, relation, lake_roots).createOrReplaceTempView(view)
            if views is not None:
                views.append(view)
            names[name] = view
        # The query Spark runs is regenerated from the checked tree, its relations renamed in the tree.
        query = source_query_sql(source.query, names, "source.query")
        try:
            df = spark.sql(query)
            df.schema  # noqa: B018
        except Exception as exc:
            raise SourceError(f"source: the source query does not run: {_first_line(exc)}", field="source") from None
        return df
    if isinstance(source, FrameSource):
        built: list[str] = []
        df = source.build(spark, built)
        if views is not None:
            views.extend(built)
        return df
    raise SourceError(f"source: unsupported source {type(source).__name__}", field="source")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
