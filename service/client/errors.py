"""The client's errors: one root carrying the problem JSON, a subclass per kind that callers catch."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from service.client.jobs import Job


@dataclass(frozen=True)
class FieldError:
    """One ``errors`` member of a 422 problem: the field at fault, as a path into the body."""

    field: str
    message: str


class MergeServiceError(Exception):
    """Root of the client's errors; ``problem`` is the RFC 9457 document the service answered (or the job's
    ``error``), empty when there was none (the service could not be reached)."""

    def __init__(self, message: str, problem: Mapping[str, Any] | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.problem: dict[str, Any] = dict(problem or {})
        self.status = status if status is not None else self.problem.get("status")

    @property
    def type(self) -> str | None:
        return self.problem.get("type")

    @property
    def title(self) -> str | None:
        return self.problem.get("title")

    @property
    def detail(self) -> str | None:
        return self.problem.get("detail")

    @property
    def errors(self) -> list[FieldError]:
        return [
            FieldError(str(e.get("field", "")), str(e.get("message", ""))) for e in self.problem.get("errors") or []
        ]


class RefusedError(MergeServiceError):
    """422 (or 413): the request cannot be valid; ``errors`` names the fields at fault. Retrying will not help."""


class NotFoundError(MergeServiceError):
    """404: no job of this token's has the id."""


class UnauthorizedError(MergeServiceError):
    """401: a missing or wrong bearer token."""


class ConflictError(MergeServiceError):
    """409: the ``Idempotency-Key`` was used before with another body."""


class RateLimitedError(MergeServiceError):
    """429 after the client's own retries; ``retry_after`` is the service's last hint in seconds."""

    def __init__(self, message: str, problem: Mapping[str, Any] | None = None, retry_after: float | None = None):
        super().__init__(message, problem, 429)
        self.retry_after = retry_after


class UnavailableError(MergeServiceError):
    """503, or the service could not be reached, after the client's own retries."""


class JobFailedError(MergeServiceError):
    """The job ended ``failed``; ``problem`` is its ``error`` and ``job`` the job document."""

    def __init__(self, job: Job) -> None:
        super().__init__(f"merge job {job.id} failed: {(job.error or {}).get('detail')}", job.error)
        self.job = job


class JobCancelledError(MergeServiceError):
    """The job ended ``cancelled``; the table is unchanged."""

    def __init__(self, job: Job) -> None:
        super().__init__(f"merge job {job.id} was cancelled", job.error)
        self.job = job


class WaitTimeoutError(MergeServiceError):
    """The job did not finish within the wait's timeout; it goes on running (``job`` is its last state)."""

    def __init__(self, job: Job, timeout: float) -> None:
        super().__init__(f"merge job {job.id} still {job.status} after {timeout:g} s")
        self.job = job


_BY_STATUS: dict[int, type[MergeServiceError]] = {
    401: UnauthorizedError,
    404: NotFoundError,
    409: ConflictError,
    413: RefusedError,
    422: RefusedError,
    503: UnavailableError,
}


def retry_after(response: httpx.Response) -> float | None:
    """``Retry-After`` in seconds; None when absent or not a finite number."""
    value = response.headers.get("Retry-After")
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return max(0.0, seconds) if seconds is not None and math.isfinite(seconds) else None


def error_for(response: httpx.Response) -> MergeServiceError:
    try:
        body = response.json()
        problem = body if isinstance(body, dict) else {}
    except ValueError:
        problem = {}
    problem.setdefault("status", response.status_code)
    problem.setdefault("title", response.reason_phrase)
    message = f"{response.status_code} {problem.get('title')}: {problem.get('detail') or ''}".rstrip(": ")
    if response.status_code == 429:
        return RateLimitedError(message, problem, retry_after(response))
    return _BY_STATUS.get(response.status_code, MergeServiceError)(message, problem, response.status_code)
