"""More than one Spark Connect session in a process (two engines, a session reopened after a stalled server):
each merge's server-side state stays with the session that made it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql.connect.session import SparkSession as ConnectSession

from engine import parse_merge_sql, run_merge
from engine.spark import configure_session, local_checkpoint, session_conf
from tests.engine.harness import rows, write_table
from tests.engine.test_merge import SOURCE, TARGET


@contextmanager
def active(session: SparkSession) -> Iterator[None]:
    """Make ``session`` this thread's active one, as the first session a thread creates becomes."""
    local = ConnectSession._active_session
    before = getattr(local, "session", None)
    local.session = session
    try:
        yield
    finally:
        local.session = before


@pytest.fixture
def two_sessions(spark_remote: str) -> Iterator[tuple[SparkSession, SparkSession]]:
    first = SparkSession.builder.remote(spark_remote).create()
    second = SparkSession.builder.remote(spark_remote).create()
    configure_session(second)
    yield first, second
    second.stop()
    first.stop()


def test_pyspark_binds_a_checkpoint_to_the_active_session(two_sessions: tuple[SparkSession, SparkSession]) -> None:
    """Why ``local_checkpoint`` exists: pyspark's own call hands the result to whichever session is active."""
    first, second = two_sessions
    with active(first):
        checkpointed = second.range(3).localCheckpoint(eager=True)
        with pytest.raises(PySparkException, match="DATAFRAME_NOT_FOUND"):
            checkpointed.count()


def test_a_checkpoint_stays_with_its_session(two_sessions: tuple[SparkSession, SparkSession]) -> None:
    first, second = two_sessions
    with active(first):
        checkpointed = local_checkpoint(second, second.range(3))
        assert checkpointed.count() == 3
        assert ConnectSession.getActiveSession() is first
    assert checkpointed.sparkSession is second


def test_a_query_source_merges_in_a_session_that_is_not_the_active_one(
    two_sessions: tuple[SparkSession, SparkSession], tmp_path: Path
) -> None:
    first, second = two_sessions
    target = write_table(tmp_path / "t", TARGET)
    source = write_table(tmp_path / "s", SOURCE)
    spec = parse_merge_sql(
        f"MERGE INTO delta.`{target}` AS t USING (SELECT id, upper(v) AS v, n FROM delta.`{source}` WHERE id > 2) AS s "
        "ON t.id = s.id WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT *"
    )
    with active(first):
        result = run_merge(second, spec)
    assert result.result["num_updated_rows"] == 1 and result.result["num_inserted_rows"] == 1
    assert rows(target, ["id", "v"]) == [(1, "a"), (2, "b"), (3, "C"), (4, "d"), (5, "E")]


def test_session_conf_puts_back_what_was_there(spark: SparkSession) -> None:
    """Set keys get their earlier values back, unset ones are unset again, also when the block fails."""
    earlier = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "7")
    spark.conf.unset("spark.merge_service.test.unset")
    try:
        with (
            pytest.raises(RuntimeError, match="inside"),
            session_conf(spark, {"spark.sql.shuffle.partitions": "1", "spark.merge_service.test.unset": "x"}),
        ):
            assert spark.conf.get("spark.sql.shuffle.partitions") == "1"
            assert spark.conf.get("spark.merge_service.test.unset") == "x"
            raise RuntimeError("inside")
        assert spark.conf.get("spark.sql.shuffle.partitions") == "7"
        assert spark.conf.get("spark.merge_service.test.unset", None) is None
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", earlier)
