"""RFC 9457 problem documents: every error the API answers, and the ``error`` object of a failed job."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

import engine.errors as engine_errors
from engine.delta import ChangeFeedError, TimeTravelError
from engine.delta.deletion_vectors import DeletionVectorError
from engine.delta.errors import (
    CommitRetriesExhaustedError,
    ConcurrentDomainMetadataError,
    CorruptLogError,
    InvalidWriteError,
    WriteSchemaMismatchError,
)
from service.errors import (
    BatchAwaitsSparkError,
    CancelRequestedError,
    DatabaseUnavailableError,
    IdempotencyConflictError,
    InvalidCursorError,
    InvalidParameterProblem,
    InvalidTransitionError,
    JobNotFoundError,
    LeaseLostError,
    RequestValidationProblem,
    ServiceError,
    TxnTakenError,
)
from service.schemas import CLAUSE_TAGS, UNION_TAGS

PROBLEM_MEDIA_TYPE = "application/problem+json"
TYPE_BASE = "urn:merge-service:problem:"
log = structlog.get_logger(__name__)


def problem_type(slug: str) -> str:
    return TYPE_BASE + slug


INTERNAL_SLUG = "internal"
"""What a failure the service did not foresee is: an unexpected error, a 500."""
GENERIC_ENGINE_SLUG = "merge-failed"
"""An engine error of a kind this table does not name yet."""

PROBLEM_SLUGS: dict[type[BaseException], str] = {
    # The API's own refusals and the service's errors.
    RequestValidationError: "invalid-request",
    InvalidCursorError: "invalid-request",
    InvalidParameterProblem: "invalid-request",
    RequestValidationProblem: "invalid-merge",
    JobNotFoundError: "job-not-found",
    IdempotencyConflictError: "idempotency-conflict",
    DatabaseUnavailableError: "database-unavailable",
    LeaseLostError: "lease-lost",
    CancelRequestedError: "cancelled",
    TxnTakenError: "txn-taken",
    InvalidTransitionError: INTERNAL_SLUG,
    ServiceError: INTERNAL_SLUG,
    # The engine's errors: the spec and its resolution.
    engine_errors.MergeServiceEngineError: GENERIC_ENGINE_SLUG,
    engine_errors.MergeSpecError: "merge-spec",
    engine_errors.MergeResolutionError: "merge-resolution",
    engine_errors.SchemaMismatchError: "schema-mismatch",
    engine_errors.SourceError: "source",
    engine_errors.SourceRowError: "source-row",
    # Running the merge.
    engine_errors.MultipleMatchError: "multiple-match",
    engine_errors.DataCastError: "data-cast",
    engine_errors.MergeExecutionError: "merge-execution",
    engine_errors.MergeCancelledError: "cancelled",
    engine_errors.SparkUnavailableError: "spark-unavailable",
    engine_errors.StorageWriteError: "storage-write",
    engine_errors.AutoCdcIncompleteError: "auto-cdc-incomplete",
    BatchAwaitsSparkError: "auto-cdc-incomplete",
    # The Delta table layer.
    engine_errors.DeltaError: "delta",
    engine_errors.TableNotFoundError: "table-not-found",
    engine_errors.UnsupportedTableFeatureError: "unsupported-table-feature",
    engine_errors.AppendOnlyTableError: "append-only-table",
    engine_errors.InvariantViolationError: "invariant-violation",
    WriteSchemaMismatchError: "write-schema-mismatch",
    InvalidWriteError: "invalid-write",
    CorruptLogError: "corrupt-log",
    DeletionVectorError: "deletion-vector",
    TimeTravelError: "time-travel",
    ChangeFeedError: "change-feed",
    # Committing.
    engine_errors.CommitFailedError: "commit-failed",
    engine_errors.CommitStorageError: "storage-write",
    engine_errors.CommitStateUnknownError: "commit-state-unknown",
    engine_errors.ConcurrentModificationError: "concurrent-modification",
    engine_errors.ConcurrentAppendError: "concurrent-append",
    engine_errors.ConcurrentDeleteReadError: "concurrent-delete-read",
    engine_errors.ConcurrentDeleteDeleteError: "concurrent-delete-delete",
    engine_errors.MetadataChangedError: "metadata-changed",
    engine_errors.ProtocolChangedError: "protocol-changed",
    engine_errors.ConcurrentTransactionError: "concurrent-transaction",
    ConcurrentDomainMetadataError: "concurrent-domain-metadata",
    CommitRetriesExhaustedError: "commit-retries-exhausted",
}
"""The public problem ``type`` of every error class, spelled out: the slug is a contract (docs/api.md lists each),
so renaming a class must not change it. Each class is named even where it shares its base's slug."""


def slug_for(error: BaseException | type[BaseException]) -> str:
    """The slug of an error or error class. A class the table does not name answers its nearest named base's slug
    (an engine error at least the generic ``merge-failed``), anything else ``internal``."""
    kind = error if isinstance(error, type) else type(error)
    for base in kind.__mro__:
        slug = PROBLEM_SLUGS.get(base)
        if slug is not None:
            return slug
    return INTERNAL_SLUG


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


_SCALAR_MEMBERS = {"str": "string_type", "bool": "bool_type", "int": "int_type", "float": "float_type"}
"""The members of a union of scalars (a source option's value) as pydantic names them at the end of an error's
location, with the error each gives when the value is none of them."""


def _validation_errors(exc: RequestValidationError) -> list[dict[str, str]]:
    errors: list[dict[str, str]] = []
    for err in exc.errors():
        if err.get("type") == "json_invalid":  # its loc is the body and a character offset
            reason = (err.get("ctx") or {}).get("error") or "JSON decode error"
            errors.append({"field": "body", "message": f"the body is not valid JSON: {reason}"})
            continue
        loc = tuple(err.get("loc", ()))
        message = str(err.get("msg", "invalid"))
        union_member = len(loc) > 1 and _SCALAR_MEMBERS.get(str(loc[-1])) == err.get("type")
        if union_member:  # one error per member tried: the value's field once, naming every member
            loc = loc[:-1]
        field = field_path(loc)
        if loc and loc[0] == "header":
            field = f"header {field}"
        elif loc and loc[0] == "query":
            field = f"query {field}"
        if union_member and errors and errors[-1]["field"] == field:
            errors[-1]["message"] += " or " + message.removeprefix("Input should be ")
            continue
        errors.append({"field": field, "message": message})
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


# --- the API's answers ------------------------------------------------------------------------------------------


def _answer(request: Request, status: int, **fields: Any) -> ProblemResponse:
    return problem(status=status, instance=request.url.path, **fields)


def _answer_for(request: Request, exc: Exception, status: int, title: str, **fields: Any) -> ProblemResponse:
    """The problem document of the kind ``exc``'s class names in ``PROBLEM_SLUGS``."""
    return _answer(request, status, title=title, type_=problem_type(slug_for(exc)), **fields)


async def _validation(request: Request, exc: RequestValidationError) -> ProblemResponse:
    errors = _validation_errors(exc)
    detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5])
    return _answer_for(request, exc, 422, "Invalid request", detail=detail, errors=errors)


async def _invalid_merge(request: Request, exc: RequestValidationProblem) -> ProblemResponse:
    errors = [{"field": exc.field, "message": exc.message}]
    return _answer_for(request, exc, 422, exc.title, detail=exc.message, errors=errors)


async def _cursor(request: Request, exc: InvalidCursorError) -> ProblemResponse:
    errors = [{"field": "query cursor", "message": str(exc)}]
    return _answer_for(request, exc, 422, "Invalid cursor", detail=str(exc), errors=errors)


async def _not_found(request: Request, exc: JobNotFoundError) -> ProblemResponse:
    return _answer_for(request, exc, 404, "Job not found", detail=str(exc))


async def _conflict(request: Request, exc: IdempotencyConflictError) -> ProblemResponse:
    return _answer_for(request, exc, 409, "Idempotency key reused", detail=str(exc))


async def _db_down(request: Request, exc: DatabaseUnavailableError) -> ProblemResponse:
    return _answer_for(request, exc, 503, "Job database unavailable", detail=str(exc), headers={"Retry-After": "5"})


async def _http(request: Request, exc: StarletteHTTPException) -> Response:
    detail: str | None = exc.detail if isinstance(exc.detail, str) else None
    if detail == HTTPStatus(exc.status_code).phrase:
        detail = None
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = ", ".join(allowed_methods(request))
        if request.method == "OPTIONS":
            return Response(status_code=204, headers=headers)
    return _answer(request, exc.status_code, detail=detail, headers=headers)


async def _unexpected(request: Request, exc: Exception) -> ProblemResponse:
    log.exception("unhandled error", error=repr(exc))
    return _answer(request, 500, detail="The service failed to handle the request.")


HANDLERS: tuple[tuple[type[Exception], Callable[..., Awaitable[Response]]], ...] = (
    (RequestValidationError, _validation),
    (RequestValidationProblem, _invalid_merge),
    (InvalidCursorError, _cursor),
    (JobNotFoundError, _not_found),
    (IdempotencyConflictError, _conflict),
    (DatabaseUnavailableError, _db_down),
    (StarletteHTTPException, _http),
    (Exception, _unexpected),
)


def install_handlers(app: FastAPI) -> None:
    """Replace FastAPI's default error answers with problem documents."""
    for exc_class, handler in HANDLERS:
        app.exception_handler(exc_class)(handler)


# --- the ``error`` of a job -------------------------------------------------------------------------------------


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
    if isinstance(
        exc,
        engine_errors.SparkUnavailableError | engine_errors.StorageWriteError | engine_errors.AutoCdcIncompleteError,
    ):
        return 503
    return None


def job_problem(exc: BaseException) -> dict[str, Any]:
    """What a job's ``error`` says about an exception: its kind (type, title) and the specific detail."""
    if isinstance(exc, CancelRequestedError | engine_errors.MergeCancelledError):
        return merge_cancelled_problem()
    if isinstance(exc, LeaseLostError):
        return {"type": problem_type(slug_for(exc)), "title": exc.title, "detail": str(exc)}
    if isinstance(exc, RequestValidationProblem):
        return {"type": problem_type(slug_for(exc)), "title": exc.title, "detail": exc.message, "status": 422}
    if isinstance(exc, TxnTakenError):
        return {"type": problem_type(slug_for(exc)), "title": exc.title, "detail": str(exc), "status": 409}
    if isinstance(exc, engine_errors.MergeServiceEngineError):
        body: dict[str, Any] = {
            "type": problem_type(slug_for(exc)),
            "title": exc.title,
            "detail": str(exc) or exc.title,
        }
        status = _engine_status(exc)
        if status is not None:
            body["status"] = status
        return body
    return {
        "type": problem_type(INTERNAL_SLUG),
        "title": "Merge failed unexpectedly",
        "detail": f"{type(exc).__name__}: {exc}",
        "status": 500,
    }


def cancelled_problem(detail: str) -> dict[str, Any]:
    return {"type": problem_type(slug_for(CancelRequestedError)), "title": "Merge cancelled", "detail": detail}


def merge_cancelled_problem() -> dict[str, Any]:
    """The ``error`` of a job that ran and was cancelled before any commit of it began."""
    return cancelled_problem("The merge was cancelled before its commit started; the table is unchanged.")


def lease_lost_problem(attempts: int) -> dict[str, Any]:
    return {
        "type": problem_type(slug_for(LeaseLostError)),
        "title": "Worker lease lost",
        "detail": f"The worker running attempt {attempts} stopped renewing its lease; the job was taken back.",
    }
