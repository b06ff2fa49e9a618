"""One attempt on a real Spark Connect server: the worker builds the engine's spec once from the request body the
job row stores, and the engine checks it once per process; a row this process has not checked is checked before
anything runs it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from fastapi.testclient import TestClient

import engine
import engine.command
from service import specs
from service.app import create_app
from service.jobs import NewJob, Status
from service.manager import JobManager
from service.paths import LakeRoots
from service.settings import Settings
from service.specs import ValidExpressions
from service.worker import Worker


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every run of the engine's check, by the service (``build_merge``) or inside ``run_merge``, in a process
    that has checked nothing yet."""
    seen: list[str] = []
    real = engine.validate_spec
    real_parse = engine.command.parse_merge

    def counting(spec: Any) -> Any:
        seen.append(spec.on)
        return real(spec)

    def parsing(spec: Any, *, checked: bool = False) -> Any:
        if not checked:
            seen.append(spec.on)
        return real_parse(spec, checked=checked)

    monkeypatch.setattr(specs.engine, "validate_spec", counting)
    monkeypatch.setattr(engine.command, "parse_merge", parsing)
    monkeypatch.setattr(specs, "VALID_EXPRESSIONS", ValidExpressions())
    return seen


@pytest.fixture
def worker_settings(settings: Settings, spark_remote: str) -> Settings:
    return settings.model_copy(update={"spark_remote": spark_remote})


@pytest.fixture
def worker(worker_settings: Settings, manager: JobManager) -> Iterator[Worker]:
    worker = Worker(worker_settings, manager=manager)
    yield worker
    worker.stop(timeout=30)


@pytest.fixture
def target(lake: Path) -> str:
    path = lake / "orders"
    write_deltalake(path, pa.table({"id": pa.array([1, 2], pa.int64()), "amount": pa.array([10, 20], pa.int64())}))
    return str(path)


def body(target: str, on: str = "t.id = s.id") -> dict[str, Any]:
    return {
        "target": target,
        "source": {"rows": [{"id": 2, "amount": 21}, {"id": 3, "amount": 30}], "schema": "id BIGINT, amount BIGINT"},
        "target_alias": "t",
        "source_alias": "s",
        "on": on,
        "when_matched": [{"action": "update", "set": {"amount": "s.amount"}}],
        "when_not_matched": [{"action": "insert_all"}],
    }


def stored_by_another_process(manager: JobManager, settings: Settings, request: dict[str, Any]) -> str:
    """A job row as another process (perhaps another version of the service) writes it: this one never saw it."""
    target_key = LakeRoots(settings.lake_roots).resolve(request["target"], "target")
    job, _ = manager.submit(NewJob(target=request["target"], target_key=target_key, spec=request, dry_run=False))
    return job.id


def amounts(target: str) -> dict[int, int]:
    rows = DeltaTable(target).to_pyarrow_table().to_pylist()
    return {row["id"]: row["amount"] for row in rows}


def test_a_job_submitted_in_this_process_is_checked_once(
    worker_settings: Settings, manager: JobManager, worker: Worker, target: str, checks: list[str]
) -> None:
    client = TestClient(create_app(worker_settings, manager=manager), raise_server_exceptions=False)
    response = client.post("/merges", json=body(target))
    assert response.status_code == 202, response.text
    assert worker.run_once()
    job = manager.get(response.json()["id"])
    assert job.status is Status.SUCCEEDED, job.error
    assert amounts(target) == {1: 10, 2: 21, 3: 30}
    assert checks == ["t.id = s.id"]  # at submission; neither the worker nor run_merge checks it again


def test_a_job_another_process_stored_is_checked_here_once(
    worker_settings: Settings, manager: JobManager, worker: Worker, target: str, checks: list[str]
) -> None:
    job_id = stored_by_another_process(manager, worker_settings, body(target))
    assert worker.run_once()
    job = manager.get(job_id)
    assert job.status is Status.SUCCEEDED, job.error
    assert amounts(target) == {1: 10, 2: 21, 3: 30}
    assert checks == ["t.id = s.id"]  # by the worker building the spec, not again by run_merge


def test_a_stored_merge_this_version_refuses_fails_and_leaves_the_table(
    worker_settings: Settings, manager: JobManager, worker: Worker, target: str, checks: list[str]
) -> None:
    job_id = stored_by_another_process(manager, worker_settings, body(target, on="t.id = s.id AND rand() > 0.5"))
    assert worker.run_once()
    job = manager.get(job_id)
    assert job.status is Status.FAILED
    assert job.error is not None and job.error["type"] == "urn:merge-service:problem:invalid-merge"
    assert "rand" in job.error["detail"]
    assert DeltaTable(target).version() == 0 and amounts(target) == {1: 10, 2: 20}
    assert checks == ["t.id = s.id AND rand() > 0.5"]
