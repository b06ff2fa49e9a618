"""AUTO CDC through the API: `merge-service serve` as its own process, a Spark Connect server, batches submitted
as jobs, the tables read back with delta-rs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder

from tests.e2e.harness import finished_job, serving

SCHEMA = "id BIGINT, op STRING, ts BIGINT, name STRING, city STRING"


@pytest.fixture(scope="module")
def service(spark_remote: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with serving(tmp_path_factory.mktemp("service"), spark_remote, ready="/healthz", timeout=90) as service:
        yield service


def cdc_body(target: Path, rows: list[dict[str, Any]], **auto_cdc: Any) -> dict[str, Any]:
    options: dict[str, Any] = {
        "keys": ["id"],
        "sequence_by": "ts",
        "apply_as_deletes": "op = 'DELETE'",
        "except_column_list": ["op", "ts"],
    }
    options.update(auto_cdc)
    return {"target": str(target), "source": {"rows": rows, "schema": SCHEMA}, "auto_cdc": options}


def submit(base: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{base}/merges", json=body, timeout=10)
    assert response.status_code == 202, response.text
    return finished_job(base, response.json()["id"], 180)


def table(path: Path) -> list[dict[str, Any]]:
    reader = QueryBuilder().register("t", DeltaTable(str(path))).execute("SELECT * FROM t ORDER BY id, __START_AT")
    return pa.table(reader.read_all()).to_pylist()


def event(id: int, ts: int, op: str = "UPSERT", name: str | None = None, city: str | None = None) -> dict[str, Any]:
    return {"id": id, "op": op, "ts": ts, "name": name, "city": city}


def test_scd1_batches_through_the_api(service: dict[str, Any]) -> None:
    base, lake = service["base"], service["lake"]
    target = lake / "customers"
    first = [event(1, 1, name="Ann", city="Oslo"), event(1, 3, name="Ann", city="Rome"), event(2, 2, name="Bob")]
    job = submit(base, cdc_body(target, first))
    assert job["status"] == "succeeded", job
    assert job["result"]["num_inserted_rows"] == 2
    # Out of order: the delete of 2 is newer than its late update, which must not bring it back.
    second = [event(2, 9, "DELETE"), event(2, 5, name="Bob", city="Late"), event(3, 4, name="Cid")]
    job = submit(base, cdc_body(target, second))
    assert job["status"] == "succeeded", job
    counts = {"num_affected_rows": 2, "num_updated_rows": 0, "num_deleted_rows": 1, "num_inserted_rows": 1}
    assert job["result"] == counts
    third = [event(2, 7, name="Bob", city="Later")]
    assert submit(base, cdc_body(target, third))["result"]["num_affected_rows"] == 0
    assert table(target) == [
        {"id": 1, "name": "Ann", "city": "Rome", "__START_AT": 3},
        {"id": 3, "name": "Cid", "city": None, "__START_AT": 4},
    ]
    assert DeltaTable(str(target)).history()[0]["operation"] == "MERGE"


def test_scd2_history_through_the_api(service: dict[str, Any]) -> None:
    base, lake = service["base"], service["lake"]
    target = lake / "customers_history"
    batches = [
        [event(1, 10, name="Ann", city="Oslo"), event(1, 30, name="Ann", city="Rome")],
        [event(1, 20, name="Ann", city="Pisa"), event(1, 40, "DELETE")],
    ]
    for rows in batches:
        job = submit(base, cdc_body(target, rows, stored_as_scd_type=2, track_history_column_list=["city"]))
        assert job["status"] == "succeeded", job
    assert table(target) == [
        {"id": 1, "name": "Ann", "city": "Oslo", "__START_AT": 10, "__END_AT": 20},
        {"id": 1, "name": "Ann", "city": "Pisa", "__START_AT": 20, "__END_AT": 30},
        {"id": 1, "name": "Ann", "city": "Rome", "__START_AT": 30, "__END_AT": 40},
    ]


@pytest.mark.parametrize(
    ("auto_cdc", "field"),
    [
        ({"keys": []}, "auto_cdc.keys"),
        ({"sequence_by": "reflect('java.lang.System', 'getenv')"}, "auto_cdc.sequence_by"),
        ({"column_list": ["id"], "except_column_list": ["op"]}, "auto_cdc.except_column_list"),
        ({"stored_as_scd_type": 3}, "auto_cdc.stored_as_scd_type"),
        ({"track_history_column_list": ["city"]}, "auto_cdc.track_history_column_list"),
        ({"apply_as_truncates": "op = 'TRUNCATE'", "stored_as_scd_type": 2}, "auto_cdc.apply_as_truncates"),
    ],
)
def test_bad_specs_are_422_naming_the_field(service: dict[str, Any], auto_cdc: dict[str, Any], field: str) -> None:
    body = cdc_body(service["lake"] / "never", [event(1, 1)], **auto_cdc)
    response = httpx.post(f"{service['base']}/merges", json=body, timeout=10)
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["errors"][0]["field"] == field, problem
    assert not (service["lake"] / "never").exists()


def test_a_column_the_batch_lacks_fails_the_job_by_name(service: dict[str, Any]) -> None:
    target = service["lake"] / "missing_key"
    job = submit(service["base"], cdc_body(target, [event(1, 1)], keys=["customer_id"]))
    assert job["status"] == "failed"
    assert "customer_id" in job["error"]["detail"] and job["error"]["detail"].startswith("keys:")
    assert not target.exists()
