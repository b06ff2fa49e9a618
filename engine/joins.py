"""The merge's join plans and their choice: whether the source is broadcast past the streamed target or both
sides are shuffled (Delta's own plan), and how the unmatched source rows (``source LEFT ANTI JOIN target``: the
source rows matching no target row) are found without shuffling the target."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from engine import delta
from engine.context import MergeContext
from engine.delta import AddFile
from engine.delta.internal_columns import internal_column
from engine.expressions import sql
from engine.join_keys import key_condition, qualified_column
from engine.key_bitmap import PROBE_KEY_COL, KeyBitmap
from engine.merge_condition import KeyedOn

BROADCAST_SOURCE_BYTES = 64 * 1024 * 1024
"""Sources up to this estimated size are broadcast (Spark's autoBroadcastJoinThreshold in the session)."""
BROADCAST_SIZE_RATIO = 4
"""... and only when the target rows they meet are at least this many times as many."""


MATCHED_KEYS_ALIAS = internal_column("matched_keys")


HELD_TARGET_ROWS_PER_KEY = 2
"""The target rows a key bitmap may hold per source key for them to be broadcast: in place of the semi join that
finds the unmatched source rows, and for the single pass to count its actions on."""


_TYPE_BYTES = {
    "byte": 1,
    "short": 2,
    "integer": 4,
    "long": 8,
    "float": 4,
    "double": 8,
    "boolean": 1,
    "date": 4,
    "timestamp": 8,
    "timestamp_ntz": 8,
}
_OTHER_TYPE_BYTES = 32


def _row_bytes(schema: StructType) -> int:
    """A rough row width, as Spark's size estimates have it (strings and nested values as a fixed guess)."""
    return 8 + sum(_TYPE_BYTES.get(f.dataType.typeName(), _OTHER_TYPE_BYTES) for f in schema.fields)


def source_fits_broadcast(ctx: MergeContext, rows: int | None, target_files: Sequence[AddFile]) -> bool:
    """Whether the source is worth sending whole to every task so the target's rows stream past it instead
    of being shuffled: it must be small, and much smaller than the target rows it meets (else shuffling both
    costs less than building and shipping the broadcast)."""
    if rows is None:
        return False
    target_rows = delta.known_num_records(target_files)
    if target_rows is not None and rows * BROADCAST_SIZE_RATIO > target_rows:
        return False
    return rows * _row_bytes(ctx.source.schema) <= BROADCAST_SOURCE_BYTES


def unmatched_source_rows_by_semi_join(
    source: DataFrame,
    target: DataFrame,
    on: Column,
    source_alias: str,
    target_alias: str,
    *,
    probe: DataFrame | None = None,
    bitmap: KeyBitmap | None = None,
) -> DataFrame:
    """``source LEFT ANTI JOIN target`` without shuffling the target: the target rows matching some source row
    (a semi join streaming the target past the broadcast source) are few, and a source row matches some target
    row exactly when it matches one of those. ``probe`` is the same rows as ``source`` without its
    observations (an observation may appear once in a plan); both reads must give the same rows. With a
    ``bitmap`` the semi join probes on the bitmap's probe key, and its answer is broadcast as the plan without
    the bitmap would broadcast it (the cross join with the bitmap multiplies Spark's size estimate)."""
    probe = source if probe is None else probe
    if bitmap is not None:
        target, on = bitmap.probe_keys(target), bitmap.on(target_alias, source_alias)
    matched_targets = target.alias(target_alias).join(F.broadcast(probe.alias(source_alias)), on, "left_semi")
    if bitmap is not None:
        matched_targets = F.broadcast(matched_targets)
    return source.alias(source_alias).join(matched_targets.alias(target_alias), on, "left_anti")


def unmatched_source_rows(
    ctx: MergeContext,
    source: DataFrame,
    files: Sequence[AddFile],
    bitmap: KeyBitmap | None,
    *,
    probe: DataFrame | None = None,
) -> DataFrame:
    """``source LEFT ANTI JOIN target`` over ``files``, for a source that fits a broadcast. With a bitmap that
    should hold about as few target rows as the source has keys, the held rows are the broadcast side
    (unmatched_source_rows_by_held_rows); else a semi join finds the matched ones (unmatched_source_rows_by_semi_join),
    through the bitmap when every target row's key would fit a broadcast. Either side stays bounded by that
    fit: a bitmap holds at most every target row."""
    spec = ctx.spec
    s, t = spec.source_alias, spec.target_alias
    target = ctx.target_df(files, file_columns=False)
    if bitmap is None or not _target_keys_fit_broadcast(delta.known_num_records(files)):
        return unmatched_source_rows_by_semi_join(source, target, ctx.resolved.on, s, t, probe=probe)
    if holds_few_target_rows(bitmap, files):
        return unmatched_source_rows_by_held_rows(source, target, bitmap, s, t)
    return unmatched_source_rows_by_semi_join(source, target, ctx.resolved.on, s, t, probe=probe, bitmap=bitmap)


def _target_keys_fit_broadcast(rows: int | None) -> bool:
    return rows is not None and rows * _TYPE_BYTES["long"] <= BROADCAST_SOURCE_BYTES


def holds_few_target_rows(bitmap: KeyBitmap, files: Sequence[AddFile]) -> bool:
    """Whether the target rows of ``files`` that the bitmap holds may be broadcast: about as few as the source
    has keys, and bounded even were every row held."""
    rows = delta.known_num_records(files)
    return (
        rows is not None
        and _target_keys_fit_broadcast(rows)
        and rows * bitmap.held_fraction <= HELD_TARGET_ROWS_PER_KEY * bitmap.keys
    )


def unmatched_source_rows_by_held_rows(
    source: DataFrame, target: DataFrame, bitmap: KeyBitmap, source_alias: str, target_alias: str
) -> DataFrame:
    """``source LEFT ANTI JOIN target`` through the source's key bitmap: a target row whose bit is clear
    matches no source row, so the rows the bitmap holds (the matches, and the keys sharing their bits) stand
    for the whole target. They are few enough to broadcast, and reading them waits for no other broadcast, so
    they are ready as soon as the source's own broadcast is."""
    held = bitmap.probe_keys(target).where(F.col(PROBE_KEY_COL).isNotNull())
    return source.alias(source_alias).join(
        F.broadcast(held.alias(target_alias)), bitmap.on(target_alias, source_alias), "left_anti"
    )


def unmatched_source_rows_by_matched_keys(
    source: DataFrame, matched: DataFrame, keyed: KeyedOn, source_alias: str
) -> DataFrame:
    """``source LEFT ANTI JOIN target`` from the keys findTouchedFiles saw matched: a source row matches
    some target row exactly when its key is among them and it passes ON's source-only conjuncts. The keys are
    broadcast (they are fewer than the source rows, which the plans that call this broadcast), so the source
    streams past them instead of being shuffled to meet them."""
    names = [internal_column(f"key_{i}") for i in range(len(keyed.keys))]
    condition = key_condition(
        keyed,
        [qualified_column(source_alias, k.source_column) for k in keyed.keys],
        [qualified_column(MATCHED_KEYS_ALIAS, n) for n in names],
    )
    for predicate in keyed.source_only:
        condition = condition & F.expr(sql(predicate))
    keys = F.broadcast(matched.select(*names).alias(MATCHED_KEYS_ALIAS))
    return source.alias(source_alias).join(keys, condition, "left_anti")


def broadcast_full_outer(
    ctx: MergeContext,
    source: DataFrame,
    target: DataFrame,
    unmatched: DataFrame,
    bitmap: KeyBitmap | None = None,
    *,
    keep_unmatched_target: bool = True,
) -> DataFrame:
    """``source FULL OUTER JOIN target`` as the target's broadcast left outer join with the source, united
    with ``unmatched``: the unmatched source rows, with the source's columns. Without ``keep_unmatched_target``
    it is ``source LEFT OUTER JOIN target`` (the target's join with the source is inner), still streaming the
    target past the broadcast source."""
    with_source, target_fields = broadcast_join_target(
        ctx, source, target, bitmap, keep_unmatched_target=keep_unmatched_target
    )
    return union_unmatched_source_rows(with_source, target_fields, source, unmatched, ctx.spec.source_alias)


def broadcast_join_target(
    ctx: MergeContext,
    source: DataFrame,
    target: DataFrame,
    bitmap: KeyBitmap | None = None,
    *,
    keep_unmatched_target: bool = True,
) -> tuple[DataFrame, list[StructField]]:
    """The target streamed past the broadcast source (left outer, or inner without ``keep_unmatched_target``), and
    the fields of the join's target side."""
    spec = ctx.spec
    on = ctx.resolved.on
    if bitmap is not None:
        target, on = bitmap.probe_keys(target), bitmap.on(spec.target_alias, spec.source_alias)
    how = "left_outer" if keep_unmatched_target else "inner"
    with_source = target.alias(spec.target_alias).join(F.broadcast(source.alias(spec.source_alias)), on, how)
    return with_source, list(target.schema.fields)


def union_unmatched_source_rows(
    with_source: DataFrame,
    target_fields: list[StructField],
    source: DataFrame,
    unmatched: DataFrame,
    source_alias: str,
) -> DataFrame:
    """``with_source`` (the target's side, then the source's) united with the ``unmatched`` source rows."""
    padded = unmatched.select(
        *[F.lit(None).cast(f.dataType).alias(f.name) for f in target_fields],
        *[F.col(qualified_column(source_alias, f.name)) for f in source.schema.fields],
    )
    # Union is by position and keeps the first side's columns, qualifiers included.
    return with_source.union(padded)
