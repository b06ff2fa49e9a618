"""A Delta source's Change Data Feed (``readChangeFeed`` with its bounds, ``table_changes``,
``table_changes_by_path``) gives the rows Delta on Spark gives, over histories Delta wrote and histories this engine
wrote, and a range Delta refuses is refused alike; a merge whose source is a feed merges as Delta's does.

Delta on Spark writes each history once per module; both sides read the same log, so its commit times are the
ones Delta logged."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from engine import RowsSource, TableSource, parse_merge_sql, run_merge
from engine.delta.change_feed import PICKED_ROWS
from engine.errors import MergeSpecError, SourceError
from engine.source import read_table_source
from engine.spec import MergeClause
from tests.engine.harness import clause, make_spec
from tests.oracle.differential import copy_sides
from tests.oracle.sql_cases import SqlCopies
from tests.oracle.tables import latest_version, log_actions, make_delta_table, table_ref

FEED = {"delta.enableChangeDataFeed": "true"}
DV_FEED = {**FEED, "delta.enableDeletionVectors": "true"}

HISTORY = [
    "INSERT INTO {table} VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd')",  # 1
    "UPDATE {table} SET v = 'B' WHERE id = 2",  # 2: a deletion vector, change files
    "DELETE FROM {table} WHERE id = 3",  # 3
    "MERGE INTO {table} t USING (SELECT 1 AS id, 'A' AS v UNION ALL SELECT 9, 'z') s ON t.id = s.id "
    "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",  # 4
    "OPTIMIZE {table}",  # 5: no data change
    "ALTER TABLE {table} ADD COLUMNS (w INT)",  # 6
    "INSERT INTO {table} VALUES (10, 't', 7)",  # 7
    "DELETE FROM {table} WHERE id = 4",  # 8
    "RESTORE TABLE {table} TO VERSION AS OF 7",  # 9: a file re-added under its earlier vector, no change files
]


def _feed(session_df: DataFrame) -> list[tuple[Any, ...]]:
    """The feed's rows in order, the commit time as milliseconds (both sessions are UTC, but a number is plain)."""
    columns = [F.col(c) for c in session_df.columns if c != "_commit_timestamp"]
    if "_commit_timestamp" in session_df.columns:
        columns.append(F.unix_millis("_commit_timestamp").alias("_commit_ms"))
    rows = session_df.select(*columns).collect()
    return sorted((tuple(r) for r in rows), key=repr)


def _theirs(delta_spark: SparkSession, path: Path, options: Mapping[str, str]) -> DataFrame:
    reader = delta_spark.read.format("delta")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(str(path))


def _ours(spark: SparkSession, path: Path, options: Mapping[str, str]) -> DataFrame:
    return read_table_source(spark, TableSource("delta", str(path), dict(options)))


def _read_alike(spark: SparkSession, delta_spark: SparkSession, path: Path, options: Mapping[str, str]) -> int:
    """Both read the same feed, schema and rows; how many rows."""
    theirs = _theirs(delta_spark, path, options)
    ours = _ours(spark, path, options)
    assert ours.schema.simpleString() == theirs.schema.simpleString()
    expected = _feed(theirs)
    assert _feed(ours) == expected
    return len(expected)


def _refused_alike(
    spark: SparkSession, delta_spark: SparkSession, path: Path, options: Mapping[str, str], code: str
) -> str:
    with pytest.raises(PySparkException, match=re.escape(code)):
        _theirs(delta_spark, path, options).collect()
    with pytest.raises((SourceError, MergeSpecError), match=re.escape(code)) as ours:
        _ours(spark, path, options).collect()
    return str(ours.value)


@pytest.fixture(scope="module")
def history(delta_spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_delta_table(
        delta_spark, tmp_path_factory.mktemp("feed") / "t", "id BIGINT, v STRING", properties=DV_FEED, then_sql=HISTORY
    )


def test_the_history_holds_what_the_feed_is_read_from(history: Path) -> None:
    """Change files at the update, none at the whole-file delete, none at the delete that re-adds its file under a
    deletion vector, none at the restore: each way a commit states its changes is met below."""
    kinds = {v: {k for a in log_actions(history, v) for k in a} for v in range(10)}
    assert "cdc" in kinds[2] and "cdc" in kinds[4]
    assert "cdc" not in kinds[3] and "remove" in kinds[3]
    assert not {"cdc", "add", "remove"} & kinds[5] - {"add", "remove"} and "cdc" not in kinds[9]
    deleted = log_actions(history, 8)
    added = {a["add"]["path"]: a["add"].get("deletionVector") for a in deleted if "add" in a}
    removed = {a["remove"]["path"]: a["remove"].get("deletionVector") for a in deleted if "remove" in a}
    assert "cdc" not in kinds[8]
    assert [p for p in set(added) & set(removed) if added[p] != removed[p]]


@pytest.mark.parametrize(
    "bounds",
    [(0, None), (1, 2), (3, 3), (4, 4), (5, 5), (2, 5), (6, 100), (8, 8), (9, 9), (8, 9)],
    ids=lambda b: f"{b[0]}-{b[1]}",
)
def test_a_feed_by_versions_reads_as_in_delta(
    spark: SparkSession, delta_spark: SparkSession, history: Path, bounds: tuple[int, int | None]
) -> None:
    options = {"readChangeFeed": "true", "startingVersion": str(bounds[0])}
    if bounds[1] is not None:
        options["endingVersion"] = str(bounds[1])
    count = _read_alike(spark, delta_spark, history, options)
    assert count > 0 or bounds in ((5, 5),)


def test_a_feed_by_commit_timestamps_reads_as_in_delta(
    spark: SparkSession, delta_spark: SparkSession, history: Path
) -> None:
    """Each commit's own time starts and ends the range there; a millisecond after it starts at the next commit
    and ends at this one."""
    times = {
        r[0]: r[1]
        for r in delta_spark.sql(f"DESCRIBE HISTORY {table_ref(history)}")
        .selectExpr("version", "CAST(timestamp AS STRING)")
        .collect()
    }
    later = {
        r[0]: r[1]
        for r in delta_spark.sql(f"DESCRIBE HISTORY {table_ref(history)}")
        .selectExpr("version", "CAST(timestamp + INTERVAL 1 MILLISECOND AS STRING)")
        .collect()
    }
    for start, end in [(1, 2), (3, 7), (8, 8)]:
        _read_alike(
            spark,
            delta_spark,
            history,
            {"readChangeFeed": "true", "startingTimestamp": times[start], "endingTimestamp": times[end]},
        )
        _read_alike(
            spark,
            delta_spark,
            history,
            {"readChangeFeed": "true", "startingTimestamp": later[start - 1], "endingTimestamp": later[end]},
        )
    _read_alike(spark, delta_spark, history, {"readChangeFeed": "true", "startingTimestamp": "2000-01-01"})


@pytest.mark.parametrize(
    ("options", "code"),
    [
        ({"readChangeFeed": "true"}, "DELTA_NO_START_FOR_CDC_READ"),
        ({"readChangeFeed": "true", "endingVersion": "3"}, "DELTA_NO_START_FOR_CDC_READ"),
        ({"readChangeFeed": "true", "startingVersion": "3", "endingVersion": "2"}, "DELTA_INVALID_CDC_RANGE"),
        ({"readChangeFeed": "true", "startingVersion": "20"}, "DELTA_CDC_START_VERSION_AFTER_LATEST"),
        ({"readChangeFeed": "true", "startingVersion": "latest"}, "DELTA_VERSION_INVALID"),
        ({"readChangeFeed": "yes", "startingVersion": "1"}, "DELTA_ILLEGAL_OPTION"),
        ({"readChangeFeed": "true", "startingVersion": "1", "versionAsOf": "2"}, "DELTA_UNSUPPORTED_TIME_TRAVEL_VIEWS"),
        ({"readChangeFeed": "true", "startingTimestamp": "2100-01-01"}, "DELTA_TIMESTAMP_GREATER_THAN_COMMIT"),
        (
            {"readChangeFeed": "true", "startingVersion": "0", "endingTimestamp": "2000-01-01"},
            "DELTA_TIMESTAMP_EARLIER_THAN_COMMIT_RETENTION",
        ),
        ({"readChangeFeed": "true", "startingTimestamp": "garbage"}, "DELTA_TIMESTAMP_INVALID"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_range_delta_refuses_is_refused_alike(
    spark: SparkSession, delta_spark: SparkSession, history: Path, options: dict[str, str], code: str
) -> None:
    _refused_alike(spark, delta_spark, history, options, code)


def test_the_feed_flag_takes_delta_spellings_and_bounds_need_it(
    spark: SparkSession, delta_spark: SparkSession, history: Path
) -> None:
    """``readChangeData`` and any case of ``true`` read the feed; ``false`` reads the rows. A bound without the
    flag, which Delta ignores to read every row, is refused: a forgotten flag would merge the whole table."""
    _read_alike(spark, delta_spark, history, {"readchangedata": "TRUE", "STARTINGVERSION": "7"})
    _read_alike(spark, delta_spark, history, {"readChangeFeed": "false"})
    with pytest.raises(MergeSpecError, match="startingVersion bounds a Change Data Feed read"):
        _ours(spark, history, {"startingVersion": "7"})


def test_a_feed_turned_on_later_and_off_again_is_read_only_where_it_was_on(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path
) -> None:
    table = make_delta_table(
        delta_spark,
        tmp_path / "t",
        "id BIGINT, v STRING",
        then_sql=[
            "INSERT INTO {table} VALUES (1, 'a')",  # 1
            "ALTER TABLE {table} SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')",  # 2
            "INSERT INTO {table} VALUES (2, 'b')",  # 3
            "UPDATE {table} SET v = 'x' WHERE id = 1",  # 4
            "ALTER TABLE {table} SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'false')",  # 5
            "INSERT INTO {table} VALUES (3, 'c')",  # 6
        ],
    )
    for start, end in [(2, 3), (3, 4), (2, 4)]:
        assert _read_alike(spark, delta_spark, table, _range(start, end)) > 0
    for start, end in [(0, 0), (1, 2), (4, 5), (5, 5), (3, 6)]:
        message = _refused_alike(spark, delta_spark, table, _range(start, end), "DELTA_MISSING_CHANGE_DATA")
        assert f"range [{start} , {end}]" in message


def _range(start: int, end: int) -> dict[str, str]:
    return {"readChangeFeed": "true", "startingVersion": str(start), "endingVersion": str(end)}


def test_a_range_across_a_dropped_column_is_refused_alike(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path
) -> None:
    """The latest schema reads the feed; a restore to before a column was added drops it, and a range that meets
    the column is refused: at the schema change within it, or at its start."""
    table = make_delta_table(
        delta_spark,
        tmp_path / "t",
        "id BIGINT, v STRING",
        properties=FEED,
        then_sql=[
            "INSERT INTO {table} VALUES (1, 'a')",  # 1
            "ALTER TABLE {table} ADD COLUMNS (w INT)",  # 2
            "INSERT INTO {table} VALUES (2, 'b', 5)",  # 3
            "RESTORE TABLE {table} TO VERSION AS OF 1",  # 4
        ],
    )
    for start, end in [(0, 1), (4, 4)]:
        assert _read_alike(spark, delta_spark, table, _range(start, end)) > 0
    for start, end in [(0, 4), (1, 3)]:
        message = _refused_alike(
            spark, delta_spark, table, _range(start, end), "DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_SCHEMA_CHANGE"
        )
        assert "incompatible schema change at version 2" in message
    _refused_alike(spark, delta_spark, table, _range(3, 4), "DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_DATA_SCHEMA")


def test_a_feed_over_a_column_mapped_rename_reads_as_in_delta(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path
) -> None:
    """Under column mapping the ending version's columns are read; a range across a rename is refused."""
    table = make_delta_table(
        delta_spark,
        tmp_path / "t",
        "id BIGINT, v STRING",
        properties={**DV_FEED, "delta.columnMapping.mode": "name"},
        then_sql=[
            "INSERT INTO {table} VALUES (1, 'a'), (2, 'b')",  # 1
            "UPDATE {table} SET v = 'x' WHERE id = 1",  # 2
            "ALTER TABLE {table} RENAME COLUMN v TO `v 2`",  # 3
            "INSERT INTO {table} VALUES (3, 'c')",  # 4
            "DELETE FROM {table} WHERE id = 2",  # 5
        ],
    )
    for start, end in [(0, 2), (1, 1), (3, 5), (4, 5)]:
        assert _read_alike(spark, delta_spark, table, _range(start, end)) > 0
    _refused_alike(spark, delta_spark, table, _range(1, 4), "DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_DATA_SCHEMA")


def test_a_partitioned_copy_on_write_feed_reads_as_in_delta(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path
) -> None:
    """Whole partitions dropped (removes only), a row deleted (change files under the partition), a truncate."""
    table = make_delta_table(
        delta_spark,
        tmp_path / "t",
        "id BIGINT, part STRING",
        properties=FEED,
        partitioned_by=["part"],
        then_sql=[
            "INSERT INTO {table} VALUES (1, 'x'), (2, 'y'), (3, 'y'), (4, NULL)",
            "DELETE FROM {table} WHERE part = 'x'",
            "DELETE FROM {table} WHERE id = 2",
            "UPDATE {table} SET part = 'z' WHERE id = 4",
            "TRUNCATE TABLE {table}",
        ],
    )
    assert _read_alike(spark, delta_spark, table, {"readChangeFeed": "true", "startingVersion": "0"}) == 10


def test_the_feed_of_merges_this_engine_wrote_reads_as_in_delta(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path
) -> None:
    """This engine's merges (deletion vectors, change files, an insert-only merge) read back alike."""
    table = make_delta_table(
        delta_spark,
        tmp_path / "t",
        "id BIGINT, v STRING",
        [(i, f"v{i}") for i in range(20)],
        properties=DV_FEED,
    )

    def merge(rows: list[dict[str, Any]], *clauses: MergeClause) -> None:
        spec = make_spec(table, table, "t.id = s.id", clauses)
        run_merge(spark, dataclasses.replace(spec, source=RowsSource(rows, "id BIGINT, v STRING")))

    merge(
        [{"id": 3, "v": "x"}, {"id": 4, "v": None}, {"id": 30, "v": "n"}],
        clause("matched", "update", "s.v IS NOT NULL", v="s.v"),
        clause("matched", "delete"),
        clause("notMatched", "insert_all"),
    )
    merge([{"id": 31, "v": "m"}], clause("notMatched", "insert_all"))
    merge(
        [{"id": 5, "v": "y"}],
        clause("matched", "update_all"),
        clause("notMatchedBySource", "delete", "t.id > 15"),
    )
    assert _read_alike(spark, delta_spark, table, {"readChangeFeed": "true", "startingVersion": "2"}) > 0
    assert _read_alike(spark, delta_spark, table, {"readChangeFeed": "true", "startingVersion": "0"}) > 20


CDC_APPLY = (
    "WHEN MATCHED AND s._change_type = 'delete' THEN DELETE "
    "WHEN MATCHED THEN UPDATE SET v = s.v "
    "WHEN NOT MATCHED AND s._change_type != 'delete' THEN INSERT (id, v) VALUES (s.id, s.v)"
)


def _replica(delta_spark: SparkSession, tmp: Path, using: str) -> SqlCopies:
    target = make_delta_table(
        delta_spark, tmp / "ours", "id BIGINT, v STRING", then_sql=["INSERT INTO {table} VALUES (1, 'a'), (2, 'b')"]
    )
    ours, theirs = (side.path for side in copy_sides(target, tmp / "theirs"))
    return SqlCopies(ours, theirs, f"MERGE INTO {{target}} AS t USING {using} AS s ON t.id = s.id {CDC_APPLY}")


@pytest.mark.parametrize(
    "using",
    [
        # The latest change of each key from version 2 on, applied to a replica that holds version 1.
        "(SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY id ORDER BY _commit_version DESC) AS n "
        "FROM table_changes_by_path('{source}', 2) WHERE _change_type != 'update_preimage') WHERE n = 1)",
        "(SELECT * FROM table_changes('delta.`{source}`', 8, 8))",
    ],
    ids=["latest-change-per-key", "one-version"],
)
def test_a_merge_from_a_feed_merges_as_in_delta(
    spark: SparkSession, delta_spark: SparkSession, history: Path, tmp_path: Path, using: str
) -> None:
    _replica(delta_spark, tmp_path, using.format(source=history)).merged_alike(spark, delta_spark)


def test_a_merge_from_a_feed_delta_refuses_is_refused_alike(
    spark: SparkSession, delta_spark: SparkSession, history: Path, tmp_path: Path
) -> None:
    """A range past the table's versions fails both merges and leaves both targets as they were."""
    copies = _replica(delta_spark, tmp_path, f"(SELECT * FROM table_changes_by_path('{history}', 50))")
    copies.refused_alike(spark, delta_spark, SourceError, "DELTA_CDC_START_VERSION_AFTER_LATEST")


def test_table_changes_is_read_into_the_feed_options() -> None:
    spec = parse_merge_sql(
        "MERGE INTO delta.`/lake/t` t USING table_changes('delta.`/lake/s`', TIMESTAMP '2024-01-01 00:00:00', 7) s "
        "ON t.id = s.id WHEN MATCHED THEN DELETE"
    )
    assert spec.source == TableSource(
        "delta",
        "/lake/s",
        {"readChangeFeed": "true", "startingTimestamp": "2024-01-01 00:00:00", "endingVersion": "7"},
    )
    for bad, match in [
        ("table_changes('/lake/s', 1)", "as 'delta.`/path`'"),
        ("table_changes_by_path('/lake/s')", "takes the table"),
        ("table_changes_by_path('/lake/s', 1 + 1)", "version number or a timestamp literal"),
        ("table_changes_by_path('/lake/s', 1) VERSION AS OF 2", "DELTA_UNSUPPORTED_TIME_TRAVEL_VIEWS"),
    ]:
        with pytest.raises(MergeSpecError, match=re.escape(match)):
            parse_merge_sql(f"MERGE INTO delta.`/lake/t` t USING {bad} s ON t.id = s.id WHEN MATCHED THEN DELETE")
    with pytest.raises(MergeSpecError, match="not its changes"):
        parse_merge_sql(
            "MERGE INTO table_changes_by_path('/lake/t', 1) t USING delta.`/lake/s` s ON t.id = s.id "
            "WHEN MATCHED THEN DELETE"
        )


def test_a_feed_is_not_taken_for_the_tables_rows(spark: SparkSession, history: Path) -> None:
    """A feed's row count and key bounds are not the snapshot's statistics: a merge keyed on the feed finds every
    changed key, even one the table no longer holds."""
    assert not TableSource("delta", str(history), {"readChangeFeed": "true", "startingVersion": "1"}).reads_snapshot
    assert TableSource("delta", str(history), {"versionAsOf": "1"}).reads_snapshot
    assert latest_version(history) == 9


def test_a_feed_with_in_commit_timestamps_reads_their_times_as_in_delta(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path
) -> None:
    """Where the table keeps in-commit timestamps they are the commits' times, whatever the commit files' times say
    (here: all one old moment)."""
    table = make_delta_table(
        delta_spark,
        tmp_path / "t",
        "id BIGINT, v STRING",
        properties={**DV_FEED, "delta.enableInCommitTimestamps": "true"},
        then_sql=["INSERT INTO {table} VALUES (1, 'a'), (2, 'b')", "UPDATE {table} SET v = 'x' WHERE id = 1"],
    )
    for commit in (table / "_delta_log").glob("*.json"):
        os.utime(commit, (1_000_000_000, 1_000_000_000))
    assert _read_alike(spark, delta_spark, table, {"readChangeFeed": "true", "startingVersion": "0"}) == 4


KINDS = {
    "id-mapped partitioned": (
        "id BIGINT, v STRING, part STRING",
        {**DV_FEED, "delta.columnMapping.mode": "id"},
        ["part"],
    ),
    "row tracking": ("id BIGINT, v STRING, part STRING", {**DV_FEED, "delta.enableRowTracking": "true"}, []),
    "checkpointed": ("id BIGINT, v STRING, part STRING", {**FEED, "delta.checkpointInterval": "2"}, []),
    "nested": ("id BIGINT, v STRING, part STRING, st STRUCT<a: INT, b: ARRAY<STRING>>", DV_FEED, []),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_feeds_of_other_kinds_of_table_read_as_in_delta(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, kind: str
) -> None:
    ddl, properties, partitioned_by = KINDS[kind]
    nested = "st" in ddl
    extra = ", named_struct('a', 1, 'b', array('x'))" if nested else ""
    table = make_delta_table(
        delta_spark,
        tmp_path / "t",
        ddl,
        properties=properties,
        partitioned_by=partitioned_by,
        then_sql=[
            f"INSERT INTO {{table}} VALUES (1, 'a', 'p'{extra}), (2, 'b', 'p'{extra}), (3, 'c', 'q'{extra})",
            "UPDATE {table} SET v = 'B' WHERE id = 2",
            "DELETE FROM {table} WHERE id = 3",
            "MERGE INTO {table} t USING (SELECT 1 AS id, 'A' AS v) s ON t.id = s.id "
            "WHEN MATCHED THEN UPDATE SET v = s.v",
            f"INSERT INTO {{table}} VALUES (4, 'd', 'q'{extra})",
        ],
    )
    assert _read_alike(spark, delta_spark, table, {"readChangeFeed": "true", "startingVersion": "0"}) == 9
    assert _read_alike(spark, delta_spark, table, _range(3, 4)) == 3


def test_a_wide_deletion_vector_change_reads_as_in_delta(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path
) -> None:
    """More rows than a plan picks by index: a delete that marks most of a file's rows in its vector, and a restore
    that brings them back (the vector's difference read the other way), without change files either time."""
    assert PICKED_ROWS < 15_000
    table = make_delta_table(delta_spark, tmp_path / "t", "id BIGINT, v STRING", properties=DV_FEED)
    delta_spark.range(20_000).selectExpr("id", "CAST(id AS STRING) AS v").coalesce(1).write.format("delta").mode(
        "append"
    ).save(str(table))
    delta_spark.sql(f"DELETE FROM {table_ref(table)} WHERE id % 4 != 0")  # 2
    delta_spark.sql(f"DELETE FROM {table_ref(table)} WHERE id < 10")  # 3
    delta_spark.sql(f"RESTORE TABLE {table_ref(table)} TO VERSION AS OF 1")  # 4
    assert not [a for v in (2, 3, 4) for a in log_actions(table, v) if "cdc" in a]
    assert _read_alike(spark, delta_spark, table, _range(2, 2)) == 15_000
    assert _read_alike(spark, delta_spark, table, _range(3, 4)) == 3 + 15_003
