"""Fixtures shared by every test: one real Spark Connect server process for the whole run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from engine.spark import SparkProcess, configure_session, start_connect_server


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
