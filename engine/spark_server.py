"""Spark JVM processes started from the pyspark wheel: a Spark Connect server, a standalone master and worker,
and the embedded server that the ``local`` remote means (one Connect server beside this process, bound to
loopback). Tests and the embedded service use the same code, so what they run is a real server.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import ctypes
import logging
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import SparkUnavailableError

log = logging.getLogger(__name__)

SERVER_CONF: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.connect.grpc.binding.address": "127.0.0.1",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.adaptive.enabled": "true",
    # Each session that names a scheduler pool (a merge worker's) gets its share of the cores between tasks, so
    # one large merge does not queue every other session's small merges behind all of its tasks.
    "spark.scheduler.mode": "FAIR",
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

    def __post_init__(self) -> None:
        # Reap the JVM the moment it exits, whoever killed it: no <defunct> entry waits for the next poll().
        threading.Thread(target=self._reap, name=f"reap-{self.name}-{self.port}", daemon=True).start()

    def _reap(self) -> None:
        code = self.process.wait()
        if not self._stopped:
            log.warning("%s (pid %s) exited with code %s", self.name, self.process.pid, code)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM to the JVM's process group, SIGKILL after ``timeout``."""
        if self._stopped:
            return
        self._stopped = True
        if self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


# The Spark JVM's environment is this allowlist, never the service's whole environment: the service's own
# settings (MERGE_SERVICE_API_TOKENS, MERGE_SERVICE_DATABASE_URL...) hold secrets that a query reading the JVM's
# environment could reveal.
SPARK_ENV_NAMES = frozenset(
    {"PATH", "JAVA_HOME", "JAVA_OPTS", "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "HOME", "USER", "LOGNAME", "LANG"}
    | {"LANGUAGE", "TMPDIR", "TZ", "LD_LIBRARY_PATH", "HOSTNAME", "YARN_CONF_DIR", "HIVE_CONF_DIR"}
)
SPARK_ENV_PREFIXES = ("LC_", "SPARK_", "HADOOP_", "PYSPARK_")


def spark_environment(base: Mapping[str, str] | None = None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a Spark process: the allowlisted names of ``base`` (this process's environment by
    default), plus ``extra``. Nothing named ``MERGE_SERVICE_*`` passes, whatever ``extra`` says."""
    source = os.environ if base is None else base
    env = {
        name: value for name, value in source.items() if name in SPARK_ENV_NAMES or name.startswith(SPARK_ENV_PREFIXES)
    }
    env.update(extra or {})
    return {name: value for name, value in env.items() if not name.startswith("MERGE_SERVICE_")}


PR_SET_PDEATHSIG = 1


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child receive SIGKILL when the thread that started it ends (Linux's
    ``prctl(PR_SET_PDEATHSIG)``). The setting survives ``exec``, and ``spark-submit`` and ``spark-class`` both
    ``exec``: the JVM itself carries it. Resolved here, in the parent: the child between fork and exec only
    calls a function pointer."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the line above: nobody will send the signal
            os._exit(1)

    return preexec


class _Spawner:
    """Starts every Spark process from one thread that lives as long as this process. The parent-death signal
    follows the thread that forked the child, not the process: a JVM started from a worker's or a probe's
    thread would be killed when that thread ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue[tuple[Callable[[], subprocess.Popen[bytes]], concurrent.futures.Future[Any]]]
        self._requests = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def popen(self, start: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="spark-spawner", daemon=True)
                self._thread.start()
        done: concurrent.futures.Future[subprocess.Popen[bytes]] = concurrent.futures.Future()
        self._requests.put((start, done))
        return done.result()

    def _serve(self) -> None:
        while True:
            start, done = self._requests.get()
            try:
                done.set_result(start())
            except BaseException as exc:
                done.set_exception(exc)


_spawner = _Spawner()


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
    full_env = spark_environment(
        extra={
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_NO_DAEMONIZE": "1",
            "SPARK_LOG_DIR": str(log_dir),
            "SPARK_PID_DIR": str(log_dir),
            "SPARK_CONNECT_MODE": "0",
            **(env or {}),
        }
    )

    def start() -> subprocess.Popen[bytes]:
        with open(log_path, "wb") as out:
            return subprocess.Popen(
                args,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=full_env,
                start_new_session=True,
                preexec_fn=_die_with_parent(),
            )

    proc = _spawner.popen(start)
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
    """Start the embedded local Connect server (once per process, and again if it died) and answer its URL."""
    global _embedded
    with _embedded_lock:
        if _embedded is None or _embedded.process.poll() is not None:
            if _embedded is not None:
                log.warning(
                    "the embedded Spark Connect server exited (code %s); starting a new one",
                    _embedded.process.returncode,
                )
            _embedded = start_connect_server()
        return f"sc://127.0.0.1:{_embedded.port}"


def embedded_server() -> SparkProcess | None:
    """The embedded Connect server this process started, if any."""
    return _embedded


def stop_embedded(timeout: float = 10.0) -> None:
    """Stop the embedded Connect server now (SIGTERM, then SIGKILL after ``timeout``) rather than at exit."""
    server = _embedded
    if server is not None:
        server.stop(timeout)
