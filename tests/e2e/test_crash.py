"""Crashes and restarts with the real engine: worker processes killed with SIGKILL in every phase of a merge
(and right after its Delta log entry is written, before the job row is updated), and `merge-service serve`
stopped with SIGTERM while one job runs and two wait. Every job must end succeeded with its merge in the table
exactly once, under the Delta ``txn`` (app id, job seq) that makes a retried commit recognisable.

Real at every step: a separate Spark Connect server process, worker processes of ``tests.service.proc_worker``
(``RUNNER=engine``), a SQLite job database shared across processes, Delta tables checked with ``deltalake``."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from fastapi.testclient import TestClient

from engine.spark_server import free_port
from service.jobs import JobRecord, Status
from service.manager import JobManager
from tests.e2e.harness import (
    APP_ID,
    START_TIMEOUT,
    Home,
    answers,
    api_client,
    assert_merged_once,
    job_store,
    open_home,
    tails,
    txn_of,
    upsert_body,
    wait_for,
)

BIN = Path(sys.executable).parent
CRASH_POINTS = ("preparing_source", "finding_touched_files", "writing", "committing", "after_commit")
JOB_TIMEOUT = 180.0


@pytest.fixture
def home(tmp_path: Path, spark_remote: str) -> Iterator[Home]:
    h = open_home(tmp_path, spark_remote)
    yield h
    h.close()


@pytest.fixture
def jobs(home: Home) -> Iterator[JobManager]:
    manager = job_store(home)
    yield manager
    manager.dispose()


def create_table(path: Path) -> None:
    write_deltalake(
        str(path),
        pa.table(
            {
                "id": pa.array([1, 2, 3], pa.int64()),
                "name": ["Ann", "Bob", "Cid"],
                "n": pa.array([0, 0, 0], pa.int64()),
            }
        ),
    )


def upsert(path: Path, rows: list[dict[str, Any]]) -> dict[str, Any]:
    return upsert_body(path, rows, "id BIGINT, name STRING, n BIGINT")


def table_rows(path: Path) -> dict[str, list[Any]]:
    return DeltaTable(str(path)).to_pyarrow_table().sort_by("id").to_pydict()


@dataclass
class Crash:
    """One job whose first attempt was killed at ``point``, as seen while parked and after the rescue."""

    point: str
    table: Path
    parked: JobRecord
    parked_version: int
    parked_txn: tuple[str, int] | None
    job: JobRecord


def submit_one_job_per_point(api: TestClient, home: Home, jobs: JobManager) -> tuple[dict[str, str], dict[str, str]]:
    """One job per crash point, each on its own table. Answers the job ids and the crash point of each table."""
    ids: dict[str, str] = {}
    crash_at: dict[str, str] = {}
    for point in CRASH_POINTS:
        table = home.lake / point
        create_table(table)
        response = api.post(
            "/merges", json=upsert(table, [{"id": 2, "name": "Bea", "n": 1}, {"id": 4, "name": "Dan", "n": 1}])
        )
        assert response.status_code == 202, response.text
        ids[point] = response.json()["id"]
        crash_at[jobs.get(ids[point]).target_key] = point
    return ids, crash_at


def park_and_kill(
    home: Home, jobs: JobManager, ids: dict[str, str], crash_at: dict[str, str]
) -> tuple[dict[str, JobRecord], dict[str, int], dict[str, tuple[str, int] | None]]:
    """Each job claimed by its own worker process that stops dead at its crash point; what the job row and the
    table say then; then every one of those workers killed with SIGKILL."""
    doomed = [home.worker(f"doomed-{i}", crash_at=crash_at) for i in range(len(CRASH_POINTS))]
    markers = [home.markers / f"{ids[point]}.{point}" for point in CRASH_POINTS]
    wait_for(
        lambda: all(m.exists() for m in markers),
        "every worker parked at its crash point",
        START_TIMEOUT + 60,
        alive_all=[p for p, _ in doomed],
        logs=[log for _, log in doomed],
    )
    parked = {point: jobs.get(ids[point]) for point in CRASH_POINTS}
    versions = {point: DeltaTable(str(home.lake / point)).version() for point in CRASH_POINTS}
    txns = {point: txn_of(home.lake / point, 1) if versions[point] >= 1 else None for point in CRASH_POINTS}
    for proc, _ in doomed:
        proc.send_signal(signal.SIGKILL)
    for proc, _ in doomed:
        assert proc.wait(timeout=30) == -signal.SIGKILL
    return parked, versions, txns


@pytest.fixture(scope="module")
def crashes(spark_remote: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Crash]]:
    """One job per crash point, each on its own table, each claimed by its own worker process that stops dead
    at that point; all five workers are killed with SIGKILL, then two fresh workers take the jobs over once
    their leases expire. (The five crash scenarios run side by side to keep the module within minutes.)"""
    home = open_home(tmp_path_factory.mktemp("crash"), spark_remote)
    jobs = job_store(home)
    api = api_client(home, jobs)
    try:
        ids, crash_at = submit_one_job_per_point(api, home, jobs)
        parked, versions, txns = park_and_kill(home, jobs, ids, crash_at)
        rescuers = [home.worker(f"rescuer-{i}") for i in range(2)]
        wait_for(
            lambda: all(jobs.get(i).finished for i in ids.values()),
            "every job finished after the crash",
            JOB_TIMEOUT,
            alive_all=[p for p, _ in rescuers],
            logs=[log for _, log in rescuers],
        )
        yield {
            point: Crash(
                point=point,
                table=home.lake / point,
                parked=parked[point],
                parked_version=versions[point],
                parked_txn=txns[point],
                job=jobs.get(ids[point]),
            )
            for point in CRASH_POINTS
        }
    finally:
        home.close()
        jobs.dispose()


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("point", CRASH_POINTS)
def test_sigkill_at_each_crash_point_applies_the_merge_exactly_once(point: str, crashes: dict[str, Crash]) -> None:
    crash = crashes[point]
    # While the worker was parked: the job row said running, in the phase it had reached.
    assert crash.parked.status is Status.RUNNING and crash.parked.attempts == 1, crash.parked
    assert crash.parked.phase.value == ("committing" if point == "after_commit" else point)
    if point == "after_commit":  # the commit was in the Delta log, the job row did not know it yet
        assert crash.parked_version == 1
        assert crash.parked_txn == (APP_ID, crash.parked.seq)
        assert crash.parked.table_version is None
    else:
        assert crash.parked_version == 0

    job = crash.job
    assert job.status is Status.SUCCEEDED, job
    assert job.attempts == 2, job
    assert job.table_version == 1
    assert job.error is None
    assert_merged_once(crash.table, [job])
    assert table_rows(crash.table) == {"id": [1, 2, 3, 4], "name": ["Ann", "Bea", "Cid", "Dan"], "n": [0, 1, 0, 1]}
    commit = DeltaTable(str(crash.table)).history(1)[0]
    assert commit["operationMetrics"]["numTargetRowsUpdated"] == "1"
    assert commit["operationMetrics"]["numTargetRowsInserted"] == "1"
    # After a crash past the commit, the retry reads the result back from the commit it finds.
    assert job.result == {"num_affected_rows": 2, "num_updated_rows": 1, "num_deleted_rows": 0, "num_inserted_rows": 1}


def serve(home: Home, name: str) -> tuple[subprocess.Popen[bytes], str, Path]:
    port = free_port()
    proc, log = home.spawn(
        [str(BIN / "merge-service"), "serve", "--host", "127.0.0.1", "--port", str(port)],
        name,
        MERGE_SERVICE_WORKERS="1",
    )
    base = f"http://127.0.0.1:{port}"
    wait_for(
        lambda: answers(base, "/healthz", 1), f"{name} answers /healthz", START_TIMEOUT, alive_all=[proc], logs=[log]
    )
    return proc, base, log


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_restart_with_one_job_running_and_two_queued(home: Home, jobs: JobManager) -> None:
    table = home.lake / "orders"
    create_table(table)
    first, base, first_log = serve(home, "serve-1")
    ids = []
    for k in (1, 2, 3):  # each job sets row 1's n to k and adds row 10+k: the final row 1 tells the order
        response = httpx.post(
            f"{base}/merges",
            timeout=30,
            json=upsert(table, [{"id": 1, "name": f"Ann{k}", "n": k}, {"id": 10 + k, "name": f"New{k}", "n": k}]),
        )
        assert response.status_code == 202, response.text
        ids.append(response.json()["id"])

    wait_for(
        lambda: jobs.get(ids[0]).status is Status.RUNNING,
        "the first job runs",
        START_TIMEOUT,
        alive_all=[first],
        logs=[first_log],
    )
    before = [jobs.get(i) for i in ids]
    assert [j.status for j in before[1:]] == [Status.QUEUED, Status.QUEUED], before
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=90) == 0, tails([first_log])
    stopped = [jobs.get(i) for i in ids]
    assert all(j.status in (Status.QUEUED, Status.SUCCEEDED) for j in stopped), stopped
    assert [j.status for j in stopped[1:]] == [Status.QUEUED, Status.QUEUED], "a stopping service claims nothing"

    second, _, second_log = serve(home, "serve-2")
    wait_for(
        lambda: all(jobs.get(i).finished for i in ids),
        "all jobs finished after the restart",
        JOB_TIMEOUT,
        alive_all=[second],
        logs=[second_log],
    )

    done = [jobs.get(i) for i in ids]
    assert [j.seq for j in done] == sorted(j.seq for j in done)
    assert_merged_once(table, done)
    assert [j.started_at for j in done] == sorted(j.started_at for j in done)  # type: ignore[type-var]
    data = table_rows(table)
    assert data == {
        "id": [1, 2, 3, 11, 12, 13],
        "name": ["Ann3", "Bob", "Cid", "New1", "New2", "New3"],
        "n": [3, 0, 0, 1, 2, 3],
    }
