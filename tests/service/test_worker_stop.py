"""A stopping worker keeps to its budget even when the running attempt cannot be interrupted (Spark not
answering): the attempt is left to its lease, another worker takes the job once the lease lapses, and the job's
commit happens once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from service.jobs import ClaimedJob, NewJob, Status
from service.manager import JobManager
from service.runner import TxnId
from service.settings import Settings
from service.worker import Worker, stop_workers
from tests.service.conftest import wait_until
from tests.service.stand_in import StandInRunner


@dataclass
class Result:
    table_version: int | None = 0
    result: dict[str, int] = field(default_factory=dict)
    metrics: dict[str, int] = field(default_factory=dict)
    already_applied: bool = False


class StuckRunner(StandInRunner):
    """Blocks in ``writing`` on its first attempt until released, whatever interrupts it gets."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.writing = threading.Event()
        self.commits: list[tuple[str, int]] = []

    def run(self, job: ClaimedJob, *, txn: TxnId, on_progress: Callable[[str], None], tag: str) -> Result:
        for phase in ("preparing_source", "finding_touched_files", "writing"):
            on_progress(phase)
        if job.lease.attempt == 1:
            self.writing.set()
            self.release.wait(60)
            raise RuntimeError("the abandoned attempt ends with its process")
        on_progress("committing")
        self.commits.append((job.lease.job_id, job.lease.attempt))
        return Result()


def test_stop_keeps_its_budget_and_leaves_a_stuck_attempt_to_its_lease(settings: Settings, manager: JobManager) -> None:
    job_id = manager.submit(NewJob(target="/lake/a", target_key="/lake/a", spec={}, dry_run=False))[0].id
    runner = StuckRunner()
    stuck = Worker(settings, manager=manager, runner=runner)
    stuck.start()
    assert runner.writing.wait(10)
    started = time.monotonic()
    stop_workers([stuck], drain=0.3, abandon_after=0.5)
    assert time.monotonic() - started < 3, "the stop waited past its budget"
    assert manager.get(job_id).status is Status.RUNNING  # its lease still runs: nobody else may take it yet

    other = Worker(settings, manager=manager, runner=runner)
    try:
        other.start()
        wait_until(lambda: manager.get(job_id).finished, timeout=settings.lease_seconds * 5)
    finally:
        runner.release.set()
        other.stop(timeout=5)
    job = manager.get(job_id)
    assert job.status is Status.SUCCEEDED and job.attempts == 2
    assert runner.commits == [(job_id, 2)]
