"""Where a job's time went: segments that follow one another from submission to the recorded end, so that they
add up to ``finished_at - submitted_at``; the engine's phases measured as it reports them."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient

import engine.errors as engine_errors
from service.app import create_app
from service.jobs import ClaimedJob, JobRecord, Status
from service.manager import JobManager
from service.settings import Settings
from service.timeline import SEGMENTS, Timeline, close
from tests.service.test_worker import FakeRunner, make_worker, submit

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _at(ms: int) -> datetime:
    return T0 + timedelta(milliseconds=ms)


def test_segments_follow_each_other_and_add_up_without_rounding_loss() -> None:
    marks = [
        ("queued", _at(0)),
        ("starting", _at(1000)),
        ("preparing_source", _at(1200)),
        ("writing", _at(1500)),
        ("committing", _at(2500)),
        ("writing", _at(2600)),  # a lost commit race: the merge is redone
        ("committing", _at(2900)),
        ("recording", _at(3000)),
    ]
    timings = close(marks, _at(3010))
    assert timings == {
        "queued": 1000,
        "starting": 200,
        "preparing_source": 300,
        "writing": 1300,
        "committing": 200,
        "recording": 10,
    }
    assert list(timings) == [s for s in SEGMENTS if s in timings]
    thirds = [("queued", T0), ("starting", T0 + timedelta(microseconds=333_400))]
    thirds.append(("recording", T0 + timedelta(microseconds=666_800)))
    assert sum(close(thirds, T0 + timedelta(seconds=1)).values()) == 1000


def test_a_retried_attempt_counts_the_earlier_ones_apart() -> None:
    timeline = Timeline(_at(0), _at(500), attempt=2, claimed_at=_at(4000))
    timeline.mark("recording", _at(4100))
    assert close(timeline.marks(), _at(4110)) == {"queued": 500, "retrying": 3500, "starting": 100, "recording": 10}


def _wall_ms(job: JobRecord) -> float:
    assert job.finished_at is not None
    return (job.finished_at - job.submitted_at).total_seconds() * 1000


def _check_adds_up(job: JobRecord) -> dict[str, int]:
    timings = job.timings
    assert timings is not None
    assert all(v >= 0 for v in timings.values()), timings
    assert abs(sum(timings.values()) - _wall_ms(job)) <= 1, (timings, _wall_ms(job))
    assert job.started_at is not None
    assert timings["queued"] == round((job.started_at - job.submitted_at).total_seconds() * 1000)
    return timings


def test_a_worker_records_where_the_time_went(settings: Settings, manager: JobManager) -> None:
    job_id = submit(manager)
    time.sleep(0.05)

    def slow_write(job: ClaimedJob, phase: str) -> None:
        if phase == "writing":
            time.sleep(0.3)

    assert manager.get(job_id).timings is None
    make_worker(settings, manager, FakeRunner(slow_write)).run_once()
    job = manager.get(job_id)
    assert job.status is Status.SUCCEEDED
    timings = _check_adds_up(job)
    assert list(timings) == ["queued", "starting", "preparing_source", "finding_touched_files", "writing",
                             "committing", "recording"]  # fmt: skip
    assert timings["queued"] >= 50 and timings["writing"] >= 300


def test_failed_and_retried_jobs_record_their_time(settings: Settings, manager: JobManager) -> None:
    job_id = submit(manager)
    failures = iter([engine_errors.ConcurrentAppendError("a concurrent append touched the same files")])

    def once(job: ClaimedJob, phase: str) -> None:
        if phase == "writing" and (exc := next(failures, None)) is not None:
            raise exc

    worker = make_worker(settings, manager, FakeRunner(once))
    deadline = time.monotonic() + 10
    while manager.get(job_id).status is not Status.SUCCEEDED:
        assert time.monotonic() < deadline
        worker.run_once()
    timings = _check_adds_up(manager.get(job_id))
    assert timings["retrying"] > 0

    failed_id = submit(manager, "/lake/b")

    def missing(job: ClaimedJob, phase: str) -> None:
        raise engine_errors.TableNotFoundError("No Delta table at /lake/b (no _delta_log).")

    make_worker(settings, manager, FakeRunner(missing)).run_once()
    failed = manager.get(failed_id)
    assert failed.status is Status.FAILED
    assert list(_check_adds_up(failed)) == ["queued", "starting", "preparing_source", "recording"]


def test_the_api_shows_timings_once_the_job_ended(settings: Settings, manager: JobManager) -> None:
    client = TestClient(create_app(settings, manager=manager))
    job_id = submit(manager)
    queued: dict[str, Any] = client.get(f"/merges/{job_id}").json()
    assert "timings" not in queued
    make_worker(settings, manager, FakeRunner()).run_once()
    done = client.get(f"/merges/{job_id}").json()
    wall = datetime.fromisoformat(done["finished_at"]) - datetime.fromisoformat(done["submitted_at"])
    assert abs(sum(done["timings"].values()) - wall.total_seconds() * 1000) <= 1
    listed = client.get("/merges").json()["items"][0]
    assert listed["timings"] == done["timings"]
