"""Real worker processes killed with SIGKILL in every phase (and right after the commit, before the row is
updated), with a runner that keeps a ledger per table in place of Delta commits. Per-table order with three
workers through a restart runs against real Delta tables in tests/e2e/test_order.py."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.jobs import NewJob, Status
from service.manager import JobManager
from tests.service.conftest import wait_until
from tests.service.proc_worker import read_ledger, table_name
from tests.service.worker_processes import WorkerProcesses

CRASH_PHASES = ("preparing_source", "finding_touched_files", "writing", "committing", "after_commit")


@pytest.fixture
def workers(database_url: str, tmp_path: Path) -> Iterator[WorkerProcesses]:
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    settings = {"MERGE_SERVICE_BACKOFF_BASE_SECONDS": "0.05", "MERGE_SERVICE_MAX_ATTEMPTS": "4"}
    group = WorkerProcesses(database_url, ledger, settings)
    yield group
    group.stop_all()


@pytest.fixture
def jobs_db(database_url: str) -> Iterator[JobManager]:
    manager = JobManager.from_url(database_url, lease_seconds=1.5)
    manager.migrate()
    yield manager
    manager.dispose()


def submit(manager: JobManager, target: str) -> str:
    return manager.submit(NewJob(target=target, target_key=target, spec={}, dry_run=False))[0].id


def assert_exactly_once(manager: JobManager, ledger: Path, job_ids: dict[str, list[str]]) -> None:
    assert not (ledger / "violations").exists(), (ledger / "violations").read_text()
    for target, ids in job_ids.items():
        entries = read_ledger(ledger / f"{table_name(target)}.ledger")
        assert [e["job"] for e in entries] == ids, f"{target}: the ledger holds each job once, in order"
        for version, job_id in enumerate(ids):
            job = manager.get(job_id)
            assert job.status is Status.SUCCEEDED, job
            assert job.table_version == version


@pytest.mark.slow
def test_sigkill_in_every_phase_still_applies_each_merge_exactly_once(
    jobs_db: JobManager, workers: WorkerProcesses
) -> None:
    crash_at = {f"/lake/{phase}": phase for phase in CRASH_PHASES}
    ids = {target: [submit(jobs_db, target)] for target in crash_at}
    doomed = [workers.start(crash_at=crash_at) for _ in CRASH_PHASES]
    markers = [workers.ledger / f"{ids[t][0]}.{p}" for t, p in crash_at.items()]
    wait_until(lambda: all(m.exists() for m in markers), timeout=60)
    for proc in doomed:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    for target, phase in crash_at.items():  # the rows still say the dead workers hold them
        job = jobs_db.get(ids[target][0])
        assert job.status is Status.RUNNING and job.phase.value == ("committing" if phase == "after_commit" else phase)
    workers.start(crash_at=crash_at)
    wait_until(lambda: all(jobs_db.get(i[0]).finished for i in ids.values()), timeout=60)
    assert_exactly_once(jobs_db, workers.ledger, ids)
    for target in crash_at:
        assert jobs_db.get(ids[target][0]).attempts == 2
