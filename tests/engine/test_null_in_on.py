"""An ON with a NULL conjunct (Delta's "NULL in condition"): nothing matches, and the merge's metrics are the
ones Delta reports for it, deltalake's merge of the same data the oracle. Spark folds such an ON to false and
prunes the source side from the join that findTouchedFiles runs, and the source count observed on it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from engine import COMMIT_METRICS
from tests.engine.harness import COUNTS, differential, join_plan
from tests.engine.test_merge import CASES, SOURCE, TARGET


def _oracle_metrics(table: Path) -> dict[str, int] | None:
    """The metrics deltalake's merge recorded in its commit; None when it changed nothing (and committed
    nothing)."""
    history = DeltaTable(str(table)).history(1)[0]
    if history["operation"] != "MERGE":
        return None
    metrics = history["operationMetrics"]
    return {k: int(v) for k, v in (json.loads(metrics) if isinstance(metrics, str) else metrics).items()}


NULL_ON = "t.id = s.id AND NULL"
BARE_NULL_ON = "CAST(NULL AS BOOLEAN)"
"""``ON NULL`` itself is refused by Spark (a VOID join condition), as Delta on Spark refuses it."""


@pytest.mark.parametrize(
    ("on", "name"), [(NULL_ON, name) for name in CASES] + [(BARE_NULL_ON, "upsert"), (BARE_NULL_ON, "update_only")]
)
@pytest.mark.parametrize("broadcast", [True, False], ids=["broadcast", "shuffle"])
def test_null_in_on_counts_every_source_row(
    spark: SparkSession, tmp_path: Path, on: str, name: str, broadcast: bool
) -> None:
    with join_plan(broadcast=broadcast):
        result, expected, _, theirs = differential(spark, tmp_path, TARGET, SOURCE, on, CASES[name])
    oracle = _oracle_metrics(theirs)
    m = result.metrics
    assert {k: result.result[k] for k in COUNTS} == expected
    assert m["numSourceRows"] == SOURCE.num_rows
    if oracle is not None:
        assert m["numSourceRows"] == oracle["num_source_rows"]
        assert m["numTargetRowsInserted"] == oracle["num_target_rows_inserted"]
        assert m["numTargetRowsUpdated"] == oracle["num_target_rows_updated"]
        assert m["numTargetRowsDeleted"] == oracle["num_target_rows_deleted"]
    else:
        assert result.table_version is None
    assert m["numOutputRows"] == m["numTargetRowsInserted"] + m["numTargetRowsUpdated"] + m["numTargetRowsCopied"]
    if result.table_version is not None:
        ours = DeltaTable(str(tmp_path / "ours")).history(1)[0]
        assert ours["operationMetrics"] == {k: str(m[k]) for k in COMMIT_METRICS}
