"""Completion callbacks against a real HTTP receiver on a loopback port: the outbox row written with the job's
end on every path that ends a job, signatures that verify, retries that honour Retry-After, permanent failures,
the delivery's state in the job's GET, and the SSRF refusals at submission and at send time. Jobs end through the
store's own calls, the ones the worker makes; the job store runs on SQLite and PostgreSQL alike."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from pydantic import SecretStr
from sqlalchemy import delete, select

from service.app import create_app
from service.callback_delivery import CallbackDeliverer, backoff_seconds, retry_after_seconds
from service.callback_urls import (
    Allowlist,
    CallbackUrlError,
    check_literal_host,
    forbidden_kind,
    parse_callback_url,
)
from service.client import CallbackSignatureError, verify_callback
from service.client.signatures import DELIVERY_HEADER, SIGNATURE_HEADER, signature_header
from service.jobs import DeliveryStatus, Lease, NewJob, Status
from service.manager import JobManager
from service.metrics import ServiceMetrics
from service.models import callbacks
from service.problems import cancelled_problem, job_problem, lease_lost_problem
from service.settings import Settings
from tests.service.callback_receiver import Receiver
from tests.service.conftest import FakeClock, wait_until

SECRET = "callback-secret-for-tests"
PROBLEM = "application/problem+json"
CANCELLED = cancelled_problem("cancelled")


@pytest.fixture
def cb_settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={
            "callback_secret": SecretStr(SECRET),
            "callback_allowed_hosts": ["127.0.0.1", "*.example.com", "*.example.invalid"],
            "callback_timeout_seconds": 5.0,
            "callback_backoff_base_seconds": 1.0,
            "callback_backoff_max_seconds": 60.0,
        }
    )


def deliverer_for(settings: Settings, store: JobManager, metrics: ServiceMetrics | None = None) -> CallbackDeliverer:
    return CallbackDeliverer(settings, store, metrics or ServiceMetrics(), "test-worker")


@pytest.fixture
def deliverer(cb_settings: Settings, store: JobManager) -> Iterator[CallbackDeliverer]:
    d = deliverer_for(cb_settings, store)
    yield d
    d.stop()


def events(store: JobManager, job_id: str) -> list[str]:
    """The job's outbox rows, by event, in the order they were written."""
    with store.engine.connect() as conn:
        rows = conn.execute(select(callbacks.c.event).where(callbacks.c.job_id == job_id).order_by(callbacks.c.id))
        return [r.event for r in rows]


def drop_started(store: JobManager) -> None:
    """Leave the end events alone in the outbox: the tests of one delivery's course follow the end's."""
    with store.engine.begin() as conn:
        conn.execute(delete(callbacks).where(callbacks.c.event == "started"))


def submitted(store: JobManager, url: str | None, target: str = "/lake/a") -> str:
    job, _ = store.submit(NewJob(target=target, target_key=target, spec={}, dry_run=False, callback_url=url))
    return job.id


def succeeded(store: JobManager, url: str | None, target: str = "/lake/a") -> str:
    job_id = submitted(store, url, target)
    claimed = store.claim("worker-1")
    assert claimed is not None and claimed.lease.job_id == job_id
    drop_started(store)
    store.succeed(claimed.lease, table_version=4, result={"num_affected_rows": 2}, metrics={"numSourceRows": 2})
    return job_id


def next_attempt_at(store: JobManager, job_id: str) -> Any:
    with store.engine.connect() as conn:
        due = select(callbacks.c.next_attempt_at).where(callbacks.c.job_id == job_id, callbacks.c.event != "started")
        return conn.execute(due).scalar_one()


# --- the outbox: written in the transaction that ends the job --------------------------------------------------


def test_a_queued_job_shows_its_callback_pending_without_a_delivery(store: JobManager) -> None:
    job = store.get(submitted(store, "https://hooks.example.com/merge"))
    assert job.callback is not None
    assert (job.callback.url, job.callback.status, job.callback.delivery_id) == (
        "https://hooks.example.com/merge",
        DeliveryStatus.PENDING,
        None,
    )
    assert store.get(submitted(store, None, "/lake/b")).callback is None
    assert not store.deliveries_due()


def _retry(store: JobManager, lease: Lease) -> Status:
    """An attempt that failed with a retryable error, asking for no delay before the next."""
    return store.retry(lease, error=job_problem(ValueError("x")), delay_seconds=0, cancel_error=CANCELLED)


def _end_by_fail(store: JobManager, job_id: str) -> None:
    claimed = store.claim("w")
    assert claimed is not None
    store.fail(claimed.lease, error=job_problem(ValueError("boom")))


def _end_by_cancel_running(store: JobManager, job_id: str) -> None:
    claimed = store.claim("w")
    assert claimed is not None
    store.cancel_running(claimed.lease, error=CANCELLED)


def _end_by_cancel_queued(store: JobManager, job_id: str) -> None:
    store.request_cancel(job_id, problem=CANCELLED)


def _end_by_retry_after_cancel(store: JobManager, job_id: str) -> None:
    claimed = store.claim("w")
    assert claimed is not None
    store.request_cancel(job_id, problem=CANCELLED)
    assert _retry(store, claimed.lease) is Status.CANCELLED


def _end_by_reclaim_when_attempts_are_spent(store: JobManager, job_id: str) -> None:
    claimed = store.claim("w")
    assert claimed is not None
    store.clock.advance(60)  # type: ignore[attr-defined]
    assert store.reclaim_expired(max_attempts=1, lost_problem=lease_lost_problem, cancel_error=CANCELLED) == [job_id]


@pytest.mark.parametrize(
    ("end", "status"),
    [
        (_end_by_fail, Status.FAILED),
        (_end_by_cancel_running, Status.CANCELLED),
        (_end_by_cancel_queued, Status.CANCELLED),
        (_end_by_retry_after_cancel, Status.CANCELLED),
        (_end_by_reclaim_when_attempts_are_spent, Status.FAILED),
    ],
)
def test_every_way_a_job_ends_promises_its_callback(store: JobManager, end: Any, status: Status) -> None:
    job_id = submitted(store, "https://hooks.example.com/merge")
    other = submitted(store, None, "/lake/other")
    end(store, job_id)
    job = store.get(job_id)
    assert job.status is status
    assert job.callback is not None and job.callback.delivery_id is not None
    assert job.callback.status is DeliveryStatus.PENDING and job.callback.attempts == 0
    assert store.deliveries_due()
    started = [] if end is _end_by_cancel_queued else ["started"]
    assert events(store, job_id) == [*started, status.value], "each event is its own delivery"
    assert store.get(other).callback is None


def test_success_promises_the_callback_and_a_retry_does_not(store: JobManager) -> None:
    job_id = submitted(store, "https://hooks.example.com/merge")
    claimed = store.claim("w")
    assert claimed is not None
    assert _retry(store, claimed.lease) is Status.QUEUED
    assert store.get(job_id).callback.delivery_id is None  # type: ignore[union-attr]
    claimed = store.claim("w")
    assert claimed is not None and not claimed.started_event
    store.succeed(claimed.lease, table_version=1, result={}, metrics={})
    assert store.get(job_id).callback.delivery_id is not None  # type: ignore[union-attr]
    assert events(store, job_id) == ["started", "succeeded"], "the second attempt promised no second start"


def test_a_lost_lease_ends_nothing_and_promises_nothing(store: JobManager, clock: FakeClock) -> None:
    """The job's end and the outbox row commit together: a fenced-off finish writes neither."""
    job_id = submitted(store, "https://hooks.example.com/merge")
    claimed = store.claim("w")
    assert claimed is not None
    clock.advance(60)
    store.reclaim_expired(max_attempts=5, lost_problem=lease_lost_problem, cancel_error=CANCELLED)
    with pytest.raises(Exception, match="no longer held"):
        store.succeed(claimed.lease, table_version=1, result={}, metrics={})
    job = store.get(job_id)
    assert job.status is Status.QUEUED and job.callback.delivery_id is None  # type: ignore[union-attr]
    assert events(store, job_id) == ["started"]


# --- sending: body, headers, signature ---------------------------------------------------------------------------


def test_delivery_posts_the_finished_job_signed(
    store: JobManager, deliverer: CallbackDeliverer, receiver: Receiver, clock: FakeClock
) -> None:
    job_id = succeeded(store, receiver.url())
    assert deliverer.run_once() == 1
    [request] = receiver.wait_for(1)
    assert request.path == "/hook"
    assert request.headers["content-type"] == "application/json"
    document = verify_callback(
        request.body, request.headers[SIGNATURE_HEADER.lower()], SECRET, now=clock.now.timestamp()
    )
    job = store.get(job_id)
    assert job.callback is not None and job.callback.status is DeliveryStatus.DELIVERED
    assert document["event"] == "succeeded"
    assert document["delivery_id"] == job.callback.delivery_id == request.headers[DELIVERY_HEADER.lower()]
    sent = document["job"]
    assert (sent["id"], sent["status"], sent["target"], sent["table_version"]) == (job_id, "succeeded", "/lake/a", 4)
    assert sent["metrics"] == {"numSourceRows": 2} and sent["result"] == {"num_affected_rows": 2}
    assert sent["finished_at"] == job.finished_at.isoformat().replace("+00:00", "Z")  # type: ignore[union-attr]
    assert "callback" not in sent
    assert job.callback.attempts == 1 and job.callback.delivered_at == clock.now and job.callback.last_error is None
    assert deliverer.run_once() == 0 and len(receiver.requests) == 1


def test_a_failed_job_sends_its_problem(store: JobManager, deliverer: CallbackDeliverer, receiver: Receiver) -> None:
    job_id = submitted(store, receiver.url())
    _end_by_fail(store, job_id)
    deliverer.run_once()
    by_event = {json.loads(r.body)["event"]: json.loads(r.body)["job"] for r in receiver.wait_for(2)}
    assert sorted(by_event) == ["failed", "started"]
    sent = by_event["failed"]
    assert sent["status"] == "failed"
    assert sent["error"]["type"] == "urn:merge-service:problem:internal" and "boom" in sent["error"]["detail"]


def test_signature_verification_refuses_tampering_other_secrets_and_old_requests() -> None:
    body = b'{"event":"merge.finished"}'
    header = signature_header(SECRET, body, 1_000_000)
    assert verify_callback(body, header, SECRET, now=1_000_010) == {"event": "merge.finished"}
    assert verify_callback(body, f"t=1000000,v1={'0' * 64},v1={header.split('v1=')[1]}", SECRET, now=1_000_000)
    refusals = {
        "tampered": (body.replace(b"finished", b"started"), header, SECRET, 1_000_000),
        "other secret": (body, header, "another", 1_000_000),
        "replayed late": (body, header, SECRET, 1_000_301),
        "from the future": (body, header, SECRET, 999_699),
        "no header": (body, None, SECRET, 1_000_000),
        "malformed": (body, "v1=abc", SECRET, 1_000_000),
    }
    for name, (raw, header_value, secret, now) in refusals.items():
        with pytest.raises(CallbackSignatureError):
            verify_callback(raw, header_value, secret, now=now)
            pytest.fail(f"{name} was accepted")


# --- retries, Retry-After, permanent failures --------------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_is_honoured_and_the_retry_carries_the_same_delivery(
    store: JobManager, deliverer: CallbackDeliverer, receiver: Receiver, clock: FakeClock, status: int
) -> None:
    job_id = succeeded(store, receiver.url())
    receiver.answer((status, {"Retry-After": "37"}))
    deliverer.run_once()
    job = store.get(job_id)
    assert job.callback is not None and job.callback.status is DeliveryStatus.PENDING
    assert job.callback.attempts == 1 and job.callback.last_error == f"HTTP {status} from the receiver"
    assert next_attempt_at(store, job_id) == clock.now + timedelta(seconds=37)
    clock.advance(36)
    assert deliverer.run_once() == 0
    clock.advance(1)
    assert deliverer.run_once() == 1
    first, second = receiver.wait_for(2)
    assert first.body == second.body
    assert first.headers[DELIVERY_HEADER.lower()] == second.headers[DELIVERY_HEADER.lower()]
    assert (first.headers["merge-service-attempt"], second.headers["merge-service-attempt"]) == ("1", "2")
    job = store.get(job_id)
    assert job.callback.status is DeliveryStatus.DELIVERED and job.callback.attempts == 2  # type: ignore[union-attr]


@pytest.mark.parametrize("status", [408, 500, 502])
def test_transient_answers_back_off_exponentially_with_jitter(
    store: JobManager, deliverer: CallbackDeliverer, receiver: Receiver, clock: FakeClock, status: int
) -> None:
    job_id = succeeded(store, receiver.url())
    receiver.answer((status, {"Retry-After": "999"}), (status, {}))
    started = clock.now
    deliverer.run_once()
    waited = (next_attempt_at(store, job_id) - started).total_seconds()
    assert 1.0 <= waited <= 2.0, "attempt 1: base 1 s plus up to 1 s of jitter; Retry-After only counts on 429/503"
    clock.advance(waited)
    deliverer.run_once()
    waited = (next_attempt_at(store, job_id) - clock.now).total_seconds()
    assert 2.0 <= waited <= 3.0
    assert store.get(job_id).callback.attempts == 2  # type: ignore[union-attr]


def test_backoff_grows_and_is_capped(cb_settings: Settings) -> None:
    waits = [backoff_seconds(n, cb_settings) for n in range(1, 12)]
    assert all(2 ** (n - 1) <= w <= 2 ** (n - 1) + 1 for n, w in enumerate(waits[:5], start=1))
    assert max(waits) <= cb_settings.callback_backoff_max_seconds


def test_retry_after_reads_seconds_and_dates(clock: FakeClock) -> None:
    assert retry_after_seconds("120", clock.now) == 120
    assert retry_after_seconds("Thu, 01 Jan 2026 00:01:30 GMT", clock.now) == 90
    assert retry_after_seconds("Wed, 31 Dec 2025 00:00:00 GMT", clock.now) == 0
    assert retry_after_seconds("soon", clock.now) is None and retry_after_seconds(None, clock.now) is None
    assert retry_after_seconds("\u00b2", clock.now) is None, "a digit to Python, not to HTTP"


def test_a_wait_beyond_the_maximum_age_ends_the_delivery(
    store: JobManager, deliverer: CallbackDeliverer, receiver: Receiver, clock: FakeClock, cb_settings: Settings
) -> None:
    """However long the receiver asks to wait (here some 9,500 years, past what a date can hold), the delivery
    ends as one whose next attempt would come too late, recorded at once."""
    job_id = succeeded(store, receiver.url())
    receiver.answer((503, {"Retry-After": "300000000000"}))
    deliverer.run_once()
    callback = store.get(job_id).callback
    assert callback is not None and callback.status is DeliveryStatus.FAILED and callback.attempts == 1
    limit = f"{cb_settings.callback_max_age_seconds:g}"
    assert (
        callback.last_error
        == f"HTTP 503 from the receiver (gave up: the next attempt would come more than {limit} s after the event)"
    )
    clock.advance(3600)
    assert deliverer.run_once() == 0 and len(receiver.requests) == 1


@pytest.mark.parametrize("status", [400, 401, 403, 404, 410, 422])
def test_other_client_errors_fail_the_delivery_at_once(
    store: JobManager, deliverer: CallbackDeliverer, receiver: Receiver, clock: FakeClock, status: int
) -> None:
    job_id = succeeded(store, receiver.url())
    receiver.answer((status, {}))
    deliverer.run_once()
    callback = store.get(job_id).callback
    assert callback is not None and callback.status is DeliveryStatus.FAILED and callback.attempts == 1
    assert callback.last_error is not None and f"HTTP {status}" in callback.last_error
    clock.advance(3600)
    assert deliverer.run_once() == 0 and len(receiver.requests) == 1


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_redirects_are_not_followed(
    store: JobManager, deliverer: CallbackDeliverer, receiver: Receiver, status: int
) -> None:
    job_id = succeeded(store, receiver.url())
    receiver.answer((status, {"Location": receiver.url(path="/elsewhere")}))
    deliverer.run_once()
    callback = store.get(job_id).callback
    assert callback is not None and callback.status is DeliveryStatus.FAILED
    assert "redirect" in (callback.last_error or "")
    assert [r.path for r in receiver.requests] == ["/hook"]


def test_gives_up_after_the_attempt_limit(
    cb_settings: Settings, store: JobManager, receiver: Receiver, clock: FakeClock
) -> None:
    deliverer = deliverer_for(cb_settings.model_copy(update={"callback_max_attempts": 3}), store)
    job_id = succeeded(store, receiver.url())
    receiver.answer((500, {}), (500, {}), (500, {}), (204, {}))
    for _ in range(5):
        deliverer.run_once()
        clock.advance(60)
    deliverer.stop()
    callback = store.get(job_id).callback
    assert callback is not None and callback.status is DeliveryStatus.FAILED and callback.attempts == 3
    assert callback.last_error == "HTTP 500 from the receiver (gave up after 3 attempts)"
    assert len(receiver.requests) == 3


def test_gives_up_when_the_next_attempt_would_come_too_late(
    cb_settings: Settings, store: JobManager, receiver: Receiver
) -> None:
    deliverer = deliverer_for(cb_settings.model_copy(update={"callback_max_age_seconds": 30.0}), store)
    job_id = succeeded(store, receiver.url())
    receiver.answer((503, {"Retry-After": "31"}))
    deliverer.run_once()
    deliverer.stop()
    callback = store.get(job_id).callback
    assert callback is not None and callback.status is DeliveryStatus.FAILED
    assert "more than 30 s after the event" in (callback.last_error or "")


def test_an_unreachable_receiver_is_tried_again(
    store: JobManager, deliverer: CallbackDeliverer, receiver: Receiver
) -> None:
    url = receiver.url()
    receiver.close()  # nothing listens on the port any more
    job_id = succeeded(store, url)
    deliverer.run_once()
    callback = store.get(job_id).callback
    assert callback is not None and callback.status is DeliveryStatus.PENDING and callback.attempts == 1
    assert "could not connect" in (callback.last_error or "")


def test_a_sender_that_lost_its_lease_records_nothing_and_the_next_sends_the_same_delivery(
    cb_settings: Settings, store: JobManager, clock: FakeClock
) -> None:
    """At least once: a sender that stopped (killed, or the lease ran out mid-request) leaves its delivery to the
    next sender once the lease expires, under the same delivery id; the late sender's outcome is fenced off."""
    job_id = succeeded(store, "https://hooks.example.com/merge")
    [first] = store.claim_deliveries("sender-a", lease_seconds=10)
    assert store.claim_deliveries("sender-b", lease_seconds=10) == []
    clock.advance(11)
    [second] = store.claim_deliveries("sender-b", lease_seconds=10)
    assert (second.id, second.attempt, first.attempt) == (first.id, 2, 1)
    assert not store.record_delivered(first)
    clock.advance(11)
    [third] = store.claim_deliveries("sender-b", lease_seconds=10)  # the same sender, its own lease lapsed
    assert (third.id, third.attempt) == (first.id, 3)
    assert not store.record_delivered(second), "an attempt is fenced by its number, not only by its sender"
    assert store.record_delivered(third)
    assert store.get(job_id).callback.status is DeliveryStatus.DELIVERED  # type: ignore[union-attr]


def test_a_claim_takes_no_more_deliveries_than_its_limit(store: JobManager) -> None:
    """Two events of one job due at once: a claim of one leaves the other unclaimed for the next sender."""
    job_id = submitted(store, "https://hooks.example.com/merge")
    _end_by_fail(store, job_id)
    [first] = store.claim_deliveries("sender-a", lease_seconds=10, limit=1)
    [second] = store.claim_deliveries("sender-b", lease_seconds=10, limit=1)
    assert first.id != second.id and {first.event, second.event} == {"started", "failed"}
    assert (first.attempt, second.attempt) == (1, 1)
    assert store.claim_deliveries("sender-c", lease_seconds=10, limit=5) == []


def test_a_delivery_whose_senders_kept_dying_is_given_up(
    cb_settings: Settings, store: JobManager, receiver: Receiver, clock: FakeClock
) -> None:
    deliverer = deliverer_for(cb_settings.model_copy(update={"callback_max_attempts": 2}), store)
    job_id = succeeded(store, receiver.url())
    for owner in ("a", "b"):
        store.claim_deliveries(owner, lease_seconds=10)
        clock.advance(11)
    deliverer.run_once()
    deliverer.stop()
    callback = store.get(job_id).callback
    assert callback is not None and callback.status is DeliveryStatus.FAILED and callback.attempts == 3
    assert receiver.requests == []


def test_metrics_count_outcomes_and_measure_latency(
    cb_settings: Settings, store: JobManager, receiver: Receiver, clock: FakeClock
) -> None:
    metrics = ServiceMetrics()
    deliverer = deliverer_for(cb_settings, store, metrics)
    succeeded(store, receiver.url())
    receiver.answer((500, {}))
    deliverer.run_once()
    clock.advance(5)
    deliverer.run_once()
    deliverer.stop()
    value = metrics.registry.get_sample_value
    assert value("merge_callback_deliveries_total", {"outcome": "retry"}) == 1
    assert value("merge_callback_deliveries_total", {"outcome": "delivered"}) == 1
    assert value("merge_callback_delivery_seconds_count") == 1
    assert value("merge_callback_delivery_seconds_sum") == 5
    assert value("merge_callback_request_seconds_count") == 2


# --- the API: submission checks and the delivery's state ---------------------------------------------------------


@pytest.fixture
def api(cb_settings: Settings, store: JobManager) -> TestClient:
    return TestClient(create_app(cb_settings, manager=store), raise_server_exceptions=False)


def merge_body(lake: Path, **extra: Any) -> dict[str, Any]:
    return {
        "target": str(lake / "orders"),
        "source": {"rows": [{"id": 1}], "schema": "id BIGINT"},
        "on": "target.id = source.id",
        "when_not_matched": [{"action": "insert_all"}],
        **extra,
    }


REFUSED_AT_SUBMISSION = [
    ("ftp://hooks.example.com/x", "scheme"),
    ("hooks.example.com/merge", "scheme"),
    ("http:///merge", "no host"),
    ("http://user:pw@hooks.example.com/", "credentials"),
    ("http://hooks.example.com:99999/", "malformed"),
    ("http://hooks example.com/", "whitespace"),
    ("http://10.1.2.3/", "private"),
    ("http://192.168.0.10:8080/hook", "private"),
    ("http://172.16.5.4/", "private"),
    ("http://127.0.0.2/", "loopback"),
    ("http://localhost:8080/", "loopback"),
    ("http://api.localhost/", "loopback"),
    ("http://169.254.169.254/latest/meta-data", "link-local"),
    ("http://0.0.0.0/", "unspecified"),
    ("http://224.0.0.1/", "multicast"),
    ("http://240.0.0.1/", "reserved"),
    ("http://100.64.0.1/", "not globally routable"),
    ("http://2130706434/", "loopback"),
    ("http://0x7f.2/", "loopback"),
    ("http://[::1]/", "loopback"),
    ("http://[::]/", "unspecified"),
    ("http://[fe80::1]/", "link-local"),
    ("http://[fc00::1]/", "private"),
    ("http://[ff02::1]/", "multicast"),
    ("http://[::ffff:10.0.0.1]/", "private"),
    ("http://[2001:db8::1]/", "private"),
]


@pytest.mark.parametrize(("url", "why"), REFUSED_AT_SUBMISSION)
def test_submission_refuses_a_malformed_or_internal_callback(
    api: TestClient, lake: Path, store: JobManager, url: str, why: str
) -> None:
    """The deployment allows 127.0.0.1 only (the receiver's address): every other internal address is refused."""
    response = api.post("/merges", json=merge_body(lake, callback=url))
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    problem = response.json()
    assert [e["field"] for e in problem["errors"]] == ["callback"]
    assert why in problem["detail"], problem["detail"]
    assert store.list_jobs()[0] == []


def test_submission_refuses_a_callback_that_is_not_a_string(api: TestClient, lake: Path) -> None:
    response = api.post("/merges", json=merge_body(lake, callback={"url": "https://hooks.example.com/"}))
    assert response.status_code == 422
    assert [e["field"] for e in response.json()["errors"]] == ["callback"]


def test_without_a_secret_callbacks_are_refused(settings: Settings, store: JobManager, lake: Path) -> None:
    api = TestClient(create_app(settings, manager=store), raise_server_exceptions=False)
    response = api.post("/merges", json=merge_body(lake, callback="https://hooks.example.com/merge"))
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == "callback"
    assert "MERGE_SERVICE_CALLBACK_SECRET" in response.json()["detail"]
    assert api.post("/merges", json=merge_body(lake)).status_code == 202


def test_localhost_needs_its_name_and_a_loopback_network_listed(
    cb_settings: Settings, store: JobManager, lake: Path
) -> None:
    """``localhost`` is loopback whatever DNS says: listed by name alone, every send would be refused, so the
    submission is."""
    for hosts, status in ((["localhost"], 422), (["localhost", "127.0.0.0/8"], 202), (["::1", "localhost"], 202)):
        listed = cb_settings.model_copy(update={"callback_allowed_hosts": hosts})
        api = TestClient(create_app(listed, manager=store), raise_server_exceptions=False)
        response = api.post("/merges", json=merge_body(lake, callback="http://localhost:8699/hook"))
        assert response.status_code == status, (hosts, response.text)
        if status == 422:
            assert [e["field"] for e in response.json()["errors"]] == ["callback"]
            assert "a loopback network" in response.json()["detail"]


def test_the_allowlist_admits_internal_hosts_and_networks(cb_settings: Settings, store: JobManager, lake: Path) -> None:
    allowed = cb_settings.model_copy(update={"callback_allowed_hosts": ["hooks.internal", "10.2.0.0/16", "::1"]})
    api = TestClient(create_app(allowed, manager=store), raise_server_exceptions=False)
    for url in ("http://hooks.internal/x", "http://10.2.3.4:8080/x", "http://[::1]:9000/x"):
        assert api.post("/merges", json=merge_body(lake, callback=url)).status_code == 202, url
    assert api.post("/merges", json=merge_body(lake, callback="http://10.3.0.1/")).status_code == 422


def test_get_shows_the_delivery_state(
    api: TestClient, lake: Path, store: JobManager, deliverer: CallbackDeliverer, receiver: Receiver
) -> None:
    submitted_job = api.post("/merges", json=merge_body(lake, callback=receiver.url()))
    assert submitted_job.status_code == 202, submitted_job.text
    job = submitted_job.json()
    assert job["callback"] == {
        "url": receiver.url(),
        "status": "pending",
        "delivery_id": None,
        "attempts": 0,
        "last_error": None,
        "delivered_at": None,
    }
    claimed = store.claim("w")
    assert claimed is not None
    drop_started(store)
    store.succeed(claimed.lease, table_version=0, result={}, metrics={})
    receiver.answer((503, {"Retry-After": "1"}))
    deliverer.run_once()
    pending = api.get(f"/merges/{job['id']}").json()["callback"]
    assert (pending["status"], pending["attempts"], pending["last_error"]) == (
        "pending",
        1,
        "HTTP 503 from the receiver",
    )
    store.clock.advance(1)  # type: ignore[attr-defined]
    deliverer.run_once()
    done = api.get(f"/merges/{job['id']}").json()["callback"]
    assert (done["status"], done["attempts"], done["last_error"]) == ("delivered", 2, None)
    assert done["delivery_id"] == receiver.requests[0].headers[DELIVERY_HEADER.lower()]
    assert done["delivered_at"] is not None
    listed = api.get("/merges").json()["items"][0]
    assert listed["callback"] == done
    assert "callback" not in api.post("/merges", json=merge_body(lake)).json()


def test_the_callback_is_part_of_the_idempotent_request(api: TestClient, lake: Path) -> None:
    key = {"Idempotency-Key": "k-1"}
    first = api.post("/merges", json=merge_body(lake, callback="https://a.example.com/"), headers=key)
    again = api.post("/merges", json=merge_body(lake, callback="https://a.example.com/"), headers=key)
    assert (first.status_code, again.status_code) == (202, 200) and first.json()["id"] == again.json()["id"]
    other = api.post("/merges", json=merge_body(lake, callback="https://b.example.com/"), headers=key)
    assert other.status_code == 409


# --- the start event ----------------------------------------------------------------------------------------------


def test_the_first_attempt_promises_and_delivers_a_started_callback(
    store: JobManager, deliverer: CallbackDeliverer, receiver: Receiver, clock: FakeClock
) -> None:
    job_id = submitted(store, receiver.url())
    assert events(store, job_id) == []
    claimed = store.claim("w")
    assert claimed is not None and claimed.started_event
    assert events(store, job_id) == ["started"], "written by the claim's own transaction"
    assert store.get(job_id).callback.delivery_id is None, "the job's callback shows its end's delivery"  # type: ignore[union-attr]
    assert deliverer.run_once() == 1
    [request] = receiver.wait_for(1)
    document = verify_callback(
        request.body, request.headers[SIGNATURE_HEADER.lower()], SECRET, now=clock.now.timestamp()
    )
    assert (document["event"], document["job"]["id"], document["job"]["status"]) == ("started", job_id, "running")
    assert document["delivery_id"] == request.headers[DELIVERY_HEADER.lower()]
    store.succeed(claimed.lease, table_version=1, result={}, metrics={})
    assert deliverer.run_once() == 1
    _, ended = receiver.wait_for(2)
    finished = verify_callback(ended.body, ended.headers[SIGNATURE_HEADER.lower()], SECRET, now=clock.now.timestamp())
    assert finished["event"] == "succeeded" and finished["delivery_id"] != document["delivery_id"]


def test_a_job_without_a_callback_promises_no_start(store: JobManager) -> None:
    job_id = submitted(store, None)
    claimed = store.claim("w")
    assert claimed is not None and not claimed.started_event
    assert events(store, job_id) == [] and not store.deliveries_due()


# --- per-token callbacks: a default URL and a signing secret of the token's own ------------------------------------

TOKEN_A, TOKEN_B = "token-a-for-tests", "token-b-for-tests"
SECRET_A = "secret-of-token-a"


def token_settings(cb_settings: Settings, entries: dict[str, Any], **update: Any) -> Settings:
    return cb_settings.model_copy(
        update={
            "api_tokens": [TOKEN_A, TOKEN_B],
            "callback_tokens": SecretStr(json.dumps(entries)),
            **update,
        }
    )


def as_token(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_tokens_url_and_secret_serve_jobs_that_name_no_callback(
    cb_settings: Settings, store: JobManager, receiver: Receiver, lake: Path, clock: FakeClock
) -> None:
    from service.client.signatures import KEY_ID_HEADER, key_id

    settings = token_settings(cb_settings, {TOKEN_A: {"url": receiver.url(path="/a"), "secret": SECRET_A}})
    api = TestClient(create_app(settings, manager=store), raise_server_exceptions=False)
    a = api.post("/merges", json=merge_body(lake), headers=as_token(TOKEN_A))
    b = api.post("/merges", json=merge_body(lake, target=str(lake / "b")), headers=as_token(TOKEN_B))
    assert (a.status_code, b.status_code) == (202, 202), (a.text, b.text)
    assert a.json()["callback"]["url"] == receiver.url(path="/a")
    assert "callback" not in b.json(), "a token without a URL of its own calls back only where its spec says"
    claimed = store.claim("w")
    assert claimed is not None and claimed.lease.job_id == a.json()["id"]
    store.succeed(claimed.lease, table_version=1, result={}, metrics={})
    deliverer = deliverer_for(settings, store)
    deliverer.run_once()
    deliverer.stop()
    requests = receiver.wait_for(2)
    assert [r.path for r in requests] == ["/a", "/a"]
    for request in requests:
        header = request.headers[SIGNATURE_HEADER.lower()]
        assert request.headers[KEY_ID_HEADER.lower()] == key_id(SECRET_A)
        assert verify_callback(request.body, header, SECRET_A, now=clock.now.timestamp())["job"]["id"] == a.json()["id"]
        with pytest.raises(CallbackSignatureError):
            verify_callback(request.body, header, SECRET, now=clock.now.timestamp())
        picked = verify_callback(
            request.body,
            header,
            [SECRET, SECRET_A],
            key_id=request.headers[KEY_ID_HEADER.lower()],
            now=clock.now.timestamp(),
        )
        assert picked["job"]["id"] == a.json()["id"]
    with store.engine.connect() as conn:
        stored = conn.execute(select(callbacks.c.key_id).where(callbacks.c.job_id == a.json()["id"])).scalars().all()
    assert stored == [key_id(SECRET_A)] * 2
    assert SECRET_A not in repr(settings) and TOKEN_A not in repr(settings.callback_tokens)


def test_a_token_without_a_secret_signs_with_the_deployments(
    cb_settings: Settings, store: JobManager, receiver: Receiver, lake: Path, clock: FakeClock
) -> None:
    from service.client.signatures import KEY_ID_HEADER, key_id

    settings = token_settings(cb_settings, {TOKEN_A: {"secret": SECRET_A}})
    api = TestClient(create_app(settings, manager=store), raise_server_exceptions=False)
    job = api.post("/merges", json=merge_body(lake, callback=receiver.url()), headers=as_token(TOKEN_B))
    assert job.status_code == 202, job.text
    claimed = store.claim("w")
    assert claimed is not None
    drop_started(store)
    store.succeed(claimed.lease, table_version=1, result={}, metrics={})
    deliverer = deliverer_for(settings, store)
    deliverer.run_once()
    deliverer.stop()
    [request] = receiver.wait_for(1)
    assert request.headers[KEY_ID_HEADER.lower()] == key_id(SECRET)
    verify_callback(request.body, request.headers[SIGNATURE_HEADER.lower()], SECRET, now=clock.now.timestamp())
    with pytest.raises(CallbackSignatureError, match="names none of the secrets"):
        verify_callback(
            request.body,
            request.headers[SIGNATURE_HEADER.lower()],
            [SECRET_A],
            key_id=key_id(SECRET),
            now=clock.now.timestamp(),
        )


def test_a_callback_no_key_would_sign_is_refused_at_submission(
    cb_settings: Settings, store: JobManager, lake: Path
) -> None:
    settings = token_settings(cb_settings, {TOKEN_A: {"secret": SECRET_A}}, callback_secret=None)
    api = TestClient(create_app(settings, manager=store), raise_server_exceptions=False)
    refused = api.post(
        "/merges", json=merge_body(lake, callback="https://hooks.example.com/"), headers=as_token(TOKEN_B)
    )
    assert refused.status_code == 422, refused.text
    assert [e["field"] for e in refused.json()["errors"]] == ["callback"]
    assert "MERGE_SERVICE_CALLBACK_SECRET" in refused.json()["detail"]
    assert store.list_jobs()[0] == []
    accepted = api.post(
        "/merges", json=merge_body(lake, callback="https://hooks.example.com/"), headers=as_token(TOKEN_A)
    )
    assert accepted.status_code == 202, accepted.text
    assert api.post("/merges", json=merge_body(lake), headers=as_token(TOKEN_B)).status_code == 202


@pytest.mark.parametrize(
    ("entries", "why"),
    [
        ({TOKEN_A: {"secret": "s"}, "an-unknown-token-value": {"secret": "s"}}, "entry 2 names a token that is in"),
        ({TOKEN_A: {"url": "https://hooks.example.com/"}}, "entry 1 has a url but no secret"),
        ({TOKEN_A: {"url": "https://hooks.example.org/", "secret": "s"}}, "entry 1: url: the host hooks.example.org"),
        ({TOKEN_A: {"url": "http://10.0.0.1/", "secret": "s"}}, "entry 1: url: 10.0.0.1 is a private address"),
        ({TOKEN_A: {"secret": ""}}, "entry 1: secret must be a non-empty string"),
        ({TOKEN_A: {"key": "s"}}, "entry 1 has unknown fields ['key']"),
        ({TOKEN_A: {}}, "entry 1 names neither a url nor a secret"),
        ([TOKEN_A], "must be a JSON object"),
    ],
)
def test_token_callbacks_are_checked_at_start_up_without_naming_tokens(entries: Any, why: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as raised:
        Settings.model_validate(
            {
                "api_tokens": TOKEN_A,
                "callback_allowed_hosts": "*.example.com,10.9.0.0/16",
                "callback_tokens": json.dumps(entries),
            }
        )
    message = str(raised.value)
    assert why in message, message
    # Not even a part of a value: pydantic would show the start of the input's repr.
    assert "an-unknown" not in message and TOKEN_A[:7] not in message and "input_value" not in message


def test_token_callbacks_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from service.callback_keys import default_url, fingerprint, signing_key
    from service.client.signatures import key_id

    monkeypatch.setenv("MERGE_SERVICE_API_TOKENS", f"{TOKEN_A},{TOKEN_B}")
    monkeypatch.setenv("MERGE_SERVICE_CALLBACK_ALLOWED_HOSTS", "*.example.com")
    monkeypatch.setenv(
        "MERGE_SERVICE_CALLBACK_TOKENS", json.dumps({TOKEN_A: {"url": "https://a.example.com/", "secret": SECRET_A}})
    )
    settings = Settings()
    assert default_url(settings, fingerprint(TOKEN_A)) == "https://a.example.com/"
    assert default_url(settings, fingerprint(TOKEN_B)) is None
    key = signing_key(settings, fingerprint(TOKEN_A))
    assert key is not None and key.id == key_id(SECRET_A) and SECRET_A not in repr(key)
    assert signing_key(settings, fingerprint(TOKEN_B)) is None
    assert SECRET_A not in repr(settings) and TOKEN_A not in repr(settings.callback_tokens)


# --- the allowlist at submission -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("https://hooks.example.org/merge", "the host hooks.example.org is not allowed"),
        ("https://example.com/merge", "the host example.com is not allowed"),
        ("https://example.com.evil.test/", "the host example.com.evil.test is not allowed"),
        ("http://8.8.8.8/", "the host 8.8.8.8 is not allowed"),
    ],
)
def test_a_host_outside_the_allowlist_is_refused_at_submission(
    api: TestClient, lake: Path, store: JobManager, url: str, why: str
) -> None:
    response = api.post("/merges", json=merge_body(lake, callback=url))
    assert response.status_code == 422, response.text
    assert [e["field"] for e in response.json()["errors"]] == ["callback"]
    assert why in response.json()["detail"]
    assert store.list_jobs()[0] == []


def test_a_wildcard_admits_names_below_its_domain(api: TestClient, lake: Path) -> None:
    for url in ("https://hooks.example.com/x", "https://a.b.example.com/x", "https://HOOKS.Example.COM./x"):
        assert api.post("/merges", json=merge_body(lake, callback=url)).status_code == 202, url


def test_an_empty_allowlist_refuses_every_callback(cb_settings: Settings, store: JobManager, lake: Path) -> None:
    closed = cb_settings.model_copy(update={"callback_allowed_hosts": []})
    api = TestClient(create_app(closed, manager=store), raise_server_exceptions=False)
    response = api.post("/merges", json=merge_body(lake, callback="https://hooks.example.com/"))
    assert response.status_code == 422
    assert "allows callbacks to no host (MERGE_SERVICE_CALLBACK_ALLOWED_HOSTS is empty)" in response.json()["detail"]


def test_a_host_taken_off_the_allowlist_is_refused_at_send_time(
    cb_settings: Settings, store: JobManager, receiver: Receiver
) -> None:
    job_id = succeeded(store, receiver.url(host="localhost"))
    listed = cb_settings.model_copy(update={"callback_allowed_hosts": ["localhost", "127.0.0.0/8", "::1"]})
    deliverer = deliverer_for(listed.model_copy(update={"callback_allowed_hosts": ["127.0.0.0/8"]}), store)
    deliverer.run_once()
    deliverer.stop()
    callback = store.get(job_id).callback
    assert callback is not None and callback.status is DeliveryStatus.FAILED
    assert (callback.last_error or "").startswith("refused: localhost is a loopback name"), callback.last_error
    job_id = succeeded(store, receiver.url(host="localhost"), "/lake/b")
    deliverer = deliverer_for(listed, store)
    deliverer.run_once()
    deliverer.stop()
    assert store.get(job_id).callback.status is DeliveryStatus.DELIVERED  # type: ignore[union-attr]


# --- SSRF at send time ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("0.0.0.0", "unspecified"),
        ("127.0.0.1", "loopback"),
        ("127.255.0.9", "loopback"),
        ("10.0.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.1.1", "private"),
        ("169.254.0.5", "link-local"),
        ("224.0.0.251", "multicast"),
        ("239.255.255.250", "multicast"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "reserved"),
        ("100.64.1.1", "not globally routable"),
        ("192.0.2.1", "private"),
        ("::", "unspecified"),
        ("::1", "loopback"),
        ("fe80::abcd", "link-local"),
        ("fc00::5", "private"),
        ("fd12:3456::1", "private"),
        ("ff05::2", "multicast"),
        ("fec0::1", "site-local"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:192.168.0.1", "private"),
        ("2001:db8::5", "private"),
    ],
)
def test_internal_addresses_are_named_by_kind(address: str, kind: str) -> None:
    assert forbidden_kind(ip_address(address)) == kind


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8"])
def test_public_addresses_pass(address: str) -> None:
    assert forbidden_kind(ip_address(address)) is None


def _internal_name_from_the_hosts_file() -> str:
    """A name other than ``localhost`` that this machine's resolver answers with an internal address (its own
    host name, usually, from /etc/hosts)."""
    import socket

    names = []
    try:
        for line in Path("/etc/hosts").read_text().splitlines():
            fields = line.split("#", 1)[0].split()
            names += fields[1:]
    except OSError:
        pass
    for name in [socket.gethostname(), *names]:
        if "localhost" in name or not name or parse_callback_url(f"http://{name}/").literal is not None:
            continue
        try:
            answers = socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)
        except OSError:
            continue
        if any(forbidden_kind(ip_address(str(a[4][0]).split("%", 1)[0])) for a in answers):
            return name.lower()
    pytest.skip("no name other than localhost resolves to an internal address on this machine")


def _listing(name: str) -> list[str]:
    """An allowlist naming the host and every address it resolves to now, as a network of one."""
    import socket

    addresses = {str(a[4][0]).split("%", 1)[0] for a in socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)}
    return [name, *sorted(addresses)]


def test_a_name_resolving_to_an_internal_address_is_refused_at_send_time(
    api: TestClient, lake: Path, store: JobManager, cb_settings: Settings, receiver: Receiver
) -> None:
    """The listed name passes at submission (no DNS then) and fails when the send resolves it: a listed name does
    not make its internal addresses reachable, only a listed network does."""
    name = _internal_name_from_the_hosts_file()
    listed = cb_settings.model_copy(update={"callback_allowed_hosts": [name]})
    deliverer = deliverer_for(listed, store)
    api = TestClient(create_app(listed, manager=store), raise_server_exceptions=False)
    response = api.post("/merges", json=merge_body(lake, callback=receiver.url(host=name)))
    assert response.status_code == 202, response.text
    claimed = store.claim("w")
    assert claimed is not None
    drop_started(store)
    store.succeed(claimed.lease, table_version=0, result={}, metrics={})
    deliverer.run_once()
    deliverer.stop()
    callback = store.get(response.json()["id"]).callback
    assert callback is not None and callback.status is DeliveryStatus.FAILED
    assert callback.last_error is not None
    assert callback.last_error.startswith(f"refused: {name} resolves to ")
    assert "MERGE_SERVICE_CALLBACK_ALLOWED_HOSTS" in callback.last_error
    assert receiver.requests == []


def test_an_allowed_name_is_delivered_to_the_address_that_was_checked(
    cb_settings: Settings, store: JobManager, receiver: Receiver
) -> None:
    name = _internal_name_from_the_hosts_file()
    deliverer = deliverer_for(cb_settings.model_copy(update={"callback_allowed_hosts": _listing(name)}), store)
    succeeded(store, receiver.url(host=name))
    deliverer.run_once()
    deliverer.stop()
    [request] = receiver.wait_for(1)
    assert request.headers["host"] == f"{name}:{receiver.port}"


@pytest.mark.parametrize(
    "url", ["http://localhost:{port}/hook", "http://[::1]:{port}/hook", "http://127.0.0.1:{port}/"]
)
def test_internal_urls_stored_before_a_rule_changed_are_refused_at_send_time(
    settings: Settings, store: JobManager, receiver: Receiver, url: str
) -> None:
    """A URL accepted under an older allowlist is checked again when it is sent: without the allowlist entry it
    fails, with a reason, and nothing reaches the address."""
    strict = settings.model_copy(update={"callback_secret": SecretStr(SECRET)})
    deliverer = deliverer_for(strict, store)
    job_id = succeeded(store, url.format(port=receiver.port))
    deliverer.run_once()
    deliverer.stop()
    callback = store.get(job_id).callback
    assert callback is not None and callback.status is DeliveryStatus.FAILED
    assert (callback.last_error or "").startswith("refused: ") and "loopback" in (callback.last_error or "")
    assert receiver.requests == []


def test_allowlist_entries_must_be_hosts_or_networks() -> None:
    allowlist = Allowlist.parse(["Hooks.Example.", "10.0.0.0/8", "[::1]"])
    assert allowlist == Allowlist(frozenset({"hooks.example"}), (ip_network("10.0.0.0/8"), ip_network("::1/128")))
    assert allowlist.allows_address(ip_address("10.9.8.7")) and not allowlist.allows_address(ip_address("11.0.0.1"))
    with pytest.raises(ValueError, match=r"neither a host name, a \*\.domain nor an IP network"):
        Settings.model_validate({"callback_allowed_hosts": "10.0.0.0/8,not a host"})


def test_a_worker_delivers_the_callback_of_the_job_it_ran(cb_settings: Settings, receiver: Receiver) -> None:
    """The worker's own delivery loop, woken when its job ends, while the worker goes on claiming."""
    from service.worker import Worker
    from tests.service.test_worker import FakeRunner

    manager = JobManager.from_url(cb_settings.database_url, lease_seconds=cb_settings.lease_seconds)
    manager.migrate()
    worker = Worker(cb_settings, manager=manager, runner=FakeRunner())
    job_id = submitted(manager, receiver.url())
    worker.start()
    try:
        requests = receiver.wait_for(2, timeout=30)
        wait_until(lambda: manager.get(job_id).callback.status is DeliveryStatus.DELIVERED)  # type: ignore[union-attr]
    finally:
        worker.stop()
        manager.dispose()
    documents = {}
    for request in requests:
        document = verify_callback(request.body, request.headers[SIGNATURE_HEADER.lower()], SECRET)
        documents[document["event"]] = document
    assert sorted(documents) == ["started", "succeeded"]
    assert (documents["started"]["job"]["id"], documents["succeeded"]["job"]["id"]) == (job_id, job_id)
    assert documents["succeeded"]["job"]["status"] == "succeeded"
    assert documents["started"]["delivery_id"] != documents["succeeded"]["delivery_id"]


def test_a_receiver_that_hangs_never_holds_up_the_merges(cb_settings: Settings, receiver: Receiver) -> None:
    from service.worker import Worker
    from tests.service.test_worker import FakeRunner

    manager = JobManager.from_url(cb_settings.database_url, lease_seconds=cb_settings.lease_seconds)
    manager.migrate()
    worker = Worker(cb_settings, manager=manager, runner=FakeRunner())
    receiver.hold()
    ids = [submitted(manager, receiver.url(), target) for target in ("/lake/a", "/lake/b", "/lake/a")]
    worker.start()
    try:
        receiver.wait_for(1, timeout=30)
        wait_until(lambda: all(manager.get(i).status is Status.SUCCEEDED for i in ids), timeout=30)
        assert len(receiver.requests) == 1, "the first callback still waits for its answer"
        receiver.release()
        wait_until(
            lambda: all(manager.get(i).callback.status is DeliveryStatus.DELIVERED for i in ids),  # type: ignore[union-attr]
            timeout=30,
        )
    finally:
        receiver.release()
        worker.stop()
        manager.dispose()
    ended = [json.loads(r.body) for r in receiver.requests if json.loads(r.body)["event"] != "started"]
    assert sorted(d["job"]["id"] for d in ended) == sorted(ids)


@hypothesis_settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(max_size=80),
        st.builds(
            lambda scheme, host, port, path: f"{scheme}://{host}{port}{path}",
            st.sampled_from(["http", "https", "HTTP", "ftp", ""]),
            st.one_of(st.text(max_size=30), st.ip_addresses().map(lambda a: f"[{a}]" if a.version == 6 else str(a))),
            st.sampled_from(["", ":80", ":0", ":65536", ":x", ":"]),
            st.text(max_size=20),
        ),
    )
)
def test_any_text_is_a_callback_or_a_clear_refusal(url: str) -> None:
    """No input makes the check fail in another way than by saying what is wrong with the URL."""
    try:
        target = parse_callback_url(url)
        check_literal_host(target, Allowlist())
    except CallbackUrlError as exc:
        assert str(exc)
        return
    assert target.scheme in ("http", "https") and target.host and 0 <= target.port <= 65535
    assert target.literal is None or forbidden_kind(target.literal) is None


def test_https_names_the_host_in_sni_and_verifies_its_certificate(
    cb_settings: Settings, store: JobManager, tmp_path: Path
) -> None:
    """The request goes to the address that was checked, while TLS still speaks to the name: SNI carries it and
    the certificate is verified against it (a self-signed one fails, and nothing is sent)."""
    import shutil
    import ssl
    import subprocess

    name = _internal_name_from_the_hosts_file()
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed to make a certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    request = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}"]
    request += ["-addext", f"subjectAltName=DNS:{name}", "-keyout", str(key), "-out", str(cert)]
    subprocess.run([openssl, *request], check=True, capture_output=True)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server_names: list[str | None] = []
    tls.sni_callback = lambda _socket, server_name, _context: server_names.append(server_name)  # type: ignore[assignment,func-returns-value]
    receiver = Receiver(tls=tls)
    deliverer = deliverer_for(cb_settings.model_copy(update={"callback_allowed_hosts": _listing(name)}), store)
    try:
        job_id = succeeded(store, receiver.url(host=name, scheme="https"))
        deliverer.run_once()
    finally:
        deliverer.stop()
        receiver.close()
    callback = store.get(job_id).callback
    assert callback is not None and callback.status is DeliveryStatus.PENDING
    assert "CERTIFICATE_VERIFY_FAILED" in (callback.last_error or ""), callback.last_error
    assert server_names == [name]
    assert receiver.requests == []


def test_a_name_that_does_not_resolve_is_tried_again(store: JobManager, deliverer: CallbackDeliverer) -> None:
    """``.invalid`` never resolves (RFC 6761): DNS may answer later, so the delivery waits for another attempt."""
    job_id = succeeded(store, "https://hooks.example.invalid/merge")
    deliverer.run_once()
    callback = store.get(job_id).callback
    assert callback is not None and callback.status is DeliveryStatus.PENDING and callback.attempts == 1
    assert (callback.last_error or "").startswith("could not resolve 'https://hooks.example.invalid/merge'")
