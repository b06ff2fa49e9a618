"""Spark Connect failures that need no server: a dead address fails a call in seconds with a readable reason,
and the Spark JVM's environment holds none of the service's settings."""

from __future__ import annotations

import time

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from engine.command import translate_spark_error
from engine.errors import SparkUnavailableError, grpc_status, spark_error_message
from engine.spark import ConnectRetry, connect
from engine.spark_server import free_port, spark_environment


def dead_address() -> str:
    """A loopback port nothing listens on: every call meets a refused connection, as after the JVM died."""
    return f"sc://127.0.0.1:{free_port()}"


@pytest.mark.timeout(60)
def test_connect_to_a_dead_server_fails_within_seconds_and_says_why() -> None:
    started = time.monotonic()
    with pytest.raises(SparkUnavailableError) as caught:
        connect(dead_address(), retry=ConnectRetry(max_retries=3, max_backoff=0.4))
    assert time.monotonic() - started < 10
    message = str(caught.value)
    assert "UNAVAILABLE: failed to connect" in message and "Connection refused" in message
    assert "Rendezvous" not in message and "\n" not in message


@pytest.mark.timeout(60)
def test_a_transport_error_becomes_a_job_error_with_the_grpc_status_and_details() -> None:
    spark = SparkSession.builder.remote(dead_address()).create()
    spark.client.set_retry_policies([ConnectRetry(max_retries=1, max_backoff=0.1).policy()])
    try:
        with pytest.raises(PySparkException) as caught:
            spark.sql("SELECT 1").collect()
    finally:
        spark.client.close()
    raw = caught.value
    assert str(raw).startswith("<_MultiThreadedRendezvous of RPC that terminated with:")
    assert grpc_status(raw) is not None and grpc_status(raw)[0] == "UNAVAILABLE"  # type: ignore[index]
    error = translate_spark_error(raw)
    assert isinstance(error, SparkUnavailableError) and error.retryable
    assert str(error).startswith("Spark Connect failed: UNAVAILABLE: failed to connect to all addresses")
    assert "Rendezvous" not in str(error)


def test_grpc_text_without_the_error_object_is_read_too() -> None:
    text = (
        "<_InactiveRpcError of RPC that terminated with:\n"
        "\tstatus = StatusCode.DEADLINE_EXCEEDED\n"
        '\tdetails = "Deadline Exceeded"\n'
        '\tdebug_error_string = "UNKNOWN:Error received from peer"\n>'
    )
    assert spark_error_message(RuntimeError(text)) == "DEADLINE_EXCEEDED: Deadline Exceeded"
    assert spark_error_message(RuntimeError("[DIVIDE_BY_ZERO] Division by zero.\nmore")) == (
        "[DIVIDE_BY_ZERO] Division by zero."
    )
    assert spark_error_message(RuntimeError("")) == "RuntimeError"


def test_the_spark_environment_is_an_allowlist() -> None:
    allowed = {
        "PATH": "/usr/bin",
        "JAVA_HOME": "/usr/lib/jvm/java-17",
        "HOME": "/home/merge",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TZ": "UTC",
        "SPARK_CONF_DIR": "/opt/conf",
        "HADOOP_CONF_DIR": "/opt/hadoop",
        "PYSPARK_PYTHON": "python3",
    }
    service_env = {
        **allowed,
        "MERGE_SERVICE_API_TOKENS": "s3cret-token",
        "MERGE_SERVICE_DATABASE_URL": "postgresql://merge:pa55word@db/merge",
        "AWS_SECRET_ACCESS_KEY": "k3y",
        "PGPASSWORD": "pa55word",
        "DATABASE_URL": "postgresql://merge:pa55word@db/merge",
    }
    env = spark_environment(service_env, {"SPARK_LOCAL_IP": "127.0.0.1", "MERGE_SERVICE_APP_ID": "x"})
    assert env == {**allowed, "SPARK_LOCAL_IP": "127.0.0.1"}
