"""The core differential cases again, on a real standalone cluster (tasks in a separate executor JVM)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from tests.engine.harness import COUNTS, differential, rows
from tests.engine.test_merge import CASES, SOURCE, TARGET

pytestmark = pytest.mark.cluster


def test_the_cluster_runs_tasks_in_an_executor(cluster_spark: SparkSession) -> None:
    assert cluster_spark.range(1000).selectExpr("sum(id)").collect()[0][0] == 499500
    # The standalone worker launched an executor JVM for the Connect server's application.
    work: Path = cluster_spark.cluster_work_dir  # type: ignore[attr-defined]
    executors = list(work.glob("app-*/*/stderr"))
    assert executors, f"no executor ran under {work}"


@pytest.mark.parametrize("name", ["upsert", "conditional_update_and_delete", "insert_only", "everything"])
@pytest.mark.parametrize("partitioned", [False, True], ids=["flat", "partitioned"])
def test_matches_deltalake_on_a_cluster(
    cluster_spark: SparkSession, tmp_path: Path, name: str, partitioned: bool
) -> None:
    target = TARGET.append_column("p", pa.array(["x", "y", "x", "y"])) if partitioned else TARGET
    source = SOURCE.append_column("p", pa.array(["y", "x", "x"])) if partitioned else SOURCE
    result, expected, ours, theirs = differential(
        cluster_spark,
        tmp_path,
        target,
        source,
        "t.id = s.id",
        CASES[name],
        partition_by=["p"] if partitioned else None,
    )
    assert {k: result.result[k] for k in COUNTS} == expected
    assert rows(ours) == rows(theirs)
