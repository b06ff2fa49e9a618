"""Completion callbacks end to end: a real ``merge-service serve`` (API and worker) runs real merges on the run's
Spark Connect server, and a real receiver on a loopback port (allowed by the deployment) checks what arrives."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from deltalake import DeltaTable

from service.client import MergeClient, RefusedError, RetryPolicy, merge, rows_source, verify_callback
from service.client.signatures import DELIVERY_HEADER, SIGNATURE_HEADER
from tests.service.callback_receiver import Receiver
from tests.service.client_service import SCHEMA, Service, running_service
from tests.service.conftest import wait_until

SECRET = "callback-secret-for-e2e-tests"


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, spark_remote: str) -> Iterator[Service]:
    yield from running_service(
        tmp_path_factory.mktemp("callbacks"),
        spark_remote,
        MERGE_SERVICE_CALLBACK_SECRET=SECRET,
        MERGE_SERVICE_CALLBACK_ALLOWED_HOSTS="127.0.0.1",
    )


@pytest.fixture
def client(service: Service) -> Iterator[MergeClient]:
    with MergeClient(service.url, retry=RetryPolicy(attempts=5, backoff=0.1)) as c:
        yield c


def requests_for(receiver: Receiver, job_id: str, event: str = "ended") -> list[dict[str, object]]:
    """The job's callbacks of one event (``ended``: any end), each verified."""
    found = []
    for request in list(receiver.requests):
        document = verify_callback(request.body, request.headers[SIGNATURE_HEADER.lower()], SECRET)
        told = document["event"]
        if document["job"]["id"] == job_id and (told == event or (event == "ended" and told != "started")):  # type: ignore[index]
            assert document["delivery_id"] == request.headers[DELIVERY_HEADER.lower()]
            found.append(document)
    return found


def test_a_merge_calls_back_with_its_commit(service: Service, client: MergeClient, receiver: Receiver) -> None:
    target = service.table("called_back")
    builder = (
        merge(
            target,
            rows_source([{"id": 2, "name": "two"}, {"id": 9, "name": "nine"}], SCHEMA),
            "t.id = s.id",
            source_alias="s",
            target_alias="t",
        )
        .when_matched_update(set={"name": "s.name"})
        .when_not_matched_insert_all()
    )
    handle = client.submit({**builder.to_spec(), "callback": receiver.url()})
    job = handle.wait(timeout=120)
    assert job.status == "succeeded"
    wait_until(lambda: len(requests_for(receiver, job.id)) == 1, timeout=30)
    [document] = requests_for(receiver, job.id)
    assert document["event"] == "succeeded"
    wait_until(lambda: len(requests_for(receiver, job.id, "started")) == 1, timeout=30)
    [started] = requests_for(receiver, job.id, "started")
    assert started["delivery_id"] != document["delivery_id"]
    sent = document["job"]
    assert isinstance(sent, dict)
    assert sent["status"] == "succeeded" and sent["table_version"] == DeltaTable(target).version() == 1
    assert sent["result"] == job.result and sent["metrics"] == job.metrics
    assert sent["metrics"]["numTargetRowsInserted"] == 1 and sent["metrics"]["numTargetRowsUpdated"] == 1
    wait_until(lambda: client.get(job.id).raw["callback"]["status"] == "delivered", timeout=30)
    callback = client.get(job.id).raw["callback"]
    assert callback["attempts"] == 1 and callback["delivery_id"] == document["delivery_id"]


def test_a_failed_merge_calls_back_with_its_problem(service: Service, client: MergeClient, receiver: Receiver) -> None:
    missing = str(service.home.lake / "no_such_table")
    spec = merge(missing, rows_source([{"id": 1, "name": "x"}], SCHEMA), "target.id = source.id")
    handle = client.submit({**spec.when_not_matched_insert_all().to_spec(), "callback": receiver.url()})
    job = handle.wait(timeout=120, raise_on_failure=False)
    assert job.status == "failed"
    wait_until(lambda: len(requests_for(receiver, job.id)) == 1, timeout=30)
    [document] = requests_for(receiver, job.id)
    assert document["event"] == "failed"
    sent = document["job"]
    assert isinstance(sent, dict)
    assert sent["status"] == "failed" and sent["error"] == job.error
    assert sent["error"]["type"].startswith("urn:merge-service:problem:") and missing in sent["error"]["detail"]
    assert sent["table_version"] is None


def test_an_internal_callback_is_refused_at_submission(service: Service, client: MergeClient) -> None:
    target = service.table("refused")
    spec = merge(target, rows_source([{"id": 1, "name": "x"}], SCHEMA), "target.id = source.id")
    with pytest.raises(RefusedError) as refused:
        client.submit({**spec.when_not_matched_insert_all().to_spec(), "callback": "http://169.254.169.254/latest"})
    assert [e.field for e in refused.value.errors] == ["callback"]
    assert "link-local" in (refused.value.detail or "")
