"""The whole path, real at every step: `merge-service serve` as its own process, a separate Spark Connect
server process, SQLite job table, Delta tables on disk checked with deltalake."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder, write_deltalake
from deltalake.table import TableFeatures

from tests.e2e.harness import finished_job, serving, upsert_body


@pytest.fixture(scope="module")
def service(spark_remote: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with serving(tmp_path_factory.mktemp("service"), spark_remote, ready="/healthz", timeout=90) as service:
        yield service


def wait_for(base: str, job_id: str, timeout: float = 180) -> dict[str, Any]:
    return finished_job(base, job_id, timeout)


def test_upsert_end_to_end(service: dict[str, Any]) -> None:
    base, lake = service["base"], service["lake"]
    table = lake / "customers"
    write_deltalake(
        str(table),
        pa.table(
            {"id": pa.array([1, 2, 3], pa.int64()), "name": ["Ann", "Bob", "Cid"], "tier": ["free", "free", "gold"]}
        ),
    )
    body = upsert_body(
        table,
        [{"id": 2, "name": "Bea", "tier": "gold"}, {"id": 4, "name": "Dan", "tier": "silver"}],
        "id BIGINT, name STRING, tier STRING",
    )
    response = httpx.post(f"{base}/merges", json=body, timeout=10)
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    assert response.headers["location"] == f"/merges/{job_id}"
    job = wait_for(base, job_id)
    assert job["status"] == "succeeded", job
    assert job["table_version"] == 1
    assert job["result"] == {
        "num_affected_rows": 2,
        "num_updated_rows": 1,
        "num_deleted_rows": 0,
        "num_inserted_rows": 1,
    }
    assert job["metrics"]["numSourceRows"] == 2
    assert job["metrics"]["numTargetRowsInserted"] == 1
    assert job["metrics"]["numTargetRowsMatchedUpdated"] == 1
    # Where the time went adds up to the job's wall time, and the engine's phases hold its execution time.
    timings = job["timings"]
    wall_ms = (datetime.fromisoformat(job["finished_at"]) - datetime.fromisoformat(job["submitted_at"])).total_seconds()
    wall_ms *= 1000
    assert abs(sum(timings.values()) - wall_ms) <= 0.05 * wall_ms, (timings, wall_ms)
    assert all(value >= 0 for value in timings.values()), timings
    engine_ms = sum(timings[p] for p in ("preparing_source", "finding_touched_files", "writing", "committing"))
    assert engine_ms + timings["starting"] >= job["metrics"]["executionTimeMs"], (timings, job["metrics"])

    dt = DeltaTable(str(table))
    assert dt.version() == 1
    data = dt.to_pyarrow_table().sort_by("id").to_pydict()
    assert data == {
        "id": [1, 2, 3, 4],
        "name": ["Ann", "Bea", "Cid", "Dan"],
        "tier": ["free", "gold", "gold", "silver"],
    }
    commit = dt.history(1)[0]
    assert commit["operation"] == "MERGE"
    metrics = commit["operationMetrics"]
    # Delta records operationMetrics as strings.
    assert metrics["numTargetRowsInserted"] == "1"
    assert metrics["numTargetRowsUpdated"] == "1"
    assert metrics["numSourceRows"] == "2"
    assert metrics["numOutputRows"] == str(job["metrics"]["numOutputRows"])


def test_missing_target_fails_with_a_clear_error(service: dict[str, Any]) -> None:
    base, lake = service["base"], service["lake"]
    body = {
        "target": str(lake / "nope"),
        "source": {"rows": [{"id": 1}], "schema": "id BIGINT"},
        "on": "target.id = source.id",
        "when_not_matched": [{"action": "insert_all"}],
    }
    response = httpx.post(f"{base}/merges", json=body, timeout=10)
    assert response.status_code == 202, response.text
    job = wait_for(base, response.json()["id"])
    assert job["status"] == "failed"
    assert job["error"]["title"]
    assert str(lake / "nope") in job["error"]["detail"]
    assert job["table_version"] is None


def test_invalid_body_is_422_problem_naming_the_field(service: dict[str, Any]) -> None:
    base = service["base"]
    body = {
        "target": str(service["lake"] / "customers"),
        "source": {"rows": [{"id": 1}]},
        "on": "target.id = source.id",
        "when_matched": [{"action": "explode"}],
    }
    response = httpx.post(f"{base}/merges", json=body, timeout=10)
    assert response.status_code == 422
    assert response.headers["content-type"].startswith("application/problem+json")
    problem = response.json()
    assert problem["status"] == 422
    assert "when_matched" in str(problem)


def test_a_broken_check_constraint_fails_the_job_and_keeps_the_table(service: dict[str, Any]) -> None:
    base, lake = service["base"], service["lake"]
    table = lake / "balances"
    write_deltalake(str(table), pa.table({"id": pa.array([1, 2], pa.int64()), "balance": pa.array([5, 9], pa.int64())}))
    DeltaTable(str(table)).alter.add_constraint({"balance_nonneg": "balance >= 0"})
    body = {
        "target": str(table),
        "source": {"rows": [{"id": 2, "delta": -4}, {"id": 1, "delta": -6}], "schema": "id BIGINT, delta BIGINT"},
        "on": "target.id = source.id",
        "when_matched": [{"action": "update", "set": {"balance": "target.balance + source.delta"}}],
    }
    job = wait_for(base, httpx.post(f"{base}/merges", json=body, timeout=10).json()["id"])
    assert job["status"] == "failed"
    assert job["error"]["type"] == "urn:merge-service:problem:invariant-violation"
    assert job["error"]["status"] == 422
    assert job["error"]["detail"] == (
        "[DELTA_VIOLATE_CONSTRAINT_WITH_VALUES] CHECK constraint balance_nonneg "
        "(balance >= 0) violated by row with values:\n - balance : -1"
    )
    assert job["table_version"] is None
    assert DeltaTable(str(table)).version() == 1  # the constraint's own commit; the merge added none
    body["source"]["rows"] = [{"id": 2, "delta": -4}]
    job = wait_for(base, httpx.post(f"{base}/merges", json=body, timeout=10).json()["id"])
    assert job["status"] == "succeeded", job
    assert DeltaTable(str(table)).to_pyarrow_table().sort_by("id").to_pydict() == {"id": [1, 2], "balance": [5, 5]}


def _dv_table(path: Path) -> Path:
    """Three rows in one file, with deletion vectors enabled as Databricks creates tables."""
    write_deltalake(str(path), pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]}))
    dt = DeltaTable(str(path))
    dt.alter.add_feature([TableFeatures.DeletionVectors], allow_protocol_versions_increase=True)
    dt.alter.set_table_properties({"delta.enableDeletionVectors": "true"})
    return path


def _newest_commit(table: Path) -> list[dict[str, Any]]:
    version = DeltaTable(str(table)).version()
    lines = (table / "_delta_log" / f"{version:020d}.json").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize(
    ("form", "choice"), [("spec", None), ("spec", "auto"), ("spec", "off"), ("sql", "off"), ("sql", None)]
)
def test_a_merge_chooses_deletion_vectors_or_a_rewrite(service: dict[str, Any], form: str, choice: str | None) -> None:
    """``deletion_vectors``: ``auto`` (the default) writes a vector where the table enables them, ``off`` rewrites
    the touched file as Delta does with ``merge.deletionVectors.persistent`` false; the rows are the same."""
    base, lake = service["base"], service["lake"]
    table = _dv_table(lake / f"dv-choice-{form}-{choice}")
    body: dict[str, Any]
    if form == "spec":
        body = upsert_body(table, [{"id": 2, "v": "B"}, {"id": 4, "v": "d"}], "id BIGINT, v STRING")
    else:
        body = {
            "sql": f"MERGE INTO delta.`{table}` AS t USING (SELECT 2L AS id, 'B' AS v UNION ALL SELECT 4L, 'd') AS s "
            "ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
        }
    if choice is not None:
        body["deletion_vectors"] = choice
    response = httpx.post(f"{base}/merges", json=body, timeout=10)
    assert response.status_code == 202, response.text
    job = wait_for(base, response.json()["id"])
    assert job["status"] == "succeeded", job
    actions = _newest_commit(table)
    adds = [a["add"] for a in actions if "add" in a]
    removes = [a["remove"] for a in actions if "remove" in a]
    written = choice != "off"
    assert any("deletionVector" in a for a in adds) == written, actions
    assert job["metrics"]["numTargetDeletionVectorsAdded"] == (1 if written else 0)
    assert job["metrics"]["numTargetRowsCopied"] == (0 if written else 2)
    if not written:  # the touched file is removed and its rows written again
        assert len(removes) == 1 and removes[0]["path"] not in {a["path"] for a in adds}, actions
    rows = QueryBuilder().register("t", DeltaTable(str(table))).execute("SELECT id, v FROM t ORDER BY id").read_all()
    assert pa.table(rows).to_pydict() == {"id": [1, 2, 3, 4], "v": ["a", "B", "c", "d"]}


def test_an_unknown_deletion_vectors_choice_is_422_naming_it(service: dict[str, Any]) -> None:
    base, lake = service["base"], service["lake"]
    body = {**upsert_body(lake / "customers", [{"id": 1}], "id BIGINT"), "deletion_vectors": "always"}
    response = httpx.post(f"{base}/merges", json=body, timeout=10)
    assert response.status_code == 422, response.text
    assert [e["field"] for e in response.json()["errors"]] == ["deletion_vectors"]


def test_a_delta_source_is_merged_at_the_version_asked_or_the_job_fails_saying_why(service: dict[str, Any]) -> None:
    """``versionAsOf`` reads the source as it was; a version its log cannot give fails the job with Delta's
    error class, the target untouched."""
    base, lake = service["base"], service["lake"]
    source, target = lake / "changes", lake / "accounts"
    for rows in ([1, 2], [3]):
        write_deltalake(str(source), pa.table({"id": pa.array(rows, pa.int64())}), mode="append")
    write_deltalake(str(target), pa.table({"id": pa.array([9], pa.int64())}))

    def merge(version: int) -> dict[str, Any]:
        body = {
            "target": str(target),
            "source": {"format": "delta", "path": str(source), "options": {"versionAsOf": version}},
            "on": "target.id = source.id",
            "when_not_matched": [{"action": "insert_all"}],
        }
        response = httpx.post(f"{base}/merges", json=body, timeout=10)
        assert response.status_code == 202, response.text
        return wait_for(base, response.json()["id"])

    job = merge(0)
    assert job["status"] == "succeeded", job
    assert sorted(DeltaTable(str(target)).to_pyarrow_table()["id"].to_pylist()) == [1, 2, 9]
    job = merge(5)
    assert job["status"] == "failed", job
    assert job["error"]["type"].endswith(":source")
    assert (
        "[DELTA_VERSION_NOT_FOUND] Cannot time travel Delta table to version 5. Available versions: [0, 1]."
        in (job["error"]["detail"])
    )
    assert DeltaTable(str(target)).version() == 1


def test_a_delta_sources_change_feed_is_merged_or_the_job_fails_saying_why(service: dict[str, Any]) -> None:
    """``readChangeFeed`` from a version merges the changes since: an append's rows as inserts, a delete's as
    deletes; a start past the source's latest version fails the job with Delta's error class, the target
    untouched."""
    base, lake = service["base"], service["lake"]
    source, target = lake / "feed", lake / "replica"
    feed_on = {"delta.enableChangeDataFeed": "true"}
    write_deltalake(str(source), pa.table({"id": pa.array([1, 2], pa.int64())}), configuration=feed_on)
    write_deltalake(str(source), pa.table({"id": pa.array([3], pa.int64())}), mode="append")
    DeltaTable(str(source)).delete("id = 1")
    write_deltalake(str(target), pa.table({"id": pa.array([1, 9], pa.int64())}))

    def merge(start: int) -> dict[str, Any]:
        options = {"readChangeFeed": True, "startingVersion": start}
        body = {
            "target": str(target),
            "source": {"format": "delta", "path": str(source), "options": options},
            "on": "target.id = source.id",
            "when_matched": [{"action": "delete", "condition": "source._change_type = 'delete'"}],
            "when_not_matched": [{"action": "insert_all", "condition": "source._change_type = 'insert'"}],
        }
        response = httpx.post(f"{base}/merges", json=body, timeout=10)
        assert response.status_code == 202, response.text
        return wait_for(base, response.json()["id"])

    job = merge(1)
    assert job["status"] == "succeeded", job
    assert sorted(DeltaTable(str(target)).to_pyarrow_table()["id"].to_pylist()) == [3, 9]
    assert job["metrics"]["numSourceRows"] == 2
    job = merge(7)
    assert job["status"] == "failed", job
    assert job["error"]["type"].endswith(":source")
    assert (
        "[DELTA_CDC_START_VERSION_AFTER_LATEST] Start version 7 for change data feed exceeds the latest table "
        "version 2." in job["error"]["detail"]
    )
    assert DeltaTable(str(target)).version() == 1
