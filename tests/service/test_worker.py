"""The worker loop with a stand-in runner: phases, outcomes, retries with backoff, cancel at safe points,
lost leases that never commit, and per-table order across workers. (The real engine runs in tests/e2e.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import engine.errors as engine_errors
from service.errors import CancelRequestedError, DatabaseUnavailableError
from service.jobs import ClaimedJob, NewJob, Status
from service.manager import JobManager
from service.metrics import ServiceMetrics
from service.retry import backoff_seconds
from service.runner import TxnId
from service.settings import Settings
from service.worker import Worker
from tests.service.conftest import wait_until
from tests.service.stand_in import StandInRunner

PHASES = ("preparing_source", "finding_touched_files", "writing", "committing")


@dataclass
class Result:
    table_version: int | None = 7
    result: dict[str, int] = field(default_factory=lambda: {"num_affected_rows": 1})
    metrics: dict[str, int] = field(default_factory=lambda: {"numSourceRows": 1})
    already_applied: bool = False


class FakeRunner(StandInRunner):
    """Walks the engine's phases; ``behaviour(job, attempt, phase)`` may raise, block or record."""

    def __init__(self, behaviour: Callable[[ClaimedJob, str], None] | None = None) -> None:
        self.behaviour = behaviour or (lambda job, phase: None)
        self.committed: list[tuple[str, int]] = []
        self.txns: list[TxnId] = []
        self.interrupted: list[str] = []
        self.interrupt_event = threading.Event()

    def run(self, job: ClaimedJob, *, txn: TxnId, on_progress: Callable[[str], None], tag: str) -> Result:
        self.txns.append(txn)
        for phase in PHASES:
            on_progress(phase)
            self.behaviour(job, phase)
        self.committed.append((job.lease.job_id, job.lease.attempt))
        return Result()

    def interrupt(self, tag: str) -> None:
        self.interrupted.append(tag)
        self.interrupt_event.set()


def submit(manager: JobManager, target: str = "/lake/a") -> str:
    return manager.submit(NewJob(target=target, target_key=target, spec={}, dry_run=False))[0].id


def make_worker(settings: Settings, manager: JobManager, runner: Any, **kw: Any) -> Worker:
    return Worker(settings, manager=manager, runner=runner, **kw)


def test_success_records_result_metrics_and_txn(settings: Settings, manager: JobManager) -> None:
    job_id = submit(manager)
    runner = FakeRunner()
    metrics = ServiceMetrics()
    worker = make_worker(settings, manager, runner, metrics=metrics)
    assert worker.run_once()
    job = manager.get(job_id)
    assert (job.status, job.phase, job.table_version, job.attempts) == (Status.SUCCEEDED, "done", 7, 1)
    assert job.result == {"num_affected_rows": 1} and job.metrics == {"numSourceRows": 1}
    assert job.started_at is not None and job.finished_at is not None
    assert runner.txns == [TxnId(settings.app_id, manager.get(job_id).seq)]
    assert metrics.jobs_finished.labels("succeeded")._value.get() == 1
    assert not worker.run_once()


def test_phase_follows_the_engine(settings: Settings, manager: JobManager) -> None:
    job_id = submit(manager)
    seen: list[str] = []
    runner = FakeRunner(lambda job, phase: seen.append(manager.get(job.lease.job_id).phase.value))
    make_worker(settings, manager, runner).run_once()
    assert seen == list(PHASES)
    assert manager.get(job_id).phase.value == "done"


def test_final_errors_fail_at_once(settings: Settings, manager: JobManager) -> None:
    job_id = submit(manager)

    def missing(job: ClaimedJob, phase: str) -> None:
        raise engine_errors.TableNotFoundError("No Delta table at /lake/a (no _delta_log).")

    make_worker(settings, manager, FakeRunner(missing)).run_once()
    job = manager.get(job_id)
    assert job.status is Status.FAILED and job.attempts == 1
    assert job.error == {
        "type": "urn:merge-service:problem:table-not-found",
        "title": "Table not found",
        "detail": "No Delta table at /lake/a (no _delta_log).",
        "status": 404,
    }


def test_transient_errors_retry_with_backoff_then_succeed(settings: Settings, manager: JobManager) -> None:
    job_id = submit(manager)
    failures = iter([engine_errors.ConcurrentAppendError("a concurrent append touched the same files")])

    def flaky(job: ClaimedJob, phase: str) -> None:
        if phase == "committing":
            exc = next(failures, None)
            if exc is not None:
                raise exc

    # Equal jitter: the retry waits 2 to 4 seconds, wide enough that a loaded machine's next call is still inside it.
    slow = settings.model_copy(update={"backoff_base_seconds": 4.0, "backoff_max_seconds": 4.0})
    worker = make_worker(slow, manager, FakeRunner(flaky))
    attempt_began = time.monotonic()
    assert worker.run_once()
    job = manager.get(job_id)
    assert job.status is Status.QUEUED and job.error is not None and job.error["status"] == 409
    if time.monotonic() - attempt_began < 2.0:
        assert not worker.run_once()  # still backing off
    wait_until(lambda: worker.run_once(), timeout=6)
    assert time.monotonic() - attempt_began >= 2.0
    job = manager.get(job_id)
    assert (job.status, job.attempts, job.error) == (Status.SUCCEEDED, 2, None)


def test_transient_errors_give_up_after_max_attempts(settings: Settings, manager: JobManager) -> None:
    job_id = submit(manager)

    def down(job: ClaimedJob, phase: str) -> None:
        raise engine_errors.SparkUnavailableError("Cannot reach Spark Connect at sc://spark:15002")

    worker = make_worker(settings, manager, FakeRunner(down))
    wait_until(lambda: (worker.run_once() and False) or manager.get(job_id).finished, timeout=5)
    job = manager.get(job_id)
    assert job.status is Status.FAILED and job.attempts == settings.max_attempts
    assert "gave up after 3 attempts" in job.error["detail"]  # type: ignore[index]


def test_unknown_commit_state_gets_one_attempt_past_the_limit(settings: Settings, manager: JobManager) -> None:
    job_id = submit(manager)

    def unknown(job: ClaimedJob, phase: str) -> None:
        if phase == "committing" and job.lease.attempt <= settings.max_attempts:
            raise engine_errors.CommitStateUnknownError("the log write timed out")

    runner = FakeRunner(unknown)
    worker = make_worker(settings, manager, runner)
    wait_until(lambda: (worker.run_once() and False) or manager.get(job_id).finished, timeout=5)
    job = manager.get(job_id)
    assert (job.status, job.attempts) == (Status.SUCCEEDED, settings.max_attempts + 1)


def test_backoff_grows_and_is_capped() -> None:
    s = Settings(backoff_base_seconds=1, backoff_max_seconds=8)
    for attempt, cap in ((1, 1), (2, 2), (3, 4), (4, 8), (9, 8)):
        delays = [backoff_seconds(attempt, s) for _ in range(50)]
        assert all(cap / 2 <= d <= cap for d in delays)
        assert len(set(delays)) > 1


def test_cancel_of_a_running_job_stops_it_before_the_commit(settings: Settings, manager: JobManager) -> None:
    job_id = submit(manager)
    in_writing = threading.Event()
    runner: FakeRunner

    def slow_write(job: ClaimedJob, phase: str) -> None:
        if phase == "writing":
            in_writing.set()
            # Spark work in progress: ends when interrupted, as Spark's interruptTag does
            if not runner.interrupt_event.wait(5):
                raise AssertionError("never interrupted")
            raise engine_errors.MergeCancelledError("OPERATION_CANCELED")

    runner = FakeRunner(slow_write)
    worker = make_worker(settings, manager, runner)
    worker.start()
    try:
        assert in_writing.wait(5)
        manager.request_cancel(job_id, problem={"type": "x", "title": "t"})
        wait_until(lambda: manager.get(job_id).finished, timeout=5)
    finally:
        worker.stop()
    job = manager.get(job_id)
    assert job.status is Status.CANCELLED and job.error["title"] == "Merge cancelled"  # type: ignore[index]
    assert runner.committed == [] and runner.interrupted


def test_cancel_seen_at_the_commit_safe_point(settings: Settings, manager: JobManager) -> None:
    job_id = submit(manager)

    def request_cancel(job: ClaimedJob, phase: str) -> None:
        if phase == "writing":
            manager.request_cancel(job_id, problem={"type": "x", "title": "t"})

    runner = FakeRunner(request_cancel)
    make_worker(settings, manager, runner).run_once()
    job = manager.get(job_id)
    assert job.status is Status.CANCELLED
    assert runner.committed == []
    # Stopped on its way into committing: its time ends in writing, never in a phase it did not enter.
    assert job.timings is not None and "writing" in job.timings and "committing" not in job.timings, job.timings


def test_cancel_after_the_commit_started_does_not_interrupt(settings: Settings, manager: JobManager) -> None:
    job_id = submit(manager)

    def cancel_during_commit(job: ClaimedJob, phase: str) -> None:
        if phase == "committing":
            manager.request_cancel(job_id, problem={"type": "x", "title": "t"})
            time.sleep(settings.heartbeat_seconds * 3)  # heartbeats see the flag meanwhile

    runner = FakeRunner(cancel_during_commit)
    make_worker(settings, manager, runner).run_once()
    assert manager.get(job_id).status is Status.SUCCEEDED
    assert runner.interrupted == []


def test_a_worker_that_lost_its_lease_never_commits(settings: Settings, manager: JobManager) -> None:
    job_id = submit(manager)
    stalled = threading.Event()

    def stall(job: ClaimedJob, phase: str) -> None:
        if phase == "writing" and job.lease.attempt == 1:
            stalled.set()
            time.sleep(settings.lease_seconds + 0.5)

    runner = FakeRunner(stall)
    silent = make_worker(settings, manager, runner)
    # The silent worker's heartbeats stop (a long GC pause, a network partition).
    silent_hb = threading.Thread(target=silent.run_once)
    original = manager.heartbeat
    manager.heartbeat = lambda lease: (
        (_ for _ in ()).throw(  # type: ignore[method-assign]
            DatabaseUnavailableError("partitioned")
        )
        if lease.attempt == 1
        else original(lease)
    )
    try:
        silent_hb.start()
        assert stalled.wait(5)
        time.sleep(settings.lease_seconds + 0.1)
        rescuer = make_worker(settings, manager, runner)
        assert rescuer.reclaim_expired() == [job_id]
        assert rescuer.run_once()
        silent_hb.join(10)
    finally:
        manager.heartbeat = original  # type: ignore[method-assign]
    job = manager.get(job_id)
    assert (job.status, job.attempts) == (Status.SUCCEEDED, 2)
    assert runner.committed == [(job_id, 2)]


def test_unexpected_errors_fail_the_job_with_a_problem(settings: Settings, manager: JobManager) -> None:
    job_id = submit(manager)

    def bug(job: ClaimedJob, phase: str) -> None:
        raise KeyError("boom")

    make_worker(settings, manager, FakeRunner(bug)).run_once()
    job = manager.get(job_id)
    assert job.status is Status.FAILED and job.error["status"] == 500  # type: ignore[index]


def test_stop_hands_a_running_job_back(settings: Settings, manager: JobManager) -> None:
    job_id = submit(manager)
    started = threading.Event()

    def long_write(job: ClaimedJob, phase: str) -> None:
        if phase == "writing" and job.lease.attempt == 1:
            started.set()
            time.sleep(1.0)

    runner = FakeRunner(long_write)
    worker = make_worker(settings, manager, runner)
    worker.start()
    assert started.wait(5)
    worker.stop(timeout=0.1)
    job = manager.get(job_id)
    assert job.status is Status.QUEUED and runner.committed == []
    make_worker(settings, manager, runner).run_once()
    assert manager.get(job_id).status is Status.SUCCEEDED


def test_two_workers_keep_each_tables_order(settings: Settings, manager: JobManager, tmp_path: Path) -> None:
    tables = ["/lake/x", "/lake/y"]
    submitted = {t: [submit(manager, t) for _ in range(6)] for t in tables}
    order: dict[str, list[str]] = {t: [] for t in tables}
    lock = threading.Lock()

    def record(job: ClaimedJob, phase: str) -> None:
        if phase == "committing":
            with lock:
                order[job.target_key].append(job.lease.job_id)

    workers = [make_worker(settings, manager, FakeRunner(record)) for _ in range(2)]
    for w in workers:
        w.start()
    try:
        wait_until(lambda: all(manager.get(i).finished for ids in submitted.values() for i in ids), timeout=15)
    finally:
        for w in workers:
            w.stop()
    assert order == submitted


def test_cancel_requested_error_is_not_retried(settings: Settings, manager: JobManager) -> None:
    job_id = submit(manager)

    def raise_cancel(job: ClaimedJob, phase: str) -> None:
        raise CancelRequestedError("cancel requested")

    make_worker(settings, manager, FakeRunner(raise_cancel)).run_once()
    assert manager.get(job_id).status is Status.CANCELLED
