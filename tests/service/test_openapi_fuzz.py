"""Schemathesis against /openapi.json: no 5xx, and every answer conforms to the documented schema, status
codes, media types and headers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from service.app import create_app
from service.manager import JobManager
from service.settings import Settings

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def fuzz_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FastAPI]:
    base = tmp_path_factory.mktemp("fuzz")
    (base / "lake").mkdir()
    s = Settings(database_url=f"sqlite:///{base / 'jobs.db'}", lake_roots=[str(base / "lake")])
    manager = JobManager.from_url(s.database_url)
    manager.migrate()
    yield create_app(s, manager=manager)
    manager.dispose()


def test_api_conforms_to_its_openapi(fuzz_app: FastAPI) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", fuzz_app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 7

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=40,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            phases=[Phase.explicit, Phase.generate],
        )  # bounded: report failures unshrunk
        def check(case: schemathesis.Case) -> None:
            case.call_and_validate(checks=CHECKS)

        check()
