"""RFC 9457 problem documents: every error the API answers, and the ``error`` object of a failed job."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

import engine.errors as engine_errors
from service.errors import (
    CancelRequestedError,
    DatabaseUnavailableError,
    IdempotencyConflictError,
    InvalidCursorError,
    JobNotFoundError,
    LeaseLostError,
    RequestValidationProblem,
)
from service.schemas import CLAUSE_TAGS, UNION_TAGS

PROBLEM_MEDIA_TYPE = "application/problem+json"
TYPE_BASE = "urn:merge-service:problem:"
log = structlog.get_logger(__name__)


def problem_type(slug: str) -> str:
    return TYPE_BASE + slug


class ProblemResponse(JSONResponse):
    media_type = PROBLEM_MEDIA_TYPE


def problem(
    *,
    status: int,
    title: str | None = None,
    detail: str | None = None,
    type_: str = "about:blank",
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> ProblemResponse:
    body: dict[str, Any] = {
        "type": type_,
        "title": title or HTTPStatus(status).phrase,
        "status": status,
    }
    if detail is not None:
        body["detail"] = detail
    body.update({k: v for k, v in extra.items() if v is not None})
    return ProblemResponse(body, status_code=status, headers=headers)


def field_path(loc: tuple[Any, ...] | list[Any]) -> str:
    """``("body", "spec", "when_matched", 1, "update", "condition")`` -> ``when_matched[1].condition``."""
    parts: list[str] = []
    items = list(loc)
    if items and items[0] in ("body", "query", "path", "header"):
        items = items[1:]
    previous: Any = None
    for i, item in enumerate(items):
        if isinstance(item, int):
            if parts:
                parts[-1] += f"[{item}]"
            else:
                parts.append(f"[{item}]")
        elif (
            (i == 0 and item in UNION_TAGS)
            or (isinstance(previous, int) and item in CLAUSE_TAGS)
            or (previous == "source" and item in UNION_TAGS)
        ):
            pass  # a union's tag, not a field of the body
        else:
            parts.append(str(item))
        previous = item
    return ".".join(parts) or "body"


def _validation_errors(exc: RequestValidationError) -> list[dict[str, str]]:
    errors = []
    for err in exc.errors():
        if err.get("type") == "json_invalid":  # its loc is the body and a character offset
            reason = (err.get("ctx") or {}).get("error") or "JSON decode error"
            errors.append({"field": "body", "message": f"the body is not valid JSON: {reason}"})
            continue
        loc = tuple(err.get("loc", ()))
        field = field_path(loc)
        if loc and loc[0] == "header":
            field = f"header {field}"
        elif loc and loc[0] == "query":
            field = f"query {field}"
        errors.append({"field": field, "message": str(err.get("msg", "invalid"))})
    return errors


PROBED_METHODS = ("DELETE", "GET", "HEAD", "PATCH", "POST", "PUT")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route answers at this path, and OPTIONS. Starlette's 405 names only the methods of
    the first route whose path matches (``/merges`` has one route for GET and one for POST). Each method is
    tried as the router would route it, so routers included in routers are looked into too."""
    methods = {"OPTIONS"}
    for method in PROBED_METHODS:
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] is Match.FULL for route in request.app.router.routes):
            methods.add(method)
    return sorted(methods)


def install_handlers(app: FastAPI) -> None:
    """Replace FastAPI's default error answers with problem documents."""

    def answer(request: Request, status: int, **fields: Any) -> ProblemResponse:
        return problem(status=status, instance=request.url.path, **fields)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> ProblemResponse:
        errors = _validation_errors(exc)
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5])
        return answer(
            request, 422, title="Invalid request", detail=detail, type_=problem_type("invalid-request"), errors=errors
        )

    @app.exception_handler(RequestValidationProblem)
    async def _invalid_merge(request: Request, exc: RequestValidationProblem) -> ProblemResponse:
        return answer(
            request,
            422,
            title=exc.title,
            detail=exc.message,
            type_=problem_type("invalid-merge"),
            errors=[{"field": exc.field, "message": exc.message}],
        )

    @app.exception_handler(InvalidCursorError)
    async def _cursor(request: Request, exc: InvalidCursorError) -> ProblemResponse:
        return answer(
            request,
            422,
            title="Invalid cursor",
            detail=str(exc),
            type_=problem_type("invalid-request"),
            errors=[{"field": "query cursor", "message": str(exc)}],
        )

    @app.exception_handler(JobNotFoundError)
    async def _not_found(request: Request, exc: JobNotFoundError) -> ProblemResponse:
        return answer(request, 404, title="Job not found", detail=str(exc), type_=problem_type("job-not-found"))

    @app.exception_handler(IdempotencyConflictError)
    async def _conflict(request: Request, exc: IdempotencyConflictError) -> ProblemResponse:
        return answer(
            request, 409, title="Idempotency key reused", detail=str(exc), type_=problem_type("idempotency-conflict")
        )

    @app.exception_handler(DatabaseUnavailableError)
    async def _db_down(request: Request, exc: DatabaseUnavailableError) -> ProblemResponse:
        return answer(
            request,
            503,
            title="Job database unavailable",
            detail=str(exc),
            type_=problem_type("database-unavailable"),
            headers={"Retry-After": "5"},
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        detail: str | None = exc.detail if isinstance(exc.detail, str) else None
        if detail == HTTPStatus(exc.status_code).phrase:
            detail = None
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(allowed_methods(request))
            if request.method == "OPTIONS":
                return Response(status_code=204, headers=headers)
        return answer(request, exc.status_code, detail=detail, headers=headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> ProblemResponse:
        log.exception("unhandled error", error=repr(exc))
        return answer(request, 500, detail="The service failed to handle the request.")


# --- the ``error`` of a job -------------------------------------------------------------------------------------


def _slug(name: str) -> str:
    out = []
    for i, ch in enumerate(name.removesuffix("Error")):
        if ch.isupper() and i:
            out.append("-")
        out.append(ch.lower())
    return "".join(out)


def _engine_status(exc: BaseException) -> int | None:
    if isinstance(exc, engine_errors.TableNotFoundError):
        return 404
    if isinstance(exc, engine_errors.ConcurrentModificationError):
        return 409
    if isinstance(
        exc,
        (
            engine_errors.MergeSpecError,
            engine_errors.SourceError,
            engine_errors.MultipleMatchError,
            engine_errors.DataCastError,
            engine_errors.InvariantViolationError,
        ),
    ):
        return 422
    if isinstance(exc, engine_errors.SparkUnavailableError | engine_errors.StorageWriteError):
        return 503
    return None


def job_problem(exc: BaseException) -> dict[str, Any]:
    """What a job's ``error`` says about an exception: its kind (type, title) and the specific detail."""
    if isinstance(exc, CancelRequestedError | engine_errors.MergeCancelledError):
        return cancelled_problem("The merge was cancelled before its commit started; the table is unchanged.")
    if isinstance(exc, LeaseLostError):
        return {"type": problem_type("lease-lost"), "title": exc.title, "detail": str(exc)}
    if isinstance(exc, RequestValidationProblem):
        return {"type": problem_type("invalid-merge"), "title": exc.title, "detail": exc.message, "status": 422}
    if isinstance(exc, engine_errors.MergeServiceEngineError):
        body: dict[str, Any] = {
            "type": problem_type(_slug(type(exc).__name__)),
            "title": exc.title,
            "detail": str(exc) or exc.title,
        }
        status = _engine_status(exc)
        if status is not None:
            body["status"] = status
        return body
    return {
        "type": problem_type("internal"),
        "title": "Merge failed unexpectedly",
        "detail": f"{type(exc).__name__}: {exc}",
        "status": 500,
    }


def cancelled_problem(detail: str) -> dict[str, Any]:
    return {"type": problem_type("cancelled"), "title": "Merge cancelled", "detail": detail}


def lease_lost_problem(attempts: int) -> dict[str, Any]:
    return {
        "type": problem_type("lease-lost"),
        "title": "Worker lease lost",
        "detail": f"The worker running attempt {attempts} stopped renewing its lease; the job was taken back.",
    }
