"""Running an AUTO CDC batch: the batch checked against its spec, the target and the state table created on the
first batch, then two merges through the engine's own MERGE: the target's (one commit, the job's ``txn``) and the
state table's (the same ``txn``, so a retried job finishes it exactly once)."""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Callable

from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from engine import delta
from engine.auto_cdc import plan
from engine.auto_cdc.batch import Batch, check_events, read_batch
from engine.auto_cdc.spec import AutoCdcSpec
from engine.auto_cdc.tables import (
    Created,
    ensure_state,
    ensure_target,
    has_tombstones,
    lacks_columns,
    state_fields,
    target_fields,
)
from engine.command import ProgressCallback, run_merge
from engine.errors import AutoCdcIncompleteError, MergeServiceEngineError, TableNotFoundError
from engine.expression_rules import check_expression, spark_text
from engine.expressions import parse_expression
from engine.result import AppTransaction, MergeResult
from engine.source import source_dataframe
from engine.spec import DeletionVectorsMode, FrameSource, MergeSpec


def validate_auto_cdc(spec: AutoCdcSpec) -> AutoCdcSpec:
    """The spec's rules and its expressions judged as a merge's are (``engine.expression_rules``), in the form Spark
    is sent them."""
    spec.validate()
    sequence = tuple(
        _checked(text, f"sequence_by[{i}]" if len(spec.sequence_by) > 1 else "sequence_by")
        for i, text in enumerate(spec.sequence_by)
    )
    deletes = None if spec.apply_as_deletes is None else _checked(spec.apply_as_deletes, "apply_as_deletes")
    truncates = None if spec.apply_as_truncates is None else _checked(spec.apply_as_truncates, "apply_as_truncates")
    return dataclasses.replace(spec, sequence_by=sequence, apply_as_deletes=deletes, apply_as_truncates=truncates)


def _checked(text: str, where: str) -> str:
    node = parse_expression(text, where)
    check_expression(node, where, deterministic=True)
    return spark_text(node, where)


def run_auto_cdc(
    spark: SparkSession,
    spec: AutoCdcSpec,
    *,
    txn: AppTransaction | None = None,
    on_progress: ProgressCallback | None = None,
    dry_run: bool = False,
    validated: bool = False,
) -> MergeResult:
    """Apply one batch of change events to the target. The target's merge is the job's one commit to it; a failure
    before it leaves both tables unchanged, and a first batch that fails leaves no table behind."""
    if not validated:
        spec = validate_auto_cdc(spec)
    views: list[str] = []
    created: list[Created] = []
    try:
        try:
            batch = read_batch(spark, spec, views)
            deletes, truncated = check_events(spark, batch, views[-1])
            created, absent = ensure_target(spec, batch, dry_run=dry_run)
            if not dry_run:
                created += ensure_state(spec, batch)
        finally:
            _drop_views(spark, views)
        result = run_merge(
            spark, _target_merge(spec, batch, truncated, absent), txn=txn, on_progress=on_progress, dry_run=dry_run
        )
    except Exception:
        for table in reversed(created):  # the state table first: it may lie inside the target's folder
            table.remove_if_unchanged(spec.lake_roots)
        raise
    if dry_run or (spec.stored_as_scd_type == 1 and not deletes and truncated is None and not has_tombstones(spec)):
        return result  # SCD 1 with no delete or truncate to record and no tombstone an upsert could drop
    try:
        run_merge(spark, _state_merge(spec, batch, truncated), txn=txn)
    except MergeServiceEngineError as exc:
        raise AutoCdcIncompleteError(
            f"the target took the batch (version {result.table_version}) but its state table "
            f"{spec.state} did not: {exc}"
        ) from exc
    return result


# --- the merges --------------------------------------------------------------------------------------------------


def _frame(spec: AutoCdcSpec, batch: Batch, sql: Callable[[plan.Views], str]) -> FrameSource:
    def build(spark: SparkSession, views: list[str]) -> DataFrame:
        suffix = uuid.uuid4().hex[:12]
        names = plan.Views(f"__cdc_batch_{suffix}", f"__cdc_target_{suffix}", f"__cdc_state_{suffix}")
        source_dataframe(spark, spec.source, views, spec.lake_roots).createOrReplaceTempView(names.batch)
        views.append(names.batch)
        _table_view(spark, spec.target, spec, names.target, target_fields(spec, batch))
        views.append(names.target)
        _table_view(spark, spec.state, spec, names.state, state_fields(spec, batch))
        views.append(names.state)
        return spark.sql(sql(names))

    return FrameSource(build=build, description="an AUTO CDC batch")


def _table_view(spark: SparkSession, path: str, spec: AutoCdcSpec, view: str, fields: list[T.StructField]) -> None:
    """A table's rows as a view; a table not created yet (a dry run's first batch) reads as empty."""
    try:
        snapshot = delta.load_snapshot(path, lake_roots=spec.lake_roots)
        df = delta.scan_files(spark, snapshot, snapshot.files, file_columns=False)
    except TableNotFoundError:
        df = spark.createDataFrame([], schema=T.StructType(fields))
    have = {c.lower() for c in df.columns}
    for f in fields:  # a column the batch brings that the table does not have yet reads as null
        if f.name.lower() not in have:
            df = df.withColumn(f.name, F.lit(None).cast(f.dataType))
    df.createOrReplaceTempView(view)


def _target_merge(spec: AutoCdcSpec, batch: Batch, truncated: str | None, absent: frozenset[str]) -> MergeSpec:
    """``absent``: the batch's value columns the target lacks, which this merge adds (schema evolution)."""
    columns = batch.columns
    if spec.stored_as_scd_type == 1:
        clauses, on = plan.scd1_target_clauses(columns, truncated, absent), plan.keys_on(columns)
        sql = plan.scd1_source_sql
    else:
        clauses, on, sql = plan.scd2_target_clauses(columns, absent), plan.scd2_target_on(columns), plan.scd2_source_sql
    source = _frame(spec, batch, lambda v: sql(columns, batch.events(v.batch), v))
    return _merge(spec, spec.target, on, source, clauses, deletion_vectors=spec.deletion_vectors, evolve=bool(absent))


def _state_merge(spec: AutoCdcSpec, batch: Batch, truncated: str | None) -> MergeSpec:
    columns = batch.columns
    if spec.stored_as_scd_type == 1:
        clauses, on = plan.scd1_tombstone_clauses(columns, truncated), plan.scd1_tombstones_on(columns)
        source = _frame(spec, batch, lambda v: plan.scd1_tombstones_sql(columns, batch.events(v.batch), v))
    else:
        clauses, on = plan.scd2_events_clauses(columns), plan.scd2_events_on(columns)
        source = _frame(spec, batch, lambda v: plan.scd2_events_sql(columns, batch.events(v.batch)))
    evolve = spec.stored_as_scd_type == 2 and lacks_columns(spec.state, spec, state_fields(spec, batch))
    return _merge(spec, spec.state, on, source, clauses, deletion_vectors="auto", evolve=evolve)


def _merge(
    spec: AutoCdcSpec,
    table: str,
    on: str,
    source: FrameSource,
    clauses: plan.Clauses,
    *,
    deletion_vectors: DeletionVectorsMode,
    evolve: bool,
) -> MergeSpec:
    """``evolve``: the table lacks a column the batch brings, which schema evolution adds (as Databricks' AUTO CDC
    evolves its target)."""
    matched, not_matched, by_source = clauses
    return MergeSpec(
        target=table,
        source=source,
        on=on,
        matched=matched,
        not_matched=not_matched,
        not_matched_by_source=by_source,
        lake_roots=spec.lake_roots,
        deletion_vectors=deletion_vectors,
        schema_evolution=evolve,
    )


def _drop_views(spark: SparkSession, views: list[str]) -> None:
    for view in views:
        with contextlib.suppress(PySparkException):
            spark.catalog.dropTempView(view)
