"""The ``delta_spark`` fixture: a Spark Connect session on Delta's own Spark, with Delta's SQL extension and catalog.

The root conftest (tests/conftest.py) offers it to every test, once: a session fixture imported into several
conftests would be started once per conftest.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from engine.spark import configure_session
from engine.spark_server import SparkProcess
from tests.oracle.delta_spark import RegistryUnreachableError, prepare, start_delta_connect_server

# Delta's own test suites' settings for small tables: a snapshot's state in 2 partitions rather than 50, so each
# log replay is 2 tasks, not 50; and at most 3 tables' logs cached, where the default keeps up to 10,000 for an hour
# each with its cached state (a long run merges into thousands of tables: the server's heap ran out after 250 random
# merges). Delta 4 reads the cache size from this Spark setting, and takes the larger of it and the JVM property
# ``delta.log.cacheSize`` its older releases read. They change how Delta reads its log, never what a merge writes.
# ``MERGE_DELTA_DRIVER_MEMORY`` gives the server more heap where a run needs it.
DELTA_TEST_CONF = {
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.databricks.delta.delta.log.cacheSize": "3",
    "spark.driver.memory": os.environ.get("MERGE_DELTA_DRIVER_MEMORY", "2g"),
}


@pytest.fixture(scope="session")
def delta_spark_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkProcess]:
    try:
        home = prepare()
    except RegistryUnreachableError as exc:
        # Only a machine that cannot reach Maven Central goes without Delta on Spark; CI must have it.
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"Delta on Spark is required in CI: {exc}")
        pytest.skip(f"Delta on Spark needs Maven Central once to fetch Delta's jars, and it is unreachable: {exc}")
    server = start_delta_connect_server(home, log_dir=tmp_path_factory.mktemp("delta-spark-logs"), conf=DELTA_TEST_CONF)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def delta_spark(delta_spark_server: SparkProcess) -> Iterator[SparkSession]:
    """Delta on Spark, configured as the engine's sessions are (UTC, ANSI...), so both answer the same SQL alike."""
    session = SparkSession.builder.remote(f"sc://127.0.0.1:{delta_spark_server.port}").create()
    configure_session(session)
    yield session
    session.stop()
