"""Running one attempt of a job on Spark: the engine over one Spark Connect session, which this module keeps
alive, and the readiness probe that tells /readyz whether Spark answers."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, Protocol

import structlog

import engine
import engine.errors as engine_errors
import engine.spark as engine_spark
from service import engines
from service.errors import BatchAwaitsSparkError
from service.jobs import ClaimedJob, Phase
from service.metrics import ServiceMetrics
from service.paths import LakeRoots
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

    def __init__(self, settings: Settings, metrics: ServiceMetrics | None = None, *, pool: str | None = None) -> None:
        self.remote = settings.spark_remote
        self.pool = pool
        """The Spark scheduler pool of this runner's jobs: each worker's own, so workers sharing a server share
        its cores fairly (``engine.spark.configure_session``)."""
        self.roots = LakeRoots(settings.lake_roots)
        self.metrics = metrics
        self.retry = engine_spark.ConnectRetry(
            max_retries=settings.spark_max_retries, max_backoff=settings.spark_max_backoff_seconds
        )
        self.probe_interval = settings.spark_probe_interval_seconds
        self.probe_timeout = settings.spark_probe_timeout_seconds
        self.stall_seconds = settings.spark_stall_seconds
        self._spark: Any = None
        self._stalled: tuple[Any, str] | None = None
        """The session given up because Spark stopped answering, and why: the reason its calls failed."""
        self._lock = threading.Lock()
        self._connect_lock = threading.Lock()
        self._closed = threading.Event()
        self._probe: threading.Thread | None = None
        self._probe_started: float | None = None
        self._answer: tuple[bool, str, float] | None = None
        self.warm_up_dir = warm_up_dir(settings)
        self.warm_up_seconds = settings.warm_up_seconds
        self.warmed = threading.Event()
        """Set once the warm-up merge has run (or failed, or is not wanted): the worker claims jobs after it."""
        if not settings.warm_up:
            self.warmed.set()

    def session(self) -> Any:
        spark = self._spark
        if spark is not None:
            return spark
        with self._connect_lock:
            if self._closed.is_set():
                raise engine_errors.SparkUnavailableError("The worker is shutting down.")
            if self._spark is None:
                spark = engine_spark.connect(self.remote, retry=self.retry, timeout=self.stall_seconds, pool=self.pool)
                with self._lock:
                    self._spark = spark
            return self._spark

    def _drop(self, spark: Any, why: str, *, wait: bool = True) -> None:
        """Forget a session Spark lost; the next use connects again. Closing it ends the calls that wait on it."""
        with self._lock:
            if self._spark is not spark:
                return
            self._spark = None
        log.warning("dropping the Spark session", reason=why)
        if wait:
            engine_spark.close_session(spark, release=False)
        else:
            threading.Thread(
                target=engine_spark.close_session, args=(spark,), kwargs={"release": False}, daemon=True
            ).start()

    def _watch_for_stalls(self) -> None:
        """Give the session up when the probe's call has waited ``stall_seconds``: a call that waits on a server
        that does not answer never ends by itself, and the running attempt's calls wait on the same server."""
        while not self._closed.wait(self.probe_interval):
            started, spark = self._probe_started, self._spark
            if started is None or spark is None:
                continue
            waited = time.monotonic() - started
            if waited > self.stall_seconds:
                why = f"Spark Connect at {self.remote} has not answered for {waited:.0f} s"
                self._stalled = (spark, why)
                self._drop(spark, why, wait=False)

    def run(self, job: ClaimedJob, *, txn: TxnId, on_progress: ProgressCallback, tag: str) -> RunResult:
        """One attempt. The engine's spec is built once, from the request body the job row stores, and checked
        by this process's engine on the way (``build_merge``); ``run_merge`` runs it as checked. The check is
        skipped only where this process already accepted the same expressions (the API in this process did at
        submission, or an earlier job did): a row another process wrote, which may run another version of the
        service, is always checked here before anything runs it."""
        built = build_merge(parse_request(job.spec), self.roots)
        name = engines.stored_engine(job.spec)
        all_metrics = engines.all_metrics(name)
        run = engines.merge_function(name)
        find_applied: Callable[..., RunResult | None] = engine.find_applied
        if isinstance(built.spec, engine.AutoCdcSpec):
            run, find_applied = engine.run_auto_cdc, engine.find_applied_batch
        if job.commit_started and not job.dry_run:
            # An earlier attempt began its commit: the log alone says whether it landed, Spark up or not.
            landed = find_applied(built.spec, txn, all_metrics=all_metrics)
            if landed is not None:
                return landed
        try:
            spark = self.session()
        except engine_errors.SparkUnavailableError as exc:
            _raise_spark_away(built.spec, txn, dry_run=job.dry_run, failure=exc)
        spark.addTag(tag)
        committing = False

        def progress(phase: str) -> None:
            nonlocal committing
            committing = committing or phase == Phase.COMMITTING.value
            on_progress(phase)

        try:
            return run(
                spark,
                built.spec,
                txn=txn,
                on_progress=progress,
                dry_run=job.dry_run,
                validated=True,
            )
        except Exception as exc:
            landed = None
            if committing and not job.dry_run:
                # A failure after the commit began may follow a commit that landed: then the merge is done.
                with contextlib.suppress(Exception):
                    landed = find_applied(built.spec, txn, all_metrics=all_metrics)
            if landed is None:
                try:
                    self._raise_failure(spark, exc)
                except engine_errors.SparkUnavailableError as failure:
                    _raise_spark_away(built.spec, txn, dry_run=job.dry_run, failure=failure)
            with contextlib.suppress(Exception):
                self._raise_failure(spark, exc)  # drops a session Spark lost
            return landed
        finally:
            try:
                spark.removeTag(tag)
            except Exception as exc:
                log.debug("removing a Spark tag failed", error=repr(exc))

    def _raise_failure(self, spark: Any, exc: Exception) -> NoReturn:
        """Raise what an attempt's failure is, dropping the session when Spark lost it (the next use connects
        again)."""
        stalled = self._stalled
        given_up = stalled is not None and stalled[0] is spark
        if not given_up and not engine_spark.session_lost(spark, exc):
            raise exc
        message = stalled[1] if stalled is not None and given_up else engine_errors.spark_error_message(exc)
        self._drop(spark, message)
        if given_up:
            raise engine_errors.SparkUnavailableError(message) from exc
        if isinstance(exc, engine_errors.SparkUnavailableError):
            raise exc
        raise engine_errors.SparkUnavailableError(f"Spark Connect lost the session: {message}") from exc

    def interrupt(self, tag: str) -> None:
        spark = self._spark
        if spark is not None:
            spark.interruptTag(tag)

    def warm_up(self) -> None:
        """Start the readiness probe, which also connects before the first job (the embedded server takes
        seconds to start), and the warm-up merge."""
        with self._lock:
            if self._probe is None and not self._closed.is_set():
                self._probe = threading.Thread(target=self._probe_loop, name="spark-readiness-probe", daemon=True)
                self._probe.start()
                threading.Thread(target=self._watch_for_stalls, name="spark-stall-watch", daemon=True).start()
                if not self.warmed.is_set():
                    threading.Thread(target=self._warm_up_once, name="spark-warm-up", daemon=True).start()

    def _warm_up_once(self) -> None:
        """The throwaway merges; whatever their outcome the worker then takes jobs (a failure says so in the log, and
        jobs run cold, failing as they would have if Spark is away)."""
        spark = None
        try:
            spark = self.session()
            done = engine.warm_up(spark, self.warm_up_dir, max_seconds=self.warm_up_seconds)
            log.info(
                "warmed up with throwaway merges",
                seconds=round(done.seconds, 3),
                rounds=[round(r, 3) for r in done.rounds],
            )
            if self.metrics is not None:
                self.metrics.warm_up_seconds.set(done.seconds)
        except Exception as exc:
            message = engine_errors.spark_error_message(exc)
            if spark is not None and engine_spark.session_lost(spark, exc):
                self._drop(spark, message)
            log.warning("the warm-up merge failed; the first job runs cold", error=message)
        finally:
            self.warmed.set()

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
        if ok and not self.warmed.is_set():
            return False, "warming up: a throwaway merge on scratch tables runs before the first job"
        return ok, why

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            spark, self._spark = self._spark, None
        if spark is not None:
            engine_spark.close_session(spark)


def warm_up_dir(settings: Settings) -> Path:
    """``warm_up_dir``, or ``_merge_service_warm_up`` under the first lake root."""
    if settings.warm_up_dir:
        return Path(settings.warm_up_dir)
    return Path(os.path.realpath(settings.lake_roots[0])) / "_merge_service_warm_up"


def _raise_spark_away(
    spec: engine.MergeSpec | engine.AutoCdcSpec,
    txn: TxnId,
    *,
    dry_run: bool,
    failure: engine_errors.SparkUnavailableError,
) -> NoReturn:
    """Raise ``failure``; for an AUTO CDC batch half applied, which only a run on Spark can finish, raise
    ``BatchAwaitsSparkError`` instead, which the worker retries until Spark returns."""
    half = False
    if isinstance(spec, engine.AutoCdcSpec) and not dry_run:
        with contextlib.suppress(Exception):
            half = engine.half_applied_batch(spec, txn)
    if half:
        raise BatchAwaitsSparkError(spec.target, str(failure)) from failure
    raise failure
