"""The job store's behaviour, run against SQLite and a real PostgreSQL server alike."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import insert, text, update
from sqlalchemy.exc import IntegrityError

from service.errors import (
    IdempotencyConflictError,
    InvalidCursorError,
    InvalidTransitionError,
    JobNotFoundError,
    LeaseLostError,
)
from service.jobs import NewJob, Phase, Status, check_transition
from service.manager import JobManager
from service.models import Base, jobs
from service.problems import lease_lost_problem
from tests.service.conftest import FakeClock

CANCELLED = {"type": "urn:test:cancelled", "title": "Merge cancelled"}


def new(target: str = "/lake/a", **kw: object) -> NewJob:
    return NewJob(target=target, target_key=target, spec={"sql": f"MERGE INTO {target}"}, dry_run=False, **kw)  # type: ignore[arg-type]


def test_submit_and_read_back(store: JobManager, clock: FakeClock) -> None:
    job, created = store.submit(new())
    assert created
    assert job.status is Status.QUEUED and job.phase is Phase.QUEUED
    assert job.submitted_at == clock.now and job.attempts == 0
    assert store.get(job.id) == job
    assert store.get_spec(job.id) == {"sql": "MERGE INTO /lake/a"}
    with pytest.raises(JobNotFoundError):
        store.get("nope")


def test_seq_increases_in_submission_order(store: JobManager) -> None:
    seqs = [store.submit(new(f"/lake/{i % 3}"))[0].seq for i in range(10)]
    assert seqs == sorted(seqs) and len(set(seqs)) == 10


def test_idempotency_key(store: JobManager) -> None:
    first, created = store.submit(new(idempotency_key="k1", request_hash="h1"))
    again, created_again = store.submit(new(idempotency_key="k1", request_hash="h1"))
    assert created and not created_again and again.id == first.id
    with pytest.raises(IdempotencyConflictError):
        store.submit(new(idempotency_key="k1", request_hash="h2"))
    assert len(store.list_jobs()[0]) == 1


def test_idempotency_keys_are_scoped_per_caller(store: JobManager) -> None:
    alice, created_alice = store.submit(new(idempotency_key="k", request_hash="h1", idempotency_scope="alice"))
    bob, created_bob = store.submit(new(idempotency_key="k", request_hash="h2", idempotency_scope="bob"))
    assert created_alice and created_bob and alice.id != bob.id
    again, created = store.submit(new(idempotency_key="k", request_hash="h1", idempotency_scope="alice"))
    assert again.id == alice.id and not created
    with pytest.raises(IdempotencyConflictError):
        store.submit(new(idempotency_key="k", request_hash="h1", idempotency_scope="bob"))
    unscoped, created = store.submit(new(idempotency_key="k", request_hash="h3"))
    assert created and unscoped.id not in (alice.id, bob.id)
    assert len(store.list_jobs()[0]) == 3


def test_idempotency_key_race(store: JobManager) -> None:
    results: list[str] = []

    def submit() -> None:
        results.append(store.submit(new(idempotency_key="race", request_hash="h"))[0].id)

    threads = [threading.Thread(target=submit) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and len(results) == 6


def test_list_newest_first_with_cursor_and_filters(store: JobManager, clock: FakeClock) -> None:
    ids = []
    for i in range(7):
        ids.append(store.submit(new("/lake/a" if i % 2 else "/lake/b"))[0].id)
        if i != 3:  # two jobs share a timestamp: the id breaks the tie
            clock.advance(1)
    seen: list[str] = []
    cursor = None
    while True:
        page, cursor = store.list_jobs(limit=3, cursor=cursor)
        seen += [j.id for j in page]
        if cursor is None:
            break
    assert seen == sorted(ids, key=lambda i: (store.get(i).submitted_at, i), reverse=True)
    only_a, _ = store.list_jobs(target_key="/lake/a")
    assert [j.id for j in only_a] == [i for i in reversed(ids) if store.get(i).target == "/lake/a"]
    store.request_cancel(ids[0], problem=CANCELLED)
    cancelled, _ = store.list_jobs(status=Status.CANCELLED)
    assert [j.id for j in cancelled] == [ids[0]]
    with pytest.raises(InvalidCursorError):
        store.list_jobs(cursor="not-a-cursor")


def test_claim_follows_per_table_submission_order(store: JobManager) -> None:
    a1 = store.submit(new("/lake/a"))[0]
    a2 = store.submit(new("/lake/a"))[0]
    b1 = store.submit(new("/lake/b"))[0]
    first = store.claim("w1")
    second = store.claim("w2")
    assert first is not None and second is not None
    assert (first.lease.job_id, second.lease.job_id) == (a1.id, b1.id)
    assert store.claim("w3") is None  # a2 waits for a1
    store.succeed(first.lease, table_version=1, result={}, metrics={})
    third = store.claim("w3")
    assert third is not None and third.lease.job_id == a2.id and third.seq > first.seq


def test_a_queued_older_job_in_backoff_blocks_newer_ones(store: JobManager, clock: FakeClock) -> None:
    a1 = store.submit(new("/lake/a"))[0]
    store.submit(new("/lake/a"))
    claimed = store.claim("w")
    assert claimed is not None
    assert (
        store.retry(claimed.lease, error={"type": "x", "title": "t"}, delay_seconds=10, cancel_error=CANCELLED)
        is Status.QUEUED
    )
    assert store.claim("w") is None
    clock.advance(10)
    again = store.claim("w")
    assert again is not None and again.lease.job_id == a1.id and again.lease.attempt == 2


def test_one_running_job_per_table_is_enforced_by_the_database(store: JobManager, clock: FakeClock) -> None:
    store.submit(new("/lake/a"))
    assert store.claim("w") is not None
    with pytest.raises(IntegrityError), store.engine.begin() as conn:
        conn.execute(
            insert(jobs).values(
                id="X" * 26,
                status="running",
                phase="queued",
                target="/lake/a",
                target_key="/lake/a",
                spec={},
                dry_run=False,
                submitted_at=clock.now,
                attempts=1,
                cancel_requested=False,
                next_run_at=clock.now,
                updated_at=clock.now,
            )
        )


def test_concurrent_claimers_keep_per_table_order(store: JobManager) -> None:
    tables = [f"/lake/t{i}" for i in range(3)]
    submitted = {t: [store.submit(new(t))[0].id for _ in range(5)] for t in tables}
    ran: dict[str, list[str]] = {t: [] for t in tables}
    lock = threading.Lock()
    running: set[str] = set()
    errors: list[str] = []

    def work(name: str) -> None:
        idle = 0
        while idle < 20:
            job = store.claim(name)
            if job is None:
                idle += 1
                threading.Event().wait(0.01)
                continue
            idle = 0
            with lock:
                if job.target_key in running:
                    errors.append(f"two running jobs on {job.target_key}")
                running.add(job.target_key)
                ran[job.target_key].append(job.lease.job_id)
            threading.Event().wait(0.005)
            with lock:
                running.discard(job.target_key)
            store.succeed(job.lease, table_version=None, result={}, metrics={})

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert ran == submitted


def test_lease_expiry_reclaim_and_fencing(store: JobManager, clock: FakeClock) -> None:
    job = store.submit(new())[0]
    old = store.claim("w1")
    assert old is not None
    assert store.heartbeat(old.lease) is False
    clock.advance(29)
    assert store.reclaim_expired(max_attempts=3, lost_problem=lease_lost_problem, cancel_error=CANCELLED) == []
    clock.advance(2)
    assert store.reclaim_expired(max_attempts=3, lost_problem=lease_lost_problem, cancel_error=CANCELLED) == [job.id]
    assert store.get(job.id).status is Status.QUEUED
    new_claim = store.claim("w2")
    assert new_claim is not None and new_claim.lease.attempt == 2
    # The first worker is fenced out of every write.
    for call in (
        lambda: store.heartbeat(old.lease),
        lambda: store.set_phase(old.lease, Phase.COMMITTING),
        lambda: store.succeed(old.lease, table_version=1, result={}, metrics={}),
        lambda: store.fail(old.lease, error={"type": "x", "title": "t"}),
        lambda: store.retry(old.lease, error={"type": "x", "title": "t"}, delay_seconds=0, cancel_error=CANCELLED),
    ):
        with pytest.raises(LeaseLostError):
            call()
    store.set_phase(new_claim.lease, Phase.WRITING)
    store.succeed(new_claim.lease, table_version=4, result={"num_affected_rows": 1}, metrics={"numSourceRows": 1})
    done = store.get(job.id)
    assert (done.status, done.phase, done.table_version, done.attempts) == (Status.SUCCEEDED, Phase.DONE, 4, 2)
    assert done.error is None and done.result == {"num_affected_rows": 1}


def test_commit_needs_a_live_lease(store: JobManager, clock: FakeClock) -> None:
    store.submit(new())
    claimed = store.claim("w")
    assert claimed is not None
    clock.advance(31)  # expired, not yet taken back: the commit must not start
    with pytest.raises(LeaseLostError):
        store.set_phase(claimed.lease, Phase.COMMITTING)


def test_reclaim_gives_up_after_max_attempts(store: JobManager, clock: FakeClock) -> None:
    job = store.submit(new())[0]
    for _ in range(2):
        assert store.claim("w") is not None
        clock.advance(31)
        store.reclaim_expired(max_attempts=2, lost_problem=lease_lost_problem, cancel_error=CANCELLED)
    final = store.get(job.id)
    assert final.status is Status.FAILED and final.error is not None
    assert final.error["title"] == "Worker lease lost"


def test_a_lease_lost_while_committing_gets_one_more_attempt(store: JobManager, clock: FakeClock) -> None:
    job = store.submit(new())[0]
    for attempt in (1, 2, 3):
        claimed = store.claim("w")
        assert claimed is not None and claimed.lease.attempt == attempt
        store.set_phase(claimed.lease, Phase.COMMITTING)
        clock.advance(31)
        store.reclaim_expired(max_attempts=2, lost_problem=lease_lost_problem, cancel_error=CANCELLED)
    assert store.get(job.id).status is Status.FAILED and store.get(job.id).attempts == 3


def test_a_lost_worker_spends_no_attempt_of_a_batch_that_awaits_spark(store: JobManager, clock: FakeClock) -> None:
    """A job whose attempt left an AUTO CDC batch half applied with Spark away is handed back however many of its
    attempts lost their worker, as the worker retries it past the limit, until an attempt ends otherwise. An
    attempt handed back at shutdown keeps what the attempt before it found."""
    job = store.submit(new())[0]
    failure = {"type": "urn:merge-service:problem:auto-cdc-incomplete", "title": "t"}
    claimed = store.claim("w")
    assert claimed is not None
    store.retry(claimed.lease, error=failure, delay_seconds=0, cancel_error=CANCELLED, awaits_spark=True)
    claimed = store.claim("w")
    assert claimed is not None
    store.retry(claimed.lease, error=failure, delay_seconds=0, cancel_error=CANCELLED)  # a shutdown
    for attempt in (3, 4, 5):
        claimed = store.claim("w")
        assert claimed is not None and claimed.lease.attempt == attempt
        clock.advance(31)
        assert store.reclaim_expired(max_attempts=2, lost_problem=lease_lost_problem, cancel_error=CANCELLED) == [
            job.id
        ]
        assert store.get(job.id).status is Status.QUEUED
    claimed = store.claim("w")
    assert claimed is not None
    store.retry(claimed.lease, error=failure, delay_seconds=0, cancel_error=CANCELLED, awaits_spark=False)
    assert store.claim("w") is not None
    clock.advance(31)
    store.reclaim_expired(max_attempts=2, lost_problem=lease_lost_problem, cancel_error=CANCELLED)
    assert store.get(job.id).status is Status.FAILED and store.get(job.id).attempts == 7


def test_cancel_queued_and_running(store: JobManager) -> None:
    queued = store.submit(new("/lake/a"))[0]
    running = store.submit(new("/lake/b"))[0]
    claimed = store.claim("w")
    assert claimed is not None and claimed.lease.job_id == queued.id
    # a queued job is cancelled at once
    other = store.submit(new("/lake/c"))[0]
    cancelled, ended = store.request_cancel(other.id, problem=CANCELLED)
    assert ended and cancelled.status is Status.CANCELLED and cancelled.finished_at is not None
    # a running one is flagged for the worker
    flagged, ended = store.request_cancel(queued.id, problem=CANCELLED)
    assert not ended and flagged.status is Status.RUNNING and flagged.cancel_requested
    assert store.heartbeat(claimed.lease) is True
    assert store.set_phase(claimed.lease, Phase.WRITING) is True
    store.cancel_running(claimed.lease, error=CANCELLED)
    assert store.get(queued.id).status is Status.CANCELLED
    # a finished job stays as it is
    assert store.request_cancel(queued.id, problem=CANCELLED) == (store.get(queued.id), False)
    with pytest.raises(JobNotFoundError):
        store.request_cancel("missing", problem=CANCELLED)
    assert store.get(running.id).status is Status.QUEUED


def test_retry_of_a_job_whose_cancel_was_requested_cancels_it(store: JobManager) -> None:
    job = store.submit(new())[0]
    claimed = store.claim("w")
    assert claimed is not None
    store.request_cancel(job.id, problem=CANCELLED)
    failure = {"type": "x", "title": "t"}
    assert store.retry(claimed.lease, error=failure, delay_seconds=1, cancel_error=CANCELLED) is Status.CANCELLED
    assert store.get(job.id).error == CANCELLED, "a cancelled job says it was cancelled, not why its attempt failed"


def test_a_running_job_whose_cancel_was_asked_and_whose_worker_is_lost_ends_cancelled(
    store: JobManager, clock: FakeClock
) -> None:
    job = store.submit(new())[0]
    assert store.claim("w") is not None
    store.request_cancel(job.id, problem=CANCELLED)
    clock.advance(31)
    assert store.reclaim_expired(max_attempts=3, lost_problem=lease_lost_problem, cancel_error=CANCELLED) == [job.id]
    ended = store.get(job.id)
    assert (ended.status, ended.error) == (Status.CANCELLED, CANCELLED)


def test_a_cancel_never_ends_a_job_whose_commit_may_have_landed(store: JobManager, clock: FakeClock) -> None:
    """Once an attempt entered ``committing``, only an attempt that looked for the job's txn may say the table
    is unchanged: a retry, a reclaim or a cancel of the queued job requeues it (cancel still asked for)."""
    job = store.submit(new())[0]
    first = store.claim("w")
    assert first is not None
    store.set_phase(first.lease, Phase.COMMITTING)
    store.request_cancel(job.id, problem=CANCELLED)
    # the commit's outcome is unknown: back to the queue, not cancelled
    assert (
        store.retry(first.lease, error={"type": "x", "title": "t"}, delay_seconds=0, cancel_error=CANCELLED)
        is Status.QUEUED
    )
    flagged, ended = store.request_cancel(job.id, problem=CANCELLED)
    assert not ended and flagged.status is Status.QUEUED and flagged.cancel_requested
    second = store.claim("w")
    assert second is not None and second.lease.attempt == 2
    # the worker is lost before it looked: reclaimed, not cancelled
    clock.advance(31)
    assert store.reclaim_expired(max_attempts=3, lost_problem=lease_lost_problem, cancel_error=CANCELLED) == [job.id]
    assert store.get(job.id).status is Status.QUEUED
    third = store.claim("w")
    assert third is not None
    # the attempt found no txn in the table: its first safe point sees the cancel
    assert store.set_phase(third.lease, Phase.PREPARING_SOURCE) is True
    store.cancel_running(third.lease, error=CANCELLED)
    assert store.get(job.id).status is Status.CANCELLED


def test_a_cancel_before_any_commit_started_still_ends_a_requeued_job(store: JobManager, clock: FakeClock) -> None:
    job = store.submit(new())[0]
    claimed = store.claim("w")
    assert claimed is not None
    # A claimed job is running, so its phase is no longer "queued".
    assert (store.get(job.id).status, store.get(job.id).phase) == (Status.RUNNING, Phase.PREPARING_SOURCE)
    store.set_phase(claimed.lease, Phase.WRITING)
    clock.advance(31)
    store.reclaim_expired(max_attempts=3, lost_problem=lease_lost_problem, cancel_error=CANCELLED)
    cancelled, ended = store.request_cancel(job.id, problem=CANCELLED)
    assert ended and cancelled.status is Status.CANCELLED


def test_transitions_refuse_invalid_moves() -> None:
    check_transition(Status.QUEUED, Status.RUNNING)
    check_transition(Status.RUNNING, Status.QUEUED)
    for frm, to in (
        (Status.SUCCEEDED, Status.RUNNING),
        (Status.QUEUED, Status.SUCCEEDED),
        (Status.CANCELLED, Status.QUEUED),
        (Status.FAILED, Status.SUCCEEDED),
    ):
        with pytest.raises(InvalidTransitionError):
            check_transition(frm, to)


def test_a_finished_job_cannot_be_finished_again(store: JobManager) -> None:
    store.submit(new())
    claimed = store.claim("w")
    assert claimed is not None
    store.fail(claimed.lease, error={"type": "x", "title": "t"})
    with pytest.raises(LeaseLostError):
        store.succeed(claimed.lease, table_version=1, result={}, metrics={})


def test_queue_stats(store: JobManager, clock: FakeClock) -> None:
    assert store.queue_stats().depth == 0
    store.submit(new("/lake/a"))
    clock.advance(5)
    store.submit(new("/lake/b"))
    clock.advance(5)
    assert store.claim("w") is not None
    stats = store.queue_stats()
    assert (stats.depth, stats.running) == (1, 1)
    assert stats.oldest_age_seconds == pytest.approx(5.0)


def test_the_migrations_build_the_tables_the_models_describe(store: JobManager) -> None:
    """Alembic's own comparison of the migrated database with the models: a column, index or type the models gained
    without a migration (or the other way round) shows up here, on each backend."""
    with store.engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []


def test_schema_at_head(store: JobManager) -> None:
    assert store.schema_at_head()
    store.migrate()  # idempotent
    with store.engine.begin() as conn:
        conn.execute(update(jobs).values(updated_at=store.clock() + timedelta(seconds=1)))
    assert store.schema_at_head()


def test_upgrade_keeps_jobs_keys_and_the_sequence(database_url: str) -> None:
    """From the first revision with jobs in it: rows, their keys and the seq counter survive the upgrade."""
    from alembic import command

    from service import migrate

    manager = JobManager.from_url(database_url)
    config = migrate.alembic_config(manager.engine.url.render_as_string(hide_password=False))
    with manager.engine.connect() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "0001")
        conn.commit()
    with manager.engine.begin() as conn:
        for seq, key in ((1, "k1"), (2, None), (3, "k3")):
            conn.execute(
                text(
                    "INSERT INTO merge_jobs (id, status, phase, target, target_key, spec, dry_run, submitted_at, "
                    "attempts, idempotency_key, request_hash, cancel_requested, next_run_at, updated_at) VALUES "
                    "(:id, 'queued', 'queued', '/lake/a', '/lake/a', '{}', false, :now, 0, :key, 'h', false, "
                    ":now, :now)"
                ),
                {"id": f"0000000000000000000000000{seq}", "key": key, "now": "2026-01-01 00:00:00"},
            )
        conn.execute(text("DELETE FROM merge_jobs WHERE id = '00000000000000000000000003'"))
    manager.migrate()
    assert manager.schema_at_head()
    again, created = manager.submit(new(idempotency_key="k1", request_hash="h"))
    assert not created and again.id == "00000000000000000000000001"
    fresh, created = manager.submit(new(idempotency_key="k1", request_hash="h", idempotency_scope="alice"))
    assert created and fresh.seq > 3  # seq 3 was issued once, so it is never issued again
    manager.dispose()


@pytest.mark.parametrize("database_url", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True)
def test_a_job_never_starts_before_its_predecessor_finished(database_url: str) -> None:
    """PostgreSQL claims without a global lock: the predecessor may finish between the claimer's first clock
    read and its candidate query. The recorded start must still follow that finish."""
    first_manager = JobManager.from_url(database_url, lease_seconds=30)
    first_manager.migrate()
    first = first_manager.submit(new("/lake/t"))[0]
    second = first_manager.submit(new("/lake/t"))[0]
    claimed = first_manager.claim("worker-a")
    assert claimed is not None and claimed.lease.job_id == first.id
    finished: list[bool] = []

    def clock_that_lets_the_predecessor_finish() -> datetime:
        now = datetime.now(UTC)
        if not finished:  # the predecessor commits its outcome right after this reading
            finished.append(True)
            first_manager.succeed(claimed.lease, table_version=1, result={}, metrics={})
        return now

    second_manager = JobManager.from_url(database_url, lease_seconds=30, clock=clock_that_lets_the_predecessor_finish)
    try:
        taken = second_manager.claim("worker-b")
        assert taken is not None and taken.lease.job_id == second.id
        done, started = first_manager.get(first.id), first_manager.get(second.id)
        assert done.finished_at is not None and started.started_at is not None
        assert started.started_at >= done.finished_at
    finally:
        second_manager.dispose()
        first_manager.dispose()
