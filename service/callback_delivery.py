"""Sending completion callbacks: a loop in each worker process claims due deliveries from the outbox, POSTs the
job with the event (``started``, or the status it ended with), signed with its token's key, and records the
outcome. Delivery is at least once: a sender killed after the receiver
answered but before the outcome was recorded leaves the delivery to be sent again, with the same
``Merge-Service-Delivery`` id, once its lease expires.

A 2xx answer delivers; 408, 429, 5xx, timeouts and connection errors are tried again with exponential back-off
and jitter (``Retry-After`` wins on 429 and 503) until ``callback_max_attempts`` or ``callback_max_age_seconds``
is spent; any other answer, a redirect (never followed), or an address the SSRF check refuses fails the delivery
at once. The worker's merges never wait on any of this: the loop has its own thread."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Literal

import httpx
import structlog
import tenacity

from service.callback_keys import signing_key
from service.callback_outbox import ClaimedDelivery
from service.callback_urls import CallbackUrlError, allowlist_of, parse_callback_url, resolve_addresses
from service.client.signatures import (
    ATTEMPT_HEADER,
    DELIVERY_HEADER,
    KEY_ID_HEADER,
    SIGNATURE_HEADER,
    signature_header,
)
from service.errors import DatabaseUnavailableError
from service.manager import JobManager
from service.metrics import ServiceMetrics
from service.routers.merges import job_json
from service.settings import Settings

log = structlog.get_logger(__name__)

USER_AGENT = "merge-service-callbacks/1"
RETRYABLE_STATUSES = frozenset({408, 429})
RETRY_AFTER_STATUSES = frozenset({429, 503})
SENDS_PER_ROUND = 8

Verdict = Literal["delivered", "retry", "failed"]


@dataclass(frozen=True)
class Outcome:
    """How one attempt went; ``retry_after`` is the receiver's own wait, in seconds, when it named one."""

    verdict: Verdict
    error: str | None = None
    retry_after: float | None = None
    key_id: str | None = None
    """The id of the key that signed the request, when one was sent."""


def callback_body(event: str, delivery_id: str, job_document: dict[str, object]) -> bytes:
    """The request body: the event and the job document as ``GET /merges/{id}`` shows it when sent (without its
    ``callback`` member, which changes as the delivery goes on). An end event's job is final, so every attempt
    of its delivery sends the same bytes; a ``started`` event's job may have moved on by a later attempt."""
    document = {k: v for k, v in job_document.items() if k != "callback"}
    return json.dumps({"event": event, "delivery_id": delivery_id, "job": document}, separators=(",", ":")).encode()


def retry_after_seconds(value: str | None, now: datetime) -> float | None:
    """``Retry-After`` as seconds or an HTTP date; None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # delta-seconds are ASCII digits only ("²" is a digit to Python)
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - now).total_seconds())


def judge(response: httpx.Response, now: datetime) -> Outcome:
    status = response.status_code
    if 200 <= status < 300:
        return Outcome("delivered")
    if 300 <= status < 400:
        where = response.headers.get("location", "elsewhere")
        return Outcome("failed", f"HTTP {status}: the receiver redirects to {where}; callbacks follow no redirects")
    error = f"HTTP {status} from the receiver"
    if status in RETRYABLE_STATUSES or status >= 500:
        wait = retry_after_seconds(response.headers.get("retry-after"), now) if status in RETRY_AFTER_STATUSES else None
        return Outcome("retry", error, retry_after=wait)
    return Outcome("failed", f"{error}, which will not change on a retry")


def backoff_seconds(attempt: int, settings: Settings) -> float:
    """Exponential back-off with jitter: about base * 2^(attempt-1), capped, plus up to one base at random."""
    wait = tenacity.wait_exponential_jitter(
        initial=settings.callback_backoff_base_seconds,
        max=settings.callback_backoff_max_seconds,
        jitter=settings.callback_backoff_base_seconds,
    )
    state = tenacity.RetryCallState(tenacity.Retrying(), None, (), {})
    state.attempt_number = attempt
    return float(wait(state))


class CallbackDeliverer:
    """The delivery loop of one worker: claims due callbacks, sends them, records each attempt."""

    def __init__(
        self,
        settings: Settings,
        manager: JobManager,
        metrics: ServiceMetrics,
        owner: str,
    ) -> None:
        self.settings = settings
        self.manager = manager
        self.metrics = metrics
        self.owner = f"{owner}:callbacks"
        self.lease_seconds = settings.callback_timeout_seconds + settings.lease_seconds
        self._client = httpx.Client(
            follow_redirects=False,
            trust_env=False,  # a proxy from the environment would reach the address the check did not look at
            timeout=settings.callback_timeout_seconds,
            # Connections are not reused: one to an address made for one host name must not carry another's request.
            limits=httpx.Limits(max_keepalive_connections=0),
            headers={"User-Agent": USER_AGENT},
        )
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"callbacks-{self.owner}", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Look for due deliveries now (a job of this worker has just ended)."""
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop after the request in flight; a delivery left claimed is sent again once its lease expires."""
        self._stop.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():  # a request still waits on its receiver: the process's exit ends it
                return
        self._client.close()

    def _loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                sent = self.run_once()
                failures = 0
            except DatabaseUnavailableError as exc:
                failures += 1
                log.warning("job database unavailable; callbacks wait", error=str(exc))
                self._stop.wait(min(30.0, self.settings.callback_poll_interval_seconds * 2**failures))
                continue
            except Exception:
                log.exception("callback delivery loop error")
                self._stop.wait(1.0)
                continue
            if not sent:
                self._wake.wait(self.settings.callback_poll_interval_seconds)
                self._wake.clear()

    def run_once(self) -> int:
        """Claim and send due deliveries, up to ``SENDS_PER_ROUND``; answers how many were attempted. Each is
        claimed just before it is sent, so its lease covers one request however slow the ones before it were."""
        sent = 0
        while sent < SENDS_PER_ROUND and not self._stop.is_set() and self.manager.deliveries_due():
            claimed = self.manager.claim_deliveries(self.owner, lease_seconds=self.lease_seconds, limit=1)
            if not claimed:
                break
            for delivery in claimed:
                self.deliver(delivery)
                sent += 1
        return sent

    def deliver(self, delivery: ClaimedDelivery) -> Verdict:
        bound = log.bind(
            job_id=delivery.job.id, delivery_id=delivery.id, event=delivery.event.value, attempt=delivery.attempt
        )
        if delivery.attempt > self.settings.callback_max_attempts:
            # The senders of the earlier attempts died before recording them.
            outcome = Outcome("failed", f"gave up after {delivery.attempt - 1} attempts whose senders stopped")
        else:
            started = time.monotonic()
            outcome = self._send(delivery)
            self.metrics.callback_request_seconds.observe(time.monotonic() - started)
        verdict = self._record(delivery, outcome)
        self.metrics.callback_deliveries.labels(verdict).inc()
        if verdict == "delivered":
            waited = (self.manager.clock() - delivery.created_at).total_seconds()
            self.metrics.callback_delivery_seconds.observe(max(0.0, waited))
            bound.info("callback delivered")
        else:
            bound.warning("callback not delivered", outcome=verdict, error=outcome.error)
        return verdict

    def _record(self, delivery: ClaimedDelivery, outcome: Outcome) -> Verdict:
        if outcome.verdict == "delivered":
            self.manager.record_delivered(delivery, key_id=outcome.key_id)
            return "delivered"
        error = outcome.error or "not delivered"
        if outcome.verdict == "retry":
            now = self.manager.clock()
            wait = outcome.retry_after
            if wait is None:
                wait = backoff_seconds(delivery.attempt, self.settings)
            # A receiver may ask for any wait: one beyond the deliveries' maximum age ends the delivery below.
            wait = min(wait, self.settings.callback_max_age_seconds + 1.0)
            next_at = now + timedelta(seconds=wait)
            deadline = delivery.created_at + timedelta(seconds=self.settings.callback_max_age_seconds)
            if delivery.attempt >= self.settings.callback_max_attempts:
                error = f"{error} (gave up after {delivery.attempt} attempts)"
            elif next_at > deadline:
                limit = self.settings.callback_max_age_seconds
                error = f"{error} (gave up: the next attempt would come more than {limit:g} s after the event)"
            else:
                self.manager.record_retry(delivery, error=error, next_attempt_at=next_at, key_id=outcome.key_id)
                return "retry"
        self.manager.record_failed(delivery, error=error, key_id=outcome.key_id)
        return "failed"

    def _send(self, delivery: ClaimedDelivery) -> Outcome:
        callback = delivery.job.callback
        if callback is None:  # the column is written once, at submission; a delivery without it has nowhere to go
            return Outcome("failed", "the job has no callback URL")
        try:
            target = parse_callback_url(callback.url)
            addresses = resolve_addresses(target, allowlist_of(self.settings))
        except CallbackUrlError as exc:
            return Outcome("failed", f"refused: {exc}")
        except OSError as exc:
            return Outcome("retry", f"could not resolve {callback.url!r}: {exc}")
        key = signing_key(self.settings, delivery.scope)
        if key is None:  # the deployment dropped the secret after the job was accepted
            return Outcome("failed", "no key signs this job's callbacks any more (neither its token's nor the default)")
        body = callback_body(delivery.event.value, delivery.id, job_json(delivery.job))
        timestamp = int(self.manager.clock().timestamp())
        headers = {
            "Content-Type": "application/json",
            "Host": target.host_header,
            DELIVERY_HEADER: delivery.id,
            ATTEMPT_HEADER: str(delivery.attempt),
            KEY_ID_HEADER: key.id,
            SIGNATURE_HEADER: signature_header(key.secret.get_secret_value(), body, timestamp),
        }
        extensions = {"sni_hostname": target.host} if target.scheme == "https" and target.literal is None else {}
        error = "no address answered"
        for address in addresses:
            try:
                with self._client.stream(
                    "POST", target.url_for(address), content=body, headers=headers, extensions=extensions
                ) as response:
                    return replace(judge(response, self.manager.clock()), key_id=key.id)
            except httpx.TimeoutException:
                return Outcome("retry", f"no answer within {self.settings.callback_timeout_seconds:g} s", key_id=key.id)
            except httpx.ConnectError as exc:
                error = f"could not connect to {address}: {exc}"
            except httpx.HTTPError as exc:
                return Outcome("retry", f"{type(exc).__name__}: {exc}", key_id=key.id)
        return Outcome("retry", error, key_id=key.id)
