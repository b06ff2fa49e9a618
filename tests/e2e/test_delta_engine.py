"""``"engine": "delta"`` end to end: `merge-service serve` as its own process whose worker runs each job as Delta
Lake's own MERGE INTO on Delta's Spark (``tests.oracle.delta_spark``), SQLite job table, Delta tables on disk
read back with deltalake. Delta's commit is the oracle for the job's result and metrics: the commit names Delta
as its writer (``engineInfo``), carries the job's ``txn``, and its ``operationMetrics`` are the job's metrics.

Skipped, saying why, only where Maven Central cannot be reached to fetch Delta's jars once (``CI=true`` fails)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from fastapi.testclient import TestClient
from pyspark.sql import SparkSession

import engine
import engine.errors as engine_errors
from engine import delta
from engine.delta_connect import _run_statement, _statement_conf, merge_statement
from engine.spark_server import SparkProcess
from service.app import create_app
from service.jobs import Status
from service.manager import JobManager
from service.settings import Settings
from service.worker import EngineRunner, TxnId, Worker
from tests.e2e.harness import finished_job, serving
from tests.oracle.tables import make_delta_table
from tests.service.stand_in import WrappedRunner

APP_ID = "merge-service-delta-engine-tests"


@pytest.fixture(scope="module")
def service(delta_spark_server: SparkProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with serving(
        tmp_path_factory.mktemp("delta-engine-service"),
        f"sc://127.0.0.1:{delta_spark_server.port}",
        MERGE_SERVICE_APP_ID=APP_ID,
        MERGE_SERVICE_HEARTBEAT_SECONDS="0.5",
        MERGE_SERVICE_LOG_JSON="false",
    ) as service:
        yield service


def submit(base: str, body: dict[str, Any]) -> str:
    response = httpx.post(f"{base}/merges", json={**body, "engine": "delta"}, timeout=10)
    assert response.status_code == 202, response.text
    assert response.json()["engine"] == "delta"
    return str(response.json()["id"])


def wait_for(base: str, job_id: str, timeout: float = 240) -> dict[str, Any]:
    return finished_job(base, job_id, timeout)


def failed_with(
    base: str, problem: str, *, target: Path, source: dict[str, Any], update: dict[str, str]
) -> dict[str, Any]:
    """A ``WHEN MATCHED THEN UPDATE`` on ``target.id = source.id`` that Delta refuses: the job, failed with the
    problem type named ``problem``."""
    body = {"target": str(target), "source": source, "on": "target.id = source.id"}
    job_id = submit(base, {**body, "when_matched": [{"action": "update", "set": update}]})
    job = wait_for(base, job_id)
    assert job["status"] == "failed", job
    assert job["error"]["type"] == f"urn:merge-service:problem:{problem}"
    return job


def commit_entry(table: Path, version: int) -> list[dict[str, Any]]:
    text = (table / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def job_seq(home: Path, job_id: str) -> int:
    manager = JobManager.from_url(f"sqlite:///{home / 'jobs.db'}")
    try:
        return manager.get(job_id).seq
    finally:
        manager.dispose()


def assert_delta_committed(table: Path, version: int, job: dict[str, Any], seq: int) -> None:
    """The commit is Delta's own MERGE, carries the job's txn, and its operationMetrics are the job's metrics."""
    entry = commit_entry(table, version)
    info = next(a["commitInfo"] for a in entry if "commitInfo" in a)
    assert info["operation"] == "MERGE"
    assert "Delta-Lake/4.4.0" in info["engineInfo"], info["engineInfo"]
    assert [a["txn"] for a in entry if "txn" in a] == [{"appId": APP_ID, "version": seq, **_txn_extra(entry)}]
    assert job["metrics"] == {k: int(v) for k, v in info["operationMetrics"].items()}
    assert job["table_version"] == version


def _txn_extra(entry: list[dict[str, Any]]) -> dict[str, Any]:
    """Delta may stamp its txn action with ``lastUpdated``; only the app id and version are the job's."""
    txn = next(a["txn"] for a in entry if "txn" in a)
    return {k: v for k, v in txn.items() if k not in ("appId", "version")}


def rows_of(table: Path) -> dict[str, list[Any]]:
    return DeltaTable(str(table)).to_pyarrow_table().sort_by("id").to_pydict()


def customers(lake: Path, name: str) -> Path:
    table = lake / name
    write_deltalake(
        str(table),
        pa.table(
            {"id": pa.array([1, 2, 3], pa.int64()), "name": ["Ann", "Bob", "Cid"], "tier": ["free", "free", "gold"]}
        ),
    )
    return table


# --- through the service --------------------------------------------------------------------------------------


def test_a_structured_upsert_runs_as_delta_merge(service: dict[str, Any]) -> None:
    base, lake = service["base"], service["lake"]
    table = customers(lake, "upsert")
    job_id = submit(
        base,
        {
            "target": str(table),
            "source": {
                "rows": [{"id": 2, "name": "Bea", "tier": "gold"}, {"id": 4, "name": "Dan", "tier": "silver"}],
                "schema": "id BIGINT, name STRING, tier STRING",
            },
            "target_alias": "t",
            "source_alias": "s",
            "on": "t.id = s.id",
            "when_matched": [{"condition": "s.tier <> t.tier", "action": "update", "set": {"tier": "s.tier"}}],
            "when_not_matched": [{"action": "insert_all"}],
        },
    )
    job = wait_for(base, job_id)
    assert job["status"] == "succeeded", job
    assert job["engine"] == "delta"
    assert job["result"] == {
        "num_affected_rows": 2,
        "num_updated_rows": 1,
        "num_deleted_rows": 0,
        "num_inserted_rows": 1,
    }
    assert rows_of(table) == {
        "id": [1, 2, 3, 4],
        "name": ["Ann", "Bob", "Cid", "Dan"],
        "tier": ["free", "gold", "gold", "silver"],
    }
    assert_delta_committed(table, 1, job, job_seq(service["home"], job_id))
    assert job["metrics"]["numTargetRowsMatchedUpdated"] == 1 and job["metrics"]["numSourceRows"] == 2


def test_a_sql_merge_from_a_delta_source_with_every_clause_kind(service: dict[str, Any]) -> None:
    base, lake = service["base"], service["lake"]
    table = customers(lake, "sql_target")
    source = lake / "sql_source"
    write_deltalake(
        str(source),
        pa.table(
            {"id": pa.array([1, 3, 5], pa.int64()), "name": ["Ann", "Cy", "Eve"], "op": ["delete", "upsert", "upsert"]}
        ),
    )
    sql = (
        f"MERGE INTO delta.`{table}` AS t USING delta.`{source}` AS s ON t.id = s.id "
        "WHEN MATCHED AND s.op = 'delete' THEN DELETE "
        "WHEN MATCHED THEN UPDATE SET name = upper(s.name) "
        "WHEN NOT MATCHED THEN INSERT (id, name, tier) VALUES (s.id, s.name, 'new') "
        "WHEN NOT MATCHED BY SOURCE THEN UPDATE SET tier = 'lapsed'"
    )
    job_id = submit(base, {"sql": sql})
    job = wait_for(base, job_id)
    assert job["status"] == "succeeded", job
    assert rows_of(table) == {"id": [2, 3, 5], "name": ["Bob", "CY", "Eve"], "tier": ["lapsed", "gold", "new"]}
    assert job["result"] == {
        "num_affected_rows": 4,
        "num_updated_rows": 2,
        "num_deleted_rows": 1,
        "num_inserted_rows": 1,
    }
    assert_delta_committed(table, 1, job, job_seq(service["home"], job_id))
    assert job["metrics"]["numTargetRowsNotMatchedBySourceUpdated"] == 1


def test_a_failed_merge_leaves_the_table_unchanged_and_says_why(service: dict[str, Any]) -> None:
    base, lake = service["base"], service["lake"]
    table = customers(lake, "duplicates")
    job = failed_with(
        base,
        "multiple-match",
        source={"rows": [{"id": 2, "name": "B1"}, {"id": 2, "name": "B2"}], "schema": "id BIGINT, name STRING"},
        update={"name": "source.name"},
        target=table,
    )
    assert "DELTA_MULTIPLE_SOURCE_ROW_MATCHING_TARGET_ROW_IN_MERGE" in job["error"]["detail"]
    assert job["attempts"] == 1
    assert DeltaTable(str(table)).version() == 0
    assert rows_of(table)["name"] == ["Ann", "Bob", "Cid"]

    job = failed_with(
        base,
        "merge-resolution",
        source={"rows": [{"id": 2}], "schema": "id BIGINT"},
        update={"name": "source.nickname"},
        target=table,
    )
    assert "nickname" in job["error"]["detail"]
    assert DeltaTable(str(table)).version() == 0


def test_cancel_interrupts_delta_merge_and_leaves_the_table_unchanged(service: dict[str, Any]) -> None:
    base, lake = service["base"], service["lake"]
    rows = 200_000
    ids = pa.array(range(rows), pa.int64())
    table, source = lake / "big_target", lake / "big_source"
    write_deltalake(str(table), pa.table({"id": ids, "payload": pa.array(["0123456789"] * rows)}))
    write_deltalake(str(source), pa.table({"id": ids, "payload": pa.array(["abcdefghij"] * rows)}))
    # Hashing a 20 kB string per matched pair keeps Delta's MERGE busy for a minute or more on two cores.
    job_id = submit(
        base,
        {
            "target": str(table),
            "source": {"format": "delta", "path": str(source)},
            "target_alias": "t",
            "source_alias": "s",
            "on": "t.id = s.id AND sha2(repeat(s.payload, 2000), 512) <> ''",
            "when_matched": [{"action": "update_all"}],
        },
    )
    deadline = time.monotonic() + 120
    while httpx.get(f"{base}/merges/{job_id}", timeout=5).json()["phase"] != "committing":
        assert time.monotonic() < deadline, "the merge never started"
        time.sleep(0.1)
    time.sleep(2.0)  # Delta's MERGE statement is under way on the server
    started = time.monotonic()
    assert httpx.post(f"{base}/merges/{job_id}/cancel", timeout=10).status_code == 202
    job = wait_for(base, job_id)
    assert job["status"] == "cancelled", job
    assert job["error"]["type"] == "urn:merge-service:problem:cancelled"
    assert time.monotonic() - started < 30, "the statement was interrupted, not waited for"
    assert DeltaTable(str(table)).version() == 0
    assert [a for a in commit_entry(table, 0) if "commitInfo" in a]
    assert not (table / "_delta_log" / f"{1:020d}.json").exists()


# --- exactly-once ---------------------------------------------------------------------------------------------


def upsert_spec(table: Path, lake: Path) -> engine.MergeSpec:
    return engine.MergeSpec(
        target=str(table),
        source=engine.RowsSource(
            rows=[{"id": 3, "name": "Cy"}, {"id": 9, "name": "Ida"}], schema="id BIGINT, name STRING"
        ),
        on="t.id = s.id",
        matched=(engine.MergeClause("matched", engine.UpdateAction(set={"name": "s.name"})),),
        not_matched=(engine.MergeClause("notMatched", engine.InsertAction(values={"id": "s.id", "name": "s.name"})),),
        target_alias="t",
        source_alias="s",
        lake_roots=(str(lake),),
    )


def test_a_rerun_job_whose_commit_landed_does_not_commit_again(delta_spark: SparkSession, tmp_path: Path) -> None:
    table = customers(tmp_path, "rerun")
    spec = upsert_spec(table, tmp_path)
    txn = engine.AppTransaction(APP_ID, 41)
    first = engine.run_delta_merge(delta_spark, spec, txn=txn)
    assert (first.table_version, first.already_applied) == (1, False)
    again = engine.run_delta_merge(delta_spark, spec, txn=txn)
    assert again.already_applied
    assert (again.table_version, again.result, again.metrics["numSourceRows"]) == (1, first.result, 2)
    assert DeltaTable(str(table)).version() == 1
    # A later job (a higher txn version) merges again.
    later = engine.run_delta_merge(delta_spark, spec, txn=engine.AppTransaction(APP_ID, 42))
    assert later.table_version == 2


def test_delta_itself_skips_a_statement_whose_txn_the_table_holds(delta_spark: SparkSession, tmp_path: Path) -> None:
    """The race the log check before the statement cannot close: another attempt's commit lands after the check.
    Delta's idempotent DML, set for the statement, is what refuses the second commit."""
    table = customers(tmp_path, "race")
    spec = engine.validate_spec(upsert_spec(table, tmp_path))
    txn = engine.AppTransaction(APP_ID, 7)
    engine.run_delta_merge(delta_spark, spec, txn=txn)
    before = delta.load_snapshot(str(table))
    delta_spark.createDataFrame([(3, "Cy")], "id BIGINT, name STRING").createOrReplaceTempView("race_source")
    rows = _run_statement(delta_spark, merge_statement(spec, "race_source"), _statement_conf(spec, txn), before, txn)
    assert rows == []
    assert DeltaTable(str(table)).version() == 1
    # The settings were the statement's only: the session holds no txn afterwards.
    assert delta_spark.conf.get("spark.databricks.delta.write.txnAppId", None) is None


class FailsOnceAfterCommit(WrappedRunner):
    """The real runner, whose first attempt loses its answer after Delta's commit landed (as a worker that dies,
    or a commit whose outcome is unknown): the job is retried."""

    def __init__(self, inner: EngineRunner) -> None:
        super().__init__(inner)
        self.failed = False

    def run(self, job: Any, *, txn: TxnId, on_progress: Any, tag: str) -> Any:
        result = self.inner.run(job, txn=txn, on_progress=on_progress, tag=tag)
        if not self.failed:
            self.failed = True
            raise engine_errors.CommitStateUnknownError("the commit's answer was lost")
        return result


def test_a_retried_job_records_the_commit_its_first_attempt_landed(
    delta_spark_server: SparkProcess, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    lake.mkdir()
    table = customers(lake, "retried")
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'jobs.db'}",
        spark_remote=f"sc://127.0.0.1:{delta_spark_server.port}",
        lake_roots=[str(lake)],
        app_id=APP_ID,
        backoff_base_seconds=0.05,
        backoff_max_seconds=0.1,
        heartbeat_seconds=0.5,
    )
    manager = JobManager.from_url(settings.database_url, lease_seconds=settings.lease_seconds)
    manager.migrate()
    runner = FailsOnceAfterCommit(EngineRunner(settings))
    worker = Worker(settings, manager=manager, runner=runner)
    try:
        client = TestClient(create_app(settings, manager=manager))
        body = {
            "target": str(table),
            "source": {
                "rows": [{"id": 3, "name": "Cy", "tier": "gold"}],
                "schema": "id BIGINT, name STRING, tier STRING",
            },
            "on": "target.id = source.id",
            "when_matched": [{"action": "update_all"}],
            "engine": "delta",
        }
        job_id = client.post("/merges", json=body).json()["id"]
        deadline = time.monotonic() + 180
        while manager.get(job_id).status not in (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED):
            assert time.monotonic() < deadline
            worker.run_once() or time.sleep(0.05)
        job = manager.get(job_id)
        assert job.status is Status.SUCCEEDED, job
        assert (job.attempts, job.table_version) == (2, 1)
        assert DeltaTable(str(table)).version() == 1, "one commit, not two"
        info = next(a["commitInfo"] for a in commit_entry(table, 1) if "commitInfo" in a)
        assert job.metrics == {k: int(v) for k, v in info["operationMetrics"].items()}
        assert job.result == {
            "num_affected_rows": 1,
            "num_updated_rows": 1,
            "num_deleted_rows": 0,
            "num_inserted_rows": 0,
        }
    finally:
        runner.close()
        manager.dispose()


# --- the spec's options as Delta's settings ---------------------------------------------------------------------


def test_schema_evolution_is_deltas_auto_merge(delta_spark: SparkSession, tmp_path: Path) -> None:
    table = customers(tmp_path, "evolving")
    spec = engine.MergeSpec(
        target=str(table),
        source=engine.RowsSource(rows=[{"id": 4, "name": "Dan", "tier": "gold", "email": "d@x"}]),
        on="t.id = s.id",
        not_matched=(engine.MergeClause("notMatched", engine.InsertAction(star=True)),),
        target_alias="t",
        source_alias="s",
        lake_roots=(str(tmp_path),),
    )
    fixed = engine.run_delta_merge(delta_spark, spec)
    assert "email" not in DeltaTable(str(table)).schema().to_arrow().names, "no evolution unless asked for"
    assert fixed.result["num_inserted_rows"] == 1
    later = engine.RowsSource(rows=[{"id": 5, "name": "Eve", "tier": "gold", "email": "e@x"}])
    evolved = engine.run_delta_merge(delta_spark, dataclasses.replace(spec, source=later, schema_evolution=True))
    assert (evolved.table_version, evolved.result["num_inserted_rows"]) == (2, 1)
    data = rows_of(table)
    assert data["id"] == [1, 2, 3, 4, 5] and data["email"] == [None, None, None, None, "e@x"]


@pytest.mark.parametrize(("mode", "vectors"), [("auto", True), ("off", False)])
def test_the_deletion_vectors_choice_reaches_deltas_merge(
    delta_spark: SparkSession, tmp_path: Path, mode: str, vectors: bool
) -> None:
    table = make_delta_table(
        delta_spark,
        tmp_path / "vectors",
        "id BIGINT, name STRING",
        [(i, f"n{i}") for i in range(20)],
        properties={"delta.enableDeletionVectors": "true"},
    )
    spec = engine.MergeSpec(
        target=str(table),
        source=engine.RowsSource(rows=[{"id": 3, "name": "three"}], schema="id BIGINT, name STRING"),
        on="t.id = s.id",
        matched=(engine.MergeClause("matched", engine.UpdateAction(star=True)),),
        target_alias="t",
        source_alias="s",
        lake_roots=(str(tmp_path),),
        deletion_vectors=mode,  # type: ignore[arg-type]
    )
    result = engine.run_delta_merge(delta_spark, spec)
    added = [a["add"] for a in commit_entry(table, result.table_version or 0) if "add" in a]
    assert any(a.get("deletionVector") for a in added) is vectors
    assert (result.metrics["numTargetDeletionVectorsAdded"] > 0) is vectors
    assert (result.metrics["numTargetRowsCopied"] == 0) is vectors
    # deltalake does not read deletion vectors: Delta does.
    merged = delta_spark.read.format("delta").load(str(table))
    assert (merged.count(), merged.where("id = 3").first()["name"]) == (20, "three")  # type: ignore[index]


def test_a_spark_without_delta_fails_the_merge_saying_so(spark: SparkSession, tmp_path: Path) -> None:
    """The product's own Spark Connect server has no Delta: Spark's "table not found" for a table that exists
    becomes what is missing, and the table is untouched."""
    table = customers(tmp_path, "no-delta")
    with pytest.raises(engine_errors.MergeExecutionError, match="has no Delta Lake") as failed:
        engine.run_delta_merge(spark, upsert_spec(table, tmp_path), txn=engine.AppTransaction("no-delta", 1))
    assert "DeltaSparkSessionExtension" in str(failed.value) and '"builtin"' in str(failed.value)
    assert DeltaTable(str(table)).version() == 0
