"""A Python client for the merge job API (``docs/client.md``): sync ``MergeClient``, async ``AsyncMergeClient``,
typed errors carrying the problem JSON, and a merge builder shaped like Delta's ``DeltaMergeBuilder``.

Needs only httpx: it imports nothing of the server (no engine, pyspark, sqlalchemy or fastapi), so an
integration can use it on its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = [
    "AsyncJobHandle",
    "AsyncMergeClient",
    "ConflictError",
    "FieldError",
    "Job",
    "JobCancelledError",
    "JobFailedError",
    "JobHandle",
    "MergeBuilder",
    "MergeClient",
    "MergeServiceError",
    "NotFoundError",
    "RateLimitedError",
    "RefusedError",
    "UnauthorizedError",
    "UnavailableError",
    "WaitTimeoutError",
    "merge",
    "rows_source",
    "table_source",
]

DEFAULT_URL = "http://127.0.0.1:8000"
FINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})
RETRY_STATUSES = frozenset({429, 503})

# --- errors ---------------------------------------------------------------------------------------------------


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


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _error_for(response: httpx.Response) -> MergeServiceError:
    try:
        body = response.json()
        problem = body if isinstance(body, dict) else {}
    except ValueError:
        problem = {}
    problem.setdefault("status", response.status_code)
    problem.setdefault("title", response.reason_phrase)
    message = f"{response.status_code} {problem.get('title')}: {problem.get('detail') or ''}".rstrip(": ")
    if response.status_code == 429:
        return RateLimitedError(message, problem, _retry_after(response))
    return _BY_STATUS.get(response.status_code, MergeServiceError)(message, problem, response.status_code)


# --- jobs -----------------------------------------------------------------------------------------------------


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
            raw=dict(data),
        )

    @property
    def finished(self) -> bool:
        return self.status in FINAL_STATUSES


def _outcome(job: Job, raise_on_failure: bool) -> Job:
    if raise_on_failure and job.status == "failed":
        raise JobFailedError(job)
    if raise_on_failure and job.status == "cancelled":
        raise JobCancelledError(job)
    return job


# --- the merge builder ----------------------------------------------------------------------------------------


def table_source(path: str, format: str = "delta", options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A table source: a Delta table or files Spark reads (``parquet``, ``json``, ``csv``)."""
    return {"format": format, "path": path, "options": dict(options or {})}


def rows_source(rows: list[dict[str, Any]], schema: str | None = None) -> dict[str, Any]:
    """Inline rows, optionally typed by a Spark DDL column list."""
    source: dict[str, Any] = {"rows": rows}
    if schema is not None:
        source["schema"] = schema
    return source


def _clause(action: str, condition: str | None, **fields: Mapping[str, str]) -> dict[str, Any]:
    clause: dict[str, Any] = {"action": action}
    if condition is not None:
        clause["condition"] = condition
    clause.update({k: dict(v) for k, v in fields.items()})
    return clause


@dataclass(frozen=True)
class MergeBuilder:
    """Delta's ``DeltaMergeBuilder`` as a spec: each ``when_*`` call returns a new builder with one clause more,
    in order; ``to_spec()`` is the structured body ``POST /merges`` takes."""

    target: str
    source: Mapping[str, Any]
    on: str
    source_alias: str = "source"
    target_alias: str = "target"
    when_matched: tuple[dict[str, Any], ...] = ()
    when_not_matched: tuple[dict[str, Any], ...] = ()
    when_not_matched_by_source: tuple[dict[str, Any], ...] = ()
    schema_evolution: bool = False
    dry_run: bool = False

    def _add(self, kind: str, clause: dict[str, Any]) -> MergeBuilder:
        changes: dict[str, Any] = {kind: (*getattr(self, kind), clause)}
        return dataclasses.replace(self, **changes)

    def when_matched_update(self, set: Mapping[str, str], condition: str | None = None) -> MergeBuilder:
        return self._add("when_matched", _clause("update", condition, set=set))

    def when_matched_update_all(self, condition: str | None = None) -> MergeBuilder:
        return self._add("when_matched", _clause("update_all", condition))

    def when_matched_delete(self, condition: str | None = None) -> MergeBuilder:
        return self._add("when_matched", _clause("delete", condition))

    def when_not_matched_insert(self, values: Mapping[str, str], condition: str | None = None) -> MergeBuilder:
        return self._add("when_not_matched", _clause("insert", condition, values=values))

    def when_not_matched_insert_all(self, condition: str | None = None) -> MergeBuilder:
        return self._add("when_not_matched", _clause("insert_all", condition))

    def when_not_matched_by_source_update(self, set: Mapping[str, str], condition: str | None = None) -> MergeBuilder:
        return self._add("when_not_matched_by_source", _clause("update", condition, set=set))

    def when_not_matched_by_source_delete(self, condition: str | None = None) -> MergeBuilder:
        return self._add("when_not_matched_by_source", _clause("delete", condition))

    def with_schema_evolution(self) -> MergeBuilder:
        return dataclasses.replace(self, schema_evolution=True)

    def as_dry_run(self) -> MergeBuilder:
        return dataclasses.replace(self, dry_run=True)

    def to_spec(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "source": dict(self.source),
            "target_alias": self.target_alias,
            "source_alias": self.source_alias,
            "on": self.on,
            "when_matched": list(self.when_matched),
            "when_not_matched": list(self.when_not_matched),
            "when_not_matched_by_source": list(self.when_not_matched_by_source),
            "schema_evolution": self.schema_evolution,
            "dry_run": self.dry_run,
        }


def merge(
    target: str, source: Mapping[str, Any], on: str, *, source_alias: str = "source", target_alias: str = "target"
) -> MergeBuilder:
    """Start a merge of ``source`` (``table_source`` or ``rows_source``) into the Delta table at ``target``."""
    return MergeBuilder(target, source, on, source_alias=source_alias, target_alias=target_alias)


Merge = MergeBuilder | Mapping[str, Any] | str


def _body(request: Merge) -> dict[str, Any]:
    if isinstance(request, MergeBuilder):
        return request.to_spec()
    if isinstance(request, str):
        return {"sql": request}
    return dict(request)


# --- the shared policy ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long the client retries what is safe to retry: a dropped connection, 429 and 503.
    ``Retry-After`` wins over the back-off when the service sends it."""

    attempts: int = 5
    backoff: float = 0.5
    backoff_max: float = 10.0

    def delay(self, attempt: int, hint: float | None) -> float:
        return hint if hint is not None else min(self.backoff_max, self.backoff * 2**attempt)


@dataclass(frozen=True)
class _Call:
    method: str
    path: str
    json: dict[str, Any] | None = None
    params: dict[str, Any] | None = None
    headers: dict[str, str] | None = None


def _headers(token: str | None) -> dict[str, str]:
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def _submit_call(request: Merge, idempotency_key: str | None) -> _Call:
    """Every submit carries an ``Idempotency-Key`` (a fresh one unless given): the client's own retries of one
    submit then answer the job the first try created instead of creating a second."""
    return _Call(
        "POST", "/merges", json=_body(request), headers={"Idempotency-Key": idempotency_key or str(uuid.uuid4())}
    )


def _list_call(status: str | None, target: str | None, limit: int | None, cursor: str | None) -> _Call:
    params = {"status": status, "target": target, "limit": limit, "cursor": cursor}
    return _Call("GET", "/merges", params={k: v for k, v in params.items() if v is not None})


def _unreachable(exc: httpx.TransportError) -> UnavailableError:
    return UnavailableError(f"the merge service cannot be reached: {exc!r}")


def _poll_delay(response_hint: float | None, step: int, remaining: float, policy: RetryPolicy) -> float:
    return max(0.0, min(remaining, policy.delay(step, response_hint)))


# --- sync -----------------------------------------------------------------------------------------------------


class JobHandle:
    """A submitted job: ``job`` is its last known state."""

    def __init__(self, client: MergeClient, job: Job) -> None:
        self.client = client
        self.job = job

    @property
    def id(self) -> str:
        return self.job.id

    def refresh(self) -> Job:
        self.job = self.client.get(self.id)
        return self.job

    def wait(self, timeout: float = 600.0, *, raise_on_failure: bool = True) -> Job:
        self.job = self.client.wait(self.id, timeout=timeout, raise_on_failure=raise_on_failure)
        return self.job

    def cancel(self) -> Job:
        self.job = self.client.cancel(self.id)
        return self.job


class MergeClient:
    """The merge job API over httpx, synchronously. Use as a context manager, or call ``close()``."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retry: RetryPolicy = RetryPolicy(),
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.retry = retry
        self._http = httpx.Client(base_url=url, headers=_headers(token), timeout=timeout, transport=transport)

    def __enter__(self) -> MergeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, call: _Call) -> httpx.Response:
        """Send ``call``, retrying dropped connections, 429 and 503 (every call here is safe to repeat: reads,
        cancels, and submits under one idempotency key)."""
        for attempt in range(self.retry.attempts):
            last = attempt == self.retry.attempts - 1
            try:
                response = self._http.request(
                    call.method, call.path, json=call.json, params=call.params, headers=call.headers
                )
            except httpx.TransportError as exc:
                if last:
                    raise _unreachable(exc) from exc
                time.sleep(self.retry.delay(attempt, None))
                continue
            if response.status_code in RETRY_STATUSES and not last:
                time.sleep(self.retry.delay(attempt, _retry_after(response)))
                continue
            if response.is_error:
                raise _error_for(response)
            return response
        raise AssertionError("unreachable: the last attempt returns or raises")

    def submit(self, request: Merge, idempotency_key: str | None = None) -> JobHandle:
        """Submit a merge (a ``MergeBuilder``, a structured spec, or ``MERGE INTO`` SQL text)."""
        return JobHandle(self, Job.from_json(self._send(_submit_call(request, idempotency_key)).json()))

    def get(self, job_id: str) -> Job:
        return Job.from_json(self._send(_Call("GET", f"/merges/{job_id}")).json())

    def _get_with_hint(self, job_id: str) -> tuple[Job, float | None]:
        response = self._send(_Call("GET", f"/merges/{job_id}"))
        return Job.from_json(response.json()), _retry_after(response)

    def handle(self, job_id: str) -> JobHandle:
        return JobHandle(self, self.get(job_id))

    def cancel(self, job_id: str) -> Job:
        return Job.from_json(self._send(_Call("POST", f"/merges/{job_id}/cancel")).json())

    def wait(self, job_id: str, timeout: float = 600.0, *, raise_on_failure: bool = True, on_poll: Any = None) -> Job:
        """Poll until the job ends, sleeping as its ``Retry-After`` says (else a growing back-off); raise
        ``JobFailedError``/``JobCancelledError`` for those outcomes unless ``raise_on_failure`` is false, and
        ``WaitTimeoutError`` after ``timeout`` seconds. ``on_poll(job)`` sees every state read."""
        deadline = time.monotonic() + timeout
        step = 0
        while True:
            job, hint = self._get_with_hint(job_id)
            if on_poll is not None:
                on_poll(job)
            if job.finished:
                return _outcome(job, raise_on_failure)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeoutError(job, timeout)
            time.sleep(_poll_delay(hint, step, remaining, self.retry))
            step += 1

    def pages(
        self, *, status: str | None = None, target: str | None = None, limit: int | None = None
    ) -> Iterator[list[Job]]:
        """Pages of jobs, newest first, following ``next_cursor`` to the last page."""
        cursor: str | None = None
        while True:
            body = self._send(_list_call(status, target, limit, cursor)).json()
            yield [Job.from_json(item) for item in body["items"]]
            cursor = body["next_cursor"]
            if cursor is None:
                return

    def list(self, *, status: str | None = None, target: str | None = None, limit: int | None = None) -> Iterator[Job]:
        """Every job that matches, newest first, fetched a page of ``limit`` at a time."""
        for page in self.pages(status=status, target=target, limit=limit):
            yield from page


# --- async ----------------------------------------------------------------------------------------------------


class AsyncJobHandle:
    """A submitted job, for ``AsyncMergeClient``."""

    def __init__(self, client: AsyncMergeClient, job: Job) -> None:
        self.client = client
        self.job = job

    @property
    def id(self) -> str:
        return self.job.id

    async def refresh(self) -> Job:
        self.job = await self.client.get(self.id)
        return self.job

    async def wait(self, timeout: float = 600.0, *, raise_on_failure: bool = True) -> Job:
        self.job = await self.client.wait(self.id, timeout=timeout, raise_on_failure=raise_on_failure)
        return self.job

    async def cancel(self) -> Job:
        self.job = await self.client.cancel(self.id)
        return self.job


class AsyncMergeClient:
    """``MergeClient`` for asyncio, with the same calls, retries and errors."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retry: RetryPolicy = RetryPolicy(),
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.retry = retry
        self._http = httpx.AsyncClient(base_url=url, headers=_headers(token), timeout=timeout, transport=transport)

    async def __aenter__(self) -> AsyncMergeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: _Call) -> httpx.Response:
        for attempt in range(self.retry.attempts):
            last = attempt == self.retry.attempts - 1
            try:
                response = await self._http.request(
                    call.method, call.path, json=call.json, params=call.params, headers=call.headers
                )
            except httpx.TransportError as exc:
                if last:
                    raise _unreachable(exc) from exc
                await asyncio.sleep(self.retry.delay(attempt, None))
                continue
            if response.status_code in RETRY_STATUSES and not last:
                await asyncio.sleep(self.retry.delay(attempt, _retry_after(response)))
                continue
            if response.is_error:
                raise _error_for(response)
            return response
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def submit(self, request: Merge, idempotency_key: str | None = None) -> AsyncJobHandle:
        response = await self._send(_submit_call(request, idempotency_key))
        return AsyncJobHandle(self, Job.from_json(response.json()))

    async def get(self, job_id: str) -> Job:
        return Job.from_json((await self._send(_Call("GET", f"/merges/{job_id}"))).json())

    async def cancel(self, job_id: str) -> Job:
        return Job.from_json((await self._send(_Call("POST", f"/merges/{job_id}/cancel"))).json())

    async def wait(self, job_id: str, timeout: float = 600.0, *, raise_on_failure: bool = True) -> Job:
        deadline = time.monotonic() + timeout
        step = 0
        while True:
            response = await self._send(_Call("GET", f"/merges/{job_id}"))
            job = Job.from_json(response.json())
            if job.finished:
                return _outcome(job, raise_on_failure)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeoutError(job, timeout)
            await asyncio.sleep(_poll_delay(_retry_after(response), step, remaining, self.retry))
            step += 1

    async def pages(
        self, *, status: str | None = None, target: str | None = None, limit: int | None = None
    ) -> AsyncIterator[list[Job]]:
        cursor: str | None = None
        while True:
            body = (await self._send(_list_call(status, target, limit, cursor))).json()
            yield [Job.from_json(item) for item in body["items"]]
            cursor = body["next_cursor"]
            if cursor is None:
                return

    async def list(
        self, *, status: str | None = None, target: str | None = None, limit: int | None = None
    ) -> AsyncIterator[Job]:
        async for page in self.pages(status=status, target=target, limit=limit):
            for job in page:
                yield job
