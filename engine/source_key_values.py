"""The values of a small source's one integer key, for the target rows they may match: ``target_key IN (...)``.

A merge-on-read merge of a few source rows reads every row of its candidate files only to find the few its
source matches. With the source's key values in the plan, the scan keeps those rows alone, so both sides of the
join are small: they are shuffled and joined whole, with no broadcast, no cached join and no second look at the
source for its unmatched rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from engine.context import MergeContext
from engine.expressions import quote_identifier
from engine.inline_rows import rows_to_arrow
from engine.join_keys import one_integer_key
from engine.spec import RowsSource

KEY_VALUES_MAX = 10_000
"""At most this many source rows: each key value is a literal of the plan, analyzed with it."""


@dataclass(frozen=True)
class SourceKeyValues:
    """The source's distinct non-NULL values of ON's one integer key, and whether a NULL key may match."""

    target_column: str
    values: tuple[int, ...]
    matches_null: bool
    """ON compares the key with ``<=>`` and the source holds a NULL key: target rows with a NULL key match."""

    def target_filter(self) -> Column:
        """The target rows some source row's key may equal; the others match no source row."""
        column = F.col(quote_identifier(self.target_column))
        held = column.isin(list(self.values)) if self.values else F.lit(False)
        return held | column.isNull() if self.matches_null else held


def source_key_values(ctx: MergeContext) -> SourceKeyValues | None:
    """The key values of a source of at most KEY_VALUES_MAX rows (known before any Spark job), from inline rows
    as they are, else from one Spark job over the source; None for another ON or a larger source."""
    estimate = ctx.source_rows_estimate
    keyed = one_integer_key(ctx)
    if keyed is None or estimate is None or estimate > KEY_VALUES_MAX:
        return None
    key = keyed.keys[0]
    found = _inline_values(ctx, key.source_column)
    if found is None:
        column = F.col(quote_identifier(key.source_column))
        # No distinct: Spark would shuffle the keys for it, a second job.
        rows = ctx.source.select(column.alias("k")).limit(KEY_VALUES_MAX + 1).collect()
        if len(rows) > KEY_VALUES_MAX:
            return None
        found = list({r["k"] for r in rows})
    values = tuple(sorted(int(v) for v in found if v is not None))
    return SourceKeyValues(key.target_column, values, key.null_safe and len(values) < len(found))


def _inline_values(ctx: MergeContext, name: str) -> list[Any] | None:
    """The distinct values of inline rows' key column (NULL among them), when Arrow reads it as integers."""
    source = ctx.spec.source
    if not isinstance(source, RowsSource):
        return None
    table = rows_to_arrow(source.rows, source.schema)
    match = next((n for n in table.column_names if n.lower() == name.lower()), None)
    if match is None or not pa.types.is_integer(table.schema.field(match).type):
        return None
    return list(pc.unique(table.column(match)).to_pylist())


def keep_matchable_rows(target: DataFrame, keys: SourceKeyValues) -> DataFrame:
    return target.filter(keys.target_filter())
