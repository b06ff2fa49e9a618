"""Where Delta on Spark has no trustworthy answer (docs/oracle.md, "Intended differences"): how to tell, and how
a comparison then judges the engine (by the reference model)."""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession

from tests.engine.test_merge_random import ModelClause, as_sorted, model_merge
from tests.oracle.differential import Side, delta_rows

DELTA_UNEXPECTED_ROW = "Unexpected row: did not match any merge clause"
"""Delta's own internal error where its writeAllChanges meets a row it expected a clause to act on."""


def assert_as_modelled(delta_spark: SparkSession, ours: Side, case: dict[str, Any], clauses: list[ModelClause]) -> None:
    """Where Delta has no trustworthy answer (docs/oracle.md), the engine's rows and result row are the reference
    model's."""
    columns = case["columns"]
    expected, counts = model_merge(case["target"], case["source"], clauses, columns, on=case["on"])
    assert ours.error is None, ours.error
    assert delta_rows(delta_spark, ours.path, columns) == as_sorted(expected, columns)
    assert ours.result is not None and {k: ours.result[k] for k in counts} == counts


def delta_disagrees_with_itself(delta_spark: SparkSession, theirs: Side, start_rows: int, columns: list[str]) -> bool:
    """Whether Delta's table holds other than the rows its own result row says (rows before, less those deleted,
    plus those inserted): then the engine is judged by the reference model (docs/oracle.md)."""
    if theirs.result is None:
        return False
    expected = start_rows - theirs.result["num_deleted_rows"] + theirs.result["num_inserted_rows"]
    return len(delta_rows(delta_spark, theirs.path, columns)) != expected
