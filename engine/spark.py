"""Spark Connect sessions, and Spark Connect server processes started from the pyspark wheel.

``local`` (the embedded default) means: start one Connect server process beside this one, bound to loopback,
and connect to it. Tests and the embedded service use the same code, so what they run is a real server.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import Column, SparkSession
from pyspark.sql.connect import plan as connect_plan
from pyspark.sql.connect.dataframe import DataFrame as ConnectDataFrame
from pyspark.sql.connect.observation import Observation as ConnectObservation

from engine.errors import SparkUnavailableError

SESSION_CONF: Mapping[str, str] = {
    # Delta's statistics need min/max on timestamps; INT96 carries none.
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.session.timeZone": "UTC",
    # Spark would replace ${env:NAME} (and ${system:...}) in SQL text with the server's environment.
    "spark.sql.variable.substitute": "false",
    # Planning a scan of explicit file paths lists them in parallel above this many paths: slow for 500 files.
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
    "spark.sql.ansi.enabled": "true",
    "spark.sql.storeAssignmentPolicy": "ANSI",
    "spark.sql.caseSensitive": "false",
    # writeAllChanges' full outer join cannot broadcast: a shuffled hash join spares sorting the touched files.
    "spark.sql.join.preferSortMergeJoin": "false",
    # Sources up to this size are broadcast to the target scan instead of shuffling the target.
    "spark.sql.autoBroadcastJoinThreshold": str(64 * 1024 * 1024),
    # An adaptive plan that finds a stage empty replaces it, and any DataFrame.observe inside it stops reporting:
    # the merge's metrics come from observations.
    "spark.sql.adaptive.optimizer.excludedRules": "org.apache.spark.sql.execution.adaptive.AQEPropagateEmptyRelation",
}

SERVER_CONF: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.connect.grpc.binding.address": "127.0.0.1",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.adaptive.enabled": "true",
    "spark.driver.memory": "2g",
    "spark.sql.warehouse.dir": os.path.join(tempfile.gettempdir(), "merge-service-warehouse"),
}


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def require_java() -> str:
    java = shutil.which("java")
    if java is None:
        raise SparkUnavailableError(
            "Spark needs Java 17 or newer on PATH; none was found (install a JDK, e.g. openjdk-17-jre-headless)."
        )
    return java


@dataclass
class SparkProcess:
    """A Spark JVM (Connect server, standalone master or worker) this process started and will stop."""

    process: subprocess.Popen[bytes]
    log_path: Path
    port: int
    name: str
    _stopped: bool = field(default=False, repr=False)

    def stop(self, timeout: float = 20.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _spawn(
    args: list[str],
    *,
    name: str,
    port: int,
    log_dir: Path,
    env: Mapping[str, str] | None = None,
    ready_timeout: float = 120.0,
) -> SparkProcess:
    require_java()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}-{port}.log"
    full_env = dict(os.environ)
    full_env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_NO_DAEMONIZE="1",
        SPARK_LOG_DIR=str(log_dir),
        SPARK_PID_DIR=str(log_dir),
        SPARK_CONNECT_MODE="0",
    )
    if env:
        full_env.update(env)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=full_env, start_new_session=True)
    server = SparkProcess(proc, log_path, port, name)
    atexit.register(server.stop)
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SparkUnavailableError(f"{name} exited with code {proc.returncode}:\n{server.log_tail()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return server
        except OSError:
            time.sleep(0.25)
    server.stop()
    raise SparkUnavailableError(f"{name} did not listen on port {port} within {ready_timeout:.0f}s")


def start_connect_server(
    *,
    master: str = "local[2]",
    port: int | None = None,
    conf: Mapping[str, str] | None = None,
    log_dir: Path | None = None,
) -> SparkProcess:
    """A Spark Connect server process from the pyspark wheel; ``sc://127.0.0.1:<port>`` reaches it."""
    port = port or free_port()
    settings = {**SERVER_CONF, "spark.connect.grpc.binding.port": str(port), **(conf or {})}
    args = [
        str(spark_home() / "bin" / "spark-submit"),
        "--class",
        "org.apache.spark.sql.connect.service.SparkConnectServer",
        "--name",
        "merge-service Spark Connect",
        "--master",
        master,
    ]
    for key, value in settings.items():
        args += ["--conf", f"{key}={value}"]
    args.append("spark-internal")
    return _spawn(
        args, name="spark-connect", port=port, log_dir=log_dir or Path(tempfile.gettempdir()) / "merge-service-spark"
    )


def start_standalone_cluster(
    *, cores: int = 2, memory: str = "4g", log_dir: Path | None = None
) -> tuple[SparkProcess, SparkProcess]:
    """A real standalone master and one worker; tasks then run in a separate executor JVM, whose logs land in
    ``<log_dir>/work/app-*``."""
    log_dir = log_dir or Path(tempfile.gettempdir()) / "merge-service-spark"
    spark_class = str(spark_home() / "bin" / "spark-class")
    master_port = free_port()
    master = _spawn(
        [
            spark_class,
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(master_port),
            "--webui-port",
            str(free_port()),
        ],
        name="spark-master",
        port=master_port,
        log_dir=log_dir,
    )
    worker_port = free_port()
    worker = _spawn(
        [
            spark_class,
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            "127.0.0.1",
            "--port",
            str(worker_port),
            "--webui-port",
            str(free_port()),
            "--cores",
            str(cores),
            "--memory",
            memory,
            f"spark://127.0.0.1:{master_port}",
        ],
        name="spark-worker",
        port=worker_port,
        log_dir=log_dir,
        env={"SPARK_WORKER_DIR": str(log_dir / "work")},
    )
    return master, worker


_embedded_lock = threading.Lock()
_embedded: SparkProcess | None = None


def embedded_remote() -> str:
    """Start (once per process) the embedded local Connect server and answer its URL."""
    global _embedded
    with _embedded_lock:
        if _embedded is None or _embedded.process.poll() is not None:
            _embedded = start_connect_server()
        return f"sc://127.0.0.1:{_embedded.port}"


def connect(remote: str = "local") -> SparkSession:
    """A new Spark Connect session, configured for the engine. ``local`` starts the embedded server."""
    url = embedded_remote() if remote in ("local", "") or remote.startswith("local[") else remote
    try:
        spark = SparkSession.builder.remote(url).create()
        configure_session(spark)
    except Exception as exc:
        raise SparkUnavailableError(f"Cannot reach Spark Connect at {url}: {exc}") from exc
    return spark


def configure_session(spark: SparkSession) -> None:
    for key, value in SESSION_CONF.items():
        spark.conf.set(key, value)


class Observation(ConnectObservation):
    """``DataFrame.observe``'s metrics holder, for batch DataFrames only. pyspark's asks the server whether the
    DataFrame is a stream before each use, one analysis of the whole plan per round trip (some 50 ms for a
    merge's plans); a merge's DataFrames never are, and the rest is pyspark's own code."""

    def _on(self, df: ConnectDataFrame, *exprs: Column) -> ConnectDataFrame:  # type: ignore[override]
        if self._result is not None:
            return super()._on(df, *exprs)  # pyspark's error for an observation used twice
        self._result = {}
        return ConnectDataFrame(connect_plan.CollectMetrics(df._plan, self, list(exprs)), df._session)
