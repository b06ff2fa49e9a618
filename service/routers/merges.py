"""The merge job resource: submit, read, list, cancel."""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any

import structlog
from fastapi import APIRouter, Body, Header, Path, Query, Response
from fastapi.responses import JSONResponse

from service import callback_urls, engines
from service.deps import AuthDep, ManagerDep, MetricsDep, RootsDep, SettingsDep
from service.errors import InvalidParameterProblem, RequestValidationProblem
from service.jobs import JobRecord, NewJob, Status
from service.middleware import StrictJsonRoute
from service.problems import cancelled_problem
from service.schemas import AutoCdcMergeIn, CallbackOut, JobListOut, JobOut, MergeRequest, Problem
from service.specs import build_merge

router = APIRouter(prefix="/merges", tags=["merges"], route_class=StrictJsonRoute)
log = structlog.get_logger(__name__)

RETRY_AFTER_QUEUED = "2"
RETRY_AFTER_RUNNING = "1"


def _problem(description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = {"model": Problem, "description": description}
    if headers:
        answer["headers"] = headers
    return answer


JOB_HEADERS = {
    "Location": {"description": "The job's URL.", "schema": {"type": "string"}},
    "Retry-After": {
        "description": "Seconds to wait before polling again (unfinished jobs).",
        "schema": {"type": "string"},
    },
}
GET_MERGE, CANCEL_MERGE = "get_merge_merges__id__get", "cancel_merge_merges__id__cancel_post"
"""The operationIds of the job's routes (FastAPI's own names for them, kept), which the links below name."""
JOB_LINKS = {
    "GetMerge": {
        "operationId": GET_MERGE,
        "parameters": {"id": "$response.body#/id"},
        "description": "Poll the job.",
    },
    "CancelMerge": {
        "operationId": CANCEL_MERGE,
        "parameters": {"id": "$response.body#/id"},
        "description": "Cancel the job.",
    },
}
"""OpenAPI links from an answer that holds a job to reading and cancelling it."""
COMMON_ERRORS: dict[int | str, dict[str, Any]] = {
    401: _problem(
        "Missing or wrong bearer token.",
        {"WWW-Authenticate": {"description": "The bearer scheme the service expects.", "schema": {"type": "string"}}},
    ),
    503: _problem(
        "The job database cannot be reached.",
        {"Retry-After": {"description": "Seconds to wait before trying again.", "schema": {"type": "string"}}},
    ),
}

JobId = Annotated[str, Path(alias="id", description="The job's id.")]


def callback_out(job: JobRecord) -> CallbackOut | None:
    callback = job.callback
    if callback is None:
        return None
    return CallbackOut(
        url=callback.url,
        status=callback.status.value,
        delivery_id=callback.delivery_id,
        attempts=callback.attempts,
        last_error=callback.last_error,
        delivered_at=callback.delivered_at,
    )


def job_out(job: JobRecord) -> JobOut:
    return JobOut(
        id=job.id,
        status=job.status.value,
        phase=job.phase.value,
        target=job.target,
        submitted_at=job.submitted_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        attempts=job.attempts,
        dry_run=job.dry_run,
        engine=job.engine,  # type: ignore[arg-type]
        table_version=job.table_version,
        result=job.result,
        metrics=job.metrics,
        error=job.error,  # type: ignore[arg-type]
        callback=callback_out(job),
        timings=job.timings,
    )


def job_json(job: JobRecord) -> dict[str, Any]:
    data = job_out(job).model_dump(mode="json")
    if data["error"] is not None:  # RFC 9457 members are absent rather than null
        data["error"] = {k: v for k, v in data["error"].items() if v is not None}
    if data["callback"] is None:  # a job without a callback reads as jobs did before callbacks existed
        del data["callback"]
    if data["timings"] is None:  # shown once the job has ended
        del data["timings"]
    return data


def _job_response(job: JobRecord, status_code: int) -> JSONResponse:
    headers = {"Location": f"/merges/{job.id}"}
    if not job.finished:
        headers["Retry-After"] = RETRY_AFTER_RUNNING if job.status is Status.RUNNING else RETRY_AFTER_QUEUED
    return JSONResponse(job_json(job), status_code=status_code, headers=headers)


@router.post(
    "",
    status_code=202,
    response_model=JobOut,
    summary="Submit a merge",
    responses={
        202: {"description": "Accepted: the job is queued.", "headers": JOB_HEADERS, "links": JOB_LINKS},
        200: {
            "model": JobOut,
            "description": "The job this Idempotency-Key already created.",
            "headers": JOB_HEADERS,
            "links": JOB_LINKS,
        },
        409: _problem("The Idempotency-Key was used with another body."),
        413: _problem("The body is over the configured limit."),
        415: _problem("The body is not sent as JSON (`Content-Type: application/json`)."),
        422: _problem("The merge cannot be valid; `errors` names the field at fault."),
        **COMMON_ERRORS,
    },
)
def submit_merge(
    body: Annotated[MergeRequest, Body()],
    caller: AuthDep,
    manager: ManagerDep,
    roots: RootsDep,
    metrics: MetricsDep,
    settings: SettingsDep,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", min_length=1, max_length=255)] = None,
) -> Response:
    built = build_merge(body, roots)
    auto_cdc = isinstance(body, AutoCdcMergeIn)
    engine_name = engines.chosen_engine(body.engine, engines.DEFAULT_ENGINE if auto_cdc else settings.default_engine)
    engines.check_engine(engine_name, dry_run=built.dry_run, auto_cdc=auto_cdc)
    callback_url = callback_urls.check_submission(body.callback, caller.fingerprint, settings)
    # The callback lives in its own column, and the default deletion-vector choice is left out: bodies without
    # either keep the form (and Idempotency-Key hash) they had before these fields existed.
    dumped = body.model_dump(mode="json", by_alias=True, exclude={"callback"})
    if dumped.get("deletion_vectors") == "auto":
        del dumped["deletion_vectors"]
    stored = engines.stored_body(dumped, engine_name)
    request_hash = None
    if idempotency_key is not None:
        hashed = stored if body.callback is None else {**stored, "callback": body.callback}
        canonical = json.dumps(hashed, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        request_hash = hashlib.sha256(canonical.encode()).hexdigest()
    job, created = manager.submit(
        NewJob(
            target=built.target,
            target_key=built.target_key,
            spec=stored,
            dry_run=built.dry_run,
            idempotency_key=idempotency_key,
            request_hash=request_hash,
            idempotency_scope=caller.fingerprint,
            engine=engine_name,
            callback_url=callback_url,
        )
    )
    if created:
        metrics.jobs_submitted.inc()
        log.info("job submitted", job_id=job.id, target=job.target)
    return _job_response(job, 202 if created else 200)


@router.get(
    "",
    response_model=JobListOut,
    summary="List merge jobs, newest first",
    responses={422: _problem("A query parameter is invalid."), **COMMON_ERRORS},
)
def list_merges(
    caller: AuthDep,
    manager: ManagerDep,
    roots: RootsDep,
    settings: SettingsDep,
    status: Annotated[Status | None, Query(description="Only jobs with this status.")] = None,
    target: Annotated[str | None, Query(description="Only jobs on this table.", max_length=2048)] = None,
    limit: Annotated[
        int, Query(ge=1, description="Page size; larger values are served as the configured maximum (200 by default).")
    ] = 50,
    cursor: Annotated[str | None, Query(description="`next_cursor` of the previous page.", max_length=1024)] = None,
) -> Response:
    target_key = None
    if target:
        try:
            target_key = roots.resolve(target, "query target")
        except RequestValidationProblem as exc:
            raise InvalidParameterProblem(exc.field, exc.message, title=exc.title) from exc
    items, next_cursor = manager.list_jobs(
        status=status,
        target_key=target_key,
        limit=min(limit, settings.list_limit_max),
        cursor=cursor,
        owner=caller.owner,
    )
    return JSONResponse({"items": [job_json(j) for j in items], "next_cursor": next_cursor})


@router.get(
    "/{id}",
    response_model=JobOut,
    operation_id=GET_MERGE,
    summary="Read a merge job",
    responses={
        200: {
            "description": "The job.",
            "headers": {"Retry-After": JOB_HEADERS["Retry-After"]},
            "links": {"CancelMerge": JOB_LINKS["CancelMerge"]},
        },
        404: _problem("No job of the caller's has this id (admin tokens see every job)."),
        **COMMON_ERRORS,
    },
)
def get_merge(job_id: JobId, caller: AuthDep, manager: ManagerDep) -> Response:
    job = manager.get(job_id, owner=caller.owner)
    response = _job_response(job, 200)
    del response.headers["Location"]
    return response


@router.post(
    "/{id}/cancel",
    status_code=202,
    response_model=JobOut,
    operation_id=CANCEL_MERGE,
    summary="Cancel a merge job",
    responses={
        202: {
            "description": "A queued job is cancelled at once; a running one at its next safe point.",
            "headers": JOB_HEADERS,
            "links": {"GetMerge": JOB_LINKS["GetMerge"]},
        },
        404: _problem("No job of the caller's has this id (admin tokens see every job)."),
        **COMMON_ERRORS,
    },
)
def cancel_merge(job_id: JobId, caller: AuthDep, manager: ManagerDep, metrics: MetricsDep) -> Response:
    job, ended = manager.request_cancel(
        job_id,
        problem=cancelled_problem("The job was cancelled before it started; the table is unchanged."),
        owner=caller.owner,
    )
    if ended:
        metrics.jobs_finished.labels("cancelled").inc()
    log.info("job cancel requested", job_id=job.id, status=job.status.value)
    return _job_response(job, 202)
