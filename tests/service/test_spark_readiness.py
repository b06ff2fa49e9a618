"""A worker's Spark session against a real Spark Connect server (local mode: the driver runs the tasks): its
readiness and its scheduler pool. A cluster without executors is checked end to end by the compose check
(tests/deploy/test_compose.py)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import cast

from service.metrics import ServiceMetrics
from service.runner import EngineRunner, is_loopback, spark_server_identity
from service.settings import Settings
from service.spark_executors import driver_ui_url, local_master_cores, usable_cores
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


def test_a_worker_bounds_its_servers_merges_at_once_by_the_cores_it_reads(spark_remote: str, tmp_path: Path) -> None:
    """Unset, ``spark_merges_at_once`` is half the cores the probe read from the server (the test server runs
    ``local[2]``): one merge at a time there; set, it is the setting; 0 is no bound."""
    settings = Settings(spark_remote=spark_remote, lake_roots=[str(tmp_path)], warm_up=False)
    runner = EngineRunner(settings)
    try:
        assert runner.spark_share().merges_at_once is None  # nothing read yet: no bound
        runner.warm_up()
        wait_until(lambda: runner.readiness() == (True, "ok"), timeout=60, interval=0.2)
        share = runner.spark_share()
        master = runner.session().conf.get("spark.master")
        assert master == "local[2]", master
        assert share.server == spark_remote.split(";")[0] and share.merges_at_once == 1
        assert share.long_merge_seconds == settings.spark_long_merge_seconds
    finally:
        runner.close()
    assert EngineRunner(settings.model_copy(update={"spark_merges_at_once": 3})).spark_share().merges_at_once == 3
    assert EngineRunner(settings.model_copy(update={"spark_merges_at_once": 0})).spark_share().merges_at_once is None


def test_cores_and_server_identities() -> None:
    assert [local_master_cores(m, 8) for m in ("local", "local[4]", "local[*]", "local[3,2]", "spark://m:7077")] == [
        1,
        4,
        8,
        3,
        None,
    ]
    assert local_master_cores("local[*]", None) is None and local_master_cores(None, 8) is None
    driver = {"id": "driver", "isActive": True, "totalCores": 0}
    assert usable_cores([driver, {"isActive": True, "totalCores": 4}, {"isActive": False, "totalCores": 4}]) == 4
    assert spark_server_identity("sc://spark:15002/;token=abc") == "sc://spark:15002"
    assert spark_server_identity("local").startswith("local:")
    assert is_loopback("sc://127.0.0.1:15002") and not is_loopback("sc://spark:15002/;token=a")


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
