"""Fixtures shared by every test: one real Spark Connect server process for the whole run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from engine.spark import configure_session
from engine.spark_server import SparkProcess, start_connect_server, start_standalone_cluster
from tests.oracle.fixtures import delta_spark, delta_spark_server

# The suite's many worker starts take the warm-up's first merges but not its JIT rounds, which would add seconds to
# each start on a server that is warm anyway; tests/service/test_warm_up.py runs the rounds.
os.environ.setdefault("MERGE_SERVICE_WARM_UP_SECONDS", "0")

# Session fixtures are one per place they are defined: Delta on Spark (a JVM of a minute's start and gigabytes of
# heap) is offered here once, for tests/oracle, tests/e2e and the engine tests that check their tables with it.
__all__ = ["delta_spark", "delta_spark_server"]


@pytest.fixture(scope="session")
def spark_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkProcess]:
    server = start_connect_server(log_dir=tmp_path_factory.mktemp("spark-logs"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def spark_remote(spark_server: SparkProcess) -> str:
    return f"sc://127.0.0.1:{spark_server.port}"


@pytest.fixture(scope="session")
def spark(spark_remote: str) -> Iterator[SparkSession]:
    session = SparkSession.builder.remote(spark_remote).create()
    configure_session(session)
    yield session
    session.stop()


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    """A lake root for one test."""
    root = tmp_path / "lake"
    root.mkdir()
    return root


@pytest.fixture(scope="session")
def cluster_spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """A real standalone cluster: master, worker and a Connect server whose tasks run in a separate executor
    JVM, so what passes here runs distributed."""
    logs = tmp_path_factory.mktemp("cluster-logs")
    master, worker = start_standalone_cluster(cores=2, memory="3g", log_dir=logs)
    master_url = f"spark://127.0.0.1:{master.port}"
    server = start_connect_server(
        master=master_url, log_dir=logs, conf={"spark.executor.memory": "2g", "spark.driver.memory": "1g"}
    )
    session = SparkSession.builder.remote(f"sc://127.0.0.1:{server.port}").create()
    configure_session(session)
    session.cluster_work_dir = logs / "work"  # type: ignore[attr-defined]
    yield session
    session.stop()
    for process in (server, worker, master):
        process.stop()
