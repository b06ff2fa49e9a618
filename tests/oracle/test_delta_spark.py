"""Delta on Spark itself runs here: it writes deletion vectors, and the product's Connect client reads its answers."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from engine.spark_server import SparkProcess
from tests.oracle.tables import commit_info, latest_version, log_actions, make_delta_table


def test_delta_writes_a_deletion_vector(delta_spark: SparkSession, tmp_path: Path) -> None:
    path = make_delta_table(
        delta_spark,
        tmp_path / "dv",
        "id BIGINT, v STRING",
        [(i, f"v{i}") for i in range(10)],
        properties={"delta.enableDeletionVectors": "true"},
        then_sql=["DELETE FROM {table} WHERE id IN (2, 7)"],
    )
    version = latest_version(path)
    adds = [a["add"] for a in log_actions(path, version) if "add" in a]
    descriptors = [a["deletionVector"] for a in adds if a.get("deletionVector")]
    assert descriptors, adds
    assert sum(d["cardinality"] for d in descriptors) == 2
    assert all(d["storageType"] in ("u", "i", "p") for d in descriptors)
    assert commit_info(path, version)["operation"] == "DELETE"
    protocol = next(a["protocol"] for a in log_actions(path, 0) if "protocol" in a)
    assert "deletionVectors" in protocol["writerFeatures"]
    got = delta_spark.sql(f"SELECT id FROM delta.`{path}` ORDER BY id").collect()
    assert [r.id for r in got] == [0, 1, 3, 4, 5, 6, 8, 9]


def test_delta_merge_answers_through_the_products_client(delta_spark: SparkSession, tmp_path: Path) -> None:
    """MERGE, DESCRIBE HISTORY and table_changes of Delta's Spark, read by the product's Spark Connect client."""
    path = make_delta_table(
        delta_spark,
        tmp_path / "cdf",
        "id BIGINT, v STRING",
        [(1, "a"), (2, "b")],
        properties={"delta.enableChangeDataFeed": "true"},
    )
    result = delta_spark.sql(
        f"MERGE INTO delta.`{path}` t USING (SELECT 2 AS id, 'z' AS v UNION ALL SELECT 3, 'c') s ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
    ).collect()
    assert result[0].asDict() == {
        "num_affected_rows": 2,
        "num_updated_rows": 1,
        "num_deleted_rows": 0,
        "num_inserted_rows": 1,
    }
    history = delta_spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").collect()[0]
    assert history.operation == "MERGE"
    assert history.operationMetrics["numTargetRowsUpdated"] == "1"
    changes = delta_spark.sql(
        f"SELECT id, v, _change_type FROM table_changes_by_path('{path}', {history.version}) ORDER BY id, _change_type"
    ).collect()
    assert [tuple(r) for r in changes] == [
        (2, "z", "update_postimage"),
        (2, "b", "update_preimage"),
        (3, "c", "insert"),
    ]


def test_the_oracle_server_caches_few_tables_logs(
    delta_spark: SparkSession, delta_spark_server: SparkProcess, tmp_path: Path
) -> None:
    """Delta keeps a DeltaLog, with its snapshot's cached state, per table it touched: by default up to 10,000 for
    an hour, which exhausted the oracle server's heap in long runs. With the cache bounded, writing a dozen tables
    leaves only a few more logs alive than before (counted in the server's heap after a full collection).

    Counted against what was alive before: other sessions on the server (earlier tests') keep the logs of the plans
    they still hold, whatever the cache does."""
    java_home = Path(os.path.realpath(shutil.which("java") or "java")).parent
    jcmd = shutil.which("jcmd") or str(java_home / "jcmd")
    if not Path(jcmd).exists():
        pytest.skip("jcmd (the JDK's) is needed to count the server's DeltaLogs")

    def delta_logs_alive() -> int:
        histogram = subprocess.run(
            [jcmd, str(delta_spark_server.process.pid), "GC.class_histogram"],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout
        counts = [
            int(line.split()[1])
            for line in histogram.splitlines()
            if line.endswith(" org.apache.spark.sql.delta.DeltaLog")
        ]
        return counts[0] if counts else 0

    before = delta_logs_alive()
    tables = 12
    for i in range(tables):
        path = tmp_path / f"t{i}"
        delta_spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT) USING delta").collect()
        delta_spark.sql(f"INSERT INTO delta.`{path}` VALUES ({i})").collect()
        delta_spark.sql(f"DELETE FROM delta.`{path}` WHERE id = {i}").collect()
    # Right after the writes Spark may still hold some for a moment (the listener bus's events): count again after
    # a pause until it settles. An unbounded cache keeps every log for an hour, so it never settles below the bound.
    alive: list[int] = []
    for _ in range(10):
        alive.append(delta_logs_alive())
        if alive[-1] - before < tables // 2:
            break
        time.sleep(3)
    assert alive[-1] > 0, "no DeltaLog in the server's heap: the histogram was not read"
    assert alive[-1] - before < tables // 2, (
        f"DeltaLogs alive: {before} before writing {tables} tables, then (every 3 s) {alive}"
    )
