"""Tokens are tenants: a token lists, reads and cancels only the jobs it submitted; another token's job answers
404 as an unknown one does; admin tokens see every job. Run on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import inspect

from service.app import create_app
from service.errors import JobNotFoundError
from service.jobs import NewJob, Status
from service.manager import JobManager
from service.settings import Settings
from tests.service.test_api import assert_problem, spec

ALICE = {"Authorization": "Bearer alice-token"}
BOB = {"Authorization": "Bearer bob-token"}
ADMIN = {"Authorization": "Bearer admin-token"}
CANCELLED = {"type": "urn:test:cancelled", "title": "Merge cancelled"}


@pytest.fixture
def manager(database_manager: JobManager) -> JobManager:
    return database_manager


@pytest.fixture
def client(settings: Settings, database_url: str, manager: JobManager) -> TestClient:
    secured = settings.model_copy(
        update={
            "database_url": database_url,
            "api_tokens": ["alice-token", "bob-token"],
            "admin_tokens": ["admin-token"],
        }
    )
    return TestClient(create_app(secured, manager=manager), raise_server_exceptions=False)


@pytest.fixture
def target(lake: Path) -> str:
    path = lake / "orders"
    path.mkdir()
    return str(path)


def submit(client: TestClient, target: str, headers: dict[str, str]) -> dict[str, Any]:
    response = client.post("/merges", json=spec(target), headers=headers)
    assert response.status_code == 202, response.text
    return response.json()  # type: ignore[no-any-return]


def ids(client: TestClient, headers: dict[str, str], **params: Any) -> list[str]:
    response = client.get("/merges", params=params, headers=headers)
    assert response.status_code == 200, response.text
    return [j["id"] for j in response.json()["items"]]


def test_a_token_lists_only_its_own_jobs(client: TestClient, target: str) -> None:
    mine = [submit(client, target, ALICE)["id"] for _ in range(3)]
    theirs = submit(client, target, BOB)["id"]
    assert ids(client, ALICE) == list(reversed(mine))
    assert ids(client, BOB) == [theirs]
    assert ids(client, ALICE, target=target, status="queued") == list(reversed(mine))
    # Pages of a token's listing hold only its jobs, however the others' jobs interleave with them.
    first = client.get("/merges", params={"limit": 2}, headers=ALICE).json()
    second = client.get("/merges", params={"limit": 2, "cursor": first["next_cursor"]}, headers=ALICE).json()
    assert [j["id"] for j in first["items"] + second["items"]] == list(reversed(mine))
    assert second["next_cursor"] is None


def test_another_token_s_job_is_unknown(client: TestClient, target: str) -> None:
    job = submit(client, target, ALICE)
    read = client.get(f"/merges/{job['id']}", headers=BOB)
    body = assert_problem(read, 404)
    unknown = assert_problem(client.get("/merges/01ZZZZZZZZZZZZZZZZZZZZZZZZ", headers=BOB), 404)
    # Nothing tells "someone else's" apart from "no such job" but the id the caller sent.
    assert body == {
        **unknown,
        "detail": unknown["detail"].replace("01ZZZZZZZZZZZZZZZZZZZZZZZZ", job["id"]),
        "instance": f"/merges/{job['id']}",
    }
    assert_problem(client.post(f"/merges/{job['id']}/cancel", headers=BOB), 404)
    still = client.get(f"/merges/{job['id']}", headers=ALICE)
    assert still.status_code == 200 and still.json()["status"] == "queued"
    assert still.json() == job


def test_the_owner_cancels_its_job(client: TestClient, target: str) -> None:
    job = submit(client, target, ALICE)
    response = client.post(f"/merges/{job['id']}/cancel", headers=ALICE)
    assert response.status_code == 202 and response.json()["status"] == "cancelled"


def test_an_admin_token_sees_and_cancels_every_job(client: TestClient, target: str) -> None:
    alice = submit(client, target, ALICE)["id"]
    bob = submit(client, target, BOB)["id"]
    own = submit(client, target, ADMIN)["id"]
    assert ids(client, ADMIN) == [own, bob, alice]
    assert client.get(f"/merges/{alice}", headers=ADMIN).status_code == 200
    cancelled = client.post(f"/merges/{bob}/cancel", headers=ADMIN)
    assert cancelled.status_code == 202 and cancelled.json()["status"] == "cancelled"
    assert client.get(f"/merges/{bob}", headers=BOB).json()["status"] == "cancelled"
    # An admin's own jobs are its own: other tokens do not see them.
    assert ids(client, ALICE) == [alice]
    assert_problem(client.get(f"/merges/{own}", headers=ALICE), 404)


def test_admin_tokens_alone_require_authentication(settings: Settings, manager: JobManager, target: str) -> None:
    admins_only = settings.model_copy(update={"admin_tokens": ["admin-token"]})
    client = TestClient(create_app(admins_only, manager=manager), raise_server_exceptions=False)
    assert_problem(client.get("/merges"), 401)
    assert_problem(client.post("/merges", json=spec(target)), 401)
    assert client.get("/merges", headers=ADMIN).status_code == 200


def test_without_tokens_everyone_is_one_caller(settings: Settings, manager: JobManager, target: str) -> None:
    client = TestClient(create_app(settings, manager=manager), raise_server_exceptions=False)
    job = submit(client, target, {})
    assert ids(client, {}) == [job["id"]]
    assert client.post(f"/merges/{job['id']}/cancel").status_code == 202


def test_admin_tokens_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MERGE_SERVICE_ADMIN_TOKENS", " ops-1 , ops-2,")
    assert Settings().admin_tokens == ["ops-1", "ops-2"]


# --- the store ---------------------------------------------------------------------------------------------


def new(owner: str) -> NewJob:
    return NewJob(target="/lake/a", target_key="/lake/a", spec={}, dry_run=False, idempotency_scope=owner)


def test_the_store_scopes_reads_lists_and_cancels(manager: JobManager) -> None:
    alice, _ = manager.submit(new("alice"))
    bob, _ = manager.submit(new("bob"))
    assert manager.get(alice.id, owner="alice") == alice
    with pytest.raises(JobNotFoundError):
        manager.get(alice.id, owner="bob")
    assert [j.id for j in manager.list_jobs(owner="bob")[0]] == [bob.id]
    assert [j.id for j in manager.list_jobs()[0]] == [bob.id, alice.id]
    with pytest.raises(JobNotFoundError):
        manager.request_cancel(alice.id, problem=CANCELLED, owner="bob")
    assert manager.get(alice.id).status is Status.QUEUED and not manager.get(alice.id).cancel_requested
    job, ended = manager.request_cancel(alice.id, problem=CANCELLED, owner="alice")
    assert ended and job.status is Status.CANCELLED


def test_the_listing_index_comes_and_goes_with_its_migration(manager: JobManager) -> None:
    from alembic import command

    from service import migrate

    def indexes() -> set[str]:
        return {ix["name"] for ix in inspect(manager.engine).get_indexes("merge_jobs") if ix["name"]}

    assert "ix_merge_jobs_scope_submitted" in indexes()
    config = migrate.alembic_config(manager.engine.url.render_as_string(hide_password=False))
    with manager.engine.connect() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0003")
        conn.commit()
    assert "ix_merge_jobs_scope_submitted" not in indexes()
    assert not manager.schema_at_head()
    manager.migrate()
    assert "ix_merge_jobs_scope_submitted" in indexes() and manager.schema_at_head()
