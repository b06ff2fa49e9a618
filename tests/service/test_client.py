"""The Python client end to end against a real ``merge-service serve`` and Spark Connect server; the one answer
the service never gives (429) against a loopback stub."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from service.client import (
    AsyncMergeClient,
    ConflictError,
    JobCancelledError,
    JobFailedError,
    MergeClient,
    NotFoundError,
    RateLimitedError,
    RefusedError,
    RetryPolicy,
    UnavailableError,
    WaitTimeoutError,
    merge,
    rows_source,
)
from tests.service.client_service import SCHEMA, Service, running_service

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, spark_remote: str) -> Iterator[Service]:
    yield from running_service(tmp_path_factory.mktemp("client"), spark_remote)


@pytest.fixture
def client(service: Service) -> Iterator[MergeClient]:
    with MergeClient(service.url, retry=RetryPolicy(attempts=5, backoff=0.1)) as c:
        yield c


def rows_by_id(path: str) -> dict[int, str]:
    data = DeltaTable(path).to_pyarrow_table().to_pylist()
    return {r["id"]: r["name"] for r in data}


def test_client_does_not_import_the_server() -> None:
    code = (
        "import sys, service.client\n"
        "bad = [m for m in ('engine', 'pyspark', 'sqlalchemy', 'fastapi') if m in sys.modules]\n"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_builder_spec_equals_the_hand_written_one() -> None:
    built = (
        merge("/lake/t", rows_source([{"id": 1}], "id BIGINT"), "t.id = s.id", source_alias="s", target_alias="t")
        .when_matched_delete(condition="s.op = 'delete'")
        .when_matched_update(set={"name": "s.name"})
        .when_not_matched_insert(values={"id": "s.id"}, condition="s.id > 0")
        .when_not_matched_insert_all()
        .when_not_matched_by_source_update(set={"name": "'gone'"}, condition="t.id > 10")
        .when_not_matched_by_source_delete()
        .with_schema_evolution()
        .rewriting_files()
    )
    assert built.to_spec() == {
        "target": "/lake/t",
        "source": {"rows": [{"id": 1}], "schema": "id BIGINT"},
        "target_alias": "t",
        "source_alias": "s",
        "on": "t.id = s.id",
        "when_matched": [
            {"action": "delete", "condition": "s.op = 'delete'"},
            {"action": "update", "set": {"name": "s.name"}},
        ],
        "when_not_matched": [
            {"action": "insert", "condition": "s.id > 0", "values": {"id": "s.id"}},
            {"action": "insert_all"},
        ],
        "when_not_matched_by_source": [
            {"action": "update", "condition": "t.id > 10", "set": {"name": "'gone'"}},
            {"action": "delete"},
        ],
        "schema_evolution": True,
        "dry_run": False,
        "deletion_vectors": "off",
    }


def test_builder_merge_submits_waits_and_changes_the_table(service: Service, client: MergeClient) -> None:
    target = service.table("built")
    source = rows_source([{"id": 2, "name": "two"}, {"id": 9, "name": "nine"}], SCHEMA)
    builder = (
        merge(target, source, "t.id = s.id", source_alias="s", target_alias="t")
        .when_matched_update(set={"name": "s.name"})
        .when_not_matched_insert_all()
    )
    handle = client.submit(builder)
    assert handle.job.status in ("queued", "running")
    job = handle.wait(timeout=90)
    assert job.status == "succeeded" and job.table_version == 1
    assert job.result == {"num_affected_rows": 2, "num_updated_rows": 1, "num_deleted_rows": 0, "num_inserted_rows": 1}
    assert rows_by_id(target) == {1: "n1", 2: "two", 3: "n3", 9: "nine"}


def test_sql_merge_and_async_client(service: Service) -> None:
    target = service.table("sql")
    sql = f"MERGE INTO delta.`{target}` AS t USING (SELECT 1 AS id) AS s ON t.id = s.id WHEN MATCHED THEN DELETE"

    async def run() -> str:
        async with AsyncMergeClient(service.url) as c:
            handle = await c.submit(sql)
            job = await handle.wait(timeout=90)
            listed = [j.id async for j in c.list(target=target, limit=1)]
            assert listed == [job.id]
            return job.status

    assert asyncio.run(run()) == "succeeded"
    assert rows_by_id(target) == {2: "n2", 3: "n3"}


def test_refused_merge_is_a_typed_error_naming_the_field(service: Service, client: MergeClient) -> None:
    builder = merge("/not/in/the/lake", rows_source([], SCHEMA), "t.id = s.id").when_matched_delete()
    with pytest.raises(RefusedError) as caught:
        client.submit(builder)
    err = caught.value
    assert err.status == 422 and err.type == "urn:merge-service:problem:invalid-merge"
    assert [e.field for e in err.errors] == ["target"]
    with pytest.raises(NotFoundError) as missing:
        client.get("01ARZ3NDEKTSV4RRFFQ69G5FAV")
    assert missing.value.type == "urn:merge-service:problem:job-not-found"


def test_failed_job_raises_with_its_problem(service: Service, client: MergeClient) -> None:
    target = service.table("failing")
    builder = merge(target, rows_source([{"id": 1, "name": "x"}], SCHEMA), "target.id = source.no_such_column")
    handle = client.submit(builder.when_matched_delete())
    with pytest.raises(JobFailedError) as caught:
        handle.wait(timeout=90)
    assert caught.value.type == "urn:merge-service:problem:merge-resolution"
    assert caught.value.job.status == "failed"
    assert handle.wait(timeout=5, raise_on_failure=False).status == "failed"
    assert DeltaTable(target).version() == 0


def test_cancel_a_queued_job_and_wait_timeout(service: Service, client: MergeClient) -> None:
    target = service.table("cancelled")
    upsert = (
        merge(
            target, rows_source([{"id": 5, "name": "five"}], SCHEMA), "t.id = s.id", target_alias="t", source_alias="s"
        )
        .when_matched_update_all()
        .when_not_matched_insert_all()
    )
    first = client.submit(upsert)
    second = client.submit(upsert)  # queued behind the first: jobs on one table run in order
    with pytest.raises(WaitTimeoutError) as timed_out:
        second.wait(timeout=0.2)
    assert timed_out.value.job.status in ("queued", "running")
    second.cancel()
    with pytest.raises(JobCancelledError) as caught:
        second.wait(timeout=90)
    assert caught.value.type == "urn:merge-service:problem:cancelled"
    assert first.wait(timeout=90).status == "succeeded"
    assert DeltaTable(target).version() == 1


def test_list_follows_cursors_over_every_page(service: Service, client: MergeClient) -> None:
    target = service.table("listed")
    builder = merge(
        target,
        rows_source([{"id": 1, "name": "x"}], SCHEMA),
        "target.id = source.id",
    ).as_dry_run()
    ids = {client.submit(builder.when_matched_delete()).id for _ in range(5)}
    pages = list(client.pages(target=target, limit=2))
    assert [len(p) for p in pages] == [2, 2, 1]
    assert [j.id for p in pages for j in p] == sorted(ids, reverse=True)
    assert {j.id for j in client.list(target=target, limit=2)} == ids


class DropFirstResponse:
    """A loopback TCP proxy to the service that closes the first connection once the service has answered,
    before the answer reaches the client: the request was served, the client saw a dropped connection."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            drop = self.connections == 1
            threading.Thread(target=self._pipe, args=(conn, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, conn, drop), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, drop: bool) -> None:
        try:
            while data := src.recv(65536):
                if drop:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self.listener.close()


def test_retry_after_a_dropped_connection_creates_one_job(service: Service) -> None:
    target = service.table("dropped")
    proxy = DropFirstResponse(int(service.url.rsplit(":", 1)[1]))
    builder = merge(target, rows_source([{"id": 7, "name": "seven"}], SCHEMA), "target.id = source.id")
    try:
        with MergeClient(f"http://127.0.0.1:{proxy.port}", retry=RetryPolicy(backoff=0.1)) as c:
            job = c.submit(builder.when_not_matched_insert_all()).wait(timeout=90)
    finally:
        proxy.close()
    assert proxy.connections == 2
    with MergeClient(service.url) as direct:
        assert [j.id for j in direct.list(target=target)] == [job.id]
    assert rows_by_id(target) == {1: "n1", 2: "n2", 3: "n3", 7: "seven"}


class Stub(BaseHTTPRequestHandler):
    """A stand-in for the service, or a proxy in front of it, answering as a test's case needs."""

    def _answer(self, status: int, body: Mapping[str, object], headers: dict[str, str]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        for k, v in {"Content-Type": "application/json", "Content-Length": str(len(data)), **headers}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def serving(handler: type[Stub]) -> Iterator[str]:
    """``handler`` served on a free local port: its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class RateLimited(Stub):
    """Answers ``POST /merges`` with 429 (``Retry-After: 1``) ``limited`` times, then with a queued job."""

    limited = 1
    seen: ClassVar[list[tuple[float, str | None]]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).seen.append((time.monotonic(), self.headers.get("Idempotency-Key")))
        if len(self.seen) <= self.limited:
            body = {"type": "about:blank", "title": "Too Many Requests", "status": 429}
            self._answer(429, body, {"Retry-After": "1"})
            return
        job = {"id": "01J0000000000000000000000A", "status": "queued", "phase": "queued", "target": "/lake/t"}
        self._answer(202, job, {})


@pytest.fixture
def stub() -> Iterator[str]:
    RateLimited.seen = []
    with serving(RateLimited) as url:
        yield url


def test_429_is_retried_after_retry_after_with_the_same_key(stub: str) -> None:
    RateLimited.limited = 1
    with MergeClient(stub, retry=RetryPolicy(attempts=3, backoff=0.01)) as c:
        handle = c.submit({"sql": "MERGE INTO x USING y ON a = b WHEN MATCHED THEN DELETE"})
    assert handle.id == "01J0000000000000000000000A"
    (t1, key1), (t2, key2) = RateLimited.seen
    assert key1 is not None and key1 == key2
    assert t2 - t1 >= 0.95


def test_429_past_the_retries_is_rate_limited_error(stub: str) -> None:
    RateLimited.limited = 10
    with MergeClient(stub, retry=RetryPolicy(attempts=2, backoff=0.01)) as c, pytest.raises(RateLimitedError) as e:
        c.submit({"sql": "MERGE INTO x USING y ON a = b WHEN MATCHED THEN DELETE"})
    assert e.value.retry_after == 1.0 and e.value.status == 429


def test_unreachable_service_is_unavailable_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with (
        MergeClient(f"http://127.0.0.1:{port}", retry=RetryPolicy(attempts=2, backoff=0.01)) as c,
        pytest.raises(UnavailableError),
    ):
        c.get("01ARZ3NDEKTSV4RRFFQ69G5FAV")


class Unavailable(Stub):
    """Answers every ``GET`` with 503 and the ``Retry-After`` a proxy in front of the service chose."""

    retry_after = "3600"
    seen: ClassVar[list[float]] = []

    def do_GET(self) -> None:
        type(self).seen.append(time.monotonic())
        body = {"type": "about:blank", "title": "Service Unavailable", "status": 503}
        headers = {"Content-Type": "application/problem+json", "Retry-After": type(self).retry_after}
        self._answer(503, body, headers)


@pytest.fixture
def unavailable() -> Iterator[str]:
    Unavailable.seen = []
    with serving(Unavailable) as url:
        yield url


def test_wait_gives_up_by_its_deadline_whatever_retry_after_asks(unavailable: str) -> None:
    Unavailable.retry_after = "3600"
    started = time.monotonic()
    with MergeClient(unavailable) as c, pytest.raises(UnavailableError):
        c.wait("01ARZ3NDEKTSV4RRFFQ69G5FAV", timeout=1.0)
    assert time.monotonic() - started < 5, "an hour's Retry-After does not outlast wait's timeout"
    assert len(Unavailable.seen) == 1


def test_retry_after_is_capped_and_a_number_that_is_not_finite_is_no_hint(unavailable: str) -> None:
    assert RetryPolicy(retry_after_max=2.0).delay(0, 3600.0) == 2.0
    Unavailable.retry_after = "inf"
    started = time.monotonic()
    with (
        MergeClient(unavailable, retry=RetryPolicy(attempts=3, backoff=0.01)) as c,
        pytest.raises(UnavailableError) as raised,
    ):
        c.get("01ARZ3NDEKTSV4RRFFQ69G5FAV")
    assert time.monotonic() - started < 5 and len(Unavailable.seen) == 3
    assert raised.value.status == 503


def python_blocks(doc: Path) -> list[str]:
    text = doc.read_text()
    return [block.split("```", 1)[0] for block in text.split("```python\n")[1:]]


def demo_table(service: Service, name: str) -> str:
    path = service.home.lake / name / "customers"
    data = pa.table(
        {"id": pa.array([1, 2, 3], pa.int64()), "name": ["Ada", "Grace", "Edsger"], "city": ["L", "A", "N"]}
    )
    write_deltalake(str(path), data)
    return str(path)


@pytest.mark.parametrize("doc", ["README.md", "docs/client.md"])
def test_the_documented_first_merge_runs(service: Service, doc: str, capsys: pytest.CaptureFixture[str]) -> None:
    target = demo_table(service, doc.replace("/", "-"))
    code = python_blocks(ROOT / doc)[0]
    assert 'os.path.abspath("var/lake/demo/customers")' in code
    code = code.replace('os.path.abspath("var/lake/demo/customers")', repr(target))
    code = code.replace("http://127.0.0.1:8000", service.url)
    exec(compile(code, doc, "exec"), {})
    assert "'num_inserted_rows': 1" in capsys.readouterr().out
    assert {r["id"]: r["city"] for r in DeltaTable(target).to_pyarrow_table().to_pylist()} == {
        1: "L",
        2: "New York",
        3: "N",
        4: "Boston",
    }


def test_own_idempotency_key_replays_the_job_and_conflicts_on_another_body(
    service: Service, client: MergeClient
) -> None:
    target = service.table("keyed")
    builder = merge(target, rows_source([{"id": 1, "name": "x"}], SCHEMA), "target.id = source.id").as_dry_run()
    first = client.submit(builder.when_matched_delete(), idempotency_key="nightly-2026-11-24")
    again = client.submit(builder.when_matched_delete(), idempotency_key="nightly-2026-11-24")
    assert again.id == first.id
    with pytest.raises(ConflictError) as caught:
        client.submit(builder.when_matched_update_all(), idempotency_key="nightly-2026-11-24")
    assert caught.value.type == "urn:merge-service:problem:idempotency-conflict"
    assert [j.id for j in client.list(target=target)] == [first.id]
