"""Input limits at submission: every oversized or malformed input is a 422 problem naming the field at fault
(never a 500, a reset connection or a job that fails later), and nothing is queued. The limits themselves are
in engine.inline_rows (row and type nesting, DECIMAL bounds, inferred integers) and engine.expressions (expression
size); the body is read as strict JSON."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from engine.inline_rows import MAX_NESTING
from tests.service.test_api import assert_problem, spec

JSON = {"content-type": "application/json"}


def accepted(client: TestClient, body: dict[str, Any]) -> None:
    response = client.post("/merges", json=body)
    assert response.status_code == 202, response.text


def refused(client: TestClient, field: str, body: dict[str, Any] | bytes) -> dict[str, Any]:
    """The body's 422 names ``field``, and nothing was queued."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    problem = assert_problem(client.post("/merges", content=content, headers=JSON), 422, field)
    assert client.get("/merges").json()["items"] == []
    return problem


def nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"a": value}
    return value


def rows(*values: dict[str, Any], schema: str | None = None) -> dict[str, Any]:
    source: dict[str, Any] = {"rows": list(values)}
    if schema is not None:
        source["schema"] = schema
    return source


# --- F4 / F5: row nesting, DECIMAL bounds, expression size, inferred integers -----------------------------------


@pytest.mark.parametrize("levels", [MAX_NESTING + 1, 100, 254, 300])
def test_rows_nested_beyond_the_bound_are_refused(client: TestClient, target: str, levels: int) -> None:
    body = spec(target, source=rows({"id": 1}, {"id": 2, "x": nested(levels)}))
    problem = refused(client, "source.rows[1].x", body)
    assert f"more than {MAX_NESTING} levels" in problem["detail"]


def test_rows_nested_to_the_bound_are_accepted(client: TestClient, target: str) -> None:
    accepted(client, spec(target, source=rows({"id": 1, "x": [nested(MAX_NESTING - 1)]})))


@pytest.mark.parametrize("declared", ["DECIMAL(100,2)", "DECIMAL(0,0)", "DECIMAL(38,50)"])
def test_decimals_beyond_spark_s_bounds_are_refused(client: TestClient, target: str, declared: str) -> None:
    body = spec(target, source=rows({"id": 1, "amount": "1.00"}, schema=f"id BIGINT, amount {declared}"))
    problem = refused(client, "source.schema", body)
    assert "'amount'" in problem["detail"] and "Spark's DECIMAL" in problem["detail"]


def test_the_widest_decimals_are_accepted(client: TestClient, target: str) -> None:
    widest = "1234567890123456789012345678.1234567890"
    accepted(client, spec(target, source=rows({"id": 1, "amount": widest}, schema="id BIGINT, amount DECIMAL(38,10)")))


@pytest.mark.parametrize(
    ("field", "overrides"),
    [
        ("on", {"on": "(" * 5000 + "t.id = s.id" + ")" * 5000}),
        ("on", {"on": " OR ".join(["t.id = s.id"] * 20_000)}),
        ("on", {"on": " OR ".join(["t.id = s.id"] * 500)}),
        (
            "when_matched[0].condition",
            {"when_matched": [{"action": "delete", "condition": "(" * 400 + "1=1" + ")" * 400}]},
        ),
        (
            "when_not_matched[0].values.id",
            {"when_not_matched": [{"action": "insert", "values": {"id": "-" * 3000 + "1"}}]},
        ),
    ],
    ids=["5000_parentheses", "20000_or_terms", "500_or_terms", "condition", "value"],
)
def test_oversized_expressions_are_refused(
    client: TestClient, target: str, field: str, overrides: dict[str, Any]
) -> None:
    problem = refused(client, field, spec(target, **overrides))
    assert len(problem["detail"]) < 600


def test_oversized_sql_is_refused(client: TestClient, target: str) -> None:
    on = " OR ".join(["t.id = s.id"] * 20_000)
    sql = f"MERGE INTO delta.`{target}` AS t USING delta.`{target}` AS s ON {on} WHEN MATCHED THEN DELETE"
    refused(client, "sql", {"sql": sql})
    deep = "(" * 5000 + "t.id = s.id" + ")" * 5000
    problem = refused(client, "sql", {"sql": sql.replace(on, deep)})
    assert "nest 5000 levels deep" in problem["detail"]
    assert "Recursion" not in problem["detail"]


@pytest.mark.parametrize(
    ("values", "field"),
    [
        (({"id": 1}, {"id": 2**70}), "source.rows[1].id"),
        (({"id": -(2**63) - 1},), "source.rows[0].id"),
        (({"id": 1, "x": {"y": [1, 10**30]}},), "source.rows[0].x"),
    ],
)
def test_integers_beyond_int64_without_a_schema_are_refused(
    client: TestClient, target: str, values: tuple[dict[str, Any], ...], field: str
) -> None:
    problem = refused(client, field, spec(target, source=rows(*values)))
    assert "does not fit a 64-bit integer" in problem["detail"]


def test_int64_bounds_without_a_schema_are_accepted(client: TestClient, target: str) -> None:
    accepted(client, spec(target, source=rows({"id": 2**63 - 1}, {"id": -(2**63)})))


def test_rows_that_infer_no_type_are_refused_at_submission(client: TestClient, target: str) -> None:
    refused(client, "source.rows", spec(target, source=rows({"id": 1}, {"id": "one"})))


# --- F8: the body is strict JSON; OPTIONS and 405 name every method ----------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"{bad",
        b'{"target": "/x",}',
        b"\xff\xfe\x00{",
        b'{"target": "\xe9"}',
        b"[" * 100_000 + b"]" * 100_000,
        b'{"target": ' + b"9" * 5000 + b"}",
    ],
    ids=["syntax", "trailing_comma", "not_utf8", "latin1", "nested_100000", "5000_digits"],
)
def test_malformed_json_is_a_422_problem(client: TestClient, body: bytes) -> None:
    problem = refused(client, "body", body)
    assert problem["type"] == "urn:merge-service:problem:invalid-request"
    assert problem["detail"].startswith("body: the body is not valid JSON")


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999", "-1e400"])
def test_json_has_no_nan_or_infinity(client: TestClient, target: str, number: str) -> None:
    text = json.dumps(spec(target, source=rows({"id": 1, "amount": 1.5}))).replace("1.5", number)
    problem = refused(client, "body", text.encode())
    assert number.lstrip("-") in problem["detail"]


def test_options_lists_every_method(client: TestClient) -> None:
    for path, allowed in (
        ("/merges", "GET, OPTIONS, POST"),
        ("/merges/01ABC", "GET, OPTIONS"),
        ("/merges/01ABC/cancel", "OPTIONS, POST"),
    ):
        response = client.options(path)
        assert response.status_code == 204, response.text
        assert response.headers["allow"] == allowed
    not_allowed = client.delete("/merges")
    assert_problem(not_allowed, 405)
    assert not_allowed.headers["allow"] == "GET, OPTIONS, POST"
    assert client.options("/nothing-here").status_code == 404
