"""The API takes every column name Delta accepts as the key of an assignment: ``comment`` or ``desc`` used to be
refused with a 422 because the key was read as an expression."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

PROBLEM = "application/problem+json"


def body(target: str, **overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "target": target,
        "source": {"rows": [{"id": 1, "comment": "hi"}], "schema": "id BIGINT, comment STRING"},
        "target_alias": "t",
        "source_alias": "s",
        "on": "t.id = s.id",
    }
    spec.update(overrides)
    return spec


@pytest.mark.parametrize("name", ["comment", "desc", "select", "from", "case", "null", "`a``b`", "t.`order`"])
def test_keyword_and_backtick_keys_are_accepted(client: TestClient, target: str, name: str) -> None:
    response = client.post(
        "/merges",
        json=body(
            target,
            when_matched=[{"action": "update", "set": {name: "s.comment"}, "condition": "s.comment <> 'x'"}],
            when_not_matched=[{"action": "insert", "values": {"id": "s.id", name: "s.comment"}}],
        ),
    )
    assert response.status_code == 202, response.text


def test_keyword_keys_are_accepted_in_sql(client: TestClient, target: str, lake: Path) -> None:
    (lake / "updates").mkdir()
    sql = (
        f"MERGE INTO delta.`{target}` AS t USING delta.`{lake}/updates` AS s ON t.id = s.id AND t.select = s.select "
        "WHEN MATCHED AND s.case > 0 THEN UPDATE SET comment = s.comment, desc = s.desc, t.null = s.null "
        "WHEN NOT MATCHED THEN INSERT (id, from, `a``b`) VALUES (s.id, s.from, s.`a``b`)"
    )
    response = client.post("/merges", json={"sql": sql})
    assert response.status_code == 202, response.text


def test_a_key_spark_cannot_read_is_422_naming_it(client: TestClient, target: str) -> None:
    response = client.post(
        "/merges", json=body(target, when_matched=[{"action": "update", "set": {"a`b": "s.comment"}}])
    )
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    problem = response.json()
    assert [e["field"] for e in problem["errors"]] == ["when_matched[0].set.a`b"]
    assert "backtick" in problem["detail"]


@pytest.mark.parametrize(
    ("source", "field"),
    [
        ({"rows": [{"id": 1, "__merge_service_row_dropped": True}]}, "source.rows"),
        ({"rows": [], "schema": "id BIGINT, __MERGE_SERVICE_x STRING"}, "source.schema"),
    ],
)
def test_a_source_column_under_the_internal_prefix_is_422_naming_it(
    client: TestClient, target: str, source: dict[str, Any], field: str
) -> None:
    response = client.post("/merges", json=body(target, source=source, when_matched=[{"action": "delete"}]))
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    problem = response.json()
    assert problem["type"] == "urn:merge-service:problem:invalid-merge"
    assert [e["field"] for e in problem["errors"]] == [field]
    assert problem["detail"].startswith(f"{field}: column `") and "'__merge_service_'" in problem["detail"]
