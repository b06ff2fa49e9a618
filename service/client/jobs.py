"""A job document as the client hands it out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from service.client.errors import JobCancelledError, JobFailedError

FINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})


@dataclass(frozen=True)
class Job:
    """A job document as ``GET /merges/{id}`` answers it (``docs/api.md``); ``raw`` keeps every member."""

    id: str
    status: str
    phase: str
    target: str
    attempts: int
    table_version: int | None
    result: dict[str, int] | None
    metrics: dict[str, int] | None
    error: dict[str, Any] | None
    timings: dict[str, int] | None
    """Where the job's time went, milliseconds by segment, once it has ended (``docs/api.md``, Timings)."""
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Job:
        return cls(
            id=data["id"],
            status=data["status"],
            phase=data["phase"],
            target=data["target"],
            attempts=data.get("attempts", 0),
            table_version=data.get("table_version"),
            result=data.get("result"),
            metrics=data.get("metrics"),
            error=data.get("error"),
            timings=data.get("timings"),
            raw=dict(data),
        )

    @property
    def finished(self) -> bool:
        return self.status in FINAL_STATUSES


def outcome(job: Job, raise_on_failure: bool) -> Job:
    if raise_on_failure and job.status == "failed":
        raise JobFailedError(job)
    if raise_on_failure and job.status == "cancelled":
        raise JobCancelledError(job)
    return job
