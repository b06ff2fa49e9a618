"""Spark failures against real processes: `merge-service serve` as its own process, a real Spark Connect JVM
killed with SIGKILL, Delta tables on disk checked with deltalake.

With the JVM dead, /healthz answers within 1 s and /readyz answers 503 within 5 s, under 60 concurrent /readyz
too, and the /merges endpoints keep answering; once Spark is back the next merge succeeds without restarting
the service; SIGTERM stops the service within its lease; the Spark JVM never sees the service's secrets, is
reaped when it dies and dies with the service."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from engine.spark_server import SparkProcess, free_port, start_connect_server

BIN = Path(sys.executable).parent
TOKEN = "s3cret-token-for-the-fault-tests"
LEASE_SECONDS = 30.0  # the default
START_TIMEOUT = 180.0

pytestmark = pytest.mark.timeout(600)


class Service:
    """One `merge-service serve` process on a loopback port, with its log."""

    def __init__(self, home: Path, spark_remote: str, extra_env: dict[str, str] | None = None) -> None:
        self.home = home
        self.lake = home / "lake"
        self.lake.mkdir()
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "MERGE_SERVICE_DATABASE_URL": f"sqlite:///{home / 'jobs.db'}",
            "MERGE_SERVICE_SPARK_REMOTE": spark_remote,
            "MERGE_SERVICE_LAKE_ROOTS": str(self.lake),
            "MERGE_SERVICE_API_TOKENS": TOKEN,
            "MERGE_SERVICE_WORKERS": "1",
            "MERGE_SERVICE_LEASE_SECONDS": str(LEASE_SECONDS),
            "MERGE_SERVICE_HEARTBEAT_SECONDS": "1",
            "MERGE_SERVICE_MAX_ATTEMPTS": "50",
            "MERGE_SERVICE_BACKOFF_BASE_SECONDS": "0.5",
            "MERGE_SERVICE_BACKOFF_MAX_SECONDS": "2",
            "MERGE_SERVICE_ACCESS_LOG": "false",
            **(extra_env or {}),
        }
        self.log = open(home / "serve.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [str(BIN / "merge-service"), "serve", "--host", "127.0.0.1", "--port", str(self.port)],
            env=self.env,
            cwd=home,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.headers = {"Authorization": f"Bearer {TOKEN}"}

    def log_tail(self) -> str:
        return (self.home / "serve.log").read_text(errors="replace")[-6000:]

    def wait(self, predicate: Callable[[], bool], what: str, timeout: float = START_TIMEOUT) -> float:
        """Seconds until ``predicate`` holds; fails with the service's log if it does not within ``timeout``."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            assert self.proc.poll() is None, f"the service exited:\n{self.log_tail()}"
            try:
                if predicate():
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"{what} not within {timeout}s:\n{self.log_tail()}")

    def ready(self) -> bool:
        return httpx.get(f"{self.base}/readyz", timeout=5).status_code == 200

    def not_ready(self) -> bool:
        return httpx.get(f"{self.base}/readyz", timeout=5).status_code == 503

    def submit(self, body: dict[str, Any]) -> str:
        response = httpx.post(f"{self.base}/merges", json=body, headers=self.headers, timeout=10)
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        response = httpx.get(f"{self.base}/merges/{job_id}", headers=self.headers, timeout=5)
        assert response.status_code == 200, response.text
        return dict(response.json())

    def finished(self, job_id: str, timeout: float = START_TIMEOUT) -> dict[str, Any]:
        self.wait(lambda: self.job(job_id)["status"] in ("succeeded", "failed", "cancelled"), f"job {job_id}", timeout)
        return self.job(job_id)

    def jvm(self) -> psutil.Process:
        """The Spark JVM this service started (the embedded server)."""
        found: list[psutil.Process] = []

        def look() -> bool:
            found[:] = [p for p in psutil.Process(self.proc.pid).children(recursive=True) if p.name() == "java"]
            return len(found) == 1 and found[0].status() != psutil.STATUS_ZOMBIE

        self.wait(look, "one live Spark JVM under the service")
        return found[0]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Callable[..., Service]]:
    started: list[Service] = []

    def start(spark_remote: str, extra_env: dict[str, str] | None = None) -> Service:
        home = tmp_path / f"service-{len(started)}"
        home.mkdir()
        started.append(Service(home, spark_remote, extra_env))
        return started[-1]

    yield start
    for service in started:
        service.stop()


@pytest.fixture
def spark_servers(tmp_path: Path) -> Iterator[Callable[[int], SparkProcess]]:
    """Connect servers of this test's own (the session's shared one must not be killed)."""
    started: list[SparkProcess] = []

    def start(port: int) -> SparkProcess:
        started.append(start_connect_server(port=port, log_dir=tmp_path / "spark-logs"))
        return started[-1]

    yield start
    for server in started:
        server.stop(5)


def customers(lake: Path) -> Path:
    table = lake / "customers"
    write_deltalake(str(table), pa.table({"id": pa.array([1, 2], pa.int64()), "name": ["Ann", "Bob"]}))
    return table


def upsert(table: Path, key: int, name: str) -> dict[str, Any]:
    return {
        "target": str(table),
        "source": {"rows": [{"id": key, "name": name}], "schema": "id BIGINT, name STRING"},
        "target_alias": "t",
        "source_alias": "s",
        "on": "t.id = s.id",
        "when_matched": [{"action": "update_all"}],
        "when_not_matched": [{"action": "insert_all"}],
    }


def kill_jvm(process: psutil.Process) -> None:
    assert process.name() == "java", process
    process.send_signal(signal.SIGKILL)


def timed(call: Callable[[], httpx.Response]) -> tuple[int, float]:
    started = time.monotonic()
    try:
        status = call().status_code
    except httpx.HTTPError as exc:
        status = -1
        print(f"request failed: {exc!r}")
    return status, time.monotonic() - started


def assert_answers_while_spark_is_dead(service: Service, table: Path) -> str:
    """60 concurrent /readyz, with /healthz, GET and POST /merges and /metrics beside them; answers the id of
    the merge submitted meanwhile. One client with a connection for each caller, made beforehand, so the times
    are the service's and not the test's own set-up of 70 clients."""
    base, headers = service.base, service.headers
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    with httpx.Client(limits=limits, timeout=15) as client, ThreadPoolExecutor(max_workers=72) as pool:
        readyz = [pool.submit(timed, lambda: client.get(f"{base}/readyz")) for _ in range(60)]
        time.sleep(0.2)  # the /readyz callers are in flight
        healthz = [pool.submit(timed, lambda: client.get(f"{base}/healthz")) for _ in range(5)]
        others = [
            pool.submit(timed, lambda: client.get(f"{base}/merges", headers=headers)),
            pool.submit(timed, lambda: client.get(f"{base}/metrics")),
        ]
        posted = pool.submit(service.submit, upsert(table, 3, "Cid"))
        ready_answers = [f.result() for f in readyz]
        health_answers = [f.result() for f in healthz]
        other_answers = [f.result() for f in others]
        job_id = posted.result(timeout=15)
    assert all(status == 503 and took < 5 for status, took in ready_answers), ready_answers
    assert all(status == 200 and took < 1 for status, took in health_answers), health_answers
    assert all(status == 200 and took < 5 for status, took in other_answers), other_answers
    return job_id


def test_a_dead_connect_server_fails_fast_and_the_next_merge_succeeds_once_it_is_back(
    services: Callable[[str], Service], spark_servers: Callable[[int], SparkProcess]
) -> None:
    port = free_port()
    spark = spark_servers(port)
    service = services(f"sc://127.0.0.1:{port}")
    table = customers(service.lake)
    service.wait(service.ready, "/readyz 200")
    assert service.finished(service.submit(upsert(table, 2, "Bea")))["status"] == "succeeded"

    kill_jvm(psutil.Process(spark.process.pid))
    assert service.wait(service.not_ready, "/readyz 503 after the JVM died", timeout=5) < 5
    during = assert_answers_while_spark_is_dead(service, table)
    assert service.job(during)["status"] in ("queued", "running")

    spark = spark_servers(port)  # Spark comes back at the same address; the service is not restarted
    assert service.finished(during)["status"] == "succeeded", service.job(during)
    after = service.finished(service.submit(upsert(table, 4, "Dan")))
    assert after["status"] == "succeeded", after
    service.wait(service.ready, "/readyz 200 once Spark is back", timeout=30)
    rows = DeltaTable(str(table)).to_pyarrow_table().sort_by("id").to_pydict()
    assert rows == {"id": [1, 2, 3, 4], "name": ["Ann", "Bea", "Cid", "Dan"]}
    assert DeltaTable(str(table)).version() == 3

    # SIGTERM while Spark is dead again, with a merge on its way and /readyz callers waiting.
    kill_jvm(psutil.Process(spark.process.pid))
    service.wait(service.not_ready, "/readyz 503 after the JVM died again", timeout=5)
    pending = service.submit(upsert(table, 5, "Eve"))
    with ThreadPoolExecutor(max_workers=30) as pool:
        for _ in range(30):
            pool.submit(timed, lambda: httpx.get(f"{service.base}/readyz", timeout=15))
        time.sleep(1.0)
        stopping = time.monotonic()
        service.proc.send_signal(signal.SIGTERM)
        try:
            code = service.proc.wait(LEASE_SECONDS)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"SIGTERM did not stop the service within the lease:\n{service.log_tail()}") from None
    assert time.monotonic() - stopping < LEASE_SECONDS
    assert code == 0, service.log_tail()
    assert DeltaTable(str(table)).version() == 3, "the merge pending at the stop did not commit"
    assert pending


def test_a_stalled_connect_server_costs_the_attempt_not_the_job(
    services: Callable[..., Service], spark_servers: Callable[[int], SparkProcess]
) -> None:
    """A server that accepts connections but never answers (its JVM stopped: a long GC pause, a frozen host) would
    hold the worker's call for as long as it stays stopped: gRPC calls have no deadline. The worker gives the
    attempt up after MERGE_SERVICE_SPARK_STALL_SECONDS without an answer and retries it later."""
    port = free_port()
    spark = spark_servers(port)
    service = services(f"sc://127.0.0.1:{port}", {"MERGE_SERVICE_SPARK_STALL_SECONDS": "8"})
    table = customers(service.lake)
    service.wait(service.ready, "/readyz 200")
    assert service.finished(service.submit(upsert(table, 2, "Bea")))["status"] == "succeeded"

    jvm = psutil.Process(spark.process.pid)
    jvm.suspend()
    try:
        stalled = service.submit(upsert(table, 3, "Cid"))

        def given_up() -> bool:
            job = service.job(stalled)
            return job["status"] == "queued" and "not answer" in str(job["error"])

        service.wait(given_up, "the stalled attempt given up", timeout=60)
        assert service.not_ready()
    finally:
        jvm.resume()
    done = service.finished(stalled)
    assert done["status"] == "succeeded", done
    assert done["attempts"] >= 2
    rows = DeltaTable(str(table)).to_pyarrow_table().sort_by("id").to_pydict()
    assert rows == {"id": [1, 2, 3], "name": ["Ann", "Bea", "Cid"]}
    assert DeltaTable(str(table)).version() == 2


def gone(process: psutil.Process) -> bool:
    """Not running: exited and reaped, or (its parent dead too) a zombie left to init."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE and process.ppid() != os.getpid()
    except psutil.NoSuchProcess:
        return True


def test_the_embedded_server_keeps_secrets_out_restarts_when_killed_and_dies_with_the_service(
    services: Callable[[str], Service],
) -> None:
    service = services("local")
    table = customers(service.lake)
    service.wait(service.ready, "/readyz 200 with the embedded server")
    jvm = service.jvm()
    environment = jvm.environ()
    assert not [name for name in environment if name.startswith("MERGE_SERVICE_")], sorted(environment)
    assert not [name for name, value in environment.items() if TOKEN in value or "jobs.db" in value]
    assert service.finished(service.submit(upsert(table, 2, "Bea")))["status"] == "succeeded"

    kill_jvm(jvm)
    assert service.wait(service.not_ready, "/readyz 503 after the JVM died", timeout=5) < 5
    took = service.wait(lambda: httpx.get(f"{service.base}/healthz", timeout=1).status_code == 200, "/healthz", 1)
    assert took < 1
    # Reaped at once: no <defunct> child of the service waits for someone to poll it.
    service.wait(lambda: not psutil.pid_exists(jvm.pid), "the killed JVM reaped", timeout=3)

    service.wait(service.ready, "/readyz 200 once the embedded server is started again")
    restarted = service.jvm()
    assert restarted.pid != jvm.pid
    assert service.finished(service.submit(upsert(table, 3, "Cid")))["status"] == "succeeded"
    assert DeltaTable(str(table)).to_pyarrow_table().sort_by("id").to_pydict() == {
        "id": [1, 2, 3],
        "name": ["Ann", "Bea", "Cid"],
    }

    # The restarted JVM was started from a thread of the running service, not at start-up: it dies with the
    # service all the same.
    service.proc.send_signal(signal.SIGKILL)
    service.proc.wait()
    deadline = time.monotonic() + 5
    while not gone(restarted) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(restarted), f"the Spark JVM {restarted.pid} outlived the service: {restarted.status()}"
