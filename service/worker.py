"""The worker: claim a job, run it through the engine under a heartbeated lease, record what happened.

Safety rules, in Delta terms: the only irreversible step is the commit, and the engine asks ``on_progress``
before it ("committing"). That call checks the lease (renewing it) and the cancel flag; raising there aborts the
merge before anything reaches the Delta log. After it, nothing interrupts the attempt. A worker that lost its
lease writes nothing: every row update is fenced by the attempt number, and a retried job carries the same
Delta ``txn`` version (the job's ``seq``), so a commit that did land is recognised instead of applied twice.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from datetime import UTC, datetime

import structlog
from ulid import ULID

import engine.errors as engine_errors
from service import engines
from service.callback_delivery import CallbackDeliverer
from service.errors import (
    BatchAwaitsSparkError,
    CancelRequestedError,
    DatabaseUnavailableError,
    LeaseLostError,
    TxnTakenError,
)
from service.job_control import JobControl
from service.jobs import ClaimedJob
from service.manager import JobManager
from service.metrics import ServiceMetrics
from service.problems import job_problem, lease_lost_problem, merge_cancelled_problem
from service.retry import backoff_seconds, is_retryable
from service.runner import EngineRunner, MergeRunner, TxnId
from service.settings import Settings
from service.timeline import Timeline

log = structlog.get_logger(__name__)


class Worker:
    """One merge worker: a loop thread that claims and runs jobs one at a time."""

    def __init__(
        self,
        settings: Settings,
        *,
        manager: JobManager | None = None,
        runner: MergeRunner | None = None,
        metrics: ServiceMetrics | None = None,
        worker_id: str | None = None,
    ) -> None:
        self.settings = settings
        self._owns_manager = manager is None
        self.manager = manager or JobManager.from_url(settings.database_url, lease_seconds=settings.lease_seconds)
        self.metrics = metrics or ServiceMetrics()
        self.id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{ULID()}"
        self.runner: MergeRunner = runner or EngineRunner(settings, self.metrics, pool=f"merge-worker-{self.id}")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._current: JobControl | None = None
        self._last_reclaim = 0.0
        self._log = log.bind(worker=self.id)
        self.callbacks = CallbackDeliverer(settings, self.manager, self.metrics, self.id)
        """Sends the completion callbacks of every worker's jobs, on a thread of its own."""

    # --- life cycle ---------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"merge-worker-{self.id}", daemon=True)
        self._thread.start()
        self.callbacks.start()
        self._log.info("worker started")

    def request_stop(self) -> None:
        """Claim no further job; the running attempt goes on (``stop`` waits for it)."""
        self._stop.set()

    def stop(self, timeout: float = 30.0, *, abandon_after: float | None = None) -> None:
        """Finish the running attempt if it ends within ``timeout``; otherwise interrupt it before its commit
        and hand the job back to the queue, waiting ``abandon_after`` more (by default the lease). An attempt
        still busy then (its commit under way, or Spark not answering) is left to the process's exit: its lease
        lapses, and the next attempt finds the commit by its Delta ``txn`` if it landed, never applying it
        twice."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            current = self._current
            if thread.is_alive() and current is not None:
                current.interrupt("shutdown")
                thread.join(self.settings.lease_seconds if abandon_after is None else abandon_after)
            current = self._current
            if thread.is_alive() and current is not None:
                current.abandon()
                self._log.warning("the running attempt did not stop in time; its lease will lapse")
        self._thread = None
        self.callbacks.stop()
        self.runner.close()
        if self._owns_manager:
            self.manager.dispose()
        self._log.info("worker stopped")

    def readiness(self) -> tuple[bool, str]:
        return self.runner.readiness()

    # --- the loop -----------------------------------------------------------------------------------------

    def _loop(self) -> None:
        warm_up = getattr(self.runner, "warm_up", None)
        if warm_up is not None:
            warm_up()
        warmed = getattr(self.runner, "warmed", None)
        if isinstance(warmed, threading.Event):
            # The first job waits for the warm-up merge rather than paying the cold start itself.
            while not self._stop.is_set() and not warmed.wait(0.2):
                pass
        failures = 0
        while not self._stop.is_set():
            try:
                worked = self.run_once()
                failures = 0
            except DatabaseUnavailableError as exc:
                failures += 1
                delay = min(30.0, self.settings.poll_interval_seconds * 2**failures)
                self._log.warning("job database unavailable", error=str(exc), retry_in=delay)
                self._stop.wait(delay)
                continue
            except Exception:
                self._log.exception("worker loop error")
                self._stop.wait(1.0)
                continue
            if not worked:
                self._stop.wait(self.settings.poll_interval_seconds)

    def reclaim_expired(self) -> list[str]:
        taken = self.manager.reclaim_expired(
            max_attempts=self.settings.max_attempts,
            lost_problem=lease_lost_problem,
            cancel_error=merge_cancelled_problem(),
        )
        for job_id in taken:
            self._log.warning("took back a job whose lease expired", job_id=job_id)
        if taken:
            self.callbacks.wake()  # a job taken back may have ended
        return taken

    def run_once(self) -> bool:
        """Claim and run at most one job; answers whether one ran."""
        now = time.monotonic()
        if now - self._last_reclaim >= min(self.settings.heartbeat_seconds, self.settings.lease_seconds / 2):
            self._last_reclaim = now
            self.reclaim_expired()
        claimed = self.manager.claim(self.id)
        if claimed is None:
            return False
        self.process(claimed)
        return True

    def process(self, job: ClaimedJob) -> None:
        lease = job.lease
        context = {"job_id": lease.job_id, "target": job.target, "attempt": lease.attempt}
        with structlog.contextvars.bound_contextvars(**context):
            if lease.attempt == 1:
                self.metrics.job_queue_wait_seconds.observe(
                    max(0.0, (job.started_at - job.submitted_at).total_seconds())
                )
            tag = f"merge-job-{lease.job_id}-{lease.attempt}"
            control = JobControl(self.manager, lease, self.runner, tag, self.settings.heartbeat_seconds, context)
            control.timeline = Timeline(job.submitted_at, job.started_at, lease.attempt, datetime.now(UTC))
            control.commit_interruptible = engines.commit_interruptible(engines.stored_engine(job.spec))
            self._current = control
            started = time.monotonic()
            log.info("job started", seq=job.seq)
            if job.started_event:
                self.callbacks.wake()
            control.start()
            try:
                outcome = self._run(job, control)
            finally:
                control.stop()
                self._current = None
            self.metrics.job_run_seconds.labels(outcome).observe(time.monotonic() - started)
            if outcome in ("succeeded", "failed", "cancelled"):
                self.metrics.jobs_finished.labels(outcome).inc()
                self.callbacks.wake()
            elif outcome == "retry":
                self.metrics.job_retries.inc()

    def _run(self, job: ClaimedJob, control: JobControl) -> str:
        lease = job.lease
        txn = TxnId(app_id=self.settings.app_id, version=job.seq)
        timeline = control.timeline
        assert timeline is not None  # set by ``process``
        try:
            result = self.runner.run(job, txn=txn, on_progress=control.on_progress, tag=control.tag)
        except BaseException as exc:  # the attempt's outcome is recorded whatever went wrong
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            timeline.mark("recording")
            control.stop()  # the attempt is over: no heartbeat may race the recording of its outcome
            return self._record_failure(job, control, exc)
        timeline.mark("recording")
        control.stop()
        if result.already_applied and not (job.commit_started or control.commit_started):
            return self._record_failure(job, control, TxnTakenError(txn.app_id, txn.version))
        try:
            self.manager.succeed(
                lease,
                table_version=result.table_version,
                result=dict(result.result),
                metrics={k: int(v) for k, v in result.metrics.items()},
                timeline=timeline.marks(),
            )
        except LeaseLostError:
            log.warning("merge finished but the lease was lost; the next attempt will find its txn")
            return "lease_lost"
        log.info("job succeeded", table_version=result.table_version, already_applied=result.already_applied)
        return "succeeded"

    def _record_failure(self, job: ClaimedJob, control: JobControl, exc: BaseException) -> str:
        lease = job.lease
        marks = control.timeline.marks() if control.timeline is not None else None
        try:
            if control.lease_lost or (isinstance(exc, LeaseLostError) and not control.shutting_down):
                log.warning("attempt abandoned: lease lost", error=str(exc))
                return "lease_lost"
            cancelled = isinstance(exc, CancelRequestedError | engine_errors.MergeCancelledError)
            if control.cancel_requested and not control.commit_started:
                cancelled = True
            if cancelled and not control.shutting_down:
                self.manager.cancel_running(lease, error=merge_cancelled_problem(), timeline=marks)
                log.info("job cancelled")
                return "cancelled"
            problem = job_problem(exc)
            if control.shutting_down:
                self.manager.retry(
                    lease,
                    error={**problem, "detail": "The worker stopped during the attempt."},
                    delay_seconds=0,
                    cancel_error=merge_cancelled_problem(),
                )
                log.info("job handed back to the queue at shutdown")
                return "retry"
            # A commit whose outcome is unknown gets one attempt beyond the limit: it finds its txn if it landed. An
            # AUTO CDC batch half applied while Spark is away has no limit: failing it would leave its target changed.
            limit = self.settings.max_attempts + (1 if isinstance(exc, engine_errors.CommitStateUnknownError) else 0)
            awaits_spark = isinstance(exc, BatchAwaitsSparkError)
            if is_retryable(exc) and (lease.attempt < limit or awaits_spark):
                delay = backoff_seconds(lease.attempt, self.settings)
                status = self.manager.retry(
                    lease,
                    error=problem,
                    delay_seconds=delay,
                    cancel_error=merge_cancelled_problem(),
                    awaits_spark=awaits_spark,
                )
                log.warning("attempt failed; retrying", error=str(exc), retry_in=round(delay, 3), status=status.value)
                return "retry" if status.value == "queued" else "cancelled"
            if is_retryable(exc):
                problem["detail"] = f"{problem['detail']} (gave up after {lease.attempt} attempts)"
            self.manager.fail(lease, error=problem, timeline=marks)
            log.warning("job failed", error=str(exc), error_type=type(exc).__name__)
            return "failed"
        except LeaseLostError:
            log.warning("could not record the outcome: lease lost", error=str(exc))
            return "lease_lost"


def stop_workers(workers: list[Worker], *, drain: float, abandon_after: float) -> None:
    """Stop several workers within one budget: none claims another job, running attempts get ``drain`` seconds
    to finish, then ``abandon_after`` more once interrupted (see ``Worker.stop``)."""
    for worker in workers:
        worker.request_stop()
    drain_until = time.monotonic() + drain
    abandon_until = drain_until + abandon_after
    for worker in workers:
        worker.stop(
            timeout=max(0.0, drain_until - time.monotonic()), abandon_after=max(0.0, abandon_until - time.monotonic())
        )
