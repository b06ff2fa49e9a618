"""An AUTO CDC batch read and checked against its spec: the columns it keeps, its events' SQL and their Spark types,
before any table is touched."""

from __future__ import annotations

import dataclasses
import re
import uuid

from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from engine import delta
from engine.auto_cdc import plan
from engine.auto_cdc.columns import Columns, Fields, resolve_columns
from engine.auto_cdc.spec import AutoCdcSpec
from engine.errors import MergeResolutionError, MergeSpecError, SourceError
from engine.source import source_dataframe

UNORDERED_TYPES = (T.MapType, T.VariantType, T.BinaryType)
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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


def read_batch(spark: SparkSession, spec: AutoCdcSpec, views: list[str]) -> Batch:
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


def check_events(spark: SparkSession, batch: Batch, view: str) -> tuple[int, str | None]:
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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
