"""``MergeClient`` and ``AsyncMergeClient``: the same calls, retries and errors over httpx, sync and async."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from service.client.builder import Merge, request_body
from service.client.errors import UnavailableError, WaitTimeoutError, error_for, retry_after
from service.client.jobs import Job, outcome

DEFAULT_URL = "http://127.0.0.1:8000"
RETRY_STATUSES = frozenset({429, 503})

# --- the shared policy ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long the client retries what is safe to retry: a dropped connection, 429 and 503.
    ``Retry-After`` wins over the back-off when the service sends it."""

    attempts: int = 5
    backoff: float = 0.5
    backoff_max: float = 10.0
    retry_after_max: float = 60.0
    """The longest wait a ``Retry-After`` may ask for (a proxy may ask for hours)."""

    def delay(self, attempt: int, hint: float | None) -> float:
        if hint is not None:
            return min(hint, self.retry_after_max)
        return min(self.backoff_max, self.backoff * 2**attempt)

    def gives_up(self, attempt: int, delay: float, deadline: float | None) -> bool:
        """Whether to stop retrying: the attempts are spent, or the wait would pass the caller's deadline."""
        return attempt == self.attempts - 1 or (deadline is not None and time.monotonic() + delay > deadline)


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
        "POST", "/merges", json=request_body(request), headers={"Idempotency-Key": idempotency_key or str(uuid.uuid4())}
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

    def _send(self, call: _Call, deadline: float | None = None) -> httpx.Response:
        """Send ``call``, retrying dropped connections, 429 and 503 (every call here is safe to repeat: reads,
        cancels, and submits under one idempotency key), never waiting past ``deadline`` (``time.monotonic()``)."""
        for attempt in range(self.retry.attempts):
            try:
                response = self._http.request(
                    call.method, call.path, json=call.json, params=call.params, headers=call.headers
                )
            except httpx.TransportError as exc:
                delay = self.retry.delay(attempt, None)
                if self.retry.gives_up(attempt, delay, deadline):
                    raise _unreachable(exc) from exc
                time.sleep(delay)
                continue
            if response.status_code in RETRY_STATUSES:
                delay = self.retry.delay(attempt, retry_after(response))
                if not self.retry.gives_up(attempt, delay, deadline):
                    time.sleep(delay)
                    continue
            if response.is_error:
                raise error_for(response)
            return response
        raise AssertionError("unreachable: the last attempt returns or raises")

    def submit(self, request: Merge, idempotency_key: str | None = None) -> JobHandle:
        """Submit a merge (a ``MergeBuilder``, a structured spec, or ``MERGE INTO`` SQL text)."""
        return JobHandle(self, Job.from_json(self._send(_submit_call(request, idempotency_key)).json()))

    def get(self, job_id: str) -> Job:
        return Job.from_json(self._send(_Call("GET", f"/merges/{job_id}")).json())

    def _get_with_hint(self, job_id: str, deadline: float) -> tuple[Job, float | None]:
        response = self._send(_Call("GET", f"/merges/{job_id}"), deadline)
        return Job.from_json(response.json()), retry_after(response)

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
            job, hint = self._get_with_hint(job_id, deadline)
            if on_poll is not None:
                on_poll(job)
            if job.finished:
                return outcome(job, raise_on_failure)
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

    async def _send(self, call: _Call, deadline: float | None = None) -> httpx.Response:
        for attempt in range(self.retry.attempts):
            try:
                response = await self._http.request(
                    call.method, call.path, json=call.json, params=call.params, headers=call.headers
                )
            except httpx.TransportError as exc:
                delay = self.retry.delay(attempt, None)
                if self.retry.gives_up(attempt, delay, deadline):
                    raise _unreachable(exc) from exc
                await asyncio.sleep(delay)
                continue
            if response.status_code in RETRY_STATUSES:
                delay = self.retry.delay(attempt, retry_after(response))
                if not self.retry.gives_up(attempt, delay, deadline):
                    await asyncio.sleep(delay)
                    continue
            if response.is_error:
                raise error_for(response)
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
            response = await self._send(_Call("GET", f"/merges/{job_id}"), deadline)
            job = Job.from_json(response.json())
            if job.finished:
                return outcome(job, raise_on_failure)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeoutError(job, timeout)
            await asyncio.sleep(_poll_delay(retry_after(response), step, remaining, self.retry))
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
