"""The HTTP API against the contract: answers, problem documents for every error, and that refused requests
leave nothing in the queue."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service import specs
from service.app import create_app
from service.manager import JobManager
from service.settings import Settings
from tests.service.conftest import FakeClock

PROBLEM = "application/problem+json"
# What a job answers with, the same in a response and in the OpenAPI document's JobOut.
JOB_FIELDS = {
    "id",
    "status",
    "phase",
    "target",
    "submitted_at",
    "started_at",
    "finished_at",
    "attempts",
    "dry_run",
    "engine",
    "table_version",
    "result",
    "metrics",
    "error",
}


def spec(target: str, **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "target": target,
        "source": {"rows": [{"id": 1, "amount": "12.50"}], "schema": "id BIGINT, amount DECIMAL(10,2)"},
        "target_alias": "t",
        "source_alias": "s",
        "on": "t.id = s.id",
        "when_matched": [{"action": "update_all"}],
        "when_not_matched": [{"action": "insert_all"}],
    }
    body.update(overrides)
    return body


def queued(client: TestClient) -> int:
    return len(client.get("/merges").json()["items"])


def assert_problem(response: Any, status: int, field: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    body = response.json()
    assert body["status"] == status and body["title"] and body["type"]
    if field is not None:
        assert field in [e["field"] for e in body["errors"]], body
        assert field in body["detail"]
    return body


def test_submit_answers_202_with_location_and_retry_after(client: TestClient, target: str) -> None:
    response = client.post("/merges", json=spec(target))
    assert response.status_code == 202
    job = response.json()
    assert response.headers["location"] == f"/merges/{job['id']}"
    assert response.headers["retry-after"] == "2"
    assert set(job) == JOB_FIELDS
    assert (job["status"], job["phase"], job["target"], job["attempts"]) == ("queued", "queued", target, 0)
    assert job["submitted_at"].endswith("Z")
    read = client.get(f"/merges/{job['id']}")
    assert read.status_code == 200 and read.json() == job and read.headers["retry-after"] == "2"


def test_sql_body_and_file_uri(client: TestClient, target: str, lake: Path) -> None:
    (lake / "updates").mkdir()
    sql = (
        f"MERGE INTO delta.`file://{target}` AS t USING delta.`{lake}/updates` AS s ON t.id = s.id "
        "WHEN MATCHED AND s.op = 'D' THEN DELETE WHEN MATCHED THEN UPDATE SET amount = s.amount "
        "WHEN NOT MATCHED THEN INSERT *"
    )
    response = client.post("/merges", json={"sql": sql})
    assert response.status_code == 202, response.text
    listed = client.get("/merges", params={"target": target}).json()["items"]
    assert [j["id"] for j in listed] == [response.json()["id"]]


def test_sql_body_takes_dry_run_and_schema_evolution(client: TestClient, target: str, lake: Path) -> None:
    (lake / "updates").mkdir()
    sql = f"MERGE INTO delta.`{target}` AS t USING delta.`{lake}/updates` AS s ON t.id = s.id WHEN MATCHED THEN DELETE"
    response = client.post("/merges", json={"sql": sql, "dry_run": True, "schema_evolution": True})
    assert response.status_code == 202, response.text
    assert response.json()["dry_run"] is True
    built = specs.build_merge(specs.parse_request({"sql": sql, "schema_evolution": True}), client.app.state.roots)
    assert built.spec.schema_evolution and not built.dry_run
    assert_problem(client.post("/merges", json={"sql": sql, "dry_run": "maybe"}), 422, "dry_run")


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"when_matched": [{"action": "delete"}, {"action": "update_all"}]}, "when_matched[0].condition"),
        ({"when_matched": [{"action": "update", "set": {"amount": "s.amount +"}}]}, "when_matched[0].set.amount"),
        (
            {
                "when_matched": [
                    {"condition": "s.op = 'D'", "action": "delete"},
                    {"condition": "reflect('java.lang.Runtime', 'getRuntime')", "action": "update_all"},
                ]
            },
            "when_matched[1].condition",
        ),
        ({"on": "t.id = s.id AND java_method('java.lang.System', 'exit', 1) = 1"}, "on"),
        ({"on": "t.id IN (SELECT id FROM other)"}, "on"),
        (
            {"when_not_matched": [{"action": "insert", "values": {"id": "rand()"}, "condition": "rand() > 0.5"}]},
            "when_not_matched[0].condition",
        ),
        ({"when_matched": [], "when_not_matched": []}, "when_matched"),
        ({"when_matched": [{"action": "insert_all"}]}, "when_matched[0]"),
        ({"when_not_matched_by_source": [{"action": "update_all"}]}, "when_not_matched_by_source[0]"),
        ({"source_alias": "T"}, "source_alias"),
        ({"on": ""}, "on"),
        ({"when_matched": [{"action": "update", "set": {"amount": "{#"}}]}, "when_matched[0].set.amount"),
        ({"surprise": 1}, "surprise"),
        ({"source": {"format": "avro", "path": "/x"}}, "source.format"),
        ({"source": {"rows": [{"id": 1}, {"id": "x"}], "schema": "id BIGINT"}}, "source.rows[1].id"),
        ({"source": {"rows": [{"id": 1}], "schema": "id NOT_A_TYPE"}}, "source.schema"),
        ({"source": {"rows": [{"id": 1}, {"id": None}], "schema": "id BIGINT NOT NULL"}}, "source.rows[1].id"),
        ({"dry_run": "yes"}, "dry_run"),
        ({"dry_run": 1}, "dry_run"),
        ({"schema_evolution": "true"}, "schema_evolution"),
        # A clause that sees one side only may not name the other (no schema needed to know it).
        (
            {"when_not_matched": [{"action": "insert", "values": {"id": "s.id", "amount": "t.amount"}}]},
            "when_not_matched[0].values.amount",
        ),
        (
            {"when_not_matched_by_source": [{"condition": "s.op = 'D'", "action": "delete"}]},
            "when_not_matched_by_source[0].condition",
        ),
    ],
)
def test_invalid_specs_are_422_naming_the_field_and_enqueue_nothing(
    client: TestClient, target: str, overrides: dict[str, Any], field: str
) -> None:
    response = client.post("/merges", json=spec(target, **overrides))
    assert_problem(response, 422, field)
    assert queued(client) == 0


def test_invalid_sql_is_422(client: TestClient, target: str) -> None:
    response = client.post("/merges", json={"sql": "MERGE INTO nowhere"})
    assert_problem(response, 422, "sql")
    forbidden = (
        f"MERGE INTO delta.`{target}` t USING delta.`{target}` s ON t.id = s.id "
        "WHEN MATCHED AND reflect('java.lang.Thread', 'sleep', 1) IS NULL THEN DELETE"
    )
    assert_problem(client.post("/merges", json={"sql": forbidden}), 422, "sql")
    assert queued(client) == 0


def test_malformed_bodies_are_problems(client: TestClient) -> None:
    bad_json = client.post("/merges", content=b"{not json", headers={"content-type": "application/json"})
    assert_problem(bad_json, 422)
    assert_problem(client.post("/merges", json=[1, 2]), 422)
    assert_problem(client.post("/merges", json={"sql": ""}), 422, "sql")
    assert queued(client) == 0


@pytest.mark.parametrize(
    "location",
    [
        "{lake}/../outside",
        "{lake}/a/../../outside",
        "/etc",
        "relative/path",
        "s3://bucket/table",
        "hdfs://namenode/lake/t",
        "file://otherhost{lake}/t",
        "{lake}",
        "{lake}/link/t",
        "{lake}/t\x00",
    ],
)
def test_paths_must_resolve_inside_a_lake_root(client: TestClient, lake: Path, tmp_path: Path, location: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    if not (lake / "link").exists():
        os.symlink(outside, lake / "link")
    path = location.format(lake=lake)
    assert_problem(client.post("/merges", json=spec(path)), 422, "target")
    body = spec(str(lake / "t"), source={"format": "delta", "path": path})
    assert_problem(client.post("/merges", json=body), 422, "source.path")
    sql = f"MERGE INTO delta.`{path}` t USING delta.`{lake}/s` s ON t.id = s.id WHEN MATCHED THEN DELETE"
    if "\x00" not in path and "`" not in path:
        assert_problem(client.post("/merges", json={"sql": sql}), 422, "sql")
    assert queued(client) == 0


def test_idempotency_key(client: TestClient, target: str) -> None:
    headers = {"Idempotency-Key": "batch-42"}
    first = client.post("/merges", json=spec(target), headers=headers)
    again = client.post("/merges", json=spec(target), headers=headers)
    assert (first.status_code, again.status_code) == (202, 200)
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["location"] == first.headers["location"]
    spelled = client.post("/merges", json={**spec(target), "deletion_vectors": "auto"}, headers=headers)
    assert (spelled.status_code, spelled.json()["id"]) == (200, first.json()["id"])  # the default, spelled out
    assert_problem(client.post("/merges", json={**spec(target), "deletion_vectors": "off"}, headers=headers), 409)
    conflict = client.post("/merges", json=spec(target, on="t.id = s.id AND t.amount > 0"), headers=headers)
    assert_problem(conflict, 409)
    assert queued(client) == 1


def test_reader_options_given_as_json_or_as_text_are_one_body(client: TestClient, target: str) -> None:
    """``true`` and ``"true"`` are the same option to Spark: the same Idempotency-Key finds the same job."""
    headers = {"Idempotency-Key": "csv-7"}
    path = str(Path(target).parent / "source.csv")

    def csv(options: dict[str, Any]) -> dict[str, Any]:
        return spec(target, source={"format": "csv", "path": path, "options": options})

    first = client.post("/merges", json=csv({"header": True, "samplingRatio": 0.5}), headers=headers)
    again = client.post("/merges", json=csv({"header": "true", "samplingRatio": "0.5"}), headers=headers)
    assert (first.status_code, again.status_code) == (202, 200)
    assert again.json()["id"] == first.json()["id"]
    assert_problem(client.post("/merges", json=csv({"header": False}), headers=headers), 409)


def test_idempotency_key_is_scoped_per_token(settings: Settings, target: str) -> None:
    secured = settings.model_copy(update={"api_tokens": ["s3cret", "other"]})
    manager = JobManager.from_url(secured.database_url)
    manager.migrate()
    client = TestClient(create_app(secured, manager=manager))
    alice = {"Idempotency-Key": "nightly", "Authorization": "Bearer s3cret"}
    bob = {"Idempotency-Key": "nightly", "Authorization": "Bearer other"}
    first = client.post("/merges", json=spec(target), headers=alice)
    second = client.post("/merges", json=spec(target), headers=bob)
    assert (first.status_code, second.status_code) == (202, 202)
    assert first.json()["id"] != second.json()["id"]
    again = client.post("/merges", json=spec(target), headers=alice)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    other_body = spec(target, on="t.id = s.id AND t.amount > 0")
    assert_problem(client.post("/merges", json=other_body, headers=bob), 409)
    assert client.post("/merges", json=other_body, headers={**alice, "Idempotency-Key": "n2"}).status_code == 202
    assert len(manager.list_jobs()[0]) == 3
    manager.dispose()


def test_pagination_newest_first(client: TestClient, target: str) -> None:
    ids = [client.post("/merges", json=spec(target)).json()["id"] for _ in range(5)]
    page1 = client.get("/merges", params={"limit": 2}).json()
    page2 = client.get("/merges", params={"limit": 2, "cursor": page1["next_cursor"]}).json()
    page3 = client.get("/merges", params={"limit": 2, "cursor": page2["next_cursor"]}).json()
    got = [j["id"] for p in (page1, page2, page3) for j in p["items"]]
    assert got == list(reversed(ids)) and page3["next_cursor"] is None
    assert client.get("/merges", params={"status": "queued"}).json()["items"][0]["id"] == ids[-1]
    assert client.get("/merges", params={"status": "succeeded"}).json() == {"items": [], "next_cursor": None}
    assert_problem(client.get("/merges", params={"cursor": "garbage"}), 422, "query cursor")
    assert_problem(client.get("/merges", params={"limit": 0}), 422, "query limit")
    # Over the maximum is served as the maximum, not refused.
    assert len(client.get("/merges", params={"limit": 100_000}).json()["items"]) == 5
    assert_problem(client.get("/merges", params={"status": "done"}), 422, "query status")
    outside = assert_problem(client.get("/merges", params={"target": "/etc"}), 422, "query target")
    assert outside["type"].endswith(":invalid-request") and outside["title"] == "Path outside the lake"


def test_an_empty_query_value_is_not_given(client: TestClient, target: str) -> None:
    """As forms and URL templates send them: ``?status=&target=&limit=&cursor=`` lists as ``/merges`` does."""
    ids = [client.post("/merges", json=spec(target)).json()["id"] for _ in range(3)]
    every = client.get("/merges?status=&target=&limit=&cursor=")
    assert every.status_code == 200 and [j["id"] for j in every.json()["items"]] == list(reversed(ids))
    assert every.json() == client.get("/merges").json()
    page = client.get("/merges?status=&limit=2&cursor=").json()
    assert [j["id"] for j in page["items"]] == list(reversed(ids))[:2]
    rest = client.get(f"/merges?limit=2&status=queued&cursor={page['next_cursor']}&target=").json()
    assert [j["id"] for j in rest["items"]] == ids[:1] and rest["next_cursor"] is None
    assert client.get("/merges?status=succeeded&target=").json() == {"items": [], "next_cursor": None}
    listing = client.get("/openapi.json").json()["paths"]["/merges"]["get"]
    assert {p["name"]: p.get("allowEmptyValue") for p in listing["parameters"]} == dict.fromkeys(
        ("status", "target", "limit", "cursor"), True
    ), "the OpenAPI says so"


def test_cancel(client: TestClient, target: str) -> None:
    job = client.post("/merges", json=spec(target)).json()
    response = client.post(f"/merges/{job['id']}/cancel")
    assert response.status_code == 202
    body = response.json()
    assert body["status"] == "cancelled" and body["error"]["title"] == "Merge cancelled"
    assert set(body["error"]) == {"type", "title", "detail"}
    assert "retry-after" not in response.headers
    assert 'merge_jobs_finished_total{outcome="cancelled"} 1.0' in client.get("/metrics").text
    again = client.post(f"/merges/{job['id']}/cancel")
    assert again.status_code == 202 and again.json() == body
    assert_problem(client.post("/merges/unknown/cancel"), 404)


def test_unknown_job_and_route_and_method(client: TestClient) -> None:
    assert_problem(client.get("/merges/01ABC"), 404)
    long = assert_problem(client.get("/merges/" + "x" * 20_000), 404)
    assert len(long["detail"]) < 200 and "(20000 characters)" in long["detail"]
    assert_problem(client.get("/nothing-here"), 404)
    assert_problem(client.delete("/merges"), 405)


def test_head_answers_as_get_without_a_body(client: TestClient, target: str) -> None:
    job = client.post("/merges", json=spec(target)).json()
    for path in (f"/merges/{job['id']}", "/merges", "/healthz", "/metrics"):
        got, head = client.get(path), client.head(path)
        assert head.status_code == got.status_code == 200, path
        assert head.content == b"" and head.headers["content-type"] == got.headers["content-type"], path
    head = client.head(f"/merges/{job['id']}")
    assert head.headers["retry-after"] == "2"
    assert int(head.headers["content-length"]) == len(client.get(f"/merges/{job['id']}").content)
    missing = client.head("/merges/unknown")
    assert missing.status_code == 404 and missing.content == b""
    assert client.head(f"/merges/{job['id']}/cancel").status_code == 405  # a POST-only route
    assert 'merge_http_requests_total{method="HEAD",route="/merges/{id}",status="200"}' in client.get("/metrics").text


def test_body_over_the_limit_is_413(settings: Settings, target: str) -> None:
    small = settings.model_copy(update={"max_body_bytes": 2048})
    manager = JobManager.from_url(small.database_url)
    manager.migrate()
    client = TestClient(create_app(small, manager=manager))
    rows = [{"id": i, "amount": "1.00"} for i in range(200)]
    body = spec(target, source={"rows": rows, "schema": "id BIGINT, amount DECIMAL(10,2)"})
    assert_problem(client.post("/merges", json=body), 413)

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit holds while reading
        yield b'{"sql": "'
        for _ in range(100):
            yield b"x" * 100
        yield b'"}'

    assert_problem(client.post("/merges", content=chunks(), headers={"content-type": "application/json"}), 413)
    assert len(manager.list_jobs()[0]) == 0


def test_bearer_tokens(settings: Settings, target: str) -> None:
    secured = settings.model_copy(update={"api_tokens": ["s3cret", "other"]})
    manager = JobManager.from_url(secured.database_url)
    manager.migrate()
    client = TestClient(create_app(secured, manager=manager))
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "Basic czNjcmV0"},
        {"Authorization": "Bearer s3cre"},
    ):
        response = client.post("/merges", json=spec(target), headers=headers)
        assert_problem(response, 401)
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert_problem(client.get("/merges", headers=headers), 401)
        assert_problem(client.get("/merges/x", headers=headers), 401)
    assert len(manager.list_jobs()[0]) == 0
    ok = client.post("/merges", json=spec(target), headers={"Authorization": "Bearer other"})
    assert ok.status_code == 202
    assert client.get("/healthz").status_code == 200


def test_database_unreachable_is_503(settings: Settings, target: str) -> None:
    down = settings.model_copy(update={"database_url": "postgresql://nobody@127.0.0.1:9/none"})
    client = TestClient(create_app(down), raise_server_exceptions=False)
    response = client.post("/merges", json=spec(target))
    assert_problem(response, 503)
    assert response.headers["retry-after"]
    assert_problem(client.get("/merges"), 503)
    assert client.get("/healthz").status_code == 200
    ready = client.get("/readyz")
    assert ready.status_code == 503 and ready.json()["status"] == "unavailable"
    assert "merge_job_database_up 0.0" in client.get("/metrics").text


def test_readyz_checks_schema_level(settings: Settings) -> None:
    manager = JobManager.from_url(settings.database_url)
    client = TestClient(create_app(settings, manager=manager))
    not_migrated = client.get("/readyz")
    assert not_migrated.status_code == 503 and not_migrated.json()["checks"]["schema"] != "ok"
    manager.migrate()
    assert client.get("/readyz").json() == {"status": "ok", "checks": {"database": "ok", "schema": "ok"}}


def test_readyz_includes_in_process_workers(settings: Settings) -> None:
    class Down:
        def readiness(self) -> tuple[bool, str]:
            return False, "Spark Connect does not answer"

    manager = JobManager.from_url(settings.database_url)
    manager.migrate()
    client = TestClient(create_app(settings, manager=manager, workers=[Down()]))
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["worker-0"] == "Spark Connect does not answer"


def test_metrics(client: TestClient, target: str, clock: FakeClock) -> None:
    client.post("/merges", json=spec(target))
    client.post("/merges", json=spec(target))
    client.get("/merges/nope")
    text = client.get("/metrics").text
    assert "merge_jobs_submitted_total 2.0" in text
    assert "merge_jobs_queued 2.0" in text
    assert "merge_oldest_queued_job_age_seconds" in text
    assert 'merge_http_requests_total{method="GET",route="/merges/{id}",status="404"} 1.0' in text
    assert "merge_http_request_seconds_bucket" in text
    # This app runs no worker: the workers' series, never set here, are not exported (NaN would spoil a sum).
    assert "merge_spark_executors" not in text and "merge_callback_deliveries" not in text


def test_openapi_describes_the_contract(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    assert set(doc["paths"]) == {"/merges", "/merges/{id}", "/merges/{id}/cancel", "/healthz", "/readyz", "/metrics"}
    post = doc["paths"]["/merges"]["post"]
    assert set(post["responses"]) == {"202", "200", "401", "409", "413", "415", "422", "503"}
    # A job's id is any string (an unknown one is a 404): no 422 is possible, so none is documented.
    assert set(doc["paths"]["/merges/{id}"]["get"]["responses"]) == {"200", "401", "404", "503"}
    assert set(doc["paths"]["/merges/{id}/cancel"]["post"]["responses"]) == {"202", "401", "404", "503"}
    assert set(doc["paths"]["/merges"]["get"]["responses"]) == {"200", "401", "422", "503"}
    assert "application/problem+json" in post["responses"]["422"]["content"]
    assert {p["name"] for p in post["parameters"]} == {"Idempotency-Key"}
    body = post["requestBody"]["content"]["application/json"]["schema"]
    assert [ref["$ref"].rsplit("/", 1)[1] for ref in body["oneOf"]] == [
        "StructuredMergeIn",
        "SqlMergeIn",
        "AutoCdcMergeIn",
    ]
    assert "HTTPValidationError" not in str(doc)
    operation_ids = {op["operationId"] for item in doc["paths"].values() for op in item.values()}
    links = {
        (path, method, code, name): link
        for path, item in doc["paths"].items()
        for method, op in item.items()
        for code, answer in op["responses"].items()
        for name, link in answer.get("links", {}).items()
    }
    assert set(links) == {
        ("/merges", "post", "202", "GetMerge"),
        ("/merges", "post", "202", "CancelMerge"),
        ("/merges", "post", "200", "GetMerge"),
        ("/merges", "post", "200", "CancelMerge"),
        ("/merges/{id}", "get", "200", "CancelMerge"),
        ("/merges/{id}/cancel", "post", "202", "GetMerge"),
    }
    for link in links.values():
        assert link["operationId"] in operation_ids and link["parameters"] == {"id": "$response.body#/id"}
    job = doc["components"]["schemas"]["JobOut"]
    assert set(job["properties"]) == JOB_FIELDS | {"callback", "timings"}  # present on some jobs only


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_body_not_sent_as_json_is_415(client: TestClient, target: str, content_type: str | None) -> None:
    """The body is a valid spec; only its Content-Type is wrong, and the answer says so instead of a 422."""
    headers = {} if content_type is None else {"Content-Type": content_type}
    response = client.post("/merges", content=json.dumps(spec(target)).encode(), headers=headers)
    problem = assert_problem(response, 415)
    assert problem["type"] == "urn:merge-service:problem:unsupported-media-type"
    assert "application/json" in problem["detail"] and response.headers["accept-post"] == "application/json"
    assert client.get("/merges").json()["items"] == []


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "APPLICATION/JSON", "application/x+json"])
def test_json_bodies_are_taken_whatever_their_parameters(client: TestClient, target: str, content_type: str) -> None:
    response = client.post("/merges", content=json.dumps(spec(target)).encode(), headers={"Content-Type": content_type})
    assert response.status_code == 202, response.text


def test_a_source_option_of_the_wrong_type_is_one_error_naming_the_option(client: TestClient, target: str) -> None:
    body = {**spec(target), "source": {"format": "csv", "path": f"{target}/in.csv", "options": {"sep": {"x": 1}}}}
    problem = assert_problem(client.post("/merges", json=body), 422, "source.options.sep")
    assert problem["errors"] == [
        {
            "field": "source.options.sep",
            "message": "Input should be a valid string or a valid boolean or a valid integer or a valid number",
        }
    ]


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"sep": ";"}, "a Delta source takes only versionAsOf or timestampAsOf (time travel), or readChangeFeed"),
        ({"readChangeFeed": True}, "[DELTA_NO_START_FOR_CDC_READ]"),
        ({"startingVersion": 2}, "startingVersion bounds a Change Data Feed read; set readChangeFeed to 'true'"),
        ({"versionAsOf": 1, "timestampAsOf": "2024-01-01"}, "[DELTA_ONEOF_IN_TIMETRAVEL]"),
        ({"versionAsOf": "latest"}, "[DELTA_TIME_TRAVEL_INVALID_BEGIN_VALUE]"),
    ],
)
def test_a_delta_sources_options_are_checked_at_submission(
    client: TestClient, target: str, options: dict[str, Any], words: str
) -> None:
    """A Delta source takes Delta's time travel and Change Data Feed options; anything else is a 422 naming the
    options, not an option silently ignored, and no job is queued."""
    body = spec(target, source={"format": "delta", "path": f"{target}/source", "options": options})
    problem = assert_problem(client.post("/merges", json=body), 422, "source.options")
    assert words in problem["detail"]
    assert queued(client) == 0
