"""A job database that goes away for a moment during a merge (found by the fault campaign, bench/fault_campaign.py):
the attempt goes on while its lease lasts, as its heartbeats do, instead of stopping at the next phase and leaving
the job `running` with nobody on it until the lease lapses, one attempt spent."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.errors import DatabaseUnavailableError
from service.jobs import ClaimedJob, NewJob, Status
from service.manager import JobManager
from service.settings import Settings
from service.worker import Worker
from tests.service.conftest import PostgresServer, wait_until
from tests.service.test_worker import FakeRunner


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A server of this test's own: it is stopped and started again mid-merge."""
    try:
        server = PostgresServer()
    except RuntimeError as exc:
        pytest.skip(f"PostgreSQL unavailable: {exc}")
    yield server
    server.stop()


def _start(server: PostgresServer) -> None:
    server._run(
        "pg_ctl", "-D", str(server.data), "-o", server.options, "-l", str(server.dir / "server.log"), "-w", "start"
    )


@pytest.mark.postgres
def test_a_phase_during_a_database_outage_does_not_stop_the_merge(
    own_postgres: PostgresServer, settings: Settings, tmp_path: Path
) -> None:
    url = own_postgres.create_database()
    settings = settings.model_copy(update={"database_url": url, "lease_seconds": 20.0, "heartbeat_seconds": 0.5})
    manager = JobManager.from_url(url, lease_seconds=settings.lease_seconds)
    manager.migrate()

    restarted = threading.Event()

    def behaviour(job: ClaimedJob, phase: str) -> None:
        if phase == "preparing_source":  # the next phase is recorded while the database is down
            own_postgres._run("pg_ctl", "-D", str(own_postgres.data), "-m", "fast", "-w", "stop")
        elif phase == "finding_touched_files":
            _start(own_postgres)
            restarted.set()

    runner = FakeRunner(behaviour)
    job_id = manager.submit(NewJob(target="/lake/a", target_key="/lake/a", spec={}, dry_run=False))[0].id
    worker = Worker(settings, manager=manager, runner=runner)
    worker.start()
    try:
        wait_until(restarted.is_set, timeout=15)  # the attempt went on to its next phase through the outage
        wait_until(lambda: manager.get(job_id).finished, timeout=15)
    finally:
        worker.stop()
        if not restarted.is_set():
            _start(own_postgres)
        manager.dispose()
    job = manager.get(job_id)
    assert job.status is Status.SUCCEEDED, job
    assert job.attempts == 1, "the outage cost no attempt"
    assert runner.committed == [(job_id, 1)]


def test_a_database_outage_at_the_commit_is_retried(manager: JobManager, settings: Settings) -> None:
    """The commit waits for the job database to confirm the lease; when it cannot, the merge stops before its
    commit. Once the database answers again the job is retried, not failed for good (found by the fault
    campaign: a job failed with "The job database did not answer" and its table unchanged)."""

    def behaviour(job: ClaimedJob, phase: str) -> None:
        if phase == "writing" and job.lease.attempt == 1:
            raise DatabaseUnavailableError("The job database did not answer: OperationalError")

    runner = FakeRunner(behaviour)
    job_id = manager.submit(NewJob(target="/lake/a", target_key="/lake/a", spec={}, dry_run=False))[0].id
    worker = Worker(settings, manager=manager, runner=runner)
    worker.start()
    try:
        wait_until(lambda: manager.get(job_id).finished, timeout=15)
    finally:
        worker.stop()
    job = manager.get(job_id)
    assert job.status is Status.SUCCEEDED, job
    assert job.attempts == 2
    assert runner.committed == [(job_id, 2)]
