"""Delta on Spark and the engine writing one table at once. Delta's DELETE, UPDATE, MERGE, INSERT or OPTIMIZE
committing while the engine's merge is about to commit: the engine's conflict check redoes the merge, and the table
ends as if Delta's operation came first. The engine committing while Delta's MERGE runs: Delta's own conflict check
reads the engine's commit and refuses its commit, as it would a concurrent Delta MERGE."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from engine import parse_merge_sql, run_merge
from engine.result import Phase
from tests.oracle.sql_cases import sql_rows
from tests.oracle.tables import latest_version, make_delta_table, table_ref

DDL = "id BIGINT, v STRING, p INT"
ROWS = ", ".join(f"({i}, 'v{i}', {i % 2})" for i in range(40))
SOURCE_ROWS = ", ".join(f"({i}, 's{i}', {i % 2})" for i in range(0, 60, 4))
CLAUSES = "WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT *"
LAYOUTS = {
    "copy-on-write, partitioned": ({}, ["p"]),
    "deletion vectors": ({"delta.enableDeletionVectors": "true"}, []),
}
SERVER_TMP = Path("/tmp")
"""The Delta server JVM's ``java.io.tmpdir``, where its MERGE's source leaves a marker as it starts sleeping."""
DELTA_WRITES = {
    "delete of a row the merge updates": "DELETE FROM {t} WHERE id = 8",
    "update of a row the merge updates": "UPDATE {t} SET v = 'delta' WHERE id = 12",
    "insert of a key the merge inserts": "INSERT INTO {t} VALUES (44, 'd44', 0)",
    "optimize": "OPTIMIZE {t}",
}


def _tables(delta_spark: SparkSession, tmp: Path, layout: str) -> tuple[Path, Path]:
    properties, partitioned_by = LAYOUTS[layout]
    target = make_delta_table(
        delta_spark,
        tmp / "target",
        DDL,
        properties=properties,
        partitioned_by=partitioned_by,
        then_sql=[f"INSERT INTO {{table}} VALUES {ROWS}", "INSERT INTO {table} VALUES (200, 'x', 0), (201, 'y', 1)"],
    )
    source_rows = f"INSERT INTO {{table}} VALUES {SOURCE_ROWS}"
    source = make_delta_table(delta_spark, tmp / "source", DDL, then_sql=[source_rows])
    return target, source


def _merge(target: Path, source: Path) -> str:
    return f"MERGE INTO {table_ref(target)} AS t USING {table_ref(source)} AS s ON t.id = s.id {CLAUSES}"


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("write", list(DELTA_WRITES))
def test_a_delta_commit_before_the_merges_commit_is_merged_as_if_first(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, write: str, layout: str
) -> None:
    target, source = _tables(delta_spark, tmp_path / "raced", layout)
    start = latest_version(target)
    delta_wrote: list[Phase] = []

    def delta_writes_first(phase: Phase) -> None:
        if phase == "committing" and not delta_wrote:
            delta_wrote.append(phase)
            delta_spark.sql(DELTA_WRITES[write].format(t=table_ref(target))).collect()

    run_merge(spark, parse_merge_sql(_merge(target, source)), on_progress=delta_writes_first)
    assert delta_wrote and latest_version(target) == start + 2

    serial, serial_source = _tables(delta_spark, tmp_path / "serial", layout)
    delta_spark.sql(DELTA_WRITES[write].format(t=table_ref(serial))).collect()
    run_merge(spark, parse_merge_sql(_merge(serial, serial_source)))
    assert sql_rows(delta_spark, target) == sql_rows(delta_spark, serial)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_delta_refuses_to_commit_over_the_engines_merge(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, layout: str
) -> None:
    """Delta's MERGE reads its snapshot, then its source sleeps (after leaving a marker file in the server's
    temporary folder); the engine merges and commits meanwhile, and Delta's commit then meets it."""
    target, source = _tables(delta_spark, tmp_path / "raced", layout)
    start = latest_version(target)
    marker = f"merge-race-{uuid.uuid4().hex}"
    slow_source = (
        "(SELECT * FROM VALUES (8, 'delta', 0) AS x(id, v, p) WHERE concat("
        f"reflect('java.io.File', 'createTempFile', '{marker}', '.started'), "
        "reflect('java.lang.Thread', 'sleep', CAST(10000 AS BIGINT))) IS NOT NULL)"
    )
    delta_merge = (
        f"MERGE INTO {table_ref(target)} AS t USING {slow_source} AS s ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET v = s.v"
    )
    delta_error: list[Exception] = []

    def run_delta() -> None:
        try:
            delta_spark.sql(delta_merge).collect()
        except PySparkException as exc:
            delta_error.append(exc)

    delta = threading.Thread(target=run_delta)
    delta.start()
    try:
        for _ in range(600):
            if any(SERVER_TMP.glob(f"{marker}*")):
                break
            time.sleep(0.05)
        assert any(SERVER_TMP.glob(f"{marker}*")), "Delta's MERGE never reached its source"
        run_merge(spark, parse_merge_sql(_merge(target, source)))
        assert latest_version(target) == start + 1
    finally:
        delta.join()
        for path in SERVER_TMP.glob(f"{marker}*"):
            path.unlink()
    assert delta_error and "DELTA_CONCURRENT_APPEND" in str(delta_error[0]), delta_error
    assert latest_version(target) == start + 1

    alone, alone_source = _tables(delta_spark, tmp_path / "alone", layout)
    run_merge(spark, parse_merge_sql(_merge(alone, alone_source)))
    assert sql_rows(delta_spark, target) == sql_rows(delta_spark, alone)
