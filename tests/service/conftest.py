"""Fixtures of the service tests: the job store on SQLite and on a real PostgreSQL server (Debian's package,
installed and started here when missing), a controllable clock, and an app with its store."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from service.app import create_app
from service.manager import JobManager
from service.settings import Settings
from tests.debian import install_when_missing
from tests.service.callback_receiver import Receiver

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@dataclass
class FakeClock:
    now: datetime

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """A throwaway cluster: initdb into a temp dir, started on a free loopback port (as ``postgres`` when we
    are root, since the server refuses to run as root)."""

    def __init__(self) -> None:
        install_when_missing(["postgresql"], present=lambda: _pg_bin() is not None)
        bindir = _pg_bin()
        if bindir is None:
            raise RuntimeError("initdb not found after installing postgresql")
        self.bindir = bindir
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="merge-service-pg-"))
        self.data = self.dir / "data"
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self.options = options  # the fault campaign starts the server again after killing it
        self._run(
            "pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.dir / "server.log"), "-w", "-t", "60", "start"
        )
        self.admin_url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        result = subprocess.run([*self.as_user, str(self.bindir / tool), *args], capture_output=True, text=True)
        if result.returncode != 0:
            log = self.dir / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{tool} failed: {result.stdout}\n{result.stderr}\n{tail}")

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True) as conn:
            conn.execute(sql)

    def create_database(self) -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        self._admin(f'CREATE DATABASE "{name}"')
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"

    def drop_database(self, url: str) -> None:
        name = url.rsplit("/", 1)[1]
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    try:
        server = PostgresServer()
    except Exception as exc:
        if IN_CI:
            pytest.fail(f"PostgreSQL is required in CI and could not be started: {exc}")
        pytest.skip(f"PostgreSQL unavailable: {exc}")
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'jobs.db'}"
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    url = server.create_database()
    yield url
    server.drop_database(url)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime(2026, 1, 1, tzinfo=UTC))


@pytest.fixture
def store(database_url: str, clock: FakeClock) -> Iterator[JobManager]:
    """The job store on each backend, migrated, on a clock the test moves."""
    manager = JobManager.from_url(database_url, lease_seconds=30, clock=clock)
    manager.migrate()
    yield manager
    manager.dispose()


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    root = tmp_path / "lake"
    root.mkdir()
    return root


@pytest.fixture
def settings(tmp_path: Path, lake: Path) -> Settings:
    return Settings(
        database_url=f"sqlite:///{tmp_path / 'service.db'}",
        lake_roots=[str(lake)],
        lease_seconds=2.0,
        heartbeat_seconds=0.2,
        poll_interval_seconds=0.02,
        backoff_base_seconds=0.05,
        backoff_max_seconds=0.2,
        max_attempts=3,
    )


@pytest.fixture
def database_manager(database_url: str) -> Iterator[JobManager]:
    """A migrated job store on ``database_url``: SQLite, and PostgreSQL where a test runs on both."""
    store = JobManager.from_url(database_url)
    store.migrate()
    yield store
    store.dispose()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A real HTTP server on loopback that records the callbacks it receives."""
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def manager(settings: Settings) -> Iterator[JobManager]:
    """The job store of ``settings``, migrated, on the real clock (the worker and API tests' store)."""
    store = JobManager.from_url(settings.database_url, lease_seconds=settings.lease_seconds)
    store.migrate()
    yield store
    store.dispose()


@pytest.fixture
def app(settings: Settings, manager: JobManager) -> FastAPI:
    """The API on ``settings`` and its job store, as ``merge-service api`` builds it."""
    return create_app(settings, manager=manager)


@pytest.fixture
def client(app: FastAPI) -> TestClient:
    """Answers what the server would: an exception becomes the 500 problem, not a test error."""
    return TestClient(app, raise_server_exceptions=False)


@pytest.fixture
def target(lake: Path) -> str:
    """An empty directory under the lake: a table a merge may name before it has a Delta log."""
    path = lake / "orders"
    path.mkdir()
    return str(path)


def wait_until(predicate: object, timeout: float = 10.0, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(interval)
    raise AssertionError("condition not met in time")
