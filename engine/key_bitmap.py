"""The key bitmap: a bitmap of the source's values of ON's one integer key, broadcast beside the target scan so
that the target rows it cannot hold skip the probe into a hash table larger than the CPU caches."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from engine import delta
from engine.context import MergeContext
from engine.delta.internal_columns import internal_column
from engine.expressions import quote_identifier, sql
from engine.join_keys import key_condition, one_integer_key, qualified_column
from engine.merge_condition import KeyedOn

KEY_BITMAP_MIN_SOURCE_ROWS = 100_000
"""Sources of at least this many rows get a bitmap of their join keys: their broadcast hash table outgrows the
CPU caches, and each target row's probe into it costs a cache miss, most of them for keys it does not hold. (The
single pass with NOT MATCHED clauses takes one whatever the source's size, to count on the rows it holds.)"""
KEY_BITMAP_BITS_PER_KEY = 16
KEY_BITMAP_MAX_BITS = 1 << 24
"""2 MiB: the bitmap must stay cache-sized to be worth testing before the probe."""
KEY_BITMAP_COL = internal_column("source_keys_bitmap")


PROBE_KEY_COL = internal_column("probe_key")


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
        # Spark shifts by a column too; pyspark's hints name only an int.
        shift = position.bitwiseAND(F.lit(63)).cast("int")
        held = F.shiftright(word, shift).bitwiseAND(F.lit(1)) == 1  # type: ignore[arg-type]
        return (
            target.crossJoin(F.broadcast(self.frame))
            .withColumn(PROBE_KEY_COL, F.when(held, column))
            .drop(KEY_BITMAP_COL)
        )

    def on(self, target_alias: str, source_alias: str) -> Column:
        """ON with the probe key in place of the target's key column."""
        condition = key_condition(
            self.keyed,
            [qualified_column(target_alias, PROBE_KEY_COL)],
            [qualified_column(source_alias, self.keyed.keys[0].source_column)],
        )
        for predicate in (*self.keyed.target_only, *self.keyed.source_only):
            condition = condition & F.expr(sql(predicate))
        return condition

    @classmethod
    def for_merge(cls, ctx: MergeContext, source_rows: int | None, *, any_size: bool = False) -> KeyBitmap | None:
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
        ctx.key_bitmap = cls.build(ctx.spark, ctx.source, keyed, delta.known_num_records(ctx.candidate_files) or 0)
        return ctx.key_bitmap

    @classmethod
    def build(cls, spark: SparkSession, source: DataFrame, keyed: KeyedOn, target_rows: int = 0) -> KeyBitmap:
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
        frame = spark.createDataFrame(
            pa.table({KEY_BITMAP_COL: pa.array([words.view(np.int64)], pa.list_(pa.int64()))})
        )
        return cls(frame, bits, keyed, len(keys), int(np.bitwise_count(words).sum()) / bits)
