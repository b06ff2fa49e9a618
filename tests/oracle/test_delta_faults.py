"""Delta on Spark's own faults that the random comparison met: each reproduced against Delta, with the engine's
answer beside it (docs/oracle.md, "Intended differences")."""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from tests.engine.harness import clause
from tests.engine.test_merge_random import as_sorted
from tests.oracle.delta_faults import DELTA_UNEXPECTED_ROW, delta_disagrees_with_itself
from tests.oracle.differential import delta_rows, prepare_copies, run_delta, run_engine
from tests.oracle.tables import latest_version

CDF = {"delta.enableChangeDataFeed": "true"}


def test_delta_loses_a_row_where_cdf_meets_an_unconditional_delete_with_several_matches(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path
) -> None:
    """Delta on a Change Data Feed table: one unconditional WHEN MATCHED DELETE with several matches for a row
    (allowed), and a NOT MATCHED BY SOURCE update. Delta's result row, operationMetrics and change rows report the
    update of k = 1, but its data file lacks the updated row: the table loses it (with k = 1 the target file's
    last row; in another order Delta keeps it). The engine writes it."""
    target = pa.table(
        {
            "k": pa.array([3, 3, 6, None, 1], pa.int64()),
            "c0": pa.array([dt.date(2024, 1, 1), None, None, None, dt.date(2024, 1, 1)], pa.date32()),
        }
    )
    source = pa.table(
        {
            "k": pa.array([None, None, None, None, 0], pa.int64()),
            "c0": pa.array([None, dt.date(2024, 1, 1), None, dt.date(1999, 12, 31), None], pa.date32()),
        }
    )
    clauses = [
        clause("notMatched", "insert", "s.k > 2", k="s.k", c0="DATE '1999-12-31'"),
        clause("notMatched", "insert_all"),
        clause("notMatchedBySource", "update", "t.k < 3", c0="DATE '1999-12-31'"),
        clause("notMatchedBySource", "update", "t.c0 IS NOT NULL", c0="DATE '1999-12-31'"),
        clause("matched", "delete"),
    ]
    ours, theirs, src = prepare_copies(tmp_path, target, source, configuration=CDF)
    run_engine(spark, ours, src, "t.k <=> s.k", clauses, ())
    run_delta(delta_spark, theirs, src, "t.k <=> s.k", clauses)
    result = {"num_affected_rows": 4, "num_updated_rows": 2, "num_deleted_rows": 1, "num_inserted_rows": 1}
    assert ours.result == theirs.result == result
    day = dt.date(1999, 12, 31)
    want: list[dict[str, Any]] = [{"k": k, "c0": None} for k in (0, 3, 6)] + [{"k": k, "c0": day} for k in (1, 3)]
    assert delta_rows(delta_spark, ours.path, ["k", "c0"]) == as_sorted(want, ["k", "c0"])
    assert (1, day) not in delta_rows(delta_spark, theirs.path, ["k", "c0"])
    assert delta_disagrees_with_itself(delta_spark, theirs, 5, ["k", "c0"])
    assert not delta_disagrees_with_itself(delta_spark, ours, 5, ["k", "c0"])


def test_delta_fails_on_a_row_no_clause_acts_on_where_two_not_matched_by_source_clauses_repeat(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path
) -> None:
    """Delta on a table with deletion vectors, an empty source, ON ``t.k <=> s.k``, and the same NOT MATCHED BY
    SOURCE update twice (the second can never act): its writeAllChanges meets the rows no clause acts on and
    fails with its own internal error ("Unexpected row: did not match any merge clause"). The engine updates the
    one row the condition holds for and keeps the others, as the reference model says."""
    decimal_type = pa.decimal128(10, 2)
    schema = pa.schema([("k", pa.int64()), ("c0", decimal_type), ("c1", pa.float64())])
    target = pa.table(
        {
            "k": pa.array([1, 1, None], pa.int64()),
            "c0": pa.array([decimal.Decimal("-2.25"), None, None], decimal_type),
            "c1": pa.array([0.5, None, -1.25], pa.float64()),
        },
        schema=schema,
    )
    minus = "CAST('-2.25' AS DECIMAL(10,2))"
    clauses = [
        clause("notMatched", "insert_all", "s.c0 IS NULL"),
        clause("notMatched", "insert_all", "s.c0 IS NULL"),
        clause("matched", "update", "s.c0 IS NULL", c0="s.c0"),
        clause("notMatchedBySource", "update", "t.c0 IS NOT NULL", c0=minus),
        clause("notMatchedBySource", "update", "t.c0 IS NOT NULL", c0=minus),
    ]
    ours, theirs, src = prepare_copies(
        tmp_path, target, schema.empty_table(), configuration={"delta.enableDeletionVectors": "true"}
    )
    on = "t.k <=> s.k"  # with t.k = s.k (and the ON conditions with a source- or target-only part) Delta succeeds
    run_engine(spark, ours, src, on, clauses, ())
    with pytest.raises(PySparkException, match=DELTA_UNEXPECTED_ROW):
        run_delta(delta_spark, theirs, src, on, clauses)
    assert latest_version(theirs.path) == theirs.start_version
    assert ours.result == {"num_affected_rows": 1, "num_updated_rows": 1, "num_deleted_rows": 0, "num_inserted_rows": 0}
    # The updated row keeps its value (-2.25 set to -2.25): the rows are the target's.
    assert delta_rows(delta_spark, ours.path, ["k", "c0", "c1"]) == delta_rows(
        delta_spark, theirs.path, ["k", "c0", "c1"]
    )
    assert ours.version == ours.start_version + 1
