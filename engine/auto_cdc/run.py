"""Running an AUTO CDC batch: the batch checked against its spec, the target and the state table created on the
first batch, then two merges through the engine's own MERGE: the target's (one commit, the job's ``txn``) and the
state table's (the same ``txn``, so a retried job finishes it exactly once)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import uuid
from collections.abc import Callable

import pyarrow as pa
from deltalake import write_deltalake
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from engine import delta
from engine.auto_cdc import plan
from engine.auto_cdc.columns import Columns, Fields, resolve_columns
from engine.auto_cdc.spec import DELETE_AT, END_AT, EVENT_AT, IS_DELETE, START_AT, AutoCdcSpec
from engine.command import ProgressCallback, run_merge
from engine.delta.values import to_arrow_schema
from engine.errors import (
    AutoCdcIncompleteError,
    MergeResolutionError,
    MergeServiceEngineError,
    MergeSpecError,
    SourceError,
    TableNotFoundError,
)
from engine.expression_rules import check_expression, spark_text
from engine.expressions import parse_expression
from engine.result import AppTransaction, MergeResult
from engine.source import source_dataframe
from engine.spec import DeletionVectorsMode, FrameSource, MergeSpec

UNORDERED_TYPES = (T.MapType, T.VariantType, T.BinaryType)
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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


@dataclasses.dataclass(frozen=True)
class Batch:
    """What the batch's schema settles: the kept columns, the events' SQL and their Spark types."""

    columns: Columns
    sequence: str
    delete: str | None
    truncate: str | None
    key_fields: tuple[T.StructField, ...]
    value_fields: tuple[T.StructField, ...]
    sequence_type: T.DataType

    def events(self, view: str) -> str:
        return plan.events_sql(self.columns, self.sequence, self.delete, self.truncate, view)


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
    created: list[_Created] = []
    try:
        try:
            batch = _read_batch(spark, spec, views)
            deletes, truncated = _check_events(spark, batch, views[-1])
            created, absent = _ensure_target(spec, batch, dry_run=dry_run)
            if not dry_run:
                created += _ensure_state(spec, batch)
        finally:
            _drop_views(spark, views)
        result = run_merge(
            spark, _target_merge(spec, batch, truncated, absent), txn=txn, on_progress=on_progress, dry_run=dry_run
        )
    except Exception:
        for table in reversed(created):  # the state table first: it may lie inside the target's folder
            table.remove_if_unchanged(spec.lake_roots)
        raise
    if dry_run or (spec.stored_as_scd_type == 1 and not deletes and truncated is None and not _has_tombstones(spec)):
        return result  # SCD 1 with no delete or truncate to record and no tombstone an upsert could drop
    try:
        run_merge(spark, _state_merge(spec, batch, truncated), txn=txn)
    except MergeServiceEngineError as exc:
        raise AutoCdcIncompleteError(
            f"the target took the batch (version {result.table_version}) but its state table "
            f"{spec.state} did not: {exc}"
        ) from exc
    return result


# --- the batch ---------------------------------------------------------------------------------------------------


def _read_batch(spark: SparkSession, spec: AutoCdcSpec, views: list[str]) -> Batch:
    df = source_dataframe(spark, spec.source, views, spec.lake_roots)
    columns = resolve_columns(spec, df.columns)
    name = f"__cdc_check_{uuid.uuid4().hex[:12]}"
    df.createOrReplaceTempView(name)
    views.append(name)
    types: list[T.DataType] = []
    for i, text in enumerate(spec.sequence_by):
        where = f"sequence_by[{i}]" if len(spec.sequence_by) > 1 else "sequence_by"
        dtype = _expression_type(spark, name, text, where)
        if isinstance(dtype, (UNORDERED_TYPES, T.NullType)):
            raise MergeSpecError(
                f"{where}: {text} is of type {dtype.simpleString()}, which has no order; sequence_by needs "
                "values Spark can compare (numbers, strings, dates, timestamps, or structs of them).",
                field=where,
            )
        types.append(dtype)
    for field in ("apply_as_deletes", "apply_as_truncates"):
        condition = getattr(spec, field)
        if condition is None:
            continue
        dtype = _expression_type(spark, name, condition, field)
        if not isinstance(dtype, (T.BooleanType, T.NullType)):
            raise MergeSpecError(f"{field}: the condition is of type {dtype.simpleString()}, not boolean.", field=field)
    names = tuple(text if _PLAIN_NAME.fullmatch(text) else f"sequence_{i}" for i, text in enumerate(spec.sequence_by))
    sequence = plan.sequence_sql(spec.sequence_by, names)
    schema = spark.sql(plan.events_sql(columns, sequence, spec.apply_as_deletes, spec.apply_as_truncates, name)).schema
    by_name = {f.name: f for f in schema.fields}
    unordered = frozenset(c for c in columns.values if _holds_unordered(by_name[c].dataType))
    kept_types = {c: by_name[c].dataType for c in columns.null_kept}
    structs = {c: _fields(t) for c, t in kept_types.items() if isinstance(t, T.StructType)}
    return Batch(
        columns=dataclasses.replace(columns, unordered=unordered, structs=structs),
        sequence=sequence,
        delete=spec.apply_as_deletes,
        truncate=spec.apply_as_truncates,
        key_fields=tuple(by_name[k] for k in columns.keys),
        value_fields=tuple(by_name[c] for c in columns.values),
        sequence_type=by_name[plan.SEQ].dataType,
    )


def _expression_type(spark: SparkSession, view: str, text: str, where: str) -> T.DataType:
    try:
        return spark.sql(f"SELECT ({text}) AS v FROM {delta.quote_identifier(view)}").schema.fields[0].dataType
    except PySparkException as exc:
        raise MergeResolutionError(
            f"{where}: {text} does not resolve against the source: {_first_line(exc)}", field=where
        ) from None


def _check_events(spark: SparkSession, batch: Batch, view: str) -> tuple[int, str | None]:
    """Spark's AutoCDC rules for a batch: no event without a sequence, none but a truncate without its keys (both
    would be applied in no defined order, or to no row). Answers how many events are deletes, and the newest
    truncate's sequence as a SQL literal (None without one)."""
    null_sequence = f"{plan.SEQ} IS NULL"
    if isinstance(batch.sequence_type, T.StructType):  # several columns: a null in any leaves the order undefined
        null_sequence += "".join(
            f" OR {plan.SEQ}.{delta.quote_identifier(f.name)} IS NULL" for f in batch.sequence_type.fields
        )
    counts = [f"count_if(NOT {plan.TRUNC} AND {plan.DEL})", f"count_if({null_sequence})"]
    counts += [f"count_if({delta.quote_identifier(k)} IS NULL AND NOT {plan.TRUNC})" for k in batch.columns.keys]
    newest = f"max(CASE WHEN {plan.TRUNC} THEN {plan.SEQ} END)"
    texts = _literal_parts(batch.sequence_type, newest)
    query = f"SELECT {', '.join(counts)}, {newest} IS NULL, {', '.join(texts)} FROM ({batch.events(view)})"
    row = spark.sql(query).collect()[0]
    if row[1]:
        raise SourceError(
            f"sequence_by: {row[1]} event(s) of the batch have a null sequence; every event needs one.",
            field="sequence_by",
        )
    keys = len(batch.columns.keys)
    for key, nulls in zip(batch.columns.keys, row[2 : 2 + keys], strict=True):
        if nulls:
            raise SourceError(f"keys: {nulls} event(s) of the batch have a null key {key!r}.", field="keys")
    no_truncate = row[2 + keys]
    truncated = None if no_truncate else _literal(batch.sequence_type, list(row[3 + keys :]))
    return int(row[0]), truncated


def _literal_parts(dtype: T.DataType, value: str) -> list[str]:
    """``value`` as strings Spark reads back exactly: the value itself, or each field of a struct."""
    if isinstance(dtype, T.StructType):
        return [_text(f.dataType, f"({value}).{delta.quote_identifier(f.name)}") for f in dtype.fields]
    return [_text(dtype, value)]


def _text(dtype: T.DataType, value: str) -> str:
    # Text does not CAST back to an array or a struct: those go as JSON, which from_json reads.
    return f"to_json({value})" if isinstance(dtype, (T.ArrayType, T.StructType)) else f"CAST({value} AS STRING)"


def _literal(dtype: T.DataType, parts: list[str | None]) -> str:
    """A sequence as a SQL literal for the merge's conditions, built from ``_literal_parts``."""
    if isinstance(dtype, T.StructType):
        fields = ", ".join(f"'{f.name}', {_value(f.dataType, p)}" for f, p in zip(dtype.fields, parts, strict=True))
        return f"named_struct({fields})"
    return _value(dtype, parts[0])


def _value(dtype: T.DataType, text: str | None) -> str:
    if text is None:
        return f"CAST(NULL AS {dtype.simpleString()})"
    escaped = text.replace("\\", "\\\\").replace("'", "\\'")
    if isinstance(dtype, (T.ArrayType, T.StructType)):
        return f"from_json('{escaped}', '{dtype.simpleString()}')"
    return f"CAST('{escaped}' AS {dtype.simpleString()})"


def _fields(struct: T.StructType) -> Fields:
    return {f.name: _fields(f.dataType) if isinstance(f.dataType, T.StructType) else None for f in struct.fields}


def _holds_unordered(dtype: T.DataType) -> bool:
    if isinstance(dtype, (T.MapType, T.VariantType)):
        return True
    if isinstance(dtype, T.ArrayType):
        return _holds_unordered(dtype.elementType)
    if isinstance(dtype, T.StructType):
        return any(_holds_unordered(f.dataType) for f in dtype.fields)
    return False


# --- the tables --------------------------------------------------------------------------------------------------


def _target_fields(spec: AutoCdcSpec, batch: Batch) -> list[T.StructField]:
    fields = [*batch.key_fields, *batch.value_fields, T.StructField(START_AT, batch.sequence_type, False)]
    if spec.stored_as_scd_type == 2:
        fields.append(T.StructField(END_AT, batch.sequence_type, True))
    return fields


def _ensure_target(spec: AutoCdcSpec, batch: Batch, *, dry_run: bool) -> tuple[list[_Created], frozenset[str]]:
    """The first batch creates the target (answering the table this call created); a dry run creates nothing, so
    it needs the table to exist. Also answers the batch's value columns the table lacks, which the merge adds."""
    wanted = _target_fields(spec, batch)
    try:
        snapshot = delta.load_snapshot(spec.target, lake_roots=spec.lake_roots)
    except TableNotFoundError:
        if os.path.exists(os.path.join(spec.target, "_delta_log")):
            raise
        if dry_run:
            raise TableNotFoundError(
                f"target: no Delta table at {spec.target} yet; a dry run creates nothing (the first batch that is "
                "not a dry run creates the table)."
            ) from None
        return _create(spec.target, wanted), frozenset()
    absent = _absent(snapshot, wanted)
    # A value column the table lacks is added by the merge (schema evolution); these it cannot add.
    missing = [name for name in absent if name not in batch.columns.values]
    if missing:
        raise MergeResolutionError(
            f"target: the table lacks the column(s) {', '.join(missing)} an SCD type {spec.stored_as_scd_type} "
            "AUTO CDC target keeps; add them, or let the first batch create the table.",
            field="target",
        )
    return [], frozenset(absent)


def _absent(snapshot: delta.Snapshot, fields: list[T.StructField]) -> list[str]:
    """The names of ``fields`` the table lacks (Delta's column names match case-insensitively)."""
    have = {f.name.lower() for f in snapshot.spark_schema.fields}
    return [f.name for f in fields if f.name.lower() not in have]


def _state_fields(spec: AutoCdcSpec, batch: Batch) -> list[T.StructField]:
    """SCD 1's tombstones: the keys and their newest delete; SCD 2's events: every event, values included."""
    if spec.stored_as_scd_type == 1:
        # Keys may be null: the row whose keys are all null holds the newest truncate.
        keys = [T.StructField(f.name, f.dataType, True) for f in batch.key_fields]
        return [*keys, T.StructField(DELETE_AT, batch.sequence_type, False)]
    return [
        *batch.key_fields,
        *batch.value_fields,
        T.StructField(EVENT_AT, batch.sequence_type, False),
        T.StructField(IS_DELETE, T.BooleanType(), False),
    ]


def _lacks_columns(path: str, spec: AutoCdcSpec, fields: list[T.StructField]) -> bool:
    """Whether SCD 2's events table lacks a value column the batch brings (its merge adds it)."""
    return bool(_absent(delta.load_snapshot(path, lake_roots=spec.lake_roots), fields))


def _ensure_state(spec: AutoCdcSpec, batch: Batch) -> list[_Created]:
    if os.path.isdir(os.path.join(spec.state, "_delta_log")):
        return []
    return _create(spec.state, _state_fields(spec, batch))


def _has_tombstones(spec: AutoCdcSpec) -> bool:
    """Whether the tombstones table may hold a row: its files' statistics say so without Spark."""
    snapshot = delta.load_snapshot(spec.state, lake_roots=spec.lake_roots)
    known = delta.known_num_records(snapshot.files)
    return known is None or known > 0


@dataclasses.dataclass(frozen=True)
class _Created:
    """A table a batch created, and whether its folder was there before."""

    path: str
    folder_existed: bool

    def remove_if_unchanged(self, lake_roots: tuple[str, ...]) -> None:
        """Undo the creation while the table holds only it, so a failed first batch leaves the lake as it found
        it: the folder goes if the batch made it, else only the log it wrote (never another's files). A table that
        took a commit (an outcome not known) stays."""
        with contextlib.suppress(Exception):
            if delta.load_snapshot(self.path, lake_roots=lake_roots).version == 0:
                shutil.rmtree(os.path.join(self.path, "_delta_log") if self.folder_existed else self.path)


def _create(path: str, fields: list[T.StructField]) -> list[_Created]:
    """An empty table at ``path``; none when another writer created it first (the merge reads what is there)."""
    folder_existed = os.path.exists(path)
    try:
        write_deltalake(path, pa.Table.from_batches([], schema=to_arrow_schema(T.StructType(fields))), mode="append")
    except Exception:
        if os.path.isdir(os.path.join(path, "_delta_log")):
            return []
        raise
    return [_Created(path, folder_existed)]


# --- the merges --------------------------------------------------------------------------------------------------


def _frame(spec: AutoCdcSpec, batch: Batch, sql: Callable[[plan.Views], str]) -> FrameSource:
    def build(spark: SparkSession, views: list[str]) -> DataFrame:
        suffix = uuid.uuid4().hex[:12]
        names = plan.Views(f"__cdc_batch_{suffix}", f"__cdc_target_{suffix}", f"__cdc_state_{suffix}")
        source_dataframe(spark, spec.source, views, spec.lake_roots).createOrReplaceTempView(names.batch)
        views.append(names.batch)
        _table_view(spark, spec.target, spec, names.target, _target_fields(spec, batch))
        views.append(names.target)
        _table_view(spark, spec.state, spec, names.state, _state_fields(spec, batch))
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
    evolve = spec.stored_as_scd_type == 2 and _lacks_columns(spec.state, spec, _state_fields(spec, batch))
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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
