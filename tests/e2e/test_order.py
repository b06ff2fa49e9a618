"""Per-table order with the real engine: three worker processes (``tests.service.proc_worker``, ``RUNNER=engine``)
on a PostgreSQL job database and the session's Spark Connect server, 150 jobs over five Delta tables submitted
interleaved through the API while the workers start; once a third have finished, one worker busy with a job is
killed with SIGKILL and another stopped with SIGTERM, and two fresh ones take their place.

Each job appends one row carrying its submission index, with a MERGE whose ON never holds, so a job applied twice
would leave its row twice. Checked per table: the Delta log holds one MERGE commit per job, carrying the job's
``txn`` (app id, seq), in submission order, each read from its predecessor's version; the data files each commit
added hold exactly that job's row; the job rows all succeeded, started in submission order and ran one at a time,
as did the attempts themselves (each holds a lock file per table in the worker harness)."""

from __future__ import annotations

import itertools
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from service.jobs import TERMINAL, JobRecord, Status
from service.manager import JobManager
from service.models import jobs as jobs_table
from tests.e2e.harness import (
    START_TIMEOUT,
    Home,
    api_client,
    assert_merged_once,
    job_store,
    log_entry,
    open_home,
    tails,
    wait_for,
)
from tests.service.conftest import PostgresServer

TABLES = 5
JOBS = 150
WORKERS = 3
SCHEMA = "id BIGINT, name STRING"


def table_of(index: int) -> int:
    return (index * 7 + index // 5) % TABLES  # interleaved and uneven, thirty jobs per table in all


def create_table(path: Path) -> None:
    write_deltalake(str(path), pa.table({"id": pa.array([0], pa.int64()), "name": ["created"]}))


def append(path: Path, index: int) -> dict[str, Any]:
    """A merge whose ON never holds: it inserts its row however often it is applied."""
    return {
        "target": str(path),
        "source": {"rows": [{"id": index, "name": f"job {index}"}], "schema": SCHEMA},
        "target_alias": "t",
        "source_alias": "s",
        "on": "false",
        "when_not_matched": [{"action": "insert_all"}],
    }


def commit_info(path: Path, version: int) -> dict[str, Any]:
    [info] = [a["commitInfo"] for a in log_entry(path, version) if "commitInfo" in a]
    return info


def rows_added(path: Path, version: int) -> list[dict[str, Any]]:
    """The rows of the data files that one commit added, read from the commit file's ``add`` actions."""
    actions = log_entry(path, version)
    assert not [a for a in actions if "remove" in a], "an append removes no file"
    files = [path / unquote(a["add"]["path"]) for a in actions if "add" in a]
    return sorted((row for f in files for row in pq.read_table(f).to_pylist()), key=lambda r: r["id"])


@pytest.fixture
def home(tmp_path: Path, spark_remote: str, postgres_server: PostgresServer) -> Iterator[Home]:
    url = postgres_server.create_database()
    h = open_home(tmp_path, spark_remote, database=url, lease_seconds=3.0, max_attempts=5)
    yield h
    h.close()
    postgres_server.drop_database(url)


@pytest.fixture
def jobs(home: Home) -> Iterator[JobManager]:
    manager = job_store(home)
    yield manager
    manager.dispose()


def running_owners(manager: JobManager) -> set[str]:
    with manager.engine.connect() as conn:
        rows = conn.execute(select(jobs_table.c.lease_owner).where(jobs_table.c.status == Status.RUNNING.value))
        return {r.lease_owner for r in rows if r.lease_owner}


def count_finished(manager: JobManager) -> int:
    with manager.engine.connect() as conn:
        return int(
            conn.execute(select(func.count()).where(jobs_table.c.status.in_([s.value for s in TERMINAL]))).scalar_one()
        )


def holds_a_job(proc: subprocess.Popen[bytes], owners: set[str]) -> bool:
    return any(owner.split(":")[1] == str(proc.pid) for owner in owners)


def submit_jobs(api: TestClient, tables: list[Path]) -> tuple[list[str], dict[int, list[int]]]:
    """JOBS appends spread over the tables. Answers the job ids in submission order and each table's job
    indexes."""
    ids: list[str] = []
    indexes: dict[int, list[int]] = {k: [] for k in range(len(tables))}
    for index in range(1, JOBS + 1):
        k = table_of(index)
        response = api.post("/merges", json=append(tables[k], index))
        assert response.status_code == 202, response.text
        ids.append(response.json()["id"])
        indexes[k].append(index)
    return ids, indexes


def kill_one_and_stop_one(jobs: JobManager, workers: list[tuple[subprocess.Popen[bytes], Path]]) -> None:
    """A crash and a graceful stop, each of a worker that holds a running job when it goes."""
    logs = [log for _, log in workers]
    busy: list[subprocess.Popen[bytes]] = []

    def two_busy() -> bool:
        owners = running_owners(jobs)
        busy[:] = [p for p, _ in workers if holds_a_job(p, owners)]
        return len(busy) >= 2

    wait_for(two_busy, "two workers run jobs at once", 60, alive_all=[p for p, _ in workers], logs=logs)
    killed, stopped = busy[0], busy[1]
    killed.send_signal(signal.SIGKILL)
    stopped.send_signal(signal.SIGTERM)
    assert killed.wait(timeout=30) == -signal.SIGKILL
    assert stopped.wait(timeout=60) == 0, tails(logs)


def assert_applied_once_in_order(table: Path, order: list[JobRecord], indexes: list[int]) -> None:
    """One table's jobs, in submission order, against its Delta log, its job rows and its data."""
    assert all(job.status is Status.SUCCEEDED and job.error is None for job in order), order
    # The Delta log: one MERGE commit per job, its txn the job's seq, in submission order.
    assert_merged_once(table, order)
    # Each commit read the version its predecessor committed.
    assert [commit_info(table, v)["readVersion"] for v in range(1, len(order) + 1)] == list(range(len(order)))
    # The job rows: one at a time, started in submission order.
    for before, after in itertools.pairwise(order):
        assert before.started_at is not None and before.finished_at is not None
        assert after.started_at is not None
        assert before.started_at < after.started_at, (before, after)
        assert before.finished_at <= after.started_at, (before, after)
    # The data: commit v added the row of the table's v-th job and nothing else; no row twice.
    for version, index in enumerate(indexes, start=1):
        assert rows_added(table, version) == [{"id": index, "name": f"job {index}"}], (table, version)
    data = DeltaTable(str(table)).to_pyarrow_table().sort_by("id").to_pydict()
    assert data == {"id": [0, *indexes], "name": ["created", *(f"job {i}" for i in indexes)]}, table


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(420)
def test_three_workers_apply_each_tables_merges_once_in_submission_order(home: Home, jobs: JobManager) -> None:
    assert jobs.engine.dialect.name == "postgresql"
    tables = [home.lake / f"t{k}" for k in range(TABLES)]
    for table in tables:
        create_table(table)
    api = api_client(home, jobs)
    first = [home.worker(f"worker-{n}") for n in range(WORKERS)]
    ids, indexes = submit_jobs(api, tables)  # while the workers start and take the first jobs

    logs = [log for _, log in first]
    wait_for(
        lambda: count_finished(jobs) >= JOBS // 3,
        "a third of the jobs finished",
        START_TIMEOUT + 120,
        alive_all=[p for p, _ in first],
        logs=logs,
    )
    kill_one_and_stop_one(jobs, first)
    at_restart = count_finished(jobs)
    assert at_restart < JOBS, "the restart came while jobs were still to run"
    fresh = [home.worker(f"worker-{n}") for n in range(WORKERS, WORKERS + 2)]
    survivors = [p for p, _ in first if p.poll() is None] + [p for p, _ in fresh]
    logs += [log for _, log in fresh]
    wait_for(lambda: count_finished(jobs) == JOBS, "every job finished", 240, alive_all=survivors, logs=logs)

    violations = home.markers / "violations"
    assert not violations.exists(), violations.read_text()
    done = {job.id: job for job in (jobs.get(i) for i in ids)}
    assert [done[i].seq for i in ids] == sorted(done[i].seq for i in ids), "seq follows submission order"
    assert len({done[i].seq for i in ids}) == JOBS
    retried = [job for job in done.values() if job.attempts > 1]
    assert retried, "the crash and the stop sent running jobs back to the queue"
    for k, table in enumerate(tables):
        assert_applied_once_in_order(table, [done[ids[index - 1]] for index in indexes[k]], indexes[k])
