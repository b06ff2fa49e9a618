"""The worker: claim a job, run it through the engine under a heartbeated lease, record what happened.

Safety rules, in Delta terms: the only irreversible step is the commit, and the engine asks ``on_progress``
before it ("committing"). That call checks the lease (renewing it) and the cancel flag; raising there aborts the
merge before anything reaches the Delta log. After it, nothing interrupts the attempt. A worker that lost its
lease writes nothing: every row update is fenced by the attempt number, and a retried job carries the same
Delta ``txn`` version (the job's ``seq``), so a commit that did land is recognised instead of applied twice.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import structlog
from ulid import ULID

import engine
import engine.errors as engine_errors
import engine.spark as engine_spark
from service import engines
from service.errors import CancelRequestedError, DatabaseUnavailableError, LeaseLostError
from service.jobs import ClaimedJob, Lease, Phase
from service.manager import JobManager
from service.metrics import ServiceMetrics
from service.paths import LakeRoots
from service.problems import cancelled_problem, job_problem, lease_lost_problem
from service.settings import Settings
from service.spark_executors import count_executors
from service.specs import build_merge, parse_request

log = structlog.get_logger(__name__)


TxnId = engine.AppTransaction
"""The Delta ``txn`` identity of one job: the deployment's app id and the job's ``seq``."""


class RunResult(Protocol):
    """What ``engine.MergeResult`` carries."""

    @property
    def table_version(self) -> int | None: ...

    @property
    def result(self) -> dict[str, int]: ...

    @property
    def metrics(self) -> dict[str, int]: ...

    @property
    def already_applied(self) -> bool: ...


ProgressCallback = Callable[[str], None]


class MergeRunner(Protocol):
    """Runs one attempt of a job. The real one is ``EngineRunner``; tests may pass their own."""

    def run(self, job: ClaimedJob, *, txn: TxnId, on_progress: ProgressCallback, tag: str) -> RunResult: ...

    def interrupt(self, tag: str) -> None: ...

    def readiness(self) -> tuple[bool, str]: ...

    def close(self) -> None: ...


class EngineRunner:
    """``engine.run_merge`` over one Spark Connect session, created on first use and dropped when Spark loses it
    (the next use connects again and, with the embedded server, starts a new server if the old one died).

    Readiness is measured off the request path: a probe thread asks Spark every ``spark_probe_interval_seconds``
    and ``readiness()`` answers from its last answer, so /readyz never waits on Spark. A probe that has not
    answered within ``spark_probe_timeout_seconds`` counts as Spark not answering. No lock is held across a call
    to Spark but ``_connect_lock``, which only this runner's worker and probe take, so one server start serves
    both."""

    def __init__(self, settings: Settings, metrics: ServiceMetrics | None = None) -> None:
        self.remote = settings.spark_remote
        self.roots = LakeRoots(settings.lake_roots)
        self.metrics = metrics
        self.retry = engine_spark.ConnectRetry(
            max_retries=settings.spark_max_retries, max_backoff=settings.spark_max_backoff_seconds
        )
        self.probe_interval = settings.spark_probe_interval_seconds
        self.probe_timeout = settings.spark_probe_timeout_seconds
        self._spark: Any = None
        self._lock = threading.Lock()
        self._connect_lock = threading.Lock()
        self._closed = threading.Event()
        self._probe: threading.Thread | None = None
        self._probe_started: float | None = None
        self._answer: tuple[bool, str, float] | None = None

    def session(self) -> Any:
        spark = self._spark
        if spark is not None:
            return spark
        with self._connect_lock:
            if self._closed.is_set():
                raise engine_errors.SparkUnavailableError("The worker is shutting down.")
            if self._spark is None:
                spark = engine_spark.connect(self.remote, retry=self.retry)
                with self._lock:
                    self._spark = spark
            return self._spark

    def _drop(self, spark: Any, why: str) -> None:
        """Forget a session Spark lost; the next use connects again."""
        with self._lock:
            if self._spark is not spark:
                return
            self._spark = None
        log.warning("dropping the Spark session", reason=why)
        engine_spark.close_session(spark, release=False)

    def run(self, job: ClaimedJob, *, txn: TxnId, on_progress: ProgressCallback, tag: str) -> RunResult:
        built = build_merge(parse_request(job.spec), self.roots)
        spark = self.session()
        spark.addTag(tag)
        try:
            return engines.merge_function(engines.stored_engine(job.spec))(
                spark,
                built.spec,
                txn=txn,
                on_progress=on_progress,
                dry_run=job.dry_run,
            )
        except Exception as exc:
            if not engine_spark.session_lost(spark, exc):
                raise
            message = engine_errors.spark_error_message(exc)
            self._drop(spark, message)
            if isinstance(exc, engine_errors.SparkUnavailableError):
                raise
            raise engine_errors.SparkUnavailableError(f"Spark Connect lost the session: {message}") from exc
        finally:
            try:
                spark.removeTag(tag)
            except Exception as exc:
                log.debug("removing a Spark tag failed", error=repr(exc))

    def interrupt(self, tag: str) -> None:
        spark = self._spark
        if spark is not None:
            spark.interruptTag(tag)

    def warm_up(self) -> None:
        """Start the readiness probe, which also connects before the first job (the embedded server takes
        seconds to start)."""
        with self._lock:
            if self._probe is None and not self._closed.is_set():
                self._probe = threading.Thread(target=self._probe_loop, name="spark-readiness-probe", daemon=True)
                self._probe.start()

    def _probe_loop(self) -> None:
        failures = 0
        while not self._closed.is_set():
            ok = self._probe_once()
            failures = 0 if ok else failures + 1
            delay = self.probe_interval * 2 ** min(failures, 3)
            self._closed.wait(min(delay, max(self.probe_interval, 5.0)))

    def _probe_once(self) -> bool:
        self._probe_started = time.monotonic()
        try:
            spark = self.session()
        except Exception as exc:
            ok, why = False, engine_errors.spark_error_message(exc)  # "Cannot reach Spark Connect at ...: ..."
        else:
            try:
                ok, why = self._ask(spark)
            except Exception as exc:
                message = engine_errors.spark_error_message(exc)
                if engine_spark.session_lost(spark, exc):
                    self._drop(spark, message)
                ok, why = False, f"Spark Connect at {self.remote} does not answer: {message}"
        self._answer = (ok, why, time.monotonic())
        self._probe_started = None
        return ok

    def _ask(self, spark: Any) -> tuple[bool, str]:
        """Spark answers and has executors to run tasks on. They are counted before any query runs: on a cluster
        even SELECT 1 waits for a task, so without executors it never answers, and the probe could only say that
        Spark is silent, not why. SELECT 1 runs only when the driver's API cannot tell."""
        app_id = spark.conf.get("spark.app.id", None)  # answered by the driver alone
        executors = count_executors(self.remote, app_id) if app_id else None
        if executors is not None and self.metrics is not None:
            self.metrics.spark_executors.set(executors)
        if executors == 0:
            return False, (
                f"Spark Connect at {self.remote} answers, but its application has no executors, so no merge can "
                "run a task: are Spark workers registered with free cores and memory for spark.executor.memory?"
            )
        if executors is None:
            spark.sql("SELECT 1").collect()
        return True, "ok"

    def readiness(self) -> tuple[bool, str]:
        """The probe's last answer; never waits on Spark."""
        now = time.monotonic()
        started, answer = self._probe_started, self._answer
        if started is not None and now - started > self.probe_timeout:
            return False, f"Spark Connect at {self.remote} has not answered for {now - started:.1f}s"
        if answer is None:
            return False, "not connected to Spark yet"
        ok, why, at = answer
        if ok and now - at > max(self.probe_interval, 5.0) + self.probe_timeout:
            return False, "the Spark readiness probe has not run lately"
        return ok, why

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            spark, self._spark = self._spark, None
        if spark is not None:
            engine_spark.close_session(spark)


def is_retryable(exc: BaseException) -> bool:
    """Transient failures only: what the engine marks retryable, a lost lease, the job database away, Spark
    Connect unreachable."""
    if isinstance(exc, LeaseLostError | DatabaseUnavailableError):
        # The commit waits for the job database to confirm the lease: without it the merge stopped before its
        # commit, and the next attempt (which looks for the job's txn first) is safe once the database is back.
        return True
    if isinstance(exc, engine_errors.MergeServiceEngineError):
        return bool(exc.retryable)
    # pyspark's own connection errors, if one escapes the engine unwrapped.
    if type(exc).__module__.startswith("pyspark.errors") or type(exc).__name__.startswith("SparkConnect"):
        text = str(exc)
        return any(s in text for s in ("UNAVAILABLE", "Connection refused", "failed to connect", "Deadline"))
    return False


def backoff_seconds(attempt: int, settings: Settings, rng: random.Random | None = None) -> float:
    """Exponential backoff with equal jitter: half the capped delay fixed, half random."""
    cap = min(settings.backoff_max_seconds, settings.backoff_base_seconds * 2 ** max(0, attempt - 1))
    return cap / 2 + (rng or random).uniform(0, cap / 2)


class JobControl:
    """The cross-thread state of one running attempt: heartbeats, cancel and lease checks at safe points."""

    def __init__(
        self,
        manager: JobManager,
        lease: Lease,
        runner: MergeRunner,
        tag: str,
        interval: float,
        context: Mapping[str, Any],
    ) -> None:
        self.manager = manager
        self.lease = lease
        self.runner = runner
        self.tag = tag
        self.interval = interval
        self.context = dict(context)
        self.cancel_requested = False
        self.lease_lost = False
        self.commit_started = False
        self.commit_interruptible = False
        """The engine finds out after an interrupted commit whether it landed (``engines.commit_interruptible``)."""
        self.shutting_down = False
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._heartbeats, name=f"heartbeat-{lease.job_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=self.interval + 5)

    def abandon(self) -> None:
        """Stop renewing the lease of an attempt the stopping worker no longer waits for, so that it lapses and
        another worker takes the job even while this process lingers."""
        self._done.set()

    def on_progress(self, phase: str) -> None:
        """The engine's safe points. Raising here stops the merge; at ``committing`` it is the last chance."""
        with self._lock:
            if self.lease_lost:
                raise LeaseLostError(f"Job {self.lease.job_id} attempt {self.lease.attempt}: lease lost.")
            if self.cancel_requested:
                raise CancelRequestedError("cancel requested")
            if self.shutting_down:
                raise LeaseLostError("the worker is shutting down")
            try:
                cancel = self.manager.set_phase(self.lease, Phase(phase))
            except LeaseLostError:
                self.lease_lost = True
                raise
            except DatabaseUnavailableError as exc:
                # Before the commit a phase is progress to show: the attempt goes on while its lease lasts, as
                # its heartbeats do. The commit itself waits for the job database to confirm the lease.
                if phase == Phase.COMMITTING.value:
                    raise
                log.warning("could not record the phase; the job database is unavailable", phase=phase, error=repr(exc))
                cancel = False
            if cancel:
                self.cancel_requested = True
                raise CancelRequestedError("cancel requested")
            # The engine redoes a merge whose commit lost a race from a fresh snapshot: any phase after
            # "committing" means that commit ended without landing, and the attempt may be interrupted again.
            self.commit_started = phase == Phase.COMMITTING.value
        log.info("job phase", phase=phase)

    def interrupt(self, why: str) -> None:
        with self._lock:
            if self.commit_started and not self.commit_interruptible:
                return
            if why == "cancel":
                self.cancel_requested = True
            elif why == "shutdown":
                self.shutting_down = True
            else:
                self.lease_lost = True
        try:
            self.runner.interrupt(self.tag)
        except Exception as exc:
            log.warning("interrupting Spark operations failed", error=repr(exc))

    def _heartbeats(self) -> None:
        with structlog.contextvars.bound_contextvars(**self.context):
            while not self._done.wait(self.interval):
                try:
                    cancel = self.manager.heartbeat(self.lease)
                except LeaseLostError:
                    log.warning("lease lost; stopping the attempt")
                    self.interrupt("lease")
                    return
                except Exception as exc:  # the database is away: keep trying while the lease lasts
                    log.warning("heartbeat failed; will retry", error=repr(exc))
                    continue
                if cancel and not self.cancel_requested:
                    log.info("cancel requested; interrupting")
                    self.interrupt("cancel")


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
        self.runner: MergeRunner = runner or EngineRunner(settings, self.metrics)
        self.id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{ULID()}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._current: JobControl | None = None
        self._last_reclaim = 0.0
        self._log = log.bind(worker=self.id)

    # --- life cycle ---------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"merge-worker-{self.id}", daemon=True)
        self._thread.start()
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
        taken = self.manager.reclaim_expired(max_attempts=self.settings.max_attempts, lost_problem=lease_lost_problem)
        for job_id in taken:
            self._log.warning("took back a job whose lease expired", job_id=job_id)
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
            control.commit_interruptible = engines.commit_interruptible(engines.stored_engine(job.spec))
            self._current = control
            started = time.monotonic()
            log.info("job started", seq=job.seq)
            control.start()
            try:
                outcome = self._run(job, control)
            finally:
                control.stop()
                self._current = None
            self.metrics.job_run_seconds.labels(outcome).observe(time.monotonic() - started)
            if outcome in ("succeeded", "failed", "cancelled"):
                self.metrics.jobs_finished.labels(outcome).inc()
            elif outcome == "retry":
                self.metrics.job_retries.inc()

    def _run(self, job: ClaimedJob, control: JobControl) -> str:
        lease = job.lease
        txn = TxnId(app_id=self.settings.app_id, version=job.seq)
        try:
            result = self.runner.run(job, txn=txn, on_progress=control.on_progress, tag=control.tag)
        except BaseException as exc:  # the attempt's outcome is recorded whatever went wrong
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            control.stop()  # the attempt is over: no heartbeat may race the recording of its outcome
            return self._record_failure(job, control, exc)
        control.stop()
        try:
            self.manager.succeed(
                lease,
                table_version=result.table_version,
                result=dict(result.result),
                metrics={k: int(v) for k, v in result.metrics.items()},
            )
        except LeaseLostError:
            log.warning("merge finished but the lease was lost; the next attempt will find its txn")
            return "lease_lost"
        log.info("job succeeded", table_version=result.table_version, already_applied=result.already_applied)
        return "succeeded"

    def _record_failure(self, job: ClaimedJob, control: JobControl, exc: BaseException) -> str:
        lease = job.lease
        try:
            if control.lease_lost or (isinstance(exc, LeaseLostError) and not control.shutting_down):
                log.warning("attempt abandoned: lease lost", error=str(exc))
                return "lease_lost"
            cancelled = isinstance(exc, CancelRequestedError | engine_errors.MergeCancelledError)
            if control.cancel_requested and not control.commit_started:
                cancelled = True
            if cancelled and not control.shutting_down:
                self.manager.cancel_running(
                    lease,
                    error=cancelled_problem(
                        "The merge was cancelled before its commit started; the table is unchanged."
                    ),
                )
                log.info("job cancelled")
                return "cancelled"
            problem = job_problem(exc)
            if control.shutting_down:
                self.manager.retry(
                    lease, error={**problem, "detail": "The worker stopped during the attempt."}, delay_seconds=0
                )
                log.info("job handed back to the queue at shutdown")
                return "retry"
            # A commit whose outcome is unknown gets one attempt beyond the limit: it finds its txn if it landed.
            limit = self.settings.max_attempts + (1 if isinstance(exc, engine_errors.CommitStateUnknownError) else 0)
            if is_retryable(exc) and lease.attempt < limit:
                delay = backoff_seconds(lease.attempt, self.settings)
                status = self.manager.retry(lease, error=problem, delay_seconds=delay)
                log.warning("attempt failed; retrying", error=str(exc), retry_in=round(delay, 3), status=status.value)
                return "retry" if status.value == "queued" else "cancelled"
            if is_retryable(exc):
                problem["detail"] = f"{problem['detail']} (gave up after {lease.attempt} attempts)"
            self.manager.fail(lease, error=problem)
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
