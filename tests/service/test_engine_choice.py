"""Choosing the engine per job: validated at submission, stored with the job, shown by the API, and the
deployment's default. No Spark: jobs are only submitted and read back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.manager import JobManager
from service.settings import Settings


def client_for(settings: Settings, manager: JobManager) -> TestClient:
    return TestClient(create_app(settings, manager=manager), raise_server_exceptions=False)


def body(lake: Path, **overrides: Any) -> dict[str, Any]:
    (lake / "orders").mkdir(exist_ok=True)
    return {
        "target": str(lake / "orders"),
        "source": {"rows": [{"id": 1}], "schema": "id BIGINT"},
        "on": "target.id = source.id",
        "when_not_matched": [{"action": "insert_all"}],
        **overrides,
    }


def test_the_engine_is_stored_with_the_job_and_shown(settings: Settings, manager: JobManager, lake: Path) -> None:
    client = client_for(settings, manager)
    builtin = client.post("/merges", json=body(lake))
    delta = client.post("/merges", json=body(lake, engine="delta"))
    as_sql = client.post(
        "/merges",
        json={
            "sql": f"MERGE INTO delta.`{lake / 'orders'}` AS t USING (SELECT 1 AS id) AS s ON t.id = s.id "
            "WHEN NOT MATCHED THEN INSERT *",
            "engine": "delta",
        },
    )
    assert (builtin.status_code, delta.status_code, as_sql.status_code) == (202, 202, 202), as_sql.text
    assert builtin.json()["engine"] == "builtin"
    assert client.get(f"/merges/{delta.json()['id']}").json()["engine"] == "delta"
    assert client.get(f"/merges/{as_sql.json()['id']}").json()["engine"] == "delta"
    # The worker reads the engine from the stored body; a builtin job's body is stored as before the choice.
    assert "engine" not in manager.get_spec(builtin.json()["id"])
    assert manager.get_spec(delta.json()["id"])["engine"] == "delta"
    assert {j["engine"] for j in client.get("/merges").json()["items"]} == {"builtin", "delta"}


def test_the_deployment_default_applies_when_the_body_names_none(
    settings: Settings, manager: JobManager, lake: Path
) -> None:
    client = client_for(settings.model_copy(update={"default_engine": "delta"}), manager)
    job = client.post("/merges", json=body(lake)).json()
    assert job["engine"] == "delta"
    assert manager.get_spec(job["id"])["engine"] == "delta"
    explicit = client.post("/merges", json=body(lake, engine="builtin")).json()
    assert explicit["engine"] == "builtin"


def test_an_unknown_engine_is_a_422_naming_the_field(settings: Settings, manager: JobManager, lake: Path) -> None:
    client = client_for(settings, manager)
    answer = client.post("/merges", json=body(lake, engine="photon"))
    assert answer.status_code == 422
    assert answer.headers["content-type"] == "application/problem+json"
    assert [e["field"] for e in answer.json()["errors"]] == ["engine"]
    assert client.get("/merges").json()["items"] == []


def test_a_dry_run_on_delta_is_refused_by_name(settings: Settings, manager: JobManager, lake: Path) -> None:
    client = client_for(settings.model_copy(update={"default_engine": "delta"}), manager)
    answer = client.post("/merges", json=body(lake, dry_run=True))
    assert answer.status_code == 422
    problem = answer.json()
    assert [e["field"] for e in problem["errors"]] == ["dry_run"]
    assert "Delta's MERGE INTO has no dry run" in problem["detail"]
    assert client.get("/merges").json()["items"] == []
    # The builtin engine's dry run is still taken.
    assert client.post("/merges", json=body(lake, dry_run=True, engine="builtin")).status_code == 202


def test_an_unknown_default_engine_is_refused_at_start(lake: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="default_engine"):
        Settings(database_url=f"sqlite:///{tmp_path / 'x.db'}", lake_roots=[str(lake)], default_engine="photon")
