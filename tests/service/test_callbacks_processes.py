"""Completion callbacks survive a worker killed with SIGKILL: real worker processes (``proc_worker``, its ledger
runner in place of Spark) and a real receiver. The first worker ends the job, and is killed while its callback
request waits on the receiver; the next worker sends the same delivery again once the dead one's lease expires."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.client import verify_callback
from service.client.signatures import DELIVERY_HEADER, SIGNATURE_HEADER
from service.jobs import DeliveryStatus, NewJob, Status
from service.manager import JobManager
from tests.service.callback_receiver import Received, Receiver
from tests.service.conftest import wait_until
from tests.service.proc_worker import read_ledger, table_name
from tests.service.worker_processes import WorkerProcesses

SECRET = "callback-secret-for-process-tests"
CALLBACK_TIMEOUT = 4.0
LEASE = 1.5


@pytest.fixture
def jobs_db(database_url: str) -> Iterator[JobManager]:
    manager = JobManager.from_url(database_url, lease_seconds=LEASE)
    manager.migrate()
    yield manager
    manager.dispose()


@pytest.fixture
def workers(database_url: str, tmp_path: Path) -> Iterator[WorkerProcesses]:
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    settings = {
        "MERGE_SERVICE_LEASE_SECONDS": str(LEASE),
        "MERGE_SERVICE_CALLBACK_SECRET": SECRET,
        "MERGE_SERVICE_CALLBACK_ALLOWED_HOSTS": "127.0.0.1",
        "MERGE_SERVICE_CALLBACK_TIMEOUT_SECONDS": str(CALLBACK_TIMEOUT),
        "MERGE_SERVICE_CALLBACK_POLL_INTERVAL_SECONDS": "0.1",
    }
    group = WorkerProcesses(database_url, ledger, settings)
    yield group
    group.stop_all()


def ending(body: bytes) -> bool:
    """A request that tells a job's end (not its start)."""
    return bool(json.loads(body)["event"] != "started")


def ended(receiver: Receiver) -> list[Received]:
    return [r for r in list(receiver.requests) if ending(r.body)]


@pytest.mark.slow
def test_a_worker_killed_between_the_jobs_end_and_its_delivery_still_delivers(
    jobs_db: JobManager, workers: WorkerProcesses, receiver: Receiver
) -> None:
    target = "/lake/callbacks"
    job, _ = jobs_db.submit(
        NewJob(target=target, target_key=target, spec={}, dry_run=False, callback_url=receiver.url())
    )
    receiver.hold(ending)  # the end's first attempt gets no answer: its sender dies waiting for one
    first = workers.start()
    wait_until(lambda: len(ended(receiver)) == 1, timeout=60)
    assert jobs_db.get(job.id).status is Status.SUCCEEDED
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=20)
    receiver.release()

    callback = jobs_db.get(job.id).callback
    assert callback is not None and callback.status is DeliveryStatus.PENDING and callback.attempts == 1

    workers.start()
    wait_until(
        lambda: jobs_db.get(job.id).callback.status is DeliveryStatus.DELIVERED,  # type: ignore[union-attr]
        timeout=CALLBACK_TIMEOUT + LEASE + 30,
    )
    requests = ended(receiver)
    assert len(requests) == 2, "one request per attempt: the killed one, and the one that delivered"
    assert requests[0].body == requests[1].body
    ids = {r.headers[DELIVERY_HEADER.lower()] for r in requests}
    assert ids == {jobs_db.get(job.id).callback.delivery_id}  # type: ignore[union-attr]
    assert [r.headers["merge-service-attempt"] for r in requests] == ["1", "2"]
    for request in requests:
        document = verify_callback(request.body, request.headers[SIGNATURE_HEADER.lower()], SECRET)
        assert document["event"] == document["job"]["status"] == "succeeded" and document["job"]["id"] == job.id
    started = [verify_callback(r.body, r.headers[SIGNATURE_HEADER.lower()], SECRET) for r in receiver.requests]
    assert [d["job"]["id"] for d in started if d["event"] == "started"] == [job.id], "its start, once"

    callback = jobs_db.get(job.id).callback
    assert callback is not None and callback.attempts == 2 and callback.delivered_at is not None
    entries = read_ledger(workers.ledger / f"{table_name(target)}.ledger")
    assert [e["job"] for e in entries] == [job.id], "the merge itself ran once"
    assert not (workers.ledger / "violations").exists()


@pytest.mark.slow
def test_deliveries_promised_before_every_worker_died_go_out_when_one_returns(
    jobs_db: JobManager, workers: WorkerProcesses, receiver: Receiver
) -> None:
    """Several jobs end while their receiver hangs; the only worker is killed; a new worker delivers each job's
    callback, each under its own delivery id, and nothing twice once delivered."""
    ids = [
        jobs_db.submit(NewJob(target=t, target_key=t, spec={}, dry_run=False, callback_url=receiver.url()))[0].id
        for t in ("/lake/a", "/lake/b", "/lake/c")
    ]
    receiver.hold(ending)
    first = workers.start()
    wait_until(lambda: all(jobs_db.get(i).status is Status.SUCCEEDED for i in ids), timeout=60)
    wait_until(lambda: len(ended(receiver)) >= 1, timeout=60)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=20)
    receiver.release()
    workers.start()
    wait_until(
        lambda: all(jobs_db.get(i).callback.status is DeliveryStatus.DELIVERED for i in ids),  # type: ignore[union-attr]
        timeout=CALLBACK_TIMEOUT + LEASE + 60,
    )
    delivered = {jobs_db.get(i).callback.delivery_id: i for i in ids}  # type: ignore[union-attr]
    seen: dict[str, int] = {}
    for request in ended(receiver):
        delivery = request.headers[DELIVERY_HEADER.lower()]
        assert json.loads(request.body)["job"]["id"] == delivered[delivery]
        seen[delivery] = seen.get(delivery, 0) + 1
    assert set(seen) == set(delivered)
    for delivery, count in seen.items():
        attempts = jobs_db.get(delivered[delivery]).callback.attempts  # type: ignore[union-attr]
        assert count <= attempts, "no request beyond the attempts the outbox counted"
    started = {json.loads(r.body)["job"]["id"] for r in receiver.requests if not ending(r.body)}
    assert started == set(ids), "every job's start was told too"
