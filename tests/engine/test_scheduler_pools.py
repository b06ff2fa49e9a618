"""Sessions in scheduler pools of their own share a FAIR server's cores task by task: a small job of one session
runs while another session's long job still has most of its tasks to go. Sessions in one pool queue behind each
other (FIFO), which is what the pools are for."""

from __future__ import annotations

import threading
import time

from pyspark.sql import SparkSession

from engine.spark import close_session, connect

TASKS = 160
TASK_MS = 50


def _long_job(spark: SparkSession) -> None:
    """TASKS tasks that each sleep TASK_MS: about TASKS * TASK_MS / cores of wall time, little CPU."""
    spark.range(0, TASKS, 1, TASKS).selectExpr(
        f"java_method('java.lang.Thread', 'sleep', CAST({TASK_MS} AS BIGINT)) AS slept"
    ).collect()


def _small_job_beside_a_long_one(remote: str, long_pool: str, small_pool: str) -> tuple[float, float]:
    """Seconds from the long job's start to the small job's end, and to the long job's end."""
    big = connect(remote, pool=long_pool)
    small = connect(remote, pool=small_pool)
    try:
        small.range(10).count()  # the small session's first call is not what is timed
        start = time.monotonic()
        long_done: list[float] = []
        runner = threading.Thread(target=lambda: (_long_job(big), long_done.append(time.monotonic())))
        runner.start()
        time.sleep(TASKS * TASK_MS / 1000 / 8)  # the long job's tasks are queued and running
        assert runner.is_alive()
        small.range(1000).selectExpr("sum(id)").collect()
        small_done = time.monotonic()
        runner.join()
        return small_done - start, long_done[0] - start
    finally:
        close_session(small)
        close_session(big)


def test_a_small_job_in_its_own_pool_does_not_wait_for_a_long_job(spark_remote: str) -> None:
    small, long = _small_job_beside_a_long_one(spark_remote, "pools-test-long", "pools-test-small")
    assert small < long / 2, (small, long)


def test_in_one_pool_the_small_job_waits_for_the_long_jobs_tasks(spark_remote: str) -> None:
    small, long = _small_job_beside_a_long_one(spark_remote, "pools-test-shared", "pools-test-shared")
    assert small > long * 3 / 4, (small, long)
