"""MergeIntoCommand.runMerge: snapshot, source preparation, resolution, data skipping, the executor, the
commit, and the result row with Delta's metrics."""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow.compute as pc
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DoubleType,
    FloatType,
    StringType,
    StructType,
    TimestampType,
)
from sqlglot import exp

from engine import delta
from engine.errors import (
    CommitStateUnknownError,
    ConcurrentModificationError,
    DataCastError,
    MergeCancelledError,
    MergeExecutionError,
    MergeResolutionError,
    MergeServiceEngineError,
    SparkUnavailableError,
    spark_error_message,
)
from engine.executors import INTEGRAL_TYPES, ClassicMergeExecutor, InsertOnlyMergeExecutor, MergeContext
from engine.expressions import (
    Sides,
    and_all,
    conjuncts,
    equi_join_keys,
    parse_expression,
    quote_identifier,
    sql,
    strip_qualifiers,
    target_only_predicates,
    validate_spec,
)
from engine.resolution import Resolver
from engine.result import ALL_METRICS, COMMIT_METRICS, AppTransaction, MergeResult, Phase
from engine.source import rows_to_arrow, source_dataframe
from engine.spec import DeleteAction, MergeSpec, RowsSource, TableSource, UpdateAction

MAX_CONFLICT_RETRIES = 3
MAX_PARTITION_VALUES_FOR_SKIPPING = 200
ENGINE_INFO = "merge-service/0.1.0"

ProgressCallback = Callable[[Phase], None]


def run_merge(
    spark: SparkSession,
    spec: MergeSpec,
    *,
    txn: AppTransaction | None = None,
    on_progress: ProgressCallback | None = None,
    dry_run: bool = False,
) -> MergeResult:
    """Apply one merge to its target as one Delta commit. A commit that loses a race with a conflicting one is
    redone from a fresh snapshot a few times before the conflict is raised."""
    spec = validate_spec(spec)
    for attempt in range(MAX_CONFLICT_RETRIES):
        try:
            return MergeIntoCommand(spark, spec, txn=txn, on_progress=on_progress, dry_run=dry_run).run()
        except ConcurrentModificationError:
            if attempt == MAX_CONFLICT_RETRIES - 1:
                raise
    raise AssertionError("unreachable")


def translate_spark_error(exc: PySparkException) -> MergeServiceEngineError:
    """Spark's errors by kind: data that does not fit, names that do not resolve, cancellation, transport."""
    condition = ""
    for getter in ("getCondition", "getErrorClass"):
        fn = getattr(exc, getter, None)
        if fn is not None:
            try:
                condition = fn() or ""
            except Exception:
                condition = ""
            if condition:
                break
    text = str(exc).strip()
    first = spark_error_message(exc)
    if "OPERATION_CANCELED" in condition or "OPERATION_CANCELED" in text[:300]:
        return MergeCancelledError("The merge was cancelled while Spark was running it.")
    if any(
        k in condition
        for k in (
            "CAST_OVERFLOW",
            "CAST_INVALID_INPUT",
            "NUMERIC_VALUE_OUT_OF_RANGE",
            "ARITHMETIC_OVERFLOW",
            "NUMERIC_OUT_OF_SUPPORTED_RANGE",
            "DATETIME_OVERFLOW",
        )
    ):
        return DataCastError(f"A value does not fit its target column: {first}")
    if condition.startswith(("UNRESOLVED_", "AMBIGUOUS_", "DATATYPE_MISMATCH", "INVALID_", "WRONG_NUM_ARGS")):
        return MergeResolutionError(first)
    name = type(exc).__name__
    if name in ("SparkConnectGrpcException", "RetriesExceeded") and any(
        k in text for k in ("UNAVAILABLE", "Connection refused", "failed to connect", "Socket closed", "DEADLINE")
    ):
        return SparkUnavailableError(f"Spark Connect failed: {first}")
    if name == "AnalysisException":
        return MergeResolutionError(first)
    return MergeExecutionError(first)


def _literal(value: Any) -> exp.Expression | None:
    """A SQL literal for a statistics bound; None for values data skipping cannot compare."""
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, (int, decimal.Decimal)):
        return exp.Literal.number(str(value))
    if isinstance(value, float):
        return exp.Literal.number(repr(value)) if value == value and abs(value) != float("inf") else None
    if isinstance(value, str):
        return exp.Literal.string(value)
    if isinstance(value, dt.datetime):
        stamp = value.astimezone(dt.UTC).replace(tzinfo=None) if value.tzinfo else value
        return exp.cast(exp.Literal.string(stamp.isoformat(sep=" ")), exp.DataType.build("timestamp"))
    if isinstance(value, dt.date):
        return exp.cast(exp.Literal.string(value.isoformat()), exp.DataType.build("date"))
    return None


EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _as_is(column: Column) -> Column:
    return column


def _instant(micros: int | None) -> dt.datetime | None:
    """A TIMESTAMP from its microseconds since the epoch, in UTC."""
    return None if micros is None else EPOCH + dt.timedelta(microseconds=micros)


@dataclass
class _KeyRange:
    low: Any = None
    high: Any = None
    nulls: int = 0
    values: list[Any] | None = None


_STATS_RANGE_TYPES = (*INTEGRAL_TYPES, DateType, StringType)
"""Types whose Delta statistics bound the values exactly enough: timestamps are truncated to milliseconds,
floats may hold NaN and some writers (delta-rs) round decimals through doubles, so those ranges come from
Spark."""


def _comparable(source: DataType | None, target: DataType | None) -> bool:
    if source is None or target is None:
        return False
    if isinstance(source, INTEGRAL_TYPES) and isinstance(target, INTEGRAL_TYPES):
        return True
    return type(source) is type(target) and not isinstance(source, (FloatType, DoubleType, BinaryType, BooleanType))


class MergeIntoCommand:
    def __init__(
        self,
        spark: SparkSession,
        spec: MergeSpec,
        *,
        txn: AppTransaction | None,
        on_progress: ProgressCallback | None,
        dry_run: bool,
    ) -> None:
        self.spark = spark
        self.spec = spec
        self.txn = txn
        self.on_progress = on_progress or (lambda phase: None)
        self.dry_run = dry_run
        self.metrics: dict[str, int] = dict.fromkeys(ALL_METRICS, 0)
        self.write_id = f"merge-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:12]}"
        self._views: list[str] = []
        self._committed = False
        self._outcome_unknown = False
        self._source_snap: Any = None
        self._ctx: MergeContext | None = None
        self._source_key_ranges: dict[str, tuple[Any, Any]] = {}

    def run(self) -> MergeResult:
        start = time.monotonic()
        snapshot = None
        wrote = False
        try:
            snapshot = delta.load_snapshot(self.spec.target)
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
        source = source_dataframe(self.spark, self.spec.source, self._views)
        if (
            not self.spec.is_insert_only
            and not isinstance(self.spec.source, RowsSource)
            and not (isinstance(self.spec.source, TableSource) and self.spec.source.format == "delta")
        ):
            source = source.localCheckpoint(eager=True)
            self.metrics["materializeSourceTimeMs"] = int((time.monotonic() - start) * 1000)
        return source

    def _run(self, snapshot: Any, start: float) -> MergeResult:
        spec = self.spec
        source = self._prepare_source()
        target_empty = delta.scan_files(self.spark, snapshot, [], file_columns=False)
        resolved = Resolver(spec, source, target_empty, snapshot.spark_schema).resolve()

        if snapshot.cdf_enabled:
            delta.check_no_reserved_cdc_columns(StructType(resolved.output_fields))
        all_files = list(snapshot.files)
        sides = Sides(
            spec.target_alias,
            spec.source_alias,
            frozenset(f.name.lower() for f in snapshot.spark_schema.fields),
            frozenset(f.name.lower() for f in source.schema.fields),
        )
        predicate = self._skipping_predicate(snapshot, source, sides, all_files)
        candidates = delta.prune_files(snapshot, all_files, predicate) if predicate is not None else all_files
        m = self.metrics
        m["numTargetFilesBeforeSkipping"] = len(all_files)
        m["numTargetBytesBeforeSkipping"] = sum(f.size for f in all_files)
        m["numTargetFilesAfterSkipping"] = len(candidates)
        m["numTargetBytesAfterSkipping"] = sum(f.size for f in candidates)
        m["numTargetPartitionsAfterSkipping"] = _partitions(snapshot, candidates)

        key_exprs = [sql(e) for _, e in equi_join_keys(spec.on, sides)]
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
            source_key_ranges=dict(self._source_key_ranges),
        )
        self._ctx = ctx
        removed: list[Any] = []
        cdc_files: list[Any] = []
        if spec.is_insert_only:
            self.on_progress("writing")
            added = InsertOnlyMergeExecutor(ctx).write_only_inserts()
        else:
            self.on_progress("finding_touched_files")
            executor = ClassicMergeExecutor(ctx)
            single_pass = executor.takes_single_pass()
            written = None
            if single_pass:
                # findTouchedFiles folded into the write: the files it touches are known once it is written.
                self.on_progress("writing")
                written = executor.write_in_one_pass()
            if ctx.touched_files_known:
                touched = ctx.touched_files
            else:
                if single_pass:
                    # The single pass was given up before it knew the touched files (a multiple match).
                    self.on_progress("finding_touched_files")
                touched = executor.find_touched_files()
                self.on_progress("writing")
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
        self._finish_metrics(snapshot, added, removed)
        changed = m["numTargetRowsUpdated"] + m["numTargetRowsDeleted"] + m["numTargetRowsInserted"] > 0
        version = None
        # As Delta does, the time is taken before the commit: the commit records it in operationMetrics.
        m["executionTimeMs"] = int((time.monotonic() - start) * 1000)
        if changed and not self.dry_run:
            version = self._commit(snapshot, resolved, predicate, candidates, [*added, *cdc_files], removed)
        return MergeResult(table_version=version, result=_result_row(m), metrics=dict(m))

    def _finish_metrics(self, snapshot: Any, added: list[Any], removed: list[Any]) -> None:
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
        self, snapshot: Any, source: DataFrame, sides: Sides, files: list[Any]
    ) -> exp.Expression | None:
        """Delta's getTargetOnlyPredicates (ON, and for matched-only merges the clause conditions), plus, beyond
        Delta on Spark, the source's join-key range and partition values. None with NOT MATCHED BY SOURCE
        clauses: every target row is then in scope."""
        spec = self.spec
        if spec.not_matched_by_source or not files:
            return None
        predicates = target_only_predicates(spec.on, sides)
        if spec.is_matched_only:
            per_clause = []
            for clause in spec.matched:
                if clause.condition is None:
                    per_clause = []
                    break
                parts = [
                    strip_qualifiers(c)
                    for c in conjuncts(parse_expression(clause.condition, "condition"))
                    if sides.sides_of(c) == {"target"}
                ]
                if not parts:
                    per_clause = []
                    break
                per_clause.append(and_all(parts))
            if per_clause:
                predicates.append(exp.or_(*per_clause) if len(per_clause) > 1 else per_clause[0])
        if len(files) > 1:
            predicates.extend(self._source_key_predicates(snapshot, source, sides))
        return and_all(predicates)

    def _source_key_predicates(self, snapshot: Any, source: DataFrame, sides: Sides) -> list[exp.Expression]:
        """``target_key BETWEEN min AND max`` of each ON equality's source side (an IN list for partition
        columns), from the source's own statistics where it has them, else from one Spark aggregation."""
        target_types = {f.name.lower(): f.dataType for f in snapshot.spark_schema.fields}
        source_types = {f.name.lower(): f.dataType for f in source.schema.fields}
        keys = []
        for column, source_expr in equi_join_keys(self.spec.on, sides):
            # Bounds are compared in the target column's type: only keys of the same kind of type are safe.
            if isinstance(source_expr, exp.Column) and _comparable(
                source_types.get(str(source_expr.name).lower()), target_types.get(column.lower())
            ):
                keys.append((column, str(source_expr.name)))
        if not keys:
            return []
        partition_cols = {c.lower() for c in snapshot.partition_columns}
        ranges = [_KeyRange() for _ in keys]
        missing = [
            i
            for i, (column, name) in enumerate(keys)
            if not self._range_from_source_stats(name, ranges[i], want_values=column.lower() in partition_cols)
        ]
        if missing:
            aggs = []
            instants = set()
            for i in missing:
                value = F.col(quote_identifier(keys[i][1]))
                # Spark Connect hands TIMESTAMP values over as naive datetimes in this process's time zone;
                # microseconds since the epoch cross over exactly.
                if isinstance(source_types.get(keys[i][1].lower()), TimestampType):
                    instants.add(i)
                crossed = F.unix_micros if i in instants else _as_is
                aggs += [
                    crossed(F.min(value)).alias(f"min{i}"),
                    crossed(F.max(value)).alias(f"max{i}"),
                    F.count(F.when(value.isNull(), 1)).alias(f"nulls{i}"),
                ]
                if keys[i][0].lower() in partition_cols:
                    values = F.slice(F.collect_set(value), 1, MAX_PARTITION_VALUES_FOR_SKIPPING + 1)
                    aggs.append((F.transform(values, crossed) if i in instants else values).alias(f"values{i}"))
            row = source.agg(*aggs).collect()[0].asDict()
            for i in missing:
                low, high, values = row[f"min{i}"], row[f"max{i}"], row.get(f"values{i}")
                if i in instants:
                    low, high = _instant(low), _instant(high)
                    values = None if values is None else [_instant(v) for v in values]
                ranges[i] = _KeyRange(low, high, int(row[f"nulls{i}"] or 0), values)
        null_safe_columns = set()
        for c in conjuncts(parse_expression(self.spec.on, "on")):
            if isinstance(c, exp.NullSafeEQ):
                null_safe_columns |= {
                    str(side.name).lower() for side in (c.left, c.right) if isinstance(side, exp.Column)
                }
        predicates: list[exp.Expression] = []
        for (column, _), rng in zip(keys, ranges, strict=True):
            self._source_key_ranges[column.lower()] = (rng.low, rng.high)
            col = exp.column(column, quoted=True)
            has_nulls = rng.nulls > 0 and column.lower() in null_safe_columns
            lo, hi = _literal(rng.low), _literal(rng.high)
            if rng.low is None:
                pred: exp.Expression = exp.Is(this=col, expression=exp.Null()) if has_nulls else exp.false()
            elif lo is None or hi is None:
                continue
            else:
                pred = exp.Between(this=col, low=lo, high=hi)
                if rng.values is not None and len(rng.values) <= MAX_PARTITION_VALUES_FOR_SKIPPING:
                    literals = [_literal(v) for v in rng.values if v is not None]
                    if literals and all(lit is not None for lit in literals):
                        pred = exp.In(this=col.copy(), expressions=literals)
                if has_nulls:
                    pred = exp.or_(pred, exp.Is(this=col.copy(), expression=exp.Null()))
            predicates.append(pred)
        return predicates

    def _range_from_source_stats(self, name: str, rng: _KeyRange, *, want_values: bool) -> bool:
        """Fill ``rng`` without a Spark job: inline rows are at hand, and a Delta source's log has per-file
        min, max and null counts (lower and upper bounds, which is all skipping needs)."""
        source = self.spec.source
        if isinstance(source, RowsSource):
            table = rows_to_arrow(source.rows, source.schema)
            match = next((n for n in table.column_names if n.lower() == name.lower()), None)
            if match is None:
                return False
            column = table.column(match)
            bounds = pc.min_max(column).as_py() if len(column) else {"min": None, "max": None}
            rng.low, rng.high, rng.nulls = bounds["min"], bounds["max"], column.null_count
            if want_values:
                rng.values = pc.unique(column.drop_null()).to_pylist()[: MAX_PARTITION_VALUES_FOR_SKIPPING + 1]
            return True
        if not (isinstance(source, TableSource) and source.format == "delta") or want_values:
            return False
        snap = self._source_snapshot()
        if name.lower() in {c.lower() for c in snap.partition_columns}:
            return False
        dtype = next((f.dataType for f in snap.spark_schema.fields if f.name.lower() == name.lower()), None)
        if not isinstance(dtype, _STATS_RANGE_TYPES):
            return False
        low = high = None
        nulls = 0
        for f in snap.files:
            st = f.stats
            if st is None or st.num_records is None:
                return False
            file_nulls = st.value("null_count", [name])
            if file_nulls is None:
                return False
            nulls += int(file_nulls)
            if file_nulls == st.num_records:
                continue
            fmin, fmax = st.value("min_values", [name]), st.value("max_values", [name])
            if fmin is None or fmax is None:
                return False
            low = fmin if low is None or fmin < low else low
            high = fmax if high is None or fmax > high else high
        rng.low, rng.high, rng.nulls = low, high, nulls
        return True

    def _source_snapshot(self) -> Any:
        if self._source_snap is None:
            assert isinstance(self.spec.source, TableSource)
            self._source_snap = delta.load_snapshot(self.spec.source.path)
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
        snapshot: Any,
        resolved: Any,
        predicate: exp.Expression | None,
        candidates: list[Any],
        added: list[Any],
        removed: list[Any],
    ) -> int:
        transaction = delta.Transaction(snapshot, engine_info=ENGINE_INFO)
        transaction.record_read(candidates, sql(predicate) if predicate is not None else None)
        if self.txn is not None:
            transaction.set_app_transaction(self.txn.app_id, self.txn.version)
        actions: list[Any] = []
        if resolved.schema_changed:
            actions.append(snapshot.metadata.with_schema(StructType(resolved.output_fields)))
        now = int(time.time() * 1000)
        actions += [f.to_remove(now) for f in removed]
        actions += list(added)
        self.on_progress("committing")
        metrics = {k: str(self.metrics[k]) for k in COMMIT_METRICS}
        try:
            version = transaction.commit(
                actions,
                operation="MERGE",
                operation_parameters=self._operation_parameters(),
                operation_metrics=metrics,
                is_blind_append=False,
            )
        except CommitStateUnknownError:
            self._outcome_unknown = True
            raise
        self._committed = True
        return int(version)

    def _operation_parameters(self) -> dict[str, str]:
        """DeltaOperations.Merge's parameters, in Delta's JSON shapes."""

        def predicates(clauses: Any) -> str:
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


def _partitions(snapshot: Any, files: list[Any]) -> int:
    if not snapshot.partition_columns:
        return 0
    return len({tuple(sorted(f.partition_values.items(), key=lambda kv: kv[0])) for f in files})


def _already_applied(snapshot: Any, txn: AppTransaction) -> MergeResult:
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
