"""A job database that stops answering, against real processes: a PostgreSQL server of its own stopped with
SIGSTOP (postmaster and backends: what a stalled host or a dropped network does to a connection that is open)
under `merge-service api` as its own process.

Meanwhile /healthz answers within 1 s and each of 60 concurrent /readyz answers 503 within 5 s (its deadline is
2 s), naming the database; once the server runs again /readyz answers 200 without a restart."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest

from engine.spark_server import free_port
from tests.e2e.harness import wait_ready
from tests.service.conftest import PostgresServer

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(300)]


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        yield server
    finally:
        _signal_all(server, signal.SIGCONT)
        server.stop()


def _server_processes(server: PostgresServer) -> list[psutil.Process]:
    pid = int((server.data / "postmaster.pid").read_text().split()[0])
    postmaster = psutil.Process(pid)
    return [postmaster, *postmaster.children(recursive=True)]


def _signal_all(server: PostgresServer, sig: signal.Signals) -> None:
    for proc in _server_processes(server):
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(sig)


def _start_api(env: dict[str, str], home: Path) -> tuple[subprocess.Popen[bytes], str]:
    subprocess.run([sys.executable, "-m", "service.cli", "migrate"], env=env, check=True, timeout=120)
    port = free_port()
    log = open(home / "api.log", "wb")  # noqa: SIM115 - the process keeps it
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "api", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc, home / "api.log", what="the API", timeout=90, request_timeout=5)
    except RuntimeError:
        proc.kill()
        raise
    return proc, base


def _timed_get(client: httpx.Client, url: str) -> tuple[int, float, dict[str, object]]:
    """Clients are built before the clock starts: each one built loads a TLS context, and sixty of them built at
    once in this process would time the test's own CPU, not the API."""
    started = time.monotonic()
    response = client.get(url, timeout=30)
    return response.status_code, time.monotonic() - started, response.json()


def test_a_stalled_database_never_stalls_health_or_readiness(own_postgres: PostgresServer, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    lake.mkdir()
    env = {
        **os.environ,
        "MERGE_SERVICE_DATABASE_URL": own_postgres.create_database(),
        "MERGE_SERVICE_LAKE_ROOTS": str(lake),
        "MERGE_SERVICE_API_TOKENS": "a-token-for-the-database-fault-test",
        "MERGE_SERVICE_ACCESS_LOG": "false",
    }
    proc, base = _start_api(env, tmp_path)
    try:
        ready_client = httpx.Client(limits=httpx.Limits(max_connections=64, max_keepalive_connections=64))
        health_client = httpx.Client()
        _signal_all(own_postgres, signal.SIGSTOP)
        with ready_client, health_client, ThreadPoolExecutor(max_workers=64) as pool:
            readyz = [pool.submit(_timed_get, ready_client, f"{base}/readyz") for _ in range(60)]
            time.sleep(0.5)  # the /readyz callers are in flight
            health = [_timed_get(health_client, f"{base}/healthz") for _ in range(5)]
            ready_answers = [f.result() for f in readyz]
        assert all(status == 200 and seconds < 1.0 for status, seconds, _ in health), health
        slowest = max(seconds for _, seconds, _ in ready_answers)
        assert all(status == 503 for status, _, _ in ready_answers), ready_answers[:3]
        times = sorted(round(s, 2) for _, s, _ in ready_answers)
        assert slowest < 5.0, f"the slowest /readyz took {slowest:.1f} s: {times}"
        body = ready_answers[0][2]
        assert body["status"] == "unavailable"
        assert "did not answer" in str(body["checks"]["database"]), body

        _signal_all(own_postgres, signal.SIGCONT)
        deadline = time.monotonic() + 30
        with httpx.Client() as client:
            while _timed_get(client, f"{base}/readyz")[0] != 200:
                assert time.monotonic() < deadline, "/readyz did not answer 200 after the database came back"
                time.sleep(0.2)
    finally:
        _signal_all(own_postgres, signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
