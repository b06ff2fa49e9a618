"""Prometheus metrics. Counters and histograms are recorded as things happen; the queue's depth and age are
read from the job table at scrape time, so every API process reports the same truth."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from service.errors import DatabaseUnavailableError
from service.manager import JobManager

RUN_BUCKETS = (0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1800)
WAIT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)


class QueueCollector(Collector):
    def __init__(self, manager: JobManager) -> None:
        self.manager = manager

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("merge_job_database_up", "1 when the job database answered this scrape.")
        try:
            stats = self.manager.queue_stats()
        except DatabaseUnavailableError:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield GaugeMetricFamily("merge_jobs_queued", "Jobs waiting to run.", value=stats.depth)
        yield GaugeMetricFamily("merge_jobs_running", "Jobs running now.", value=stats.running)
        yield GaugeMetricFamily(
            "merge_oldest_queued_job_age_seconds",
            "Age of the oldest queued job (0 when none).",
            value=stats.oldest_age_seconds,
        )


class ServiceMetrics:
    """One registry per process (API and in-process workers share it). ``workers``: the process runs merge
    workers. Without them their metrics are kept off the registry, so an API process exports no series it never
    sets (a NaN gauge from every API process would make a sum over the deployment NaN)."""

    def __init__(self, registry: CollectorRegistry | None = None, *, workers: bool = True) -> None:
        self.registry = registry or CollectorRegistry()
        self._queue_registered = False
        self._lock = threading.Lock()
        self.jobs_submitted = Counter(
            "merge_jobs_submitted", "Merge jobs accepted by POST /merges.", registry=self.registry
        )
        self.jobs_finished = Counter(
            "merge_jobs_finished",
            "Merge jobs that reached a final status, by outcome.",
            ["outcome"],
            registry=self.registry,
        )
        self.job_retries = Counter(
            "merge_job_retries",
            "Attempts that ended in a transient failure and were queued again.",
            registry=self.registry,
        )
        self.job_run_seconds = Histogram(
            "merge_job_run_seconds",
            "Time a worker spent running one attempt of a job, by outcome.",
            ["outcome"],
            buckets=RUN_BUCKETS,
            registry=self.registry,
        )
        self.job_queue_wait_seconds = Histogram(
            "merge_job_queue_wait_seconds",
            "Time from submission to a job's first claim.",
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        self._worker_metrics(self.registry if workers else CollectorRegistry())
        self._http_metrics()

    def _worker_metrics(self, registry: CollectorRegistry) -> None:
        """What a worker process reports about Spark, its warm-up and its callbacks."""
        self.spark_executors = Gauge(
            "merge_spark_executors",
            "Executors the Spark Connect application can run tasks on, as a worker's readiness check last read "
            "them from the driver (0: merges wait for a task that never starts; NaN: not known).",
            registry=registry,
        )
        self.spark_executors.set(math.nan)
        self.warm_up_seconds = Gauge(
            "merge_worker_warm_up_seconds",
            "How long the worker's throwaway first merge took before it claimed work (NaN: not run or failed).",
            registry=registry,
        )
        self.warm_up_seconds.set(math.nan)
        self.callback_deliveries = Counter(
            "merge_callback_deliveries",
            "Completion callback attempts, by outcome: delivered, retry (will be tried again), failed (given up).",
            ["outcome"],
            registry=registry,
        )
        self.callback_delivery_seconds = Histogram(
            "merge_callback_delivery_seconds",
            "Time from a callback's event (a job's start or end) to its delivery.",
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.callback_request_seconds = Histogram(
            "merge_callback_request_seconds",
            "Time one completion callback request took, whatever the receiver answered.",
            buckets=WAIT_BUCKETS,
            registry=registry,
        )

    def _http_metrics(self) -> None:
        self.http_requests = Counter(
            "merge_http_requests",
            "HTTP requests answered, by method, route and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.http_request_seconds = Histogram(
            "merge_http_request_seconds",
            "HTTP request latency, by method and route.",
            ["method", "route"],
            registry=self.registry,
        )

    def watch_queue(self, manager: JobManager) -> None:
        with self._lock:
            if not self._queue_registered:
                self.registry.register(QueueCollector(manager))
                self._queue_registered = True
