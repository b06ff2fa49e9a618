"""A job's Delta ``txn`` against a real Spark Connect server and real tables: a job database that starts again
from empty does not take the numbers an earlier one wrote for merges already applied, and a retry after a commit
began finds that commit in the log while Spark is away, or, for an AUTO CDC batch whose state table it did not reach,
waits for Spark past the attempt limit."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from sqlalchemy import select

import engine.errors as engine_errors
from service.errors import BatchAwaitsSparkError
from service.jobs import ClaimedJob, NewJob, Status
from service.manager import JobManager
from service.models import jobs
from service.problems import job_problem
from service.runner import EngineRunner, TxnId
from service.settings import Settings
from service.worker import Worker
from tests.e2e.harness import upsert_body
from tests.service.stand_in import WrappedRunner

SCHEMA = "id BIGINT, v STRING"


def _settings(database: Path, lake: Path, spark_remote: str, **kw: Any) -> Settings:
    return Settings(
        database_url=f"sqlite:///{database}",
        spark_remote=spark_remote,
        lake_roots=[str(lake)],
        poll_interval_seconds=0.05,
        backoff_base_seconds=0.05,
        backoff_max_seconds=0.1,
        heartbeat_seconds=0.5,
        warm_up=False,
        **kw,
    )


def _finish(worker: Worker, manager: JobManager, job_id: str, timeout: float = 180) -> Any:
    deadline = time.monotonic() + timeout
    while manager.get(job_id).status not in (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED):
        assert time.monotonic() < deadline, manager.get(job_id)
        worker.run_once() or time.sleep(0.05)
    return manager.get(job_id)


def _submit(manager: JobManager, target: Path, rows: list[dict[str, Any]]) -> str:
    body = upsert_body(target, rows, SCHEMA)
    return manager.submit(NewJob(target=str(target), target_key=str(target), spec=body, dry_run=False))[0].id


def _rows(target: Path) -> list[dict[str, Any]]:
    return DeltaTable(str(target)).to_pyarrow_table().sort_by("id").to_pylist()


def _txns(target: Path) -> list[tuple[int, dict[str, Any]]]:
    found = []
    for entry in sorted((target / "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "txn" in action:
                found.append((int(entry.stem), action["txn"]))
    return found


def test_a_job_database_started_again_does_not_take_an_applied_number_for_its_own(
    spark_remote: str, tmp_path: Path, lake: Path
) -> None:
    target = lake / "orders"
    write_deltalake(str(target), pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]}))
    first = _settings(tmp_path / "first.db", lake, spark_remote)
    manager = JobManager.from_url(first.database_url)
    manager.migrate()
    runner = EngineRunner(first)
    try:
        worker = Worker(first, manager=manager, runner=runner)
        for rows in ([{"id": 2, "v": "B"}], [{"id": 3, "v": "c"}]):
            assert _finish(worker, manager, _submit(manager, target, rows)).status is Status.SUCCEEDED
        manager.dispose()
        assert [t["version"] for _, t in _txns(target)] == [1, 2]
        before = (_rows(target), DeltaTable(str(target)).version())

        # A new, empty job database on the same lake under the same app id: its first job is seq 1 again.
        again = _settings(tmp_path / "again.db", lake, spark_remote)
        manager = JobManager.from_url(again.database_url)
        manager.migrate()
        worker = Worker(again, manager=manager, runner=runner)
        job = _finish(worker, manager, _submit(manager, target, [{"id": 1, "v": "A"}, {"id": 4, "v": "d"}]))
        assert job.status is Status.FAILED, job
        assert job.error["type"] == "urn:merge-service:problem:txn-taken"
        assert job.error["status"] == 409
        assert "MERGE_SERVICE_APP_ID" in job.error["detail"] and "'merge-service'" in job.error["detail"]
        assert job.table_version is None and job.attempts == 1
        assert (_rows(target), DeltaTable(str(target)).version()) == before, "the table is unchanged"
        manager.dispose()

        # The same merge under an app id of its own applies, once.
        own = _settings(tmp_path / "own.db", lake, spark_remote, app_id="merge-service-own")
        manager = JobManager.from_url(own.database_url)
        manager.migrate()
        worker = Worker(own, manager=manager, runner=runner)
        job = _finish(worker, manager, _submit(manager, target, [{"id": 1, "v": "A"}, {"id": 4, "v": "d"}]))
        assert job.status is Status.SUCCEEDED, job
        assert job.table_version == before[1] + 1
        assert _rows(target) == [
            {"id": 1, "v": "A"},
            {"id": 2, "v": "B"},
            {"id": 3, "v": "c"},
            {"id": 4, "v": "d"},
        ]
        version, txn = _txns(target)[-1]
        assert (version, txn["appId"], txn["version"]) == (before[1] + 1, "merge-service-own", 1)
    finally:
        manager.dispose()
        runner.close()


class SparkGoesAwayAfterTheCommit(WrappedRunner):
    """The first attempt commits on the real server and then loses its answer (a commit whose outcome is
    unknown); every later attempt meets a Spark Connect server that does not answer."""

    def __init__(self, inner: EngineRunner, away: EngineRunner) -> None:
        super().__init__(inner)
        self.away = away
        self.attempts = 0

    def run(self, job: ClaimedJob, *, txn: TxnId, on_progress: Any, tag: str) -> Any:
        self.attempts += 1
        if self.attempts > 1:
            return self.away.run(job, txn=txn, on_progress=on_progress, tag=tag)
        self.inner.run(job, txn=txn, on_progress=on_progress, tag=tag)
        raise engine_errors.CommitStateUnknownError("the commit's answer was lost")


def test_a_retry_finds_the_commit_that_landed_while_spark_is_away(
    spark_remote: str, tmp_path: Path, lake: Path
) -> None:
    target = lake / "orders"
    write_deltalake(str(target), pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]}))
    settings = _settings(tmp_path / "jobs.db", lake, spark_remote)
    away = EngineRunner(_settings(tmp_path / "jobs.db", lake, "sc://127.0.0.1:9", spark_max_retries=0))
    manager = JobManager.from_url(settings.database_url)
    manager.migrate()
    runner = SparkGoesAwayAfterTheCommit(EngineRunner(settings), away)
    try:
        worker = Worker(settings, manager=manager, runner=runner)
        job = _finish(worker, manager, _submit(manager, target, [{"id": 2, "v": "B"}, {"id": 3, "v": "c"}]))
        assert job.status is Status.SUCCEEDED, job
        assert (job.attempts, job.table_version) == (2, 1)
        assert job.result == {
            "num_affected_rows": 2,
            "num_updated_rows": 1,
            "num_deleted_rows": 0,
            "num_inserted_rows": 1,
        }
        assert job.metrics["numTargetRowsInserted"] == 1 and job.metrics["numTargetRowsUpdated"] == 1
        assert DeltaTable(str(target)).version() == 1, "one commit, not two"
        assert _rows(target) == [{"id": 1, "v": "a"}, {"id": 2, "v": "B"}, {"id": 3, "v": "c"}]
    finally:
        manager.dispose()
        runner.close()
        away.close()


class StateMergeLostThenSparkAway(WrappedRunner):
    """The first attempt runs the AUTO CDC batch on the real server, then its state table's commit is taken back (as
    if the attempt ended between the batch's two merges) and Spark is lost; the next ``away_attempts`` attempts meet
    a Spark Connect server that does not answer, the ones after them the real server again."""

    def __init__(
        self, inner: EngineRunner, away: EngineRunner, state: Path, away_attempts: int, manager: JobManager
    ) -> None:
        super().__init__(inner)
        self.away, self.state, self.away_attempts, self.manager = away, state, away_attempts, manager
        self.attempts = 0
        self.away_errors: list[BaseException] = []
        self.state_rows: list[dict[str, Any]] = []
        self.awaits_spark: list[bool] = []
        """The job's ``awaits_spark`` as each attempt found it."""

    def run(self, job: ClaimedJob, *, txn: TxnId, on_progress: Any, tag: str) -> Any:
        self.attempts += 1
        with self.manager.engine.connect() as conn:
            query = select(jobs.c.awaits_spark).where(jobs.c.id == job.lease.job_id)
            self.awaits_spark.append(conn.execute(query).scalar_one())
        if self.attempts == 1:
            self.inner.run(job, txn=txn, on_progress=on_progress, tag=tag)
            self.state_rows = _rows(self.state)
            max((self.state / "_delta_log").glob("*.json")).unlink()
            raise engine_errors.SparkUnavailableError("Spark Connect lost the session")
        if self.attempts <= 1 + self.away_attempts:
            try:
                return self.away.run(job, txn=txn, on_progress=on_progress, tag=tag)
            except Exception as exc:
                self.away_errors.append(exc)
                raise
        return self.inner.run(job, txn=txn, on_progress=on_progress, tag=tag)


def test_a_half_applied_batch_waits_for_spark_past_the_attempt_limit(
    spark_remote: str, tmp_path: Path, lake: Path
) -> None:
    """Failing such a job would leave its target changed and the table's next batch reading a state without it."""
    target = lake / "customers"
    settings = _settings(tmp_path / "jobs.db", lake, spark_remote, max_attempts=2)
    away = EngineRunner(_settings(tmp_path / "jobs.db", lake, "sc://127.0.0.1:9", spark_max_retries=0))
    manager = JobManager.from_url(settings.database_url)
    manager.migrate()
    runner = StateMergeLostThenSparkAway(
        EngineRunner(settings), away, target / "_auto_cdc_events", away_attempts=4, manager=manager
    )
    rows = [{"id": 1, "ts": 1, "v": "a"}, {"id": 1, "ts": 2, "v": "b"}, {"id": 2, "ts": 1, "v": "c"}]
    body = {
        "target": str(target),
        "source": {"rows": rows, "schema": "id BIGINT, ts BIGINT, v STRING"},
        "auto_cdc": {"keys": ["id"], "sequence_by": "ts", "stored_as_scd_type": 2},
    }
    try:
        worker = Worker(settings, manager=manager, runner=runner)
        job_id = manager.submit(NewJob(target=str(target), target_key=str(target), spec=body, dry_run=False))[0].id
        job = _finish(worker, manager, job_id)
        assert job.status is Status.SUCCEEDED, job
        assert job.attempts == 6, "four attempts while Spark was away, past the limit of two"
        assert [type(e) for e in runner.away_errors] == [BatchAwaitsSparkError] * 4
        assert runner.awaits_spark == [False, False, True, True, True, True], "a lost worker would spend no attempt"
        problem = job_problem(runner.away_errors[-1])
        assert (problem["type"], problem["status"]) == ("urn:merge-service:problem:auto-cdc-incomplete", 503)
        assert "Spark is away" in problem["detail"]
        assert [t["version"] for _, t in _txns(target)] == [1], "the target took the batch once"
        assert job.table_version == _txns(target)[0][0]
        assert job.result["num_inserted_rows"] == 3
        assert [t["version"] for _, t in _txns(target / "_auto_cdc_events")] == [1]
        finished = sorted(_rows(target / "_auto_cdc_events"), key=repr)
        assert finished == sorted(runner.state_rows, key=repr), "the state table finished as a run does"
    finally:
        manager.dispose()
        runner.close()
        away.close()
