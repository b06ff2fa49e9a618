"""Liveness and readiness: readiness looks at the job database, its schema level and (for workers) Spark, as
each worker's readiness probe last found it."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.schemas import HealthOut

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=HealthOut, summary="The process lives")
async def healthz() -> HealthOut:
    # On the event loop, not in the request thread pool: it answers even when every pool thread is busy.
    return HealthOut(status="ok")


@router.get(
    "/readyz",
    response_model=HealthOut,
    summary="The job database (and, for workers, Spark) answers",
    responses={503: {"model": HealthOut, "description": "Something this process needs does not answer."}},
)
async def readyz(request: Request) -> JSONResponse:
    # On the event loop: the database is asked by its own thread with a deadline (service.readiness), and workers
    # answer from their Spark probe's last answer (never a call to Spark here), so no caller holds a pool thread.
    checks = await request.app.state.database_readiness.checks()
    for index, worker in enumerate(request.app.state.workers):
        ok, why = worker.readiness()
        checks[f"worker-{index}"] = "ok" if ok else why
    ready = all(v == "ok" for v in checks.values())
    body = HealthOut(status="ok" if ready else "unavailable", checks=checks)
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)
