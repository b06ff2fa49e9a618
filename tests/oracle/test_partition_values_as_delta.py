"""Partition values against Delta on Spark: a table Delta created, partitioned by a string column whose values
need escaping in a path (``/``, ``=``, ``%``, ``:``, ``#``, ``?``, spaces, brackets, non-ASCII), the empty string
and NULL (both Delta's null partition), or by typed columns (DATE, TIMESTAMP with microseconds, DECIMAL, BOOLEAN,
before 1970 and NULL); the engine's merge and Delta's MERGE INTO on copies commit the same, with and without
deletion vectors, and Delta then merges into the engine's result."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.engine.harness import clause
from tests.oracle.differential import assert_same, delta_made_copies, delta_rows, run_delta, run_engine

STRING_VALUES = ["NULL", "''", "'a/b'", "'a=b'", "'a%b'", "'ü ß'", "' x '", "'a:b'", "'[x] (y)'", "'a#b?c'"]
TYPED_VALUES = [
    "DATE'2020-01-01', TIMESTAMP'2020-01-01 10:11:12.345678', 1.50, true",
    "NULL, NULL, NULL, NULL",
    "DATE'1969-12-31', TIMESTAMP'1969-12-31 23:59:59', -0.01, false",
]
LAYOUTS: dict[str, tuple[str, list[str], str, str]] = {
    "escaped strings": (
        "id BIGINT, v STRING, p STRING",
        ["p"],
        ", ".join(f"({i}, 'v{i}', {STRING_VALUES[i % len(STRING_VALUES)]})" for i in range(30)),
        ", ".join(f"({i}, 's{i}', {STRING_VALUES[(i * 3) % len(STRING_VALUES)]})" for i in range(20, 45)),
    ),
    "typed": (
        "id BIGINT, v STRING, d DATE, ts TIMESTAMP, dec DECIMAL(7,2), b BOOLEAN",
        ["d", "ts", "dec", "b"],
        ", ".join(f"({i}, 'v{i}', {TYPED_VALUES[i % 3]})" for i in range(12)),
        ", ".join(f"({i}, 's{i}', {TYPED_VALUES[(i + 1) % 3]})" for i in range(8, 16)),
    ),
}
CLAUSES = [
    clause("matched", "delete", "s.id % 5 = 0"),
    clause("matched", "update_all"),
    clause("notMatched", "insert_all"),
    clause("notMatchedBySource", "update", "t.id % 4 = 0", v="'not matched by source'"),
]


@pytest.mark.parametrize("deletion_vectors", [False, True], ids=["copy-on-write", "deletion-vectors"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_partition_values_are_written_as_delta_writes_them(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, layout: str, deletion_vectors: bool
) -> None:
    """Updates move rows between partitions, inserts open new ones and deletes empty others."""
    ddl, partitioned_by, rows, source_rows = LAYOUTS[layout]
    properties = {"delta.enableDeletionVectors": "true"} if deletion_vectors else {}
    ours, theirs, source = delta_made_copies(
        delta_spark,
        tmp_path,
        ddl,
        (ddl, source_rows),
        properties=properties,
        partitioned_by=partitioned_by,
        then_sql=[f"INSERT INTO {{table}} VALUES {rows}"],
    )
    run_engine(spark, ours, source, "t.id = s.id", CLAUSES)
    run_delta(delta_spark, theirs, source, "t.id = s.id", CLAUSES)
    columns = [c.split()[0] for c in ddl.split(", ")]
    assert_same(delta_spark, ours, theirs, columns)
    assert ours.result is not None and ours.result["num_inserted_rows"] > 0 and ours.result["num_deleted_rows"] > 0
    # Delta reads the engine's partition folders and values back and merges into them (the files differ from
    # here on, so only the rows and the result are compared).
    run_delta(delta_spark, ours, source, "t.id = s.id", CLAUSES)
    run_delta(delta_spark, theirs, source, "t.id = s.id", CLAUSES)
    assert ours.result == theirs.result
    assert delta_rows(delta_spark, ours.path, columns) == delta_rows(delta_spark, theirs.path, columns)
