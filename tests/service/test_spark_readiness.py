"""A worker's Spark session against a real Spark Connect server (local mode: the driver runs the tasks): its
readiness and its scheduler pool. A cluster without executors is checked end to end by the compose check
(tests/deploy/test_compose.py)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import cast

from service.metrics import ServiceMetrics
from service.runner import EngineRunner
from service.settings import Settings
from service.spark_executors import driver_ui_url
from service.worker import Worker
from tests.service.conftest import wait_until


def test_a_connect_server_that_runs_tasks_is_ready(spark_remote: str, tmp_path: Path) -> None:
    metrics = ServiceMetrics()
    runner = EngineRunner(Settings(spark_remote=spark_remote, lake_roots=[str(tmp_path)]), metrics)
    try:
        runner.warm_up()
        wait_until(lambda: runner.readiness() == (True, "ok"), timeout=60, interval=0.2)
        # NaN (not known) unless this server's own driver API answered; then local mode counts the driver.
        seen = metrics.registry.get_sample_value("merge_spark_executors")
        assert seen is not None and (math.isnan(seen) or seen >= 1)
    finally:
        runner.close()


def test_the_driver_api_is_found_beside_the_connect_endpoint() -> None:
    assert driver_ui_url("sc://spark-connect:15002") == "http://spark-connect:4040"
    assert driver_ui_url("sc://10.0.0.7:15002/;token=abc;use_ssl=true") == "http://10.0.0.7:4040"
    assert driver_ui_url("local") is None


def test_each_worker_runs_its_jobs_in_a_scheduler_pool_of_its_own(spark_remote: str, tmp_path: Path) -> None:
    """Workers sharing one server are scheduled fairly against each other (engine/spark_server.py runs it FAIR)."""
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'service.db'}",
        spark_remote=spark_remote,
        lake_roots=[str(tmp_path)],
        warm_up=False,
    )
    workers = [Worker(settings), Worker(settings)]
    try:
        pools = [cast(EngineRunner, w.runner).session().conf.get("spark.scheduler.pool") for w in workers]
        assert pools == [f"merge-worker-{w.id}" for w in workers]
        assert pools[0] != pools[1]
    finally:
        for worker in workers:
            worker.stop()
