"""Spark Connect sessions configured for the engine: connecting (``local`` starts the embedded server of
``engine.spark_server``), retrying, closing without blocking on a server that is gone.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql.connect import plan as connect_plan
from pyspark.sql.connect import proto
from pyspark.sql.connect.client.retries import DefaultPolicy
from pyspark.sql.connect.dataframe import DataFrame as ConnectDataFrame
from pyspark.sql.connect.observation import Observation as ConnectObservation
from pyspark.sql.connect.session import SparkSession as ConnectSession

from engine.errors import SparkUnavailableError, grpc_status, spark_error_message
from engine.spark_server import embedded_remote

log = logging.getLogger(__name__)
# pyspark warns on stderr each time a call gives up retrying, then raises: the error carries the news, and while
# Spark is down the readiness probe would print the warning every few seconds.
warnings.filterwarnings("ignore", message=r"\[RETRIES_EXCEEDED\]", category=UserWarning)

SESSION_CONF: Mapping[str, str] = {
    # Delta's statistics need min/max on timestamps; INT96 carries none.
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.session.timeZone": "UTC",
    # Spark would replace ${env:NAME} (and ${system:...}) in SQL text with the server's environment.
    "spark.sql.variable.substitute": "false",
    # Planning a scan of explicit file paths lists them in parallel above this many paths: slow for 500 files.
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
    "spark.sql.ansi.enabled": "true",
    "spark.sql.storeAssignmentPolicy": "ANSI",
    "spark.sql.caseSensitive": "false",
    # writeAllChanges' full outer join cannot broadcast: a shuffled hash join spares sorting the touched files.
    "spark.sql.join.preferSortMergeJoin": "false",
    # Sources up to this size are broadcast to the target scan instead of shuffling the target.
    "spark.sql.autoBroadcastJoinThreshold": str(64 * 1024 * 1024),
    # A shuffled join the adaptive plan turns into a broadcast one reads its streamed side by reducer, not per map
    # task: a source of one file (one map task) read per map task leaves the join and its write to one task
    # (measured in docs/engine.md, "Spark session").
    "spark.sql.adaptive.localShuffleReader.enabled": "false",
    # An adaptive plan that finds a stage empty replaces it, and any DataFrame.observe inside it stops reporting:
    # the merge's metrics come from observations.
    "spark.sql.adaptive.optimizer.excludedRules": "org.apache.spark.sql.execution.adaptive.AQEPropagateEmptyRelation",
    # Column mapping's id mode resolves a file's columns by Parquet field id; a read schema without ids (every
    # other table) still matches by name.
    "spark.sql.parquet.fieldId.read.enabled": "true",
    # variantType stores a VARIANT as its metadata and value binaries; shredded columns (typed_value) are
    # variantShredding's, a feature tables with VARIANT columns do not have.
    "spark.sql.variant.writeShredding.enabled": "false",
    "spark.sql.parquet.variant.annotateLogicalType.enabled": "false",
}


@dataclass(frozen=True)
class ConnectRetry:
    """How long one Spark Connect call keeps retrying a server that does not answer (gRPC UNAVAILABLE): at most
    ``max_retries`` retries, waiting ``initial_backoff`` seconds, doubling up to ``max_backoff``. pyspark's own
    policy waits some ten minutes, holding whatever the caller holds; a dead server should fail a call in
    seconds, and the caller (a job's retries, the readiness probe) decides what next."""

    max_retries: int = 5
    initial_backoff: float = 0.1
    max_backoff: float = 2.0

    def policy(self) -> DefaultPolicy:
        return DefaultPolicy(
            max_retries=self.max_retries,
            initial_backoff=max(1, int(self.initial_backoff * 1000)),
            max_backoff=max(1, int(self.max_backoff * 1000)),
            backoff_multiplier=2.0,
            jitter=100,
            min_jitter_threshold=1000,
            max_server_retry_delay=max(1, int(self.max_backoff * 1000)),
        )


def connect(
    remote: str = "local",
    *,
    retry: ConnectRetry | None = None,
    timeout: float | None = None,
    pool: str | None = None,
) -> SparkSession:
    """A new Spark Connect session, configured for the engine, whose calls retry as ``retry`` says. ``local``
    starts the embedded server (again, if it died). A server that accepts the connection but does not answer
    (a stopped JVM, a frozen host) would hold the caller for as long as it stays so: gRPC calls have no
    deadline. With ``timeout`` the session is given up after that many seconds without an answer. ``pool``: the
    scheduler pool the session's jobs run in (``configure_session``)."""
    url = embedded_remote() if remote in ("local", "") or remote.startswith("local[") else remote
    spark = SparkSession.builder.remote(url).create()
    spark.client.set_retry_policies([(retry or ConnectRetry()).policy()])
    failure: list[BaseException] = []

    def configure() -> None:
        try:
            configure_session(spark, pool=pool)
        except Exception as exc:
            failure.append(exc)

    configuring = threading.Thread(target=configure, name="spark-configure-session", daemon=True)
    configuring.start()
    configuring.join(timeout)
    if configuring.is_alive():
        close_session(spark, release=False)  # closing the channel ends the call that waits
        raise SparkUnavailableError(f"Spark Connect at {url} did not answer within {timeout:g} s")
    if failure:
        close_session(spark, release=False)
        raise SparkUnavailableError(f"Cannot reach Spark Connect at {url}: {spark_error_message(failure[0])}") from (
            failure[0]
        )
    return spark


def local_checkpoint(spark: SparkSession, df: DataFrame) -> DataFrame:
    """``df.localCheckpoint(eager=True)``, bound to ``spark``. pyspark hands the checkpointed DataFrame to the
    thread's *active* session, which is not always the one that holds it once a process has more than one (two
    engines, a session reopened after a stalled server): its queries would then fail with DATAFRAME_NOT_FOUND
    and its release would go to the wrong session."""
    local = ConnectSession._active_session  # pyspark's thread-local; there is no public setter
    before = getattr(local, "session", None)
    local.session = spark
    try:
        return df.localCheckpoint(eager=True)
    finally:
        local.session = before


def session_lost(spark: SparkSession, exc: BaseException | None = None) -> bool:
    """Whether ``spark`` is of no further use: its client closed itself (the server's session changed, as after
    a server restart), or ``exc`` says the server cannot be reached."""
    try:
        if spark.client.is_closed:
            return True
    except Exception:
        return True
    if exc is None:
        return False
    status = grpc_status(exc)
    return status is not None and status[0] == "UNAVAILABLE"


def close_session(spark: SparkSession, *, release: bool = True, release_timeout: float = 2.0) -> None:
    """Close a session without blocking on a server that may be gone. ``SparkSession.stop`` releases the
    server's session while holding pyspark's process-wide session lock, through the client's retries: with the
    server dead, every other thread creating a session waits on it. Here the release runs in a thread of its
    own for at most ``release_timeout`` seconds, and the channel closes whatever it answered."""
    if release:
        releaser = threading.Thread(target=_release, args=(spark,), name="spark-release-session", daemon=True)
        releaser.start()
        releaser.join(release_timeout)
    try:
        spark.client.close()  # outside pyspark's session lock, which stop() holds while it closes the client
    except Exception as exc:
        log.debug("closing a Spark Connect channel failed: %r", exc)
    spark.release_session_on_close = False  # type: ignore[attr-defined]  # a Connect session's flag
    try:
        spark.stop()
    except Exception as exc:
        log.debug("closing a Spark session failed: %r", exc)


def _release(spark: SparkSession) -> None:
    try:
        spark.client.release_session()
    except Exception as exc:
        log.debug("releasing a Spark session failed: %s", spark_error_message(exc))


def configure_session(spark: SparkSession, *, pool: str | None = None) -> None:
    """``pool``: Spark's ``spark.scheduler.pool`` for every job of this session. On a server whose
    ``spark.scheduler.mode`` is FAIR, sessions in different pools share the cores task by task; a pool the
    server's allocation file does not name is created on first use with weight 1."""
    for key, value in SESSION_CONF.items():
        spark.conf.set(key, value)
    if pool is not None:
        spark.conf.set("spark.scheduler.pool", pool)


@contextmanager
def session_conf(spark: SparkSession, conf: Mapping[str, str]) -> Iterator[None]:
    """``conf`` set on the session for the block, the earlier values put back after (unset ones unset): one round
    trip reads the earlier values, one sets them all, one or two put them back (``spark.conf`` takes one key a
    round trip)."""
    client = spark.client  # type: ignore[attr-defined]  # a Connect session's
    keys = list(conf)
    read = client.config(proto.ConfigRequest.Operation(get_option=proto.ConfigRequest.GetOption(keys=keys)))
    earlier: dict[str, str | None] = dict(zip(keys, (value for _, value in read.pairs), strict=True))
    client.config(_set_operation(conf))
    try:
        yield
    finally:
        with contextlib.suppress(PySparkException):
            kept = {key: value for key, value in earlier.items() if value is not None}
            if kept:
                client.config(_set_operation(kept))
            unset = [key for key, value in earlier.items() if value is None]
            if unset:
                client.config(proto.ConfigRequest.Operation(unset=proto.ConfigRequest.Unset(keys=unset)))


STATIC_PLAN_CONF: Mapping[str, str] = {"spark.sql.adaptive.enabled": "false", "spark.sql.shuffle.partitions": "1"}
"""A query whose shuffles carry few rows, planned all at once: an adaptive plan runs each stage as a Spark job of
its own and plans the rest again after each (some 0.05 s a stage on a warm server), a static plan runs its stages
as one job. One shuffle partition: its few rows go to one task."""


def static_plan(spark: SparkSession, *, when: bool = True) -> contextlib.AbstractContextManager[None]:
    """The session planning statically for the block (``STATIC_PLAN_CONF``), where ``when``."""
    return session_conf(spark, STATIC_PLAN_CONF) if when else contextlib.nullcontext()


def _set_operation(conf: Mapping[str, str]) -> proto.ConfigRequest.Operation:
    pairs = [proto.KeyValue(key=key, value=value) for key, value in conf.items()]
    return proto.ConfigRequest.Operation(set=proto.ConfigRequest.Set(pairs=pairs))


class Observation(ConnectObservation):
    """``DataFrame.observe``'s metrics holder, for batch DataFrames only. pyspark's asks the server whether the
    DataFrame is a stream before each use, one analysis of the whole plan per round trip (some 50 ms for a
    merge's plans); a merge's DataFrames never are, and the rest is pyspark's own code."""

    def _on(self, df: ConnectDataFrame, *exprs: Column) -> ConnectDataFrame:  # type: ignore[override]
        if self._result is not None:
            return super()._on(df, *exprs)  # pyspark's error for an observation used twice
        self._result = {}
        return ConnectDataFrame(connect_plan.CollectMetrics(df._plan, self, list(exprs)), df._session)
