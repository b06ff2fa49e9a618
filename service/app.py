"""The FastAPI application: ``create_app(settings)`` wires the job store, metrics and routers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from service.manager import JobManager
from service.metrics import ServiceMetrics
from service.middleware import (
    BodyLimitMiddleware,
    EmptyQueryValuesMiddleware,
    HeadAsGetMiddleware,
    HttpMetricsMiddleware,
)
from service.paths import LakeRoots
from service.problems import PROBLEM_MEDIA_TYPE, install_handlers
from service.readiness import DatabaseReadiness
from service.routers import health, merges, ui
from service.routers import metrics as metrics_router
from service.settings import Settings

API_VERSION = "1"


class ReadinessProvider(Protocol):
    def readiness(self) -> tuple[bool, str]: ...


def create_app(
    settings: Settings | None = None,
    *,
    manager: JobManager | None = None,
    metrics: ServiceMetrics | None = None,
    workers: Sequence[ReadinessProvider] = (),
    include_merges: bool = True,
) -> FastAPI:
    """The API. Pass ``workers`` that run in this process so /readyz also checks their Spark connection;
    ``include_merges=False`` gives a worker process its health and metrics endpoints only."""
    settings = settings or Settings()
    owns_manager = manager is None
    manager = manager or JobManager.from_url(settings.database_url, lease_seconds=settings.lease_seconds)
    metrics = metrics or ServiceMetrics(workers=bool(workers))
    metrics.watch_queue(manager)
    readiness = DatabaseReadiness(manager, settings.readiness_timeout_seconds)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        readiness.close()
        if owns_manager:
            manager.dispose()

    app = FastAPI(
        title="merge-service",
        version=API_VERSION,
        summary="Applies MERGE INTO jobs to Delta Lake tables.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.manager = manager
    app.state.metrics = metrics
    app.state.roots = LakeRoots(settings.lake_roots)
    app.state.workers = list(workers)
    app.state.database_readiness = readiness

    install_handlers(app)
    if include_merges:
        app.include_router(merges.router)
        app.include_router(ui.router)
    app.include_router(health.router)
    app.include_router(metrics_router.router)
    app.add_middleware(EmptyQueryValuesMiddleware)
    app.add_middleware(HeadAsGetMiddleware)  # inside the metrics, which count HEAD as HEAD
    app.add_middleware(HttpMetricsMiddleware, metrics=metrics)
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body_bytes)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _empty_query_values(
                _problem_media_types(
                    _without_impossible_422(
                        get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
                    )
                )
            )
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def create_process_app() -> FastAPI:
    """The app of one of several API processes (``uvicorn`` factory): settings from the environment, its own
    job store connections, and the same logging as the command that started it."""
    from service.logs import configure_logging

    settings = Settings()
    configure_logging(settings.log_level, json=settings.log_json)
    return create_app(settings)


_CONSTRAINTS = frozenset({"minLength", "maxLength", "pattern", "format", "enum", "minimum", "maximum"})


def _without_impossible_422(schema: dict[str, Any]) -> dict[str, Any]:
    """FastAPI documents a 422 for every operation with a parameter; one whose only parameters are unconstrained
    path strings (a job's id) and that takes no body can never answer it: an unknown id is a 404."""
    for path in schema.get("paths", {}).values():
        for operation in path.values():
            parameters = operation.get("parameters", [])
            if "requestBody" not in operation and all(
                p["in"] == "path" and p["schema"].get("type") == "string" and not _CONSTRAINTS & set(p["schema"])
                for p in parameters
            ):
                operation.get("responses", {}).pop("422", None)
    return schema


def _empty_query_values(schema: dict[str, Any]) -> dict[str, Any]:
    """An optional query parameter sent empty counts as not given (``EmptyQueryValuesMiddleware``): OpenAPI's
    ``allowEmptyValue`` says so."""
    for path in schema.get("paths", {}).values():
        for operation in path.values():
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "query" and not parameter.get("required"):
                    parameter["allowEmptyValue"] = True
    return schema


def _problem_media_types(schema: dict[str, Any]) -> dict[str, Any]:
    """Error answers are ``application/problem+json``; FastAPI would document them as ``application/json``."""
    for path in schema.get("paths", {}).values():
        for operation in path.values():
            for code, response in operation.get("responses", {}).items():
                content = response.get("content", {})
                if code.isdigit() and int(code) >= 400 and "application/json" in content:
                    media = content.pop("application/json")
                    if "HTTPValidationError" in str(media.get("schema")):
                        media = {"schema": {"$ref": "#/components/schemas/Problem"}}
                    if code == "503" and "readyz" in str(operation.get("operationId", "")):
                        content["application/json"] = media
                    else:
                        content[PROBLEM_MEDIA_TYPE] = media
    components = schema.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        if unused in components and unused not in str(schema["paths"]):
            del components[unused]
    return schema
