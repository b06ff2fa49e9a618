"""Delta Lake on Spark as a peer: Delta's own ``MERGE INTO`` (Delta 4.4 on Spark 4.2, tests/oracle/delta_spark.py)
on a Spark Connect server of its own, given the same resources as the engine's (``local[2]``, the driver memory,
shuffle partitions, adaptive execution) and the engine's session settings.

Every Delta process joins one session on that server, as the engine's do on theirs. The timing is the client's
wall time of the ``MERGE INTO`` statement: Delta loads the snapshot, reads the source table and commits inside it.
On a table with ``delta.enableDeletionVectors`` Delta's MERGE writes deletion vectors
(``spark.databricks.delta.merge.deletionVectors.persistent``, true by default, set here to say so).
"""

from __future__ import annotations

import time
from typing import Any

from bench.merge.measure import merge_error, peak_rss_bytes, tree_cpu_seconds

DELTA_SESSION_CONF = {
    "spark.databricks.delta.merge.deletionVectors.persistent": "true",
    # Delta rebuilds a snapshot's state in 50 partitions by default, sized for clusters; on the bench's two cores
    # it gets the shuffle partitions the engine's server has.
    "spark.databricks.delta.snapshotPartitions": "8",
}

_CLAUSES = {
    "upsert": "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
    "insert": "WHEN NOT MATCHED THEN INSERT *",
    "delete": "WHEN MATCHED THEN DELETE",
}


def _session(job: dict[str, Any]) -> Any:
    from pyspark.sql import SparkSession

    from engine.spark import configure_session

    spark = SparkSession.builder.remote(f"{job['remote'].rstrip('/')}/;session_id={job['session_id']}").create()
    configure_session(spark)
    for key, value in DELTA_SESSION_CONF.items():
        spark.conf.set(key, value)
    spark.range(1).collect()
    return spark


def _release(spark: Any) -> None:
    spark.release_session_on_close = False
    spark.stop()


def _table(path: str) -> str:
    return "delta.`" + path.replace("`", "``") + "`"


def merge(job: dict[str, Any]) -> dict[str, Any]:
    spark = _session(job)
    statement = (
        f"MERGE INTO {_table(job['target'])} AS t USING {_table(job['source'])} AS s ON t.id = s.id "
        + _CLAUSES[job["kind"]]
    )
    jvm_cpu0 = tree_cpu_seconds(job.get("jvm_pid"))
    start = time.perf_counter()
    try:
        row = spark.sql(statement).collect()[0].asDict()
    except Exception as exc:
        return merge_error(exc)
    wall = time.perf_counter() - start
    jvm_cpu = tree_cpu_seconds(job.get("jvm_pid"))
    history = spark.sql(f"DESCRIBE HISTORY {_table(job['target'])} LIMIT 1").collect()[0]
    _release(spark)
    return {
        "status": "ok",
        "wall_s": wall,
        "cpu_s": jvm_cpu - jvm_cpu0 if jvm_cpu is not None and jvm_cpu0 is not None else None,
        "table_version": int(history["version"]),
        "result": {k: int(v) for k, v in row.items()},
        "metrics": {k: int(v) for k, v in (history["operationMetrics"] or {}).items()},
        "peak_rss": peak_rss_bytes(),
    }


def scan(job: dict[str, Any]) -> dict[str, Any]:
    """Delta's own full scan of ``job["target"]``: every live row counted and ``value`` summed."""
    from pyspark.sql import functions as F

    spark = _session(job)
    times = []
    answer: tuple[int, float] = (0, 0.0)
    for _ in range(int(job["repeat"])):
        start = time.perf_counter()
        rows = spark.read.format("delta").load(job["target"])
        row = rows.agg(F.count(F.lit(1)).alias("n"), F.sum("value").alias("s")).collect()[0]
        times.append(time.perf_counter() - start)
        answer = (int(row["n"]), float(row["s"] or 0.0))
    _release(spark)
    return {"status": "ok", "times": times, "rows": answer[0], "sum": answer[1], "peak_rss": peak_rss_bytes()}
