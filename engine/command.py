"""MergeIntoCommand.runMerge: snapshot, source preparation, resolution, data skipping, the executor, the
commit, and the result row with Delta's metrics."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
import uuid
from collections.abc import Callable, Sequence

from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    StructType,
)
from sqlglot import exp

from engine import delta, streamed_source
from engine.applied import applied_result, holds, result_row
from engine.context import MergeContext
from engine.delta import AddCDCFile, AddFile, CommitAction, Snapshot, row_tracking
from engine.delta.identity import with_high_water_marks
from engine.delta.type_widening import type_widening_enabled
from engine.errors import (
    CommitStateUnknownError,
    ConcurrentModificationError,
    MergeServiceEngineError,
)
from engine.expressions import sql
from engine.file_skipping import partitions, skip_files
from engine.merge_condition import Sides
from engine.merge_writes import write_merge, writes_deletion_vectors
from engine.resolution import Resolver
from engine.resolved import ResolvedMerge
from engine.result import ALL_METRICS, COMMIT_METRICS, AppTransaction, MergeResult, Phase
from engine.source import delta_source_snapshot, source_dataframe
from engine.source_keys import SourceKeyRanges
from engine.spark import local_checkpoint
from engine.spark_errors import translate_spark_error
from engine.spec import DeleteAction, MergeClause, MergeSpec, RowsSource, TableSource, UpdateAction
from engine.validation import ParsedMerge, check_no_internal_columns, parse_merge

MAX_CONFLICT_RETRIES = 3
ENGINE_INFO = "merge-service/0.1.0"

ProgressCallback = Callable[[Phase], None]


def run_merge(
    spark: SparkSession,
    spec: MergeSpec,
    *,
    txn: AppTransaction | None = None,
    on_progress: ProgressCallback | None = None,
    dry_run: bool = False,
    validated: bool = False,
) -> MergeResult:
    """Apply one merge to its target as one Delta commit. A commit that loses a race with a conflicting one is
    redone from a fresh snapshot a few times before the conflict is raised.

    ``validated``: ``spec`` is what ``validate_spec`` returned for it in this process, so its expressions are
    parsed (once, for the whole merge) but not judged again.
    """
    parsed = parse_merge(spec, checked=validated)
    for attempt in range(MAX_CONFLICT_RETRIES):
        try:
            return MergeIntoCommand(spark, parsed, txn=txn, on_progress=on_progress, dry_run=dry_run).run()
        except ConcurrentModificationError:
            if attempt == MAX_CONFLICT_RETRIES - 1:
                raise
    raise AssertionError("unreachable")


class MergeIntoCommand:
    def __init__(
        self,
        spark: SparkSession,
        parsed: ParsedMerge,
        *,
        txn: AppTransaction | None,
        on_progress: ProgressCallback | None,
        dry_run: bool,
    ) -> None:
        self.spark = spark
        self.parsed = parsed
        self.spec = spec = parsed.spec
        self.txn = txn
        self.on_progress = on_progress or (lambda phase: None)
        self.dry_run = dry_run
        self.metrics: dict[str, int] = dict.fromkeys(ALL_METRICS, 0)
        self.write_id = f"merge-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:12]}"
        self._views: list[str] = []
        self._committed = False
        self._outcome_unknown = False
        self._source_snap: Snapshot | None = None
        self._ctx: MergeContext | None = None
        self._source_keys = SourceKeyRanges(spec, parsed.on, self._source_snapshot)

    def run(self) -> MergeResult:
        start = time.monotonic()
        snapshot = None
        wrote = False
        try:
            snapshot = delta.load_snapshot(self.spec.target, lake_roots=self.spec.lake_roots)
            delta.check_supported(snapshot)
            if self.txn is not None and holds(snapshot, self.txn):
                return applied_result(snapshot, self.txn)
            if any(isinstance(c.action, (UpdateAction, DeleteAction)) for c in self.spec.clauses):
                delta.check_can_modify(snapshot)
            wrote = True
            return self._run(snapshot, start)
        except MergeServiceEngineError:
            raise
        except PySparkException as exc:
            raise translate_spark_error(exc) from exc
        finally:
            # Files of a commit whose outcome is unknown may be live in the table: those are never removed.
            if snapshot is not None and wrote and not self._committed and not self._outcome_unknown:
                delta.discard_write(snapshot, self.write_id)
            if self._ctx is not None:
                with contextlib.suppress(PySparkException):
                    self._ctx.release()
            for view in self._views:
                with contextlib.suppress(PySparkException):
                    self.spark.catalog.dropTempView(view)

    # --- the merge ---------------------------------------------------------------------------------------------

    def _prepare_source(self) -> DataFrame:
        """MergeIntoMaterializeSource: a source that could change between the two reads of a classic merge is
        materialized once; a Delta snapshot, a Delta table's Change Data Feed (its files fixed when the source is
        read) or inline rows read the same twice."""
        self.on_progress("preparing_source")
        start = time.monotonic()
        source = source_dataframe(self.spark, self.spec.source, self._views, self.spec.lake_roots)
        if (
            not self.spec.is_insert_only
            and not isinstance(self.spec.source, RowsSource)
            and not (isinstance(self.spec.source, TableSource) and self.spec.source.format == "delta")
        ):
            source = local_checkpoint(self.spark, source)
            self.metrics["materializeSourceTimeMs"] = int((time.monotonic() - start) * 1000)
        return source

    def _run(self, snapshot: Snapshot, start: float) -> MergeResult:
        spec = self.spec
        source = self._prepare_source()
        check_no_internal_columns("target", [f.name for f in snapshot.spark_schema.fields])
        check_no_internal_columns("source", source.columns)
        target_empty = delta.scan_files(self.spark, snapshot, [], file_columns=False)
        resolved = Resolver(
            self.parsed,
            source,
            target_empty,
            snapshot.spark_schema,
            type_widening=type_widening_enabled(snapshot.protocol, snapshot.metadata),
        ).resolve()
        if resolved.schema_changed:
            # Column mapping: new columns get their physical names and ids once, for the files and the commit.
            resolved.output_fields = list(snapshot.metadata.with_schema(StructType(resolved.output_fields)).schema)

        if snapshot.cdf_enabled:
            delta.check_no_reserved_cdc_columns(StructType(resolved.output_fields))
        sides = Sides(
            spec.target_alias,
            spec.source_alias,
            frozenset(f.name.lower() for f in snapshot.spark_schema.fields),
            frozenset(f.name.lower() for f in source.schema.fields),
        )
        predicate, candidates = skip_files(self.parsed, self._source_keys, snapshot, source, sides, self.metrics)
        m = self.metrics
        key_exprs = [sql(e) for _, e in resolved.on_condition.equi_join_keys(sides)]
        ctx = MergeContext(
            self.spark,
            spec,
            snapshot,
            resolved,
            source,
            candidates,
            self.write_id,
            m,
            cdc_enabled=bool(snapshot.cdf_enabled),
            key_exprs=key_exprs,
            source_rows_estimate=self._source_rows_estimate(),
            source_splits=self._source_splits(),
            source_key_ranges=dict(self._source_keys.ranges),
            write_deletion_vectors=writes_deletion_vectors(spec, snapshot),
            row_tracking_columns=row_tracking.materialized_columns(snapshot.protocol, snapshot.metadata),
        )
        self._ctx = ctx
        writes = write_merge(ctx, self.on_progress)
        added, cdc_files, removed, readded = writes
        self._finish_metrics(snapshot, added, writes.replaced)
        # As Delta's commitIfNeeded: a touched file is rewritten and committed even when no row of it changed
        # (a match that no clause acts on, in a merge with more than MATCHED clauses).
        changed = bool(added or removed or cdc_files or readded) or (
            m["numTargetRowsUpdated"] + m["numTargetRowsDeleted"] + m["numTargetRowsInserted"] > 0
        )
        version = None
        # As Delta does, the time is taken before the commit: the commit records it in operationMetrics.
        m["executionTimeMs"] = int((time.monotonic() - start) * 1000)
        if changed and not self.dry_run:
            version = self._commit(snapshot, resolved, predicate, candidates, [*readded, *added, *cdc_files], removed)
        return MergeResult(table_version=version, result=result_row(m), metrics=dict(m))

    def _finish_metrics(self, snapshot: Snapshot, added: list[AddFile], removed: list[AddFile]) -> None:
        m = self.metrics
        m["numTargetRowsUpdated"] = m["numTargetRowsMatchedUpdated"] + m["numTargetRowsNotMatchedBySourceUpdated"]
        m["numTargetRowsDeleted"] = m["numTargetRowsMatchedDeleted"] + m["numTargetRowsNotMatchedBySourceDeleted"]
        m["numOutputRows"] = m["numTargetRowsInserted"] + m["numTargetRowsUpdated"] + m["numTargetRowsCopied"]
        m["numTargetFilesAdded"] = len(added)
        m["numTargetBytesAdded"] = sum(f.size for f in added)
        m["numTargetFilesRemoved"] = len(removed)
        m["numTargetBytesRemoved"] = sum(f.size for f in removed)
        m["numTargetPartitionsRemovedFrom"] = partitions(snapshot, removed)
        m["numTargetPartitionsAddedTo"] = partitions(snapshot, added)

    def _source_snapshot(self) -> Snapshot:
        if self._source_snap is None:
            assert isinstance(self.spec.source, TableSource)
            self._source_snap = delta_source_snapshot(self.spark, self.spec.source, self.spec.lake_roots)
        return self._source_snap

    def _source_rows_estimate(self) -> int | None:
        """The source's row count where it is known without Spark and every read of it gives the same rows:
        inline rows, or a Delta source's statistics."""
        source = self.spec.source
        if isinstance(source, RowsSource):
            return len(source.rows)
        if isinstance(source, TableSource) and source.reads_snapshot:
            return delta.known_num_records(self._source_snapshot().files)
        return None

    def _source_splits(self) -> int | None:
        """The row groups of a Delta source large enough for ``spread_streamed_source`` to ask."""
        source = self.spec.source
        if not (isinstance(source, TableSource) and source.reads_snapshot):
            return None
        if not streamed_source.is_large(self._source_rows_estimate()):
            return None
        return delta.row_group_count(self._source_snapshot())

    # --- the commit ----------------------------------------------------------------------------------------------

    def _commit(
        self,
        snapshot: Snapshot,
        resolved: ResolvedMerge,
        predicate: exp.Expression | None,
        candidates: list[AddFile],
        added: Sequence[AddFile | AddCDCFile],
        removed: list[AddFile],
    ) -> int:
        transaction = delta.Transaction(snapshot, engine_info=ENGINE_INFO)
        transaction.record_read(candidates, sql(predicate) if predicate is not None else None)
        if self.txn is not None:
            transaction.set_app_transaction(self.txn.app_id, self.txn.version)
        actions: list[CommitAction] = []
        schema = StructType(resolved.output_fields) if resolved.schema_changed else snapshot.spark_schema
        new_files = [f for f in added if isinstance(f, AddFile) and f.path not in snapshot.files_by_path]
        written = [snapshot.file_path(f) for f in new_files]
        marked = with_high_water_marks(schema, resolved.identity_generated, written)
        if resolved.schema_changed or marked is not None:
            actions.append(snapshot.metadata.with_schema(marked or schema))
        now = int(time.time() * 1000)
        actions += [f.to_remove(now) for f in removed]
        actions += list(added)
        self.on_progress("committing")
        metrics = {k: str(self.metrics[k]) for k in COMMIT_METRICS}
        # Updated and copied rows keep their stable row ids, copied rows their commit versions (write_files).
        tags = (
            {row_tracking.PRESERVED_TAG: "true"}
            if row_tracking.is_enabled(snapshot.protocol, snapshot.metadata)
            else None
        )
        try:
            version = transaction.commit(
                actions,
                operation="MERGE",
                operation_parameters=self._operation_parameters(),
                operation_metrics=metrics,
                is_blind_append=False,
                tags=tags,
            )
        except CommitStateUnknownError:
            self._outcome_unknown = True
            raise
        self._committed = True
        return int(version)

    def _operation_parameters(self) -> dict[str, str]:
        """DeltaOperations.Merge's parameters, in Delta's JSON shapes."""

        def predicates(clauses: Sequence[MergeClause]) -> str:
            out = []
            for c in clauses:
                item = {"actionType": c.action_type}
                if c.condition is not None:
                    item = {"predicate": c.condition, **item}
                out.append(item)
            return json.dumps(out)

        return {
            "predicate": json.dumps([self.spec.on]),
            "matchedPredicates": predicates(self.spec.matched),
            "notMatchedPredicates": predicates(self.spec.not_matched),
            "notMatchedBySourcePredicates": predicates(self.spec.not_matched_by_source),
        }
