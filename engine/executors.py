"""Delta's two merge executors over Spark Connect.

ClassicMergeExecutor: ``find_touched_files`` joins the data-skipped target with the source once, collecting
the touched files and the per-target-row match counts (the multiple-match check) in one Spark job: by target
row as Delta does, or, when ON pins each target row to one source key, with the source grouped by key and
broadcast so that no target row is shuffled; ``write_all_changes`` rewrites only those files, joined with the
source, through MergeOutputGeneration. When the key statistics say every candidate file will be touched,
``write_in_one_pass`` skips the first pass: it rewrites every candidate and observes the touched files and
the rows the join gave each target row as it writes, keeping the result only if the guess held. A large
broadcast source with one integer key also goes out as a bitmap of its keys (KeyBitmap), so that the target
rows it cannot hold skip the probe into a hash table larger than the CPU caches.
InsertOnlyMergeExecutor: a left-anti join of the source against the target, appended; no file rewritten.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StructType,
)

from engine import delta
from engine.errors import MergeExecutionError, MultipleMatchError
from engine.expressions import KeyedOn, Sides, keyed_on, quote_identifier, sql
from engine.output import (
    ACTION_COL,
    CDC_TYPE_COL,
    CDC_TYPE_INSERT,
    COPY,
    DROP_SOURCE,
    INSERT,
    MATCHED_DELETE,
    MATCHED_UPDATE,
    NOT_MATCHED_BY_SOURCE_DELETE,
    NOT_MATCHED_BY_SOURCE_UPDATE,
    ROW_DROPPED_COL,
    SOURCE_ROW_INDEX_COL,
    SOURCE_ROW_PRESENT_COL,
    TARGET_ROW_INDEX_COL,
    TARGET_ROW_PRESENT_COL,
    action,
    action_counts,
    generate_cdc_and_output_rows,
    generate_inserts_only_output_cols,
    generate_precomputed_conditions_and_df,
    generate_write_all_changes_output_cols,
    preimage_names,
    target_write_cols,
)
from engine.resolution import ResolvedMerge
from engine.spark import Observation
from engine.spec import DeleteAction, MergeSpec

MULTIPLE_MATCH_EXAMPLES = 5
BROADCAST_SOURCE_BYTES = 64 * 1024 * 1024
"""Sources up to this estimated size are broadcast (Spark's autoBroadcastJoinThreshold in the session)."""
BROADCAST_SIZE_RATIO = 4
"""... and only when the target rows they meet are at least this many times as many."""
ONE_TASK_GROUPING_ROWS = 1_000_000
"""Sources known to have at most this many rows are grouped by key in one task."""
SOURCE_KEY_ROWS_COL = "_source_rows_with_key_"
MATCHED_KEYS_ALIAS = "_matched_keys_"
SINGLE_PASS_MIN_MATCHES_PER_FILE = 16
"""The single pass is taken when every candidate file is expected to hold at least this many matched rows
(source keys in its key range times the share of that range its rows fill): with random keys the chance that
such a file has none is below e**-16."""
TOUCHED_FILE_COL = "_touched_file_"
KEY_BITMAP_MIN_SOURCE_ROWS = 100_000
"""Sources of at least this many rows get a bitmap of their join keys: their broadcast hash table outgrows the
CPU caches, and each target row's probe into it costs a cache miss, most of them for keys it does not hold. (The
single pass with NOT MATCHED clauses takes one whatever the source's size, to count on the rows it holds.)"""
KEY_BITMAP_BITS_PER_KEY = 16
KEY_BITMAP_MAX_BITS = 1 << 24
"""2 MiB: the bitmap must stay cache-sized to be worth testing before the probe."""
KEY_BITMAP_COL = "_source_keys_bitmap_"
HELD_TARGET_ROWS_PER_KEY = 2
"""The target rows a key bitmap may hold per source key for them to be broadcast: in place of the semi join that
finds the source rows matching none, and for the single pass to count its actions on."""
PROBE_KEY_COL = "_probe_key_"
FILE_HASH_COL = "_file_hash_"
TARGET_SIDE_ACTIONS = (COPY, MATCHED_UPDATE, MATCHED_DELETE, NOT_MATCHED_BY_SOURCE_UPDATE, NOT_MATCHED_BY_SOURCE_DELETE)
"""The actions a row of the target takes: one each."""


@dataclass
class MergeContext:
    """What both executors need: the session, the spec resolved against the snapshot, and the source."""

    spark: SparkSession
    spec: MergeSpec
    snapshot: Any  # engine.delta.Snapshot
    resolved: ResolvedMerge
    source: DataFrame
    candidate_files: Sequence[Any]
    """Live files left after data skipping."""
    write_id: str
    """The folder of the merge's data files, under the table root."""
    metrics: dict[str, int]
    cdc_enabled: bool = False
    deduplicate_cdf_deletes: bool = False
    """Set by findTouchedFiles: several source rows matched one target row under the delete-only exemption."""
    key_exprs: Sequence[str] = ()
    """Source-side expressions of the ON equalities, to name colliding keys in the multiple-match error."""
    touched_files: list[Any] = field(default_factory=list)
    source_rows_estimate: int | None = None
    """Source rows known before any Spark job (inline rows, a Delta source's statistics); None if unknown."""
    matched_source_keys: tuple[DataFrame, KeyedOn] | None = None
    """The source keys some target row matched (cached by findTouchedFiles), as ``_key_<i>_`` columns."""
    source_key_ranges: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    """The source's (min, max) for ON's key equalities, by target column (lower case), where data skipping
    computed them."""
    touched_files_known: bool = False
    """The single pass found the touched files (and no multiple match) but had to give up its write."""
    key_bitmap: KeyBitmap | None = None

    @property
    def output_names(self) -> list[str]:
        return [f.name for f in self.resolved.output_fields]

    def target_df(self, files: Sequence[Any], *, file_columns: bool = True) -> DataFrame:
        return delta.scan_files(self.spark, self.snapshot, files, file_columns=file_columns)

    def release(self) -> None:
        """Free what the merge cached on the Spark server."""
        if self.matched_source_keys is not None:
            self.matched_source_keys[0].unpersist()
            self.matched_source_keys = None


def _source_with_count(ctx: MergeContext, obs: Observation) -> DataFrame:
    return ctx.source.observe(obs, F.count(F.lit(1)).alias("numSourceRows"))


def _observed_source_rows(ctx: MergeContext, obs: Observation) -> int:
    """The source rows ``obs`` counted. Spark folds an ON with a NULL conjunct to false and prunes the join's
    source side, its observation with it: the source is then counted on its own."""
    observed = obs.get
    return int(observed.get("numSourceRows") or 0) if observed else ctx.source.count()


def _touches_every_match(spec: MergeSpec) -> bool:
    """Whether every match touches its file: the write reads every matched row when the merge has more than
    MATCHED clauses, and a MATCHED clause without condition acts on every match."""
    return not spec.is_matched_only or any(c.condition is None for c in spec.matched)


INTEGRAL_TYPES = (ByteType, ShortType, IntegerType, LongType)


def _same_key_values(source: DataType | None, target: DataType | None) -> bool:
    """Whether distinct source key values stay distinct when compared with the target column."""
    if source is None or target is None:
        return False
    if isinstance(source, INTEGRAL_TYPES) and isinstance(target, INTEGRAL_TYPES):
        return True
    return source == target and not isinstance(source, (StructType, ArrayType, MapType))


def _key_condition(keyed: KeyedOn, left: Sequence[str], right: Sequence[str]) -> Column:
    """ON's key equalities, each between ``left[i]`` and ``right[i]`` (qualified names) with its key's
    null-safety."""
    condition: Column | None = None
    for key, left_name, right_name in zip(keyed.keys, left, right, strict=True):
        left_col, right_col = F.col(left_name), F.col(right_name)
        equal = left_col.eqNullSafe(right_col) if key.null_safe else left_col == right_col
        condition = equal if condition is None else condition & equal
    assert condition is not None
    return condition


def _qualified(alias: str, name: str) -> str:
    return f"{quote_identifier(alias)}.{quote_identifier(name)}"


@dataclass(frozen=True)
class KeyBitmap:
    """A bitmap of the source's values of ON's one integer key, bit ``key & (bits - 1)``, as a one-row DataFrame
    to broadcast beside the target scan. A target row whose bit is clear matches no source row, so it joins on a
    NULL probe key and skips the hash probe; a set bit (a source key, or another one sharing its bit) probes as
    before. The answer of the join is the same; only the cache misses go."""

    frame: DataFrame
    bits: int
    keyed: KeyedOn
    keys: int
    """The source's non-NULL keys."""
    held_fraction: float
    """The share of bits set: about the share of target rows the bitmap holds, were the target's keys spread
    evenly over the bits."""

    def probe_keys(self, target: DataFrame) -> DataFrame:
        """``target`` with PROBE_KEY_COL: its key where the bitmap may hold it, else NULL."""
        column = F.col(quote_identifier(self.keyed.keys[0].target_column))
        position = column.cast("long").bitwiseAND(F.lit(self.bits - 1))
        word = F.element_at(F.col(KEY_BITMAP_COL), F.shiftright(position, 6).cast("int") + 1)
        held = F.shiftright(word, position.bitwiseAND(F.lit(63)).cast("int")).bitwiseAND(F.lit(1)) == 1
        return (
            target.crossJoin(F.broadcast(self.frame))
            .withColumn(PROBE_KEY_COL, F.when(held, column))
            .drop(KEY_BITMAP_COL)
        )

    def on(self, target_alias: str, source_alias: str) -> Column:
        """ON with the probe key in place of the target's key column."""
        condition = _key_condition(
            self.keyed,
            [_qualified(target_alias, PROBE_KEY_COL)],
            [_qualified(source_alias, self.keyed.keys[0].source_column)],
        )
        for predicate in (*self.keyed.target_only, *self.keyed.source_only):
            condition = condition & F.expr(sql(predicate))
        return condition


def key_bitmap_of(spark: SparkSession, source: DataFrame, keyed: KeyedOn, target_rows: int = 0) -> KeyBitmap:
    """The bitmap of the source's non-NULL key values, built here from the keys Spark hands over as Arrow. It
    has at least as many bits as the target has rows, so that the target keys sharing a bit with a source key
    number at most about as many as the source's keys."""
    key = keyed.keys[0]
    keys = (
        source.select(F.col(quote_identifier(key.source_column)).cast("long").alias("k"))
        .where(F.col("k").isNotNull())
        .toArrow()
        .column(0)
        .to_numpy()
    )
    bits = 1 << 16
    while bits < max(len(keys) * KEY_BITMAP_BITS_PER_KEY, target_rows) and bits < KEY_BITMAP_MAX_BITS:
        bits <<= 1
    positions = keys.astype(np.int64) & (bits - 1)
    words = np.zeros(bits // 64, dtype=np.uint64)
    np.bitwise_or.at(words, positions >> 6, np.left_shift(np.uint64(1), (positions & 63).astype(np.uint64)))
    frame = spark.createDataFrame(pa.table({KEY_BITMAP_COL: pa.array([words.view(np.int64)], pa.list_(pa.int64()))}))
    return KeyBitmap(frame, bits, keyed, len(keys), int(np.bitwise_count(words).sum()) / bits)


def _observe_touched(rows: DataFrame, touched: Column, matches: Column) -> dict[str, Any]:
    """Touched files and multiple-match counts, observed as ``rows`` stream past in one Spark job."""
    obs = Observation("findTouchedFiles")
    rows.observe(
        obs,
        F.collect_set(F.when(touched, F.col(delta.FILE_NAME_COL))).alias("touched"),
        F.count_if(matches > 1).alias("multiple_match_rows"),
        F.sum(F.when(matches > 1, matches).otherwise(0)).alias("multiple_match_sum"),
    ).write.format("noop").mode("overwrite").save()
    found = obs.get
    if not found:
        raise MergeExecutionError("Spark did not report which files the merge touches; nothing was committed.")
    return found


def _is_only_one_unconditional_delete(spec: MergeSpec) -> bool:
    only = spec.matched[0] if len(spec.matched) == 1 else None
    return only is not None and isinstance(only.action, DeleteAction) and only.condition is None


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


def source_fits_broadcast(ctx: MergeContext, rows: int | None, target_files: Sequence[Any]) -> bool:
    """Whether the source is worth sending whole to every task so the target's rows stream past it instead
    of being shuffled: it must be small, and much smaller than the target rows it meets (else shuffling both
    costs less than building and shipping the broadcast)."""
    if rows is None:
        return False
    target_rows = delta.known_num_records(target_files)
    if target_rows is not None and rows * BROADCAST_SIZE_RATIO > target_rows:
        return False
    return rows * _row_bytes(ctx.source.schema) <= BROADCAST_SOURCE_BYTES


def source_rows_matching_none(
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


def keyed_join(ctx: MergeContext) -> KeyedOn | None:
    """ON's key equalities when every distinct source key tuple is one value to the target: the two columns
    have one type (or both are integers), so no two distinct source keys can equal the same target value."""
    spec = ctx.spec
    target_types = {f.name.lower(): f.dataType for f in ctx.snapshot.spark_schema.fields}
    source_types = {f.name.lower(): f.dataType for f in ctx.source.schema.fields}
    sides = Sides(spec.target_alias, spec.source_alias, frozenset(target_types), frozenset(source_types))
    keyed = keyed_on(spec.on, sides)
    if keyed is None:
        return None
    for key in keyed.keys:
        target_type = target_types.get(key.target_column.lower())
        source_type = source_types.get(key.source_column.lower())
        if not _same_key_values(source_type, target_type):
            return None
    return keyed


def one_integer_key(ctx: MergeContext) -> KeyedOn | None:
    """ON as one equality of integer columns (plus conjuncts over one side), else None. keyed_join already
    holds the source's key to integers when the target's is one."""
    keyed = keyed_join(ctx)
    if keyed is None or len(keyed.keys) != 1:
        return None
    target_type = next(
        (f.dataType for f in ctx.snapshot.spark_schema.fields if f.name.lower() == keyed.keys[0].target_column.lower()),
        None,
    )
    return keyed if isinstance(target_type, INTEGRAL_TYPES) else None


def key_bitmap(ctx: MergeContext, source_rows: int | None, *, any_size: bool = False) -> KeyBitmap | None:
    """The source's key bitmap (built once) when ON is one equality of integer columns (plus conjuncts over one
    side) and the broadcast source is large, or of ``any_size`` (the single pass counts its actions on the
    target rows the bitmap holds whatever the source's size); else None."""
    if ctx.key_bitmap is not None:
        return ctx.key_bitmap
    if source_rows is None or (source_rows < KEY_BITMAP_MIN_SOURCE_ROWS and not any_size):
        return None
    keyed = one_integer_key(ctx)
    if keyed is None or keyed.keys[0].null_safe:
        return None
    ctx.key_bitmap = key_bitmap_of(ctx.spark, ctx.source, keyed, delta.known_num_records(ctx.candidate_files) or 0)
    return ctx.key_bitmap


def unmatched_source_rows(
    ctx: MergeContext,
    source: DataFrame,
    files: Sequence[Any],
    bitmap: KeyBitmap | None,
    *,
    probe: DataFrame | None = None,
) -> DataFrame:
    """``source LEFT ANTI JOIN target`` over ``files``, for a source that fits a broadcast. With a bitmap that
    should hold about as few target rows as the source has keys, the held rows are the broadcast side
    (source_rows_matching_no_held_key); else a semi join finds the matched ones (source_rows_matching_none),
    through the bitmap when every target row's key would fit a broadcast. Either side stays bounded by that
    fit: a bitmap holds at most every target row."""
    spec = ctx.spec
    s, t = spec.source_alias, spec.target_alias
    target = ctx.target_df(files, file_columns=False)
    if bitmap is None or not _target_keys_fit_broadcast(delta.known_num_records(files)):
        return source_rows_matching_none(source, target, ctx.resolved.on, s, t, probe=probe)
    if holds_few_target_rows(bitmap, files):
        return source_rows_matching_no_held_key(source, target, bitmap, s, t)
    return source_rows_matching_none(source, target, ctx.resolved.on, s, t, probe=probe, bitmap=bitmap)


def _target_keys_fit_broadcast(rows: int | None) -> bool:
    return rows is not None and rows * _TYPE_BYTES["long"] <= BROADCAST_SOURCE_BYTES


def holds_few_target_rows(bitmap: KeyBitmap, files: Sequence[Any]) -> bool:
    """Whether the target rows of ``files`` that the bitmap holds may be broadcast: about as few as the source
    has keys, and bounded even were every row held."""
    rows = delta.known_num_records(files)
    return (
        rows is not None
        and _target_keys_fit_broadcast(rows)
        and rows * bitmap.held_fraction <= HELD_TARGET_ROWS_PER_KEY * bitmap.keys
    )


def source_rows_matching_no_held_key(
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


def source_rows_matching_no_key(source: DataFrame, matched: DataFrame, keyed: KeyedOn, source_alias: str) -> DataFrame:
    """``source LEFT ANTI JOIN target`` from the keys findTouchedFiles saw matched: a source row matches
    some target row exactly when its key is among them and it passes ON's source-only conjuncts."""
    names = [f"_key_{i}_" for i in range(len(keyed.keys))]
    condition = _key_condition(
        keyed,
        [_qualified(source_alias, k.source_column) for k in keyed.keys],
        [_qualified(MATCHED_KEYS_ALIAS, n) for n in names],
    )
    for predicate in keyed.source_only:
        condition = condition & F.expr(sql(predicate))
    return source.alias(source_alias).join(matched.select(*names).alias(MATCHED_KEYS_ALIAS), condition, "left_anti")


class ClassicMergeExecutor:
    def __init__(self, ctx: MergeContext) -> None:
        self.ctx = ctx

    def find_touched_files(self) -> list[Any]:
        """Files with a match that some clause may act on; fails on ambiguous multiple matches."""
        ctx = self.ctx
        spec = ctx.spec
        start = time.monotonic()
        if not ctx.candidate_files:
            ctx.metrics["numSourceRows"] = ctx.source.count()
            ctx.metrics["scanTimeMs"] = int((time.monotonic() - start) * 1000)
            return []
        obs = Observation("numSourceRows")
        source = _source_with_count(ctx, obs)
        keyed = keyed_join(ctx) if _touches_every_match(spec) else None
        found = self._find_by_target_rows(source) if keyed is None else self._find_by_source_keys(source, keyed)
        ctx.metrics["numSourceRows"] = _observed_source_rows(ctx, obs)
        multiple_match_count = int(found.get("multiple_match_rows") or 0)
        multiple_match_sum = int(found.get("multiple_match_sum") or 0)
        if multiple_match_count > 0:
            if not _is_only_one_unconditional_delete(spec):
                raise MultipleMatchError(self._multiple_match_message(self._matches()))
            # Each extra match deletes the same row again: Delta subtracts the overcount from the metrics.
            ctx.metrics["_multipleMatchDeleteOnlyOvercount"] = multiple_match_sum - multiple_match_count
            ctx.deduplicate_cdf_deletes = ctx.cdc_enabled
        if spec.not_matched_by_source:
            touched_names = {f.path for f in ctx.candidate_files}
        else:
            touched_names = set(found.get("touched") or [])
        ctx.touched_files = [f for f in ctx.candidate_files if f.path in touched_names]
        ctx.metrics["scanTimeMs"] = int((time.monotonic() - start) * 1000)
        return ctx.touched_files

    def _matches(self, source: DataFrame | None = None) -> DataFrame:
        """Every (source row, candidate target row) pair ON matches."""
        ctx = self.ctx
        spec = ctx.spec
        source = ctx.source if source is None else source
        target = ctx.target_df(ctx.candidate_files)
        return source.alias(spec.source_alias).join(target.alias(spec.target_alias), ctx.resolved.on, "inner")

    def _find_by_target_rows(self, source: DataFrame) -> dict[str, Any]:
        """Delta's findTouchedFiles: the matches counted per target row (file, row index)."""
        ctx = self.ctx
        spec = ctx.spec
        joined = self._matches(source.withColumn(SOURCE_ROW_PRESENT_COL, F.lit(True)))
        if spec.is_matched_only:
            conditions = [c.condition for c in ctx.resolved.matched]
            matched_predicate: Column = F.lit(True)
            if all(c is not None for c in conditions):
                matched_predicate = conditions[0]  # type: ignore[assignment]
                for c in conditions[1:]:
                    matched_predicate = matched_predicate | c  # type: ignore[operator]
            touch = F.when(matched_predicate, 1).otherwise(0)
        else:
            touch = F.lit(1)
        per_row = joined.groupBy(delta.FILE_NAME_COL, delta.ROW_INDEX_COL).agg(
            F.count(F.lit(1)).alias("matches"), F.max(touch).alias("touch")
        )
        # One shuffle: the per-file answers are observed as the per-row counts stream past, not aggregated again.
        return _observe_touched(per_row, F.col("touch") == 1, F.col("matches"))

    def _find_by_source_keys(self, source: DataFrame, keyed: KeyedOn) -> dict[str, Any]:
        """findTouchedFiles without shuffling the target: the source is grouped by its join keys (rows that
        no target row can match left out) and broadcast; each target row meets at most one group, whose row
        count is that row's number of matches. The matched keys are kept for writeAllChanges when it will need
        the source rows that match nothing."""
        ctx = self.ctx
        spec = ctx.spec
        s, t = spec.source_alias, spec.target_alias
        groups = self._grouped_by_key(source, keyed).agg(F.count(F.lit(1)).alias(SOURCE_KEY_ROWS_COL))
        condition = _key_condition(
            keyed,
            [_qualified(t, k.target_column) for k in keyed.keys],
            [_qualified(s, k.source_column) for k in keyed.keys],
        )
        for predicate in keyed.target_only:
            condition = condition & F.expr(sql(predicate))
        target = ctx.target_df(ctx.candidate_files).alias(t)
        matched = target.join(F.broadcast(groups.alias(s)), condition, "inner").select(
            F.col(_qualified(t, delta.FILE_NAME_COL)).alias(delta.FILE_NAME_COL),
            F.col(SOURCE_KEY_ROWS_COL),
            *[F.col(_qualified(s, k.source_column)).alias(f"_key_{i}_") for i, k in enumerate(keyed.keys)],
        )
        if spec.not_matched and self._may_broadcast_source():
            matched = matched.persist()
            ctx.matched_source_keys = (matched, keyed)
        return _observe_touched(matched, F.lit(True), F.col(SOURCE_KEY_ROWS_COL))

    def _grouped_by_key(self, source: DataFrame, keyed: KeyedOn) -> Any:
        """The source rows some target row may match (those failing a source-only conjunct of ON or holding a
        NULL ``=`` key left out), grouped by their join keys."""
        ctx = self.ctx
        keyable = source.alias(ctx.spec.source_alias)
        for predicate in keyed.source_only:
            keyable = keyable.where(F.expr(sql(predicate)))
        for key in keyed.keys:
            if not key.null_safe:
                keyable = keyable.where(F.col(quote_identifier(key.source_column)).isNotNull())
        key_columns = list({k.source_column.lower(): k.source_column for k in keyed.keys}.values())
        estimate = ctx.source_rows_estimate
        if estimate is not None and estimate <= ONE_TASK_GROUPING_ROWS:
            # One input partition needs no shuffle before the aggregation: a stage and a Spark job fewer.
            keyable = keyable.coalesce(1)
        return keyable.groupBy(*[F.col(quote_identifier(c)) for c in key_columns])

    def _may_broadcast_source(self) -> bool:
        """Whether writeAllChanges may take the broadcast plan, as far as is known before the source is read."""
        ctx = self.ctx
        estimate = ctx.source_rows_estimate
        return estimate is None or source_fits_broadcast(ctx, estimate, ctx.candidate_files)

    def _multiple_match_message(self, joined: DataFrame) -> str:
        ctx = self.ctx
        base = (
            "Cannot perform Merge as multiple source rows matched and attempted to modify the same target row "
            "in the Delta table in possibly conflicting ways. By SQL semantics of Merge, when multiple source "
            "rows match on the same target row, the result may be ambiguous as it is unclear which source row "
            "should be used to update or delete the matching target row. You can preprocess the source table "
            "to eliminate the possibility of multiple matches."
        )
        exprs = list(ctx.key_exprs)
        if not exprs:
            return base
        key = F.struct(*[F.expr(e).alias(e) for e in exprs])
        examples = (
            joined.groupBy(delta.FILE_NAME_COL, delta.ROW_INDEX_COL)
            .agg(F.count(F.lit(1)).alias("n"), F.first(key).alias("key"))
            .where(F.col("n") > 1)
            # Rendered by Spark (timestamps in the session's UTC): Spark Connect would hand TIMESTAMP values
            # over as naive datetimes in this process's time zone.
            .select(F.to_json("key").alias("key"), "n")
            .limit(MULTIPLE_MATCH_EXAMPLES)
            .collect()
        )
        described = []
        for row in examples:
            key_values = json.loads(row["key"])
            values = ", ".join(f"{name}={json.dumps(key_values.get(name))}" for name in exprs)
            described.append(f"({values}) matched {row['n']} source rows")
        return base + " Duplicate source keys: " + "; ".join(described) + "."

    def _join_for_write(self, source: DataFrame, counted: DataFrame, target: DataFrame) -> DataFrame:
        """The touched target rows with their matching source rows (right outer for matched-only merges), plus
        the source rows matching none (full outer). When the source fits a broadcast the full outer join is a
        broadcast left outer join of the target, united with the unmatched source rows: the target's rows are
        streamed once instead of shuffled. ``counted`` is ``source`` observed, read where every source row
        streams past once."""
        ctx = self.ctx
        spec = ctx.spec
        s, t, on = spec.source_alias, spec.target_alias, ctx.resolved.on
        if spec.is_matched_only:
            return counted.alias(s).join(target.alias(t), on, "right_outer")
        if not source_fits_broadcast(ctx, ctx.metrics.get("numSourceRows"), ctx.touched_files):
            return counted.alias(s).join(target.alias(t), on, "full_outer")
        bitmap = key_bitmap(ctx, ctx.metrics.get("numSourceRows"))
        if ctx.matched_source_keys is not None:
            matched, keyed = ctx.matched_source_keys
            unmatched = source_rows_matching_no_key(counted, matched, keyed, s)
        else:
            unmatched = unmatched_source_rows(ctx, counted, ctx.touched_files, bitmap, probe=source)
        return self._broadcast_full_outer(source, target, unmatched, bitmap)

    def _broadcast_full_outer(
        self, source: DataFrame, target: DataFrame, unmatched: DataFrame, bitmap: KeyBitmap | None = None
    ) -> DataFrame:
        """``source FULL OUTER JOIN target`` as the target's broadcast left outer join with the source, united
        with ``unmatched``: the source rows matching no target row, with the source's columns."""
        spec = self.ctx.spec
        s = spec.source_alias
        on = self.ctx.resolved.on
        if bitmap is not None:
            target, on = bitmap.probe_keys(target), bitmap.on(spec.target_alias, s)
        with_source = target.alias(spec.target_alias).join(F.broadcast(source.alias(s)), on, "left_outer")
        padded = unmatched.select(
            *[F.lit(None).cast(f.dataType).alias(f.name) for f in target.schema.fields],
            *[F.col(_qualified(s, f.name)) for f in source.schema.fields],
        )
        # Union is by position and keeps the first side's columns, qualifiers included.
        return with_source.union(padded)

    def takes_single_pass(self) -> bool:
        """Whether findTouchedFiles can be folded into writeAllChanges. Every candidate needs a row count in its
        statistics (the multiple-match check). With NOT MATCHED BY SOURCE clauses every candidate file is
        touched, as Delta rewrites them all, so nothing else is guessed. Otherwise ON must be one integer key
        equality (plus source-only conjuncts), every match must touch its file, and the key statistics must
        expect every candidate file to be touched."""
        ctx = self.ctx
        spec = ctx.spec
        if not ctx.candidate_files or delta.known_num_records(ctx.candidate_files) is None:
            return False
        if spec.not_matched_by_source:
            return True
        if ctx.source_rows_estimate is None or not _touches_every_match(spec):
            return False
        keyed = one_integer_key(self.ctx)
        return keyed is not None and not keyed.target_only and self._expects_every_candidate_touched(keyed)

    def _expects_every_candidate_touched(self, keyed: KeyedOn) -> bool:
        """Whether each candidate file should hold SINGLE_PASS_MIN_MATCHES_PER_FILE matched rows, taking the
        source's keys as spread evenly over their range and a file's keys over its statistics' range."""
        ctx = self.ctx
        column = keyed.keys[0].target_column
        source_range = ctx.source_key_ranges.get(column.lower())
        rows = ctx.source_rows_estimate
        if source_range is None or rows is None or None in source_range:
            return False
        low, high = (int(v) for v in source_range)
        for f in ctx.candidate_files:
            st = f.stats
            if st is None or not st.num_records:
                return False
            file_low, file_high = st.value("min_values", [column]), st.value("max_values", [column])
            if not isinstance(file_low, int) or not isinstance(file_high, int):
                return False
            overlap = min(high, file_high) - max(low, file_low) + 1
            if overlap <= 0:
                return False
            keys_in_range = rows * overlap / (high - low + 1)
            filled = min(1.0, st.num_records / (file_high - file_low + 1))
            if keys_in_range * filled < SINGLE_PASS_MIN_MATCHES_PER_FILE:
                return False
        return True

    def write_in_one_pass(self) -> tuple[list[Any], list[Any]] | None:
        """findTouchedFiles folded into writeAllChanges: every candidate file is rewritten, joined with the
        source as writeAllChanges joins it, while the touched files are observed. A target row matched more
        than once comes out of the join more than once, so the multiple-match check is the join's target rows
        against the rows the statistics count. The write is kept only when every candidate was touched and no
        target row matched twice; else it is discarded and None answered, with ``touched_files`` set when they
        are known (no multiple match), for writeAllChanges to rewrite only those."""
        ctx = self.ctx
        spec = ctx.spec
        s, t, on = spec.source_alias, spec.target_alias, ctx.resolved.on
        start = time.monotonic()
        obs_source = Observation("numSourceRows")
        observed_source = _source_with_count(ctx, obs_source).withColumn(SOURCE_ROW_PRESENT_COL, F.lit(True))
        # NOT MATCHED BY SOURCE clauses touch every candidate: only a guess needs the touched files observed,
        # and only then is the file read with its rows (unused, ``_metadata`` would be read whole).
        guessed = not spec.not_matched_by_source
        scanned = (
            delta.scan_files_with_path(ctx.spark, ctx.snapshot, ctx.candidate_files)
            if guessed
            else ctx.target_df(ctx.candidate_files, file_columns=False)
        )
        target = scanned.withColumn(TARGET_ROW_PRESENT_COL, F.lit(True))
        if not source_fits_broadcast(ctx, ctx.source_rows_estimate, ctx.candidate_files):
            how = "right_outer" if spec.is_matched_only else "full_outer"
            joined = observed_source.alias(s).join(target.alias(t), on, how)
        elif spec.not_matched:
            # The source is counted where the rows matching no target row stream past; an observation may
            # appear once in a plan.
            bitmap = key_bitmap(ctx, ctx.source_rows_estimate, any_size=guessed)
            if bitmap is not None and guessed and holds_few_target_rows(bitmap, ctx.candidate_files):
                return self._write_in_one_pass_counting_pairs(observed_source, obs_source, target, bitmap, start)
            unmatched = unmatched_source_rows(ctx, observed_source, ctx.candidate_files, bitmap, probe=ctx.source)
            joined = self._broadcast_full_outer(
                ctx.source.withColumn(SOURCE_ROW_PRESENT_COL, F.lit(True)), target, unmatched, bitmap
            )
        else:
            # A matched-only merge writes no source row: its pairs would have to be counted in a Spark job of
            # their own, which measured no faster than observing the target's rows as they stream past.
            bitmap = key_bitmap(ctx, ctx.source_rows_estimate)
            if bitmap is not None:
                target, on = bitmap.probe_keys(target), bitmap.on(t, s)
            joined = target.alias(t).join(F.broadcast(observed_source.alias(s)), on, "left_outer")
        target_present = F.col(TARGET_ROW_PRESENT_COL).isNotNull()
        matched = target_present & F.col(SOURCE_ROW_PRESENT_COL).isNotNull()
        probes = [F.when(matched, F.col(_qualified(t, delta.FILE_PATH_COL))).alias(TOUCHED_FILE_COL)] if guessed else []
        probe_metrics = [F.collect_set(TOUCHED_FILE_COL).alias(TOUCHED_FILE_COL)] if guessed else []
        added, cdc_files, obs = self._write_changes(
            joined, (), write_id=ctx.write_id, probes=probes, probe_metrics=probe_metrics
        )
        counts = observed_counts(obs, ignore=(TOUCHED_FILE_COL,))
        source_rows = ctx.metrics["numSourceRows"] = _observed_source_rows(ctx, obs_source)
        # Every target row the join gave takes one target-side action. The statistics' row count (required by
        # takes_single_pass) spares observing the scan, which would stop whole-stage code generation there.
        target_rows_out = sum(counts.get(c, 0) for c in TARGET_SIDE_ACTIONS)
        if target_rows_out != delta.known_num_records(ctx.candidate_files):
            delta.discard_write(ctx.snapshot, ctx.write_id)
            return None
        if guessed:
            ctx.touched_files = delta.files_at_paths(
                ctx.snapshot, ctx.candidate_files, obs.get.get(TOUCHED_FILE_COL) or []
            )
        else:
            ctx.touched_files = list(ctx.candidate_files)
        ctx.touched_files_known = True
        if len(ctx.touched_files) < len(ctx.candidate_files):
            delta.discard_write(ctx.snapshot, ctx.write_id)
            # The pass did findTouchedFiles' work, and that is all that is kept of it.
            ctx.metrics["scanTimeMs"] = int((time.monotonic() - start) * 1000)
            return None
        # The write read the source once, every row of it: the second scan and the first are one.
        self._record_write_metrics(counts, cdc_files, source_rows)
        ctx.metrics["rewriteTimeMs"] = int((time.monotonic() - start) * 1000)
        return added, cdc_files

    def _write_in_one_pass_counting_pairs(
        self, observed_source: DataFrame, obs_source: Observation, target: DataFrame, bitmap: KeyBitmap, start: float
    ) -> tuple[list[Any], list[Any]] | None:
        """The single pass with nothing counted where the target's rows stream past the broadcast source: an
        observation there breaks the write's generated code in two and updates its aggregates on every row,
        the costliest part of the write after Parquet itself. The source rows meet the target rows the key
        bitmap holds instead (broadcast: their key, their file's hash and the columns the clauses' conditions
        read). Each matched pair takes the action its target row takes in the write, so the pairs count the
        matched actions and the touched files, and the source rows matching none are the inserts. The copies
        are the rows written (the files' footers) less the updates and inserts; the target rows the join gave
        are the copies, updates and deletes (change files are not counted). Needs no NOT MATCHED BY SOURCE
        clause: its actions fall on the uncounted rows."""
        ctx = self.ctx
        spec = ctx.spec
        resolved = ctx.resolved
        s, t = spec.source_alias, spec.target_alias
        on = bitmap.on(t, s)
        clauses = [*resolved.matched, *resolved.not_matched]
        existing = {f.name.lower() for f in ctx.snapshot.spark_schema.fields}
        tcols = target_write_cols(resolved.output_fields, t, existing, resolved.target_values)

        cdc = ctx.cdc_enabled
        preimages = preimage_names(len(tcols)) if cdc else []

        def output_cols(lookups: dict[int, Column]) -> list[Column]:
            return generate_write_all_changes_output_cols(
                tcols, ctx.output_names, resolved.matched, resolved.not_matched, (), lookups, cdc=cdc
            )

        source = ctx.source.withColumn(SOURCE_ROW_PRESENT_COL, F.lit(True))
        # The rewrite reads no file column: left unused, ``_metadata`` would be read whole, row index and all.
        rewrite = bitmap.probe_keys(
            ctx.target_df(ctx.candidate_files, file_columns=False).withColumn(TARGET_ROW_PRESENT_COL, F.lit(True))
        )
        rewritten, lookups = generate_precomputed_conditions_and_df(
            rewrite.alias(t).join(F.broadcast(source.alias(s)), on, "left_outer"), clauses
        )
        rewritten = rewritten.select(
            *output_cols(lookups), *[c.alias(n) for c, n in zip(tcols, preimages, strict=False)]
        )

        held = (
            bitmap.probe_keys(target)
            .where(F.col(PROBE_KEY_COL).isNotNull())
            .withColumn(FILE_HASH_COL, F.xxhash64(F.col(delta.FILE_PATH_COL)))
        )
        pairs, lookups = generate_precomputed_conditions_and_df(
            observed_source.alias(s).join(F.broadcast(held.alias(t)), on, "left_outer"), clauses
        )
        # The source's own schema is known already: asking the observed frame would cost the server a round trip.
        source_names = [*(f.name for f in ctx.source.schema.fields), SOURCE_ROW_PRESENT_COL]
        acted = pairs.select(
            *[F.col(_qualified(s, n)) for n in source_names],
            # Only the action: the target's other columns stay out of the broadcast.
            output_cols(lookups)[len(ctx.output_names) + 1],
            F.when(F.col(_qualified(t, TARGET_ROW_PRESENT_COL)).isNotNull(), F.col(_qualified(t, FILE_HASH_COL))).alias(
                TOUCHED_FILE_COL
            ),
        )
        obs = Observation("writeAllChanges")
        codes = [MATCHED_UPDATE, MATCHED_DELETE, INSERT]
        counted = acted.observe(obs, *action_counts(codes), F.collect_set(TOUCHED_FILE_COL).alias(TOUCHED_FILE_COL))
        unmatched = (
            counted.where(F.col(ACTION_COL) == action(INSERT))
            .select(*[quote_identifier(n) for n in source_names])
            .alias(s)
        )
        unmatched, insert_lookups = generate_precomputed_conditions_and_df(unmatched, resolved.not_matched)
        insert_cols = generate_inserts_only_output_cols(
            ctx.output_names, resolved.output_fields, resolved.not_matched, insert_lookups
        )
        if cdc:
            insert_cols += [
                F.lit(CDC_TYPE_INSERT).alias(CDC_TYPE_COL),
                *[
                    F.lit(None).cast(f.dataType).alias(n)
                    for f, n in zip(resolved.output_fields, preimages, strict=True)
                ],
            ]
        rows = repartition_for_write(ctx, rewritten.union(unmatched.select(*insert_cols)))
        added, cdc_files = self._write_output(rows, preimages, (), write_id=ctx.write_id)
        counts = observed_counts(obs, ignore=(TOUCHED_FILE_COL,))
        source_rows = ctx.metrics["numSourceRows"] = _observed_source_rows(ctx, obs_source)
        written = sum(a.stats.num_records for a in added)
        counts[COPY] = written - counts[MATCHED_UPDATE] - counts[INSERT]
        target_rows_out = written - counts[INSERT] + counts[MATCHED_DELETE]
        touched = len(obs.get.get(TOUCHED_FILE_COL) or [])
        # A target row matched twice, or a candidate file untouched (or two files' hashes alike): the write
        # is given up, and findTouchedFiles tells which.
        if target_rows_out != delta.known_num_records(ctx.candidate_files) or touched < len(ctx.candidate_files):
            delta.discard_write(ctx.snapshot, ctx.write_id)
            return None
        ctx.touched_files = list(ctx.candidate_files)
        ctx.touched_files_known = True
        self._record_write_metrics(counts, cdc_files, source_rows)
        ctx.metrics["rewriteTimeMs"] = int((time.monotonic() - start) * 1000)
        return added, cdc_files

    def write_all_changes(self) -> tuple[list[Any], list[Any]]:
        """Rewrite the touched files joined with the source; answers the added data and change files."""
        ctx = self.ctx
        spec = ctx.spec
        start = time.monotonic()
        target = ctx.target_df(ctx.touched_files, file_columns=False).withColumn(TARGET_ROW_PRESENT_COL, F.lit(True))
        source = ctx.source.withColumn(SOURCE_ROW_PRESENT_COL, F.lit(True))
        dedup_columns: list[str] = []
        if ctx.cdc_enabled and ctx.deduplicate_cdf_deletes:
            # DeduplicateCDFDeletes: row indexes to keep one delete per target row (even / odd: never equal).
            target = target.withColumn(TARGET_ROW_INDEX_COL, F.monotonically_increasing_id() * 2)
            dedup_columns.append(TARGET_ROW_INDEX_COL)
            if spec.not_matched:
                source = source.withColumn(SOURCE_ROW_INDEX_COL, F.monotonically_increasing_id() * 2 + 1)
                dedup_columns.append(SOURCE_ROW_INDEX_COL)
        # numSourceRowsInSecondScan: every source row the write reads, matched or not (Delta counts them on
        # the join's source side).
        second_scan = Observation("secondScan")
        counted = source.observe(second_scan, F.count(F.lit(1)).alias("rows"))
        joined = self._join_for_write(source, counted, target)
        added, cdc_files, observed = self._write_changes(joined, dedup_columns, write_id=ctx.write_id)
        self._record_write_metrics(observed_counts(observed), cdc_files, int(second_scan.get.get("rows", 0) or 0))
        ctx.metrics["rewriteTimeMs"] = int((time.monotonic() - start) * 1000)
        return added, cdc_files

    def _write_changes(
        self,
        joined: DataFrame,
        dedup_columns: Sequence[str],
        *,
        write_id: str,
        probes: Sequence[Column] = (),
        probe_metrics: Sequence[Column] = (),
    ) -> tuple[list[Any], list[Any], Observation]:
        """MergeOutputGeneration over the joined rows, written; ``probes`` are columns computed on the joined
        rows only for ``probe_metrics`` to observe."""
        ctx = self.ctx
        spec = ctx.spec
        cdc = ctx.cdc_enabled
        clauses = [*ctx.resolved.matched, *ctx.resolved.not_matched, *ctx.resolved.not_matched_by_source]
        joined, lookups = generate_precomputed_conditions_and_df(joined, clauses)
        existing = {f.name.lower() for f in ctx.snapshot.spark_schema.fields}
        tcols = target_write_cols(ctx.resolved.output_fields, spec.target_alias, existing, ctx.resolved.target_values)
        output_cols = generate_write_all_changes_output_cols(
            tcols,
            ctx.output_names,
            ctx.resolved.matched,
            ctx.resolved.not_matched,
            ctx.resolved.not_matched_by_source,
            lookups,
            cdc=cdc,
        )
        preimages = preimage_names(len(tcols)) if cdc else []
        projected = joined.select(
            *output_cols,
            *[c.alias(n) for c, n in zip(tcols, preimages, strict=False)],
            *dedup_columns,
            *probes,
        )
        projected = repartition_for_write(ctx, projected)
        obs = Observation("writeAllChanges")
        # Only the actions some clause can take are counted: each count is an aggregate on every output row.
        codes = [COPY]
        for clauses, update, delete in (
            (ctx.resolved.matched, MATCHED_UPDATE, MATCHED_DELETE),
            (ctx.resolved.not_matched_by_source, NOT_MATCHED_BY_SOURCE_UPDATE, NOT_MATCHED_BY_SOURCE_DELETE),
        ):
            codes += [
                c
                for c, present in (
                    (update, any(not r.is_delete for r in clauses)),
                    (delete, any(r.is_delete for r in clauses)),
                )
                if present
            ]
        if ctx.resolved.not_matched:
            codes.append(INSERT)
        observed = projected.observe(
            obs,
            *action_counts(codes),
            *probe_metrics,
        )
        added, cdc_files = self._write_output(observed, preimages, dedup_columns, write_id=write_id)
        return added, cdc_files, obs

    def _write_output(
        self, rows: DataFrame, preimages: Sequence[str], dedup_columns: Sequence[str], *, write_id: str
    ) -> tuple[list[Any], list[Any]]:
        """The output rows written, less the dropped ones; with Change Data Feed, with their change rows."""
        ctx = self.ctx
        if not ctx.cdc_enabled:
            output = rows.where(~F.col(ROW_DROPPED_COL)).select(*[quote_identifier(n) for n in ctx.output_names])
            return delta.write_data_files(
                ctx.spark, output, ctx.snapshot, write_id=write_id, schema=output_schema(ctx)
            ), []
        names = [*ctx.output_names, ROW_DROPPED_COL, ACTION_COL, CDC_TYPE_COL]
        changes = (
            generate_cdc_and_output_rows(
                rows,
                [F.col(quote_identifier(n)) for n in names],
                ctx.output_names,
                [F.col(n) for n in preimages],
                dedup_columns,
            )
            .where(~F.col(ROW_DROPPED_COL))
            .drop(ROW_DROPPED_COL, ACTION_COL)
        )
        # Data and change rows come out of one pass and go out in one write (Delta's __is_cdc partition).
        return delta.write_data_and_cdc_files(
            ctx.spark, changes, ctx.snapshot, write_id=write_id, schema=output_schema(ctx)
        )

    def _record_write_metrics(self, counts: dict[str, int], cdc_files: list[Any], second_scan_rows: int) -> None:
        m = self.ctx.metrics
        m["numTargetRowsMatchedUpdated"] = counts.get(MATCHED_UPDATE, 0)
        m["numTargetRowsNotMatchedBySourceUpdated"] = counts.get(NOT_MATCHED_BY_SOURCE_UPDATE, 0)
        overcount = m.pop("_multipleMatchDeleteOnlyOvercount", 0)
        m["numTargetRowsMatchedDeleted"] = counts.get(MATCHED_DELETE, 0) - overcount
        m["numTargetRowsNotMatchedBySourceDeleted"] = counts.get(NOT_MATCHED_BY_SOURCE_DELETE, 0)
        m["numTargetRowsInserted"] = counts.get(INSERT, 0)
        m["numTargetRowsCopied"] = counts.get(COPY, 0)
        m["numSourceRowsInSecondScan"] = second_scan_rows
        m["numTargetChangeFilesAdded"] = len(cdc_files)
        m["numTargetChangeFileBytes"] = sum(f.size for f in cdc_files)


class InsertOnlyMergeExecutor:
    def __init__(self, ctx: MergeContext) -> None:
        self.ctx = ctx

    def write_only_inserts(
        self, *, filter_matched_rows: bool = True, source_rows_metric: str = "numSourceRows"
    ) -> list[Any]:
        """``filter_matched_rows`` is off when findTouchedFiles already showed that no source row matches."""
        ctx = self.ctx
        spec = ctx.spec
        start = time.monotonic()
        obs_source = Observation(source_rows_metric)
        source = ctx.source.observe(obs_source, F.count(F.lit(1)).alias("n")).alias(spec.source_alias)
        if ctx.candidate_files and filter_matched_rows:
            target = ctx.target_df(ctx.candidate_files, file_columns=False)
            if source_fits_broadcast(ctx, ctx.source_rows_estimate, ctx.candidate_files):
                new_rows = unmatched_source_rows(
                    ctx, source, ctx.candidate_files, key_bitmap(ctx, ctx.source_rows_estimate), probe=ctx.source
                )
            else:
                new_rows = source.join(target.alias(spec.target_alias), ctx.resolved.on, "left_anti")
        else:
            new_rows = source
        new_rows, lookups = generate_precomputed_conditions_and_df(new_rows, ctx.resolved.not_matched)
        output_cols = generate_inserts_only_output_cols(
            ctx.output_names, ctx.resolved.output_fields, ctx.resolved.not_matched, lookups
        )
        obs = Observation("writeOnlyInserts")
        projected = repartition_for_write(ctx, new_rows.select(*output_cols))
        projected = projected.observe(obs, *action_counts([INSERT, DROP_SOURCE]))
        output = projected.where(~F.col(ROW_DROPPED_COL)).drop(ROW_DROPPED_COL, ACTION_COL)
        added = delta.write_data_files(
            ctx.spark, output, ctx.snapshot, write_id=ctx.write_id, schema=output_schema(ctx)
        )
        ctx.metrics["numTargetRowsInserted"] = observed_counts(obs).get(INSERT, 0)
        ctx.metrics[source_rows_metric] = int(obs_source.get.get("n", 0) or 0)
        ctx.metrics["rewriteTimeMs"] = int((time.monotonic() - start) * 1000)
        return added


def observed_counts(obs: Observation, *, ignore: Sequence[str] = ()) -> dict[str, int]:
    """The counts an observation collected (less the ``ignore``d metrics). The merge decides whether to commit
    from them, so a missing observation is an error, never zero rows changed."""
    values = obs.get
    if not values:
        raise MergeExecutionError("Spark did not report the merge's row counts; nothing was committed.")
    return {k: int(v or 0) for k, v in values.items() if k not in ignore}


def repartition_for_write(ctx: MergeContext, df: DataFrame) -> DataFrame:
    """Delta's repartitionBeforeWrite: one task per partition value, so each touched partition gets one file set.
    It is applied below the metrics observation: an adaptive plan may drop a stage that follows an observation
    when that stage turns out empty, and the observed counts with it."""
    partition_columns = list(ctx.snapshot.partition_columns)
    if not partition_columns:
        return df
    return df.repartition(*[F.col(quote_identifier(c)) for c in partition_columns])


def output_schema(ctx: MergeContext) -> StructType | None:
    """The table schema after schema evolution, or None when the merge keeps the table's."""
    return StructType(ctx.resolved.output_fields) if ctx.resolved.schema_changed else None
