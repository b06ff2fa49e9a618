"""The operations page over HTTP: who sees what, how the token travels, cancelling and its forgery checks, the
counts and plots against the job rows, and a page that stays fast with 100,000 jobs in the table."""

from __future__ import annotations

import re
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from service.app import create_app
from service.jobs import Phase, Status
from service.manager import JobManager
from service.settings import Settings
from service.ui_pages import WINDOWS
from tests.service.ui_jobs import JobRow, failure, fingerprint, insert_jobs, now

TENANT, OTHER, ADMIN = "tenant-token", "other-token", "admin-token"
BASE = "http://testserver"


@pytest.fixture
def manager(database_manager: JobManager) -> JobManager:
    return database_manager


@pytest.fixture
def app(manager: JobManager, tmp_path: Path) -> FastAPI:
    settings = Settings(
        database_url="sqlite://", lake_roots=[str(tmp_path)], api_tokens=[TENANT, OTHER], admin_tokens=[ADMIN]
    )
    return create_app(settings, manager=manager)


def signed_in(app: FastAPI, token: str) -> TestClient:
    client = TestClient(app, base_url=BASE)
    answer = client.post("/ui/login", data={"token": token}, headers={"Origin": BASE}, follow_redirects=False)
    assert answer.status_code == 303, answer.text
    return client


def count(page: str, status: Status) -> int:
    found = re.search(rf'id="count-{status.value}">(\d+)<', page)
    assert found, f"no count for {status.value}"
    return int(found.group(1))


def table_row(page: str, key: str) -> dict[str, int]:
    row = re.search(rf'<tr data-table="{re.escape(key)}">(.*?)</tr>', page)
    assert row, f"no row for {key}"
    return {s: int(n) for s, n in re.findall(r'data-status="(\w+)">(\d+)<', row.group(1))}


def test_without_a_token_the_page_asks_for_one_and_never_reads_it_from_the_url(app: FastAPI) -> None:
    client = TestClient(app, base_url=BASE)
    assert client.get("/ui", follow_redirects=False).headers["location"] == "/ui/login"
    assert client.get(f"/ui?token={ADMIN}", follow_redirects=False).status_code == 303
    live = client.get("/ui/live.json")
    assert live.status_code == 401 and live.headers["content-type"].startswith("application/problem+json")
    assert live.headers["www-authenticate"].startswith("Bearer") and live.json()["status"] == 401
    login = client.get("/ui/login")
    assert 'type="password"' in login.text and 'method="post"' in login.text
    wrong = client.post("/ui/login", data={"token": "guess"}, headers={"Origin": BASE})
    assert wrong.status_code == 401 and "merge_service_ui" not in wrong.headers.get("set-cookie", "")


def test_the_login_cookie_is_httponly_samesite_strict_and_scoped_to_the_page(app: FastAPI) -> None:
    client = TestClient(app, base_url=BASE)
    answer = client.post("/ui/login", data={"token": TENANT}, headers={"Origin": BASE}, follow_redirects=False)
    cookie = answer.headers["set-cookie"]
    assert answer.status_code == 303 and answer.headers["location"] == "/ui"
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
    assert TENANT not in answer.headers["location"]
    assert client.get("/ui").status_code == 200
    # The cookie is the page's credential, not the API's.
    assert client.get("/merges").status_code == 401


def test_a_login_from_another_site_is_refused(app: FastAPI) -> None:
    client = TestClient(app, base_url=BASE)
    answer = client.post("/ui/login", data={"token": TENANT}, headers={"Origin": "http://evil.example"})
    assert answer.status_code == 403 and "set-cookie" not in answer.headers
    assert client.post("/ui/login", data={"token": TENANT}).status_code == 403


def test_a_token_sees_its_own_jobs_and_an_admin_token_every_job(app: FastAPI, manager: JobManager) -> None:
    mine, theirs = fingerprint(TENANT), fingerprint(OTHER)
    insert_jobs(
        manager.engine,
        [
            JobRow(Status.QUEUED, "/lake/a", owner=mine),
            JobRow(Status.SUCCEEDED, "/lake/a", owner=mine),
            JobRow(Status.FAILED, "/lake/a", owner=mine, error=failure("column x is missing from the source")),
            JobRow(Status.RUNNING, "/lake/b", owner=theirs),
            JobRow(Status.FAILED, "/lake/b", owner=theirs, error=failure("a secret of the other tenant")),
        ],
    )
    tenant = signed_in(app, TENANT).get("/ui").text
    assert [count(tenant, s) for s in Status] == [1, 0, 1, 1, 0]
    assert table_row(tenant, "/lake/a") == {"queued": 1, "running": 0, "succeeded": 1, "failed": 1, "cancelled": 0}
    assert "/lake/b" not in tenant and "other tenant" not in tenant
    assert "column x is missing from the source" in tenant

    admin = signed_in(app, ADMIN).get("/ui").text
    assert [count(admin, s) for s in Status] == [1, 1, 1, 2, 0]
    assert table_row(admin, "/lake/b") == {"queued": 0, "running": 1, "succeeded": 0, "failed": 1, "cancelled": 0}

    # API clients send the header instead of the cookie.
    header = TestClient(app).get("/ui", headers={"Authorization": f"Bearer {OTHER}"}).text
    assert [count(header, s) for s in Status] == [0, 1, 0, 1, 0]


def test_live_json_carries_the_running_phases_and_the_counts(app: FastAPI, manager: JobManager) -> None:
    running = JobRow(Status.RUNNING, "/lake/a", owner=fingerprint(TENANT), phase=Phase.WRITING)
    insert_jobs(manager.engine, [running, JobRow(Status.QUEUED, "/lake/a", owner=fingerprint(TENANT))])
    live = signed_in(app, TENANT).get("/ui/live.json").json()
    assert live["running"] == [{"id": running.id, "phase": "writing", "cancel_requested": False}]
    assert live["counts"] == {"queued": 1, "running": 1, "succeeded": 0, "failed": 0, "cancelled": 0}


def test_cancel_from_the_page_for_the_jobs_the_token_may_cancel(app: FastAPI, manager: JobManager) -> None:
    queued = JobRow(Status.QUEUED, "/lake/a", owner=fingerprint(TENANT))
    done = JobRow(Status.SUCCEEDED, "/lake/a", owner=fingerprint(TENANT))
    theirs = JobRow(Status.QUEUED, "/lake/b", owner=fingerprint(OTHER))
    insert_jobs(manager.engine, [queued, done, theirs])
    client = signed_in(app, TENANT)
    page = client.get("/ui").text
    assert f'id="cancel-{queued.id}"' in page and f"cancel-{done.id}" not in page and theirs.id not in page
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert csrf

    forged = {"Origin": "http://evil.example"}
    refused = [
        client.post(f"/ui/jobs/{queued.id}/cancel", data={"csrf": csrf.group(1)}, headers=forged),
        client.post(f"/ui/jobs/{queued.id}/cancel", data={"csrf": "0" * 64}, headers={"Origin": BASE}),
        client.post(f"/ui/jobs/{queued.id}/cancel", data={}, headers={"Origin": BASE}),
    ]
    assert [r.status_code for r in refused] == [403, 403, 403]
    assert manager.get(queued.id).status is Status.QUEUED

    other = client.post(f"/ui/jobs/{theirs.id}/cancel", data={"csrf": csrf.group(1)}, headers={"Origin": BASE})
    assert other.status_code == 404 and manager.get(theirs.id).status is Status.QUEUED

    ok = client.post(
        f"/ui/jobs/{queued.id}/cancel", data={"csrf": csrf.group(1)}, headers={"Origin": BASE}, follow_redirects=False
    )
    assert ok.status_code == 303 and manager.get(queued.id).status is Status.CANCELLED
    assert count(client.get("/ui").text, Status.CANCELLED) == 1


def test_failures_are_paged_latest_first_with_their_reason(app: FastAPI, manager: JobManager) -> None:
    rows = [
        JobRow(Status.FAILED, "/lake/a", finished_at=now() - timedelta(minutes=i), error=failure(f"reason number {i}"))
        for i in range(45)
    ]
    insert_jobs(manager.engine, rows)
    client = signed_in(app, ADMIN)
    seen: list[str] = []
    url: str | None = "/ui"
    while url:
        page = client.get(url).text
        seen += re.findall(r"reason number (\d+)", page)
        more = re.search(r'id="failures-next" href="([^"]+)"', page)
        url = more.group(1).replace("&amp;", "&") if more else None
    assert seen == [str(i) for i in range(45)]


def test_plots_count_and_time_the_merges_that_ended_in_each_slice(app: FastAPI, manager: JobManager) -> None:
    window = WINDOWS["1h"]
    start = window.start(now())
    rows = []
    for minute, seconds in [(3, 10), (3, 30), (10, 4), (59, 2)]:
        end = start + timedelta(minutes=minute, seconds=20)
        rows.append(JobRow(Status.SUCCEEDED, "/lake/a", started_at=end - timedelta(seconds=seconds), finished_at=end))
    rows.append(JobRow(Status.FAILED, "/lake/a", finished_at=start + timedelta(minutes=10, seconds=1)))
    rows.append(JobRow(Status.SUCCEEDED, "/lake/a", finished_at=start - timedelta(seconds=1)))  # before the window
    insert_jobs(manager.engine, rows)
    buckets = manager.finished_over_time(since=start, width=window.width, buckets=window.buckets)
    busy = {b.index: (b.succeeded, b.failed, b.mean_seconds, b.max_seconds) for b in buckets if b.succeeded + b.failed}
    assert busy.keys() == {3, 10, 59}
    assert busy[3][:2] == (2, 0) and busy[3][2] == pytest.approx(20.0) and busy[3][3] == pytest.approx(30.0)
    assert busy[10][:2] == (1, 1) and busy[10][2] == pytest.approx(4.0)
    assert busy[59][:2] == (1, 0)
    page = signed_in(app, ADMIN).get("/ui?window=1h").text
    assert '<svg id="plot-throughput"' in page and '<svg id="plot-duration"' in page
    assert page.count('fill="#12b76a"') == 3 and page.count('fill="#f04438"') == 1


def test_page_values_are_escaped(app: FastAPI, manager: JobManager) -> None:
    insert_jobs(manager.engine, [JobRow(Status.FAILED, "/lake/<script>x</script>", error=failure("<img src=x>"))])
    page = signed_in(app, ADMIN).get("/ui").text
    assert "<script>x" not in page and "<img src=x>" not in page and "&lt;img src=x&gt;" in page


HUNDRED_THOUSAND = 100_000


def test_the_page_answers_quickly_with_100000_jobs(app: FastAPI, manager: JobManager) -> None:
    """The bound is loose: it catches reading the whole table into Python, not a slow machine."""
    owners = [fingerprint(TENANT), fingerprint(OTHER), fingerprint(ADMIN)]
    statuses = [Status.SUCCEEDED] * 6 + [Status.FAILED, Status.CANCELLED, Status.QUEUED]
    rows = []
    current = now()
    for i in range(HUNDRED_THOUSAND):
        ended = current - timedelta(seconds=7 * i)  # spread over about eight days
        status = statuses[i % len(statuses)]
        rows.append(
            JobRow(
                status,
                f"/lake/table-{i % 400:03d}",
                owner=owners[i % 3],
                submitted_at=ended - timedelta(seconds=30),
                started_at=ended - timedelta(seconds=20),
                finished_at=None if status is Status.QUEUED else ended,
                error=failure(f"failure {i}") if status is Status.FAILED else None,
            )
        )
    running = [JobRow(Status.RUNNING, f"/lake/table-{t:03d}", owner=owners[t % 3]) for t in range(5)]
    insert_jobs(manager.engine, rows + running)
    expected = Counter(r.status for r in rows + running)
    expected_tenant = Counter(r.status for r in rows + running if r.owner == owners[0])

    for token, want in ((ADMIN, expected), (TENANT, expected_tenant)):
        client = signed_in(app, token)
        for window in ("24h", "7d"):
            began = time.monotonic()
            page = client.get(f"/ui?window={window}")
            took = time.monotonic() - began
            assert page.status_code == 200
            assert took < 5.0, f"/ui took {took:.1f} s with {HUNDRED_THOUSAND} jobs"
            assert {s: count(page.text, s) for s in Status} == {s: want[s] for s in Status}
        more = re.search(r'id="tables-next" href="([^"]+)"', page.text)
        assert more, "400 tables are paged"
        began = time.monotonic()
        assert client.get(more.group(1).replace("&amp;", "&")).status_code == 200
        assert time.monotonic() - began < 5.0


def test_every_query_of_the_page_reads_an_index_range(tmp_path: Path) -> None:
    """SQLite's plans for the page's statements: no scan of the table's rows and no sort of a whole result; the
    one full pass allowed is over a covering index (the admin's count of every job per status)."""
    from sqlalchemy import event

    store = JobManager.from_url(f"sqlite:///{tmp_path / 'plans.db'}")
    store.migrate()
    statements: list[tuple[str, Any]] = []

    @event.listens_for(store.engine, "before_cursor_execute")
    def _grab(_conn: Any, _cursor: Any, statement: str, params: Any, _context: Any, _many: bool) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "merge_jobs" in statement:
            statements.append((statement, params))

    window = WINDOWS["24h"]
    for owner in (None, fingerprint(TENANT)):
        store.status_counts(owner=owner)
        store.table_counts(owner=owner, after="/lake/a")
        store.running(owner=owner)
        store.queued(owner=owner)
        store.failures(owner=owner)
        store.finished_over_time(since=window.start(now()), width=window.width, buckets=window.buckets, owner=owner)
    with store.engine.connect() as conn:
        plans = [[step[3] for step in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + s, p)] for s, p in statements]
    store.dispose()
    assert len(plans) == 14
    for (statement, _), plan in zip(statements, plans, strict=True):
        on_table = [step for step in plan if "merge_jobs" in step]
        assert on_table, plan
        for step in on_table:
            assert step.startswith("SEARCH") or "COVERING INDEX" in step, (statement, plan)
        assert not any("FOR ORDER BY" in step for step in plan), (statement, plan)


def test_without_tokens_the_page_is_open_as_the_api_is(manager: JobManager, tmp_path: Path) -> None:
    app = create_app(Settings(database_url="sqlite://", lake_roots=[str(tmp_path)]), manager=manager)
    insert_jobs(manager.engine, [JobRow(Status.QUEUED, "/lake/a"), JobRow(Status.SUCCEEDED, "/lake/a")])
    client = TestClient(app, base_url=BASE)
    page = client.get("/ui").text
    assert count(page, Status.QUEUED) == 1 and count(page, Status.SUCCEEDED) == 1
    assert "No API tokens are configured" in page and "sign-out" not in page
    login = client.post("/ui/login", data={"token": "anything"}, headers={"Origin": BASE}, follow_redirects=False)
    assert login.status_code == 303 and "set-cookie" not in login.headers


def test_the_page_indexes_come_and_go_with_their_migration(manager: JobManager) -> None:
    from alembic import command
    from sqlalchemy import inspect

    from service import migrate

    added = {
        "ix_merge_jobs_status_finished",
        "ix_merge_jobs_scope_status_finished",
        "ix_merge_jobs_scope_target_status",
    }

    def indexes() -> set[str]:
        return {ix["name"] for ix in inspect(manager.engine).get_indexes("merge_jobs") if ix["name"]}

    assert added <= indexes()
    config = migrate.alembic_config(manager.engine.url.render_as_string(hide_password=False))
    with manager.engine.connect() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0006")
        conn.commit()
    assert not added & indexes() and not manager.schema_at_head()
    manager.migrate()
    assert added <= indexes() and manager.schema_at_head()


def test_a_running_merge_cancelled_from_the_page_is_flagged_for_its_worker(app: FastAPI, manager: JobManager) -> None:
    running = JobRow(Status.RUNNING, "/lake/a", owner=fingerprint(TENANT), phase=Phase.WRITING)
    insert_jobs(manager.engine, [running])
    client = signed_in(app, TENANT)
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', client.get("/ui").text)
    assert csrf
    answer = client.post(f"/ui/jobs/{running.id}/cancel", data={"csrf": csrf.group(1)}, headers={"Origin": BASE})
    assert answer.status_code == 200 and "cancel requested" in answer.text
    job = manager.get(running.id)
    assert job.status is Status.RUNNING and job.cancel_requested
    assert f'id="cancel-{running.id}"' not in answer.text
    assert client.get("/ui/live.json").json()["running"][0]["cancel_requested"] is True
