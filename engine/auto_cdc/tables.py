"""The tables an AUTO CDC batch keeps: the target and the state table, their columns, and their creation by the first
batch (undone when that batch fails)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil

import pyarrow as pa
from deltalake import write_deltalake
from pyspark.sql import types as T

from engine import delta
from engine.auto_cdc.batch import Batch
from engine.auto_cdc.spec import DELETE_AT, END_AT, EVENT_AT, IS_DELETE, START_AT, AutoCdcSpec
from engine.delta.values import to_arrow_schema
from engine.errors import MergeResolutionError, TableNotFoundError


def target_fields(spec: AutoCdcSpec, batch: Batch) -> list[T.StructField]:
    fields = [*batch.key_fields, *batch.value_fields, T.StructField(START_AT, batch.sequence_type, False)]
    if spec.stored_as_scd_type == 2:
        fields.append(T.StructField(END_AT, batch.sequence_type, True))
    return fields


def ensure_target(spec: AutoCdcSpec, batch: Batch, *, dry_run: bool) -> tuple[list[Created], frozenset[str]]:
    """The first batch creates the target (answering the table this call created); a dry run creates nothing, so
    it needs the table to exist. Also answers the batch's value columns the table lacks, which the merge adds."""
    wanted = target_fields(spec, batch)
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


def state_fields(spec: AutoCdcSpec, batch: Batch) -> list[T.StructField]:
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


def lacks_columns(path: str, spec: AutoCdcSpec, fields: list[T.StructField]) -> bool:
    """Whether SCD 2's events table lacks a value column the batch brings (its merge adds it)."""
    return bool(_absent(delta.load_snapshot(path, lake_roots=spec.lake_roots), fields))


def ensure_state(spec: AutoCdcSpec, batch: Batch) -> list[Created]:
    if os.path.isdir(os.path.join(spec.state, "_delta_log")):
        return []
    return _create(spec.state, state_fields(spec, batch))


def has_tombstones(spec: AutoCdcSpec) -> bool:
    """Whether the tombstones table may hold a row: its files' statistics say so without Spark."""
    snapshot = delta.load_snapshot(spec.state, lake_roots=spec.lake_roots)
    known = delta.known_num_records(snapshot.files)
    return known is None or known > 0


@dataclasses.dataclass(frozen=True)
class Created:
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


def _create(path: str, fields: list[T.StructField]) -> list[Created]:
    """An empty table at ``path``; none when another writer created it first (the merge reads what is there)."""
    folder_existed = os.path.exists(path)
    try:
        write_deltalake(path, pa.Table.from_batches([], schema=to_arrow_schema(T.StructType(fields))), mode="append")
    except Exception:
        if os.path.isdir(os.path.join(path, "_delta_log")):
            return []
        raise
    return [Created(path, folder_existed)]
