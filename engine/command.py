"""MergeIntoCommand.runMerge: snapshot, source preparation, resolution, data skipping, the executor, the
commit, and the result row with Delta's metrics."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
import uuid
from collections.abc import Callable, Sequence
from typing import cast

from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    StructType,
)
from sqlglot import exp

from engine import delta
from engine.context import MergeContext
from engine.delta import AddCDCFile, AddFile, CommitAction, Snapshot, row_tracking
from engine.delta.dml_with_deletion_vectors import deletion_vectors_writable
from engine.delta.identity import with_high_water_marks
from engine.delta.type_widening import type_widening_enabled
from engine.errors import (
    CommitStateUnknownError,
    ConcurrentModificationError,
    MergeServiceEngineError,
)
from engine.executors import ClassicMergeExecutor
from engine.expressions import sql
from engine.insert_only import InsertOnlyMergeExecutor
from engine.merge_condition import Sides, and_all, conjuncts, strip_qualifiers
from engine.resolution import ResolvedMerge, Resolver
from engine.result import ALL_METRICS, COMMIT_METRICS, AppTransaction, MergeResult, Phase
from engine.source import source_dataframe
from engine.source_keys import SourceKeyRanges
from engine.spark import local_checkpoint
from engine.spark_errors import translate_spark_error
from engine.spec import DeleteAction, MergeClause, MergeSpec, RowsSource, TableSource, UpdateAction
from engine.validation import ParsedMerge, parse_merge

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
            if self.txn is not None:
                applied = snapshot.app_transaction_version(self.txn.app_id)
                if applied is not None and applied >= self.txn.version:
                    return _already_applied(snapshot, self.txn)
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
        materialized once; a Delta snapshot or inline rows read the same twice."""
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
        predicate, candidates = self._skip_files(snapshot, source, sides)
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
            source_key_ranges=dict(self._source_keys.ranges),
            write_deletion_vectors=self._writes_deletion_vectors(snapshot),
            row_tracking_columns=row_tracking.materialized_columns(snapshot.protocol, snapshot.metadata),
        )
        self._ctx = ctx
        readded: list[AddFile] = []
        if ctx.write_deletion_vectors:
            added, cdc_files, removed, readded = self._write_with_deletion_vectors(ctx)
            self._finish_metrics(snapshot, added, [f for f in removed if f.path not in {a.path for a in readded}])
        else:
            added, cdc_files, removed = self._write(ctx)
            self._finish_metrics(snapshot, added, removed)
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
        return MergeResult(table_version=version, result=_result_row(m), metrics=dict(m))

    def _skip_files(
        self, snapshot: Snapshot, source: DataFrame, sides: Sides
    ) -> tuple[exp.Expression | None, list[AddFile]]:
        """Data skipping: the predicate the commit records as read, and the candidate files it leaves."""
        all_files = list(snapshot.files)
        predicate = self._skipping_predicate(snapshot, source, sides, all_files)
        candidates = delta.prune_files(snapshot, all_files, predicate) if predicate is not None else all_files
        m = self.metrics
        m["numTargetFilesBeforeSkipping"] = len(all_files)
        m["numTargetBytesBeforeSkipping"] = sum(f.size for f in all_files)
        m["numTargetFilesAfterSkipping"] = len(candidates)
        m["numTargetBytesAfterSkipping"] = sum(f.size for f in candidates)
        m["numTargetPartitionsAfterSkipping"] = _partitions(snapshot, candidates)
        return predicate, candidates

    def _write(self, ctx: MergeContext) -> tuple[list[AddFile], list[AddCDCFile], list[AddFile]]:
        """The executors' work: the data files and change files added, and the files removed."""
        spec = self.spec
        removed: list[AddFile] = []
        cdc_files: list[AddCDCFile] = []
        if spec.is_insert_only:
            self.on_progress("writing")
            added = InsertOnlyMergeExecutor(ctx).write_only_inserts()
        else:
            self.on_progress("finding_touched_files")
            executor = ClassicMergeExecutor(ctx)
            touched, written = executor.find_touched_files_or_write(self.on_progress)
            if written is not None:
                added, cdc_files = written
                removed = touched
            elif touched:
                added, cdc_files = executor.write_all_changes()
                removed = touched
            elif spec.not_matched:
                added = InsertOnlyMergeExecutor(ctx).write_only_inserts(
                    filter_matched_rows=False, source_rows_metric="numSourceRowsInSecondScan"
                )
            else:
                added = []
        return added, cdc_files, removed

    def _writes_deletion_vectors(self, snapshot: Snapshot) -> bool:
        """Merge-on-read: the spec allows it, the table is deletionVectorsWritable, and some clause updates or
        deletes target rows."""
        return (
            self.spec.deletion_vectors == "auto"
            and not self.spec.is_insert_only
            and deletion_vectors_writable(snapshot)
        )

    def _write_with_deletion_vectors(
        self, ctx: MergeContext
    ) -> tuple[list[AddFile], list[AddCDCFile], list[AddFile], list[AddFile]]:
        """The executors' work with deletion vectors: the data and change files added, the files removed (those
        given a new vector are among them, removed with their old one) and the same paths added back with
        their new vectors."""
        self.on_progress("finding_touched_files")
        executor = ClassicMergeExecutor(ctx)
        if self.spec.is_delete_only and not ctx.cdc_enabled:
            changes = executor.delete_with_deletion_vectors()
            removed = [*changes.removed, *[old for old, _ in changes.updated]]
            return [], [], removed, [new for _, new in changes.updated]
        touched, _ = executor.find_touched_files_or_write(self.on_progress)
        if touched:
            changes = executor.write_all_changes_with_deletion_vectors()
            removed = [*changes.removed, *[old for old, _ in changes.updated]]
            return changes.added, changes.cdc_files, removed, [new for _, new in changes.updated]
        if self.spec.not_matched:
            added = InsertOnlyMergeExecutor(ctx).write_only_inserts(
                filter_matched_rows=False, source_rows_metric="numSourceRowsInSecondScan"
            )
            return added, [], [], []
        return [], [], [], []

    def _finish_metrics(self, snapshot: Snapshot, added: list[AddFile], removed: list[AddFile]) -> None:
        m = self.metrics
        m["numTargetRowsUpdated"] = m["numTargetRowsMatchedUpdated"] + m["numTargetRowsNotMatchedBySourceUpdated"]
        m["numTargetRowsDeleted"] = m["numTargetRowsMatchedDeleted"] + m["numTargetRowsNotMatchedBySourceDeleted"]
        m["numOutputRows"] = m["numTargetRowsInserted"] + m["numTargetRowsUpdated"] + m["numTargetRowsCopied"]
        m["numTargetFilesAdded"] = len(added)
        m["numTargetBytesAdded"] = sum(f.size for f in added)
        m["numTargetFilesRemoved"] = len(removed)
        m["numTargetBytesRemoved"] = sum(f.size for f in removed)
        m["numTargetPartitionsRemovedFrom"] = _partitions(snapshot, removed)
        m["numTargetPartitionsAddedTo"] = _partitions(snapshot, added)

    # --- data skipping -----------------------------------------------------------------------------------------

    def _skipping_predicate(
        self, snapshot: Snapshot, source: DataFrame, sides: Sides, files: list[AddFile]
    ) -> exp.Expression | None:
        """Delta's getTargetOnlyPredicates (ON, and for matched-only merges the clause conditions), plus, beyond
        Delta on Spark, the source's join-key range and partition values. None with NOT MATCHED BY SOURCE
        clauses: every target row is then in scope."""
        spec = self.spec
        if spec.not_matched_by_source or not files:
            return None
        predicates = self.parsed.on.target_only_predicates(sides)
        if spec.is_matched_only:
            matched = self._matched_conditions_predicate(sides)
            if matched is not None:
                predicates.append(matched)
        if len(files) > 1:
            predicates.extend(self._source_keys.source_key_predicates(snapshot, source, sides))
        return cast("exp.Expression | None", and_all(predicates))

    def _matched_conditions_predicate(self, sides: Sides) -> exp.Expr | None:
        """For a matched-only merge, the OR of each MATCHED clause's target-only conjuncts; None when a clause
        has none (it may act on any matched row)."""
        per_clause: list[exp.Expr] = []
        for clause in self.spec.matched:
            if clause.condition is None:
                return None
            parts = and_all(
                strip_qualifiers(c)
                for c in conjuncts(self.parsed.tree(clause.condition))
                if sides.sides_of(c) == {"target"}
            )
            if parts is None:
                return None
            per_clause.append(parts)
        if not per_clause:
            return None
        if len(per_clause) == 1:
            return per_clause[0]
        return cast(exp.Expr, exp.or_(*per_clause))  # an exp.Or; sqlglot's hints say Condition

    def _source_snapshot(self) -> Snapshot:
        if self._source_snap is None:
            assert isinstance(self.spec.source, TableSource)
            self._source_snap = delta.load_snapshot(self.spec.source.path, lake_roots=self.spec.lake_roots)
        return self._source_snap

    def _source_rows_estimate(self) -> int | None:
        """The source's row count where it is known without Spark and every read of it gives the same rows:
        inline rows, or a Delta source's statistics."""
        source = self.spec.source
        if isinstance(source, RowsSource):
            return len(source.rows)
        if isinstance(source, TableSource) and source.format == "delta":
            return delta.known_num_records(self._source_snapshot().files)
        return None

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
                item = {"actionType": c.action_name}
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


def _result_row(m: dict[str, int]) -> dict[str, int]:
    updated = m.get("numTargetRowsUpdated", 0)
    deleted = m.get("numTargetRowsDeleted", 0)
    inserted = m.get("numTargetRowsInserted", 0)
    return {
        "num_affected_rows": updated + deleted + inserted,
        "num_updated_rows": updated,
        "num_deleted_rows": deleted,
        "num_inserted_rows": inserted,
    }


def _partitions(snapshot: Snapshot, files: Sequence[AddFile]) -> int:
    if not snapshot.partition_columns:
        return 0
    return len({tuple(sorted(f.partition_values.items(), key=lambda kv: kv[0])) for f in files})


def _already_applied(snapshot: Snapshot, txn: AppTransaction) -> MergeResult:
    """The result of a merge an earlier attempt committed, read back from that commit's operationMetrics."""
    version = delta.find_app_transaction_commit(snapshot, txn.app_id, txn.version)
    # The commit records the first 22 metrics; the ones Delta shows only in its UI are not recorded.
    metrics: dict[str, int] = dict.fromkeys(ALL_METRICS, 0)
    if version is not None:
        recorded = delta.commit_info(snapshot, version).get("operationMetrics") or {}
        for key, value in recorded.items():
            with contextlib.suppress(TypeError, ValueError):
                metrics[key] = int(value)
    return MergeResult(
        table_version=version if version is not None else snapshot.version,
        result=_result_row(metrics),
        metrics=metrics,
        already_applied=True,
    )
