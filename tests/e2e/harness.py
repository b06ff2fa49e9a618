"""What the real-engine process tests share: a lake and job database per test, worker processes of
``tests.service.proc_worker`` (``RUNNER=engine``) against the session's Spark Connect server, and checks of
a Delta table's log read straight from its commit files and through ``deltalake``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from deltalake import DeltaTable
from fastapi.testclient import TestClient

from engine.spark_server import free_port
from service.app import create_app
from service.jobs import JobRecord, Status
from service.manager import JobManager
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
APP_ID = "merge-service-e2e-tests"
START_TIMEOUT = 120.0  # a worker imports pyspark and opens a Spark Connect session on a busy machine


def wait_for(
    predicate: Callable[[], bool],
    what: str,
    timeout: float,
    alive_all: Sequence[subprocess.Popen[bytes]] = (),
    logs: Sequence[Path] = (),
) -> None:
    """Poll ``predicate``; fail early, with the processes' logs, if one of ``alive_all`` exits meanwhile."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if any(p.poll() is not None for p in alive_all):
            codes = [p.returncode for p in alive_all]
            raise AssertionError(f"{what}: a process exited ({codes})\n{tails(logs)}")
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout:.0f} s\n{tails(logs)}")


def tails(logs: Sequence[Path]) -> str:
    return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}" for log in logs if log.exists())


def answers(url: str, path: str = "/readyz", timeout: float = 2.0) -> bool:
    """Whether the service at ``url`` answers ``path`` with 200 now; a refused or timed-out request is a no."""
    try:
        return httpx.get(f"{url}{path}", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


def wait_ready(
    url: str,
    proc: subprocess.Popen[bytes] | None,
    log: Path,
    *,
    what: str,
    timeout: float,
    path: str = "/readyz",
    interval: float = 0.2,
    request_timeout: float = 2.0,
) -> None:
    """Poll until the service at ``url`` answers ``path``; a RuntimeError with the tail of ``log`` if ``proc``
    exits first or the time runs out (the process tests, the API bench and the fault campaign start it alike)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}):\n{tails([log])}")
        if answers(url, path, request_timeout):
            return
        time.sleep(interval)
    raise RuntimeError(f"{what} not ready within {timeout:.0f} s:\n{tails([log])}")


def upsert_body(target: Path | str, rows: list[dict[str, Any]], schema: str) -> dict[str, Any]:
    """``POST /merges``'s body for the upsert the process tests and benches submit: inline ``rows``, matched on
    ``id``, ``UPDATE SET *`` and ``INSERT *``."""
    return {
        "target": str(target),
        "source": {"rows": rows, "schema": schema},
        "target_alias": "t",
        "source_alias": "s",
        "on": "t.id = s.id",
        "when_matched": [{"action": "update_all"}],
        "when_not_matched": [{"action": "insert_all"}],
    }


def finished_job(base: str, job_id: str, timeout: float) -> dict[str, Any]:
    """The job as ``GET /merges/{id}`` shows it once it is succeeded, failed or cancelled."""
    deadline = time.monotonic() + timeout
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        job = httpx.get(f"{base}/merges/{job_id}", timeout=5).json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not finish: {job}")


@contextmanager
def serving(
    home: Path, spark_remote: str, *, ready: str = "/readyz", timeout: float = 120.0, **env: str
) -> Iterator[dict[str, Any]]:
    """``merge-service migrate``, then ``merge-service serve`` (API and one worker) on a free port over a lake
    under ``home``, as an operator runs them; yields ``base``, ``lake`` and ``home`` once it answers ``ready``,
    and stops it afterwards (SIGTERM, SIGKILL after 30 s). ``env`` adds ``MERGE_SERVICE_*`` settings."""
    lake = home / "lake"
    lake.mkdir()
    port = free_port()
    environment = {
        **os.environ,
        "MERGE_SERVICE_DATABASE_URL": f"sqlite:///{home / 'jobs.db'}",
        "MERGE_SERVICE_SPARK_REMOTE": spark_remote,
        "MERGE_SERVICE_LAKE_ROOTS": str(lake),
        "MERGE_SERVICE_WORKERS": "1",
        # Where to listen, as settings rather than flags: `make run` starts `serve` with neither.
        "MERGE_SERVICE_HOST": "127.0.0.1",
        "MERGE_SERVICE_PORT": str(port),
        **env,
    }
    subprocess.run([str(BIN / "merge-service"), "migrate"], env=environment, check=True, cwd=home, timeout=120)
    log_path = home / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(BIN / "merge-service"), "serve"],
            env=environment,
            cwd=home,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            wait_ready(base, proc, log_path, what="merge-service serve", timeout=timeout, path=ready, interval=0.3)
            yield {"base": base, "lake": lake, "home": home}
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@dataclass
class Home:
    """One test's lake, job database (a SQLite file unless ``database`` names another) and the processes it
    started."""

    dir: Path
    spark_remote: str
    database: str | None = None
    lease_seconds: float = 2.0
    max_attempts: int = 3
    procs: list[tuple[subprocess.Popen[bytes], Any]] = field(default_factory=list)

    @property
    def lake(self) -> Path:
        return self.dir / "lake"

    @property
    def markers(self) -> Path:
        return self.dir / "markers"

    @property
    def database_url(self) -> str:
        return self.database or f"sqlite:///{self.dir / 'jobs.db'}"

    def env(self, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "MERGE_SERVICE_DATABASE_URL": self.database_url,
            "MERGE_SERVICE_SPARK_REMOTE": self.spark_remote,
            "MERGE_SERVICE_LAKE_ROOTS": str(self.lake),
            "MERGE_SERVICE_APP_ID": APP_ID,
            "MERGE_SERVICE_LEASE_SECONDS": str(self.lease_seconds),
            "MERGE_SERVICE_HEARTBEAT_SECONDS": "0.3",
            "MERGE_SERVICE_POLL_INTERVAL_SECONDS": "0.05",
            "MERGE_SERVICE_BACKOFF_BASE_SECONDS": "0.1",
            "MERGE_SERVICE_BACKOFF_MAX_SECONDS": "0.5",
            "MERGE_SERVICE_MAX_ATTEMPTS": str(self.max_attempts),
            **extra,
        }

    def spawn(self, args: list[str], log_name: str, **env: str) -> tuple[subprocess.Popen[bytes], Path]:
        log_path = self.dir / f"{log_name}.log"
        log = open(log_path, "ab")  # noqa: SIM115 - closed at teardown
        proc = subprocess.Popen(args, cwd=ROOT, env=self.env(**env), stdout=log, stderr=subprocess.STDOUT)
        self.procs.append((proc, log))
        return proc, log_path

    def worker(self, name: str, crash_at: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], Path]:
        return self.spawn(
            [sys.executable, "-m", "tests.service.proc_worker"],
            name,
            RUNNER="engine",
            LEDGER_DIR=str(self.markers),
            CRASH_AT=json.dumps(crash_at or {}),
            STOP_TIMEOUT="20",
        )

    def close(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, log in self.procs:
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()


def open_home(directory: Path, spark_remote: str, **options: Any) -> Home:
    h = Home(directory, spark_remote, **options)
    h.lake.mkdir()
    h.markers.mkdir()
    return h


def job_store(home: Home) -> JobManager:
    manager = JobManager.from_url(home.database_url, lease_seconds=home.lease_seconds)
    manager.migrate()
    return manager


def api_client(home: Home, jobs: JobManager) -> TestClient:
    """The API in this process over ``home``'s job store: it submits the jobs that the worker processes take."""
    settings = Settings(
        database_url=home.database_url,
        lake_roots=[str(home.lake)],
        app_id=APP_ID,
        lease_seconds=home.lease_seconds,
        heartbeat_seconds=0.3,
    )
    return TestClient(create_app(settings, manager=jobs), raise_server_exceptions=False)


def log_entry(path: Path, version: int) -> list[dict[str, Any]]:
    text = (path / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def txn_of(path: Path, version: int) -> tuple[str, int] | None:
    found = [a["txn"] for a in log_entry(path, version) if "txn" in a]
    assert len(found) <= 1, found
    return (found[0]["appId"], found[0]["version"]) if found else None


def assert_merged_once(path: Path, jobs_in_order: list[JobRecord]) -> None:
    """Version 0 is the table's creation; then one MERGE commit per job, in job order, each carrying the job's
    txn, and nothing else."""
    dt = DeltaTable(str(path))
    assert dt.version() == len(jobs_in_order), "one new table version per job, no second one"
    history = sorted(dt.history(), key=lambda c: c["version"])
    assert [c["version"] for c in history] == list(range(len(jobs_in_order) + 1))
    assert [c["operation"] for c in history[1:]] == ["MERGE"] * len(jobs_in_order)
    for version, job in enumerate(jobs_in_order, start=1):
        assert job.status is Status.SUCCEEDED, job
        assert job.table_version == version, job
        assert txn_of(path, version) == (APP_ID, job.seq)
    assert dt.transaction_version(APP_ID) == jobs_in_order[-1].seq
