"""The engine as a peer: ``run_merge`` on a Spark Connect session, in a process of its own.

Every engine process joins the same Spark Connect session, as the service's worker runs all its merges in one: the
server compiles a query's generated code once per session, and a worker's steady state has it compiled. The timing
includes loading the target's snapshot and reading the source Delta table inside ``run_merge``.
"""

from __future__ import annotations

import time
from typing import Any

from bench.merge.measure import merge_error, peak_rss_bytes, tree_cpu_seconds
from bench.merge.workloads import Kind


def _session(job: dict[str, Any]) -> Any:
    from pyspark.sql import SparkSession

    from engine.spark import configure_session

    spark = SparkSession.builder.remote(f"{job['remote'].rstrip('/')}/;session_id={job['session_id']}").create()
    configure_session(spark)
    spark.range(1).collect()
    return spark


def _release(spark: Any) -> None:
    spark.release_session_on_close = False  # the next engine process joins the same session
    spark.stop()


def _spec(job: dict[str, Any]) -> Any:
    import engine

    kind: Kind = job["kind"]
    matched: tuple[engine.MergeClause, ...] = ()
    not_matched: tuple[engine.MergeClause, ...] = ()
    if kind == "upsert":
        matched = (engine.MergeClause("matched", engine.UpdateAction(star=True)),)
    if kind == "delete":
        matched = (engine.MergeClause("matched", engine.DeleteAction()),)
    if kind in ("upsert", "insert"):
        not_matched = (engine.MergeClause("notMatched", engine.InsertAction(star=True)),)
    return engine.MergeSpec(
        target=job["target"],
        source=engine.TableSource(format="delta", path=job["source"]),
        on="t.id = s.id",
        target_alias="t",
        source_alias="s",
        matched=matched,
        not_matched=not_matched,
    )


def merge(job: dict[str, Any]) -> dict[str, Any]:
    import engine
    from bench.merge.peer_deltars import warm_deltalake
    from engine.errors import UnsupportedTableFeatureError

    spark = _session(job)
    warm_deltalake(job)
    spec = _spec(job)
    run_merge = engine.run_merge  # `engine` imports lazily: its modules load here, not inside the timed merge
    phases: list[tuple[str, float]] = []
    rss_before = peak_rss_bytes()
    jvm_cpu0, cpu0 = tree_cpu_seconds(job.get("jvm_pid")), time.process_time()
    start = time.perf_counter()
    try:
        result = run_merge(spark, spec, on_progress=lambda p: phases.append((p, time.perf_counter() - start)))
    except UnsupportedTableFeatureError as exc:
        return {"status": "unsupported", "error": f"{type(exc).__name__}: {exc}", "peak_rss": peak_rss_bytes()}
    except Exception as exc:
        return merge_error(exc)
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    jvm_cpu = tree_cpu_seconds(job.get("jvm_pid"))
    jvm_s = jvm_cpu - jvm_cpu0 if jvm_cpu is not None and jvm_cpu0 is not None else None
    out = {
        "status": "ok",
        "wall_s": wall,
        "cpu_s": cpu + (jvm_s or 0.0),
        "jvm_cpu_s": jvm_s,
        "table_version": result.table_version,
        "result": result.result,
        "metrics": result.metrics,
        "phases": phases,
        "peak_rss": peak_rss_bytes(),
        "peak_rss_before_merge": rss_before,
    }
    _release(spark)
    return out


def scan(job: dict[str, Any]) -> dict[str, Any]:
    """A full scan of ``job["target"]`` as the engine reads a table: the snapshot (deletion vectors included),
    then every live row, counted and ``value`` summed. Each of ``job["repeat"]`` scans is timed."""
    from pyspark.sql import functions as F

    from engine import delta
    from engine.delta.snapshot import load_snapshot

    spark = _session(job)
    times = []
    answer: tuple[int, float] = (0, 0.0)
    for _ in range(int(job["repeat"])):
        start = time.perf_counter()
        snapshot = load_snapshot(job["target"])
        rows = delta.scan_files(spark, snapshot, snapshot.files, file_columns=False)
        row = rows.agg(F.count(F.lit(1)).alias("n"), F.sum("value").alias("s")).collect()[0]
        times.append(time.perf_counter() - start)
        answer = (int(row["n"]), float(row["s"] or 0.0))
    _release(spark)
    return {"status": "ok", "times": times, "rows": answer[0], "sum": answer[1], "peak_rss": peak_rss_bytes()}
