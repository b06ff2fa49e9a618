"""A source read at an earlier version (``VERSION AS OF``, ``TIMESTAMP AS OF``, the ``versionAsOf`` and
``timestampAsOf`` reader options) merges what Delta's MERGE merges from that version, and a version or timestamp
the log cannot give fails both alike.

Delta on Spark writes the source's history (an insert, an update and a delete writing deletion vectors, a
checkpoint, another insert); both sides read that one source, so its commit times are the ones Delta logged."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from engine import MergeSpec, TableSource, run_merge
from engine.errors import SourceError
from tests.engine.harness import clause
from tests.oracle.differential import copy_sides
from tests.oracle.sql_cases import SqlCopies, sql_rows
from tests.oracle.tables import latest_version, make_delta_table, table_ref

UPSERT = "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
SOURCE_HISTORY = [
    "INSERT INTO {table} VALUES (1, 'a'), (2, 'b'), (3, 'c')",
    "UPDATE {table} SET v = 'B' WHERE id = 2",
    "DELETE FROM {table} WHERE id = 3",
    "INSERT INTO {table} VALUES (4, 'd')",
]


def _source(delta_spark: SparkSession, path: Path, *, in_commit_timestamps: bool = False) -> Path:
    """Versions 0 (empty) to 4, deletion vectors at 2 and 3, a checkpoint at 2 and 4."""
    properties = {"delta.enableDeletionVectors": "true", "delta.checkpointInterval": "2"}
    if in_commit_timestamps:
        properties["delta.enableInCommitTimestamps"] = "true"
    return make_delta_table(delta_spark, path, "id BIGINT, v STRING", properties=properties, then_sql=SOURCE_HISTORY)


@pytest.fixture
def source(delta_spark: SparkSession, tmp_path: Path) -> Path:
    return _source(delta_spark, tmp_path / "source")


def _copies(delta_spark: SparkSession, tmp: Path, using: str) -> SqlCopies:
    target = make_delta_table(
        delta_spark, tmp / "ours", "id BIGINT, v STRING", then_sql=["INSERT INTO {table} VALUES (1, 'x'), (5, 'z')"]
    )
    ours, theirs = (side.path for side in copy_sides(target, tmp / "theirs"))
    return SqlCopies(ours, theirs, f"MERGE INTO {{target}} AS t USING {using} AS s ON t.id = s.id {UPSERT}")


def _commit_times(delta_spark: SparkSession, path: Path) -> dict[int, str]:
    history = delta_spark.sql(f"DESCRIBE HISTORY {table_ref(path)}")
    return {r[0]: r[1] for r in history.selectExpr("version", "CAST(timestamp AS STRING)").collect()}


@pytest.mark.parametrize("version", [1, 3])
def test_a_source_read_at_a_version_merges_as_in_delta(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, source: Path, version: int
) -> None:
    copies = _copies(delta_spark, tmp_path, f"(SELECT * FROM {table_ref(source)} VERSION AS OF {version})")
    copies.merged_alike(spark, delta_spark)


@pytest.mark.parametrize("in_commit_timestamps", [False, True], ids=["file times", "in-commit timestamps"])
def test_a_source_read_at_each_commits_timestamp_merges_as_in_delta(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, in_commit_timestamps: bool
) -> None:
    """A commit's own timestamp names that commit, whether the table keeps in-commit timestamps or its commit
    files' modification times stand for them: every version of the history is reached."""
    source = _source(delta_spark, tmp_path / "source", in_commit_timestamps=in_commit_timestamps)
    if in_commit_timestamps:  # the file times say nothing then: every commit file seems written at one old moment
        for commit in (source / "_delta_log").glob("*.json"):
            os.utime(commit, (1_000_000_000, 1_000_000_000))
    times = _commit_times(delta_spark, source)
    assert sorted(times) == [0, 1, 2, 3, 4]
    for version, moment in times.items():
        copies = _copies(
            delta_spark, tmp_path / str(version), f"(SELECT * FROM {table_ref(source)} TIMESTAMP AS OF '{moment}')"
        )
        copies.merged_alike(spark, delta_spark)


@pytest.mark.parametrize("option", ["versionAsOf", "timestampAsOf"])
def test_the_reader_options_read_the_version_delta_reads(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, source: Path, option: str
) -> None:
    """A structured merge's Delta source takes Delta's reader options: the merge commits the rows Delta's MERGE
    commits from the source Delta's reader reads with the same option."""
    value = "2" if option == "versionAsOf" else _commit_times(delta_spark, source)[2]
    copies = _copies(delta_spark, tmp_path, f"(SELECT * FROM {table_ref(source)} VERSION AS OF 2)")
    spec = MergeSpec(
        target=str(copies.ours),
        source=TableSource("delta", str(source), {option: value}),
        on="t.id = s.id",
        target_alias="t",
        source_alias="s",
        matched=(clause("matched", "update_all"),),
        not_matched=(clause("notMatched", "insert_all"),),
    )
    run_merge(spark, spec)
    delta_spark.read.format("delta").option(option, value).load(str(source)).createOrReplaceTempView("travelled")
    delta_spark.sql(
        f"MERGE INTO {table_ref(copies.theirs)} AS t USING travelled AS s ON t.id = s.id {UPSERT}"
    ).collect()
    assert sql_rows(delta_spark, copies.ours) == sql_rows(delta_spark, copies.theirs)


@pytest.mark.parametrize(
    ("travel", "error_class"),
    [
        ("VERSION AS OF 9", "DELTA_VERSION_NOT_FOUND"),
        ("TIMESTAMP AS OF '2000-01-01 00:00:00'", "DELTA_TIMESTAMP_EARLIER_THAN_COMMIT_RETENTION"),
        ("TIMESTAMP AS OF '2999-01-01 00:00:00'", "DELTA_TIMESTAMP_GREATER_THAN_COMMIT"),
    ],
)
def test_a_version_the_log_cannot_give_fails_as_in_delta(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, source: Path, travel: str, error_class: str
) -> None:
    """Both fail with Delta's error class and its words (the versions available, the commit times), and neither
    table changes."""
    copies = _copies(delta_spark, tmp_path, f"(SELECT * FROM {table_ref(source)} {travel})")
    ours, theirs = copies.refused_alike(spark, delta_spark, SourceError, error_class)
    delta_words = theirs.split("\n")[0].split(f"[{error_class}] ", 1)[1].strip()
    assert f"[{error_class}] {delta_words}" in ours


def test_versions_before_the_earliest_checkpoint_are_gone_once_their_commits_are(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, source: Path
) -> None:
    """With the commits before the checkpoint at version 2 cleaned up, version 2 is the earliest either side reads
    and version 1 fails alike."""
    cleaned = tmp_path / "cleaned"
    shutil.copytree(source, cleaned)
    for version in (0, 1):
        (cleaned / "_delta_log" / f"{version:020d}.json").unlink()
        (cleaned / "_delta_log" / f"{version:020d}.crc").unlink(missing_ok=True)
    _copies(delta_spark, tmp_path / "v2", f"(SELECT * FROM {table_ref(cleaned)} VERSION AS OF 2)").merged_alike(
        spark, delta_spark
    )
    copies = _copies(delta_spark, tmp_path / "v1", f"(SELECT * FROM {table_ref(cleaned)} VERSION AS OF 1)")
    ours, theirs = copies.refused_alike(spark, delta_spark, SourceError, "DELTA_VERSION_NOT_FOUND")
    assert "Available versions: [2, 4]." in ours and "Available versions: [2, 4]." in theirs


def test_a_timestamp_that_is_not_one_fails_as_delta_reader_fails(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, source: Path
) -> None:
    """Spark's special strings ('yesterday') are no timestamp to Delta's time travel, though Spark's optimizer
    would cast them."""
    target = make_delta_table(delta_spark, tmp_path / "ours", "id BIGINT, v STRING")
    spec = MergeSpec(
        target=str(target),
        source=TableSource("delta", str(source), {"timestampAsOf": "yesterday"}),
        on="t.id = s.id",
        target_alias="t",
        source_alias="s",
        not_matched=(clause("notMatched", "insert_all"),),
    )
    words = "[DELTA_TIMESTAMP_INVALID] The provided timestamp ('yesterday') cannot be converted to a valid timestamp."
    with pytest.raises(SourceError) as ours:
        run_merge(spark, spec)
    with pytest.raises(PySparkException) as theirs:
        delta_spark.read.format("delta").option("timestampAsOf", "yesterday").load(str(source)).collect()
    assert words in str(ours.value) and words in str(theirs.value)
    assert latest_version(target) == 0


@pytest.mark.parametrize("deletion_vectors", [False, True], ids=["copy-on-write", "deletion vectors"])
def test_a_table_merges_its_own_earlier_version_back_as_in_delta(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, deletion_vectors: bool
) -> None:
    """The restore a time travel makes possible: the target merges the rows it held at version 1 back in, undoing
    a later delete and update, as Delta's MERGE does."""
    target = make_delta_table(
        delta_spark,
        tmp_path / "ours",
        "id BIGINT, v STRING",
        properties={"delta.enableDeletionVectors": str(deletion_vectors).lower()},
        then_sql=[
            "INSERT INTO {table} VALUES (1, 'a'), (2, 'b'), (3, 'c')",
            "DELETE FROM {table} WHERE id = 2",
            "UPDATE {table} SET v = 'x' WHERE id = 1",
            "INSERT INTO {table} VALUES (4, 'd')",
        ],
    )
    ours, theirs = (side.path for side in copy_sides(target, tmp_path / "theirs"))
    copies = SqlCopies(
        ours,
        theirs,
        f"MERGE INTO {{target}} AS t USING (SELECT * FROM {{target}} VERSION AS OF 1) AS s ON t.id = s.id {UPSERT}",
    )
    copies.merged_alike(spark, delta_spark)
    assert sql_rows(delta_spark, ours) == [(1, "a"), (2, "b"), (3, "c"), (4, "d")]


def test_a_column_mapped_source_is_read_with_the_schema_of_the_version_asked(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path
) -> None:
    """Before a rename and a drop the source's columns had their old names: the version asked is read with its
    own schema, as Delta reads it."""
    source = make_delta_table(
        delta_spark,
        tmp_path / "source",
        "id BIGINT, v STRING, gone STRING",
        properties={"delta.columnMapping.mode": "name"},
        then_sql=[
            "INSERT INTO {table} VALUES (1, 'a', 'g'), (2, 'b', 'g')",
            "ALTER TABLE {table} RENAME COLUMN v TO renamed",
            "ALTER TABLE {table} DROP COLUMN gone",
            "INSERT INTO {table} VALUES (3, 'c')",
        ],
    )
    for version, expected in ((1, [(1, "a"), (2, "b"), (5, "z")]), (4, [(1, "a"), (2, "b"), (3, "c"), (5, "z")])):
        name = "v" if version == 1 else "renamed"
        copies = _copies(
            delta_spark,
            tmp_path / str(version),
            f"(SELECT id, {name} AS v FROM {table_ref(source)} VERSION AS OF {version})",
        )
        copies.merged_alike(spark, delta_spark)
        assert sql_rows(delta_spark, copies.ours) == expected
