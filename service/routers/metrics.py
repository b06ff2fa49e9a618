"""Prometheus scrape endpoint."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from service.deps import MetricsDep

router = APIRouter(tags=["metrics"])


@router.get(
    "/metrics",
    summary="Prometheus text format",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Metrics."}},
)
def metrics(service_metrics: MetricsDep) -> Response:
    return Response(generate_latest(service_metrics.registry), media_type=CONTENT_TYPE_LATEST)
