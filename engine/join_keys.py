"""ON's key equalities: when each distinct source key is one value to the target (the plans that group or
index the source by key need that), and the equalities as a Spark Column."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DataType,
    MapType,
    StructType,
)

from engine.context import MergeContext
from engine.delta import INTEGRAL_TYPES
from engine.expressions import quote_identifier
from engine.merge_condition import KeyedOn, Sides


def _same_key_values(source: DataType | None, target: DataType | None) -> bool:
    """Whether distinct source key values stay distinct when compared with the target column."""
    if source is None or target is None:
        return False
    if isinstance(source, INTEGRAL_TYPES) and isinstance(target, INTEGRAL_TYPES):
        return True
    return source == target and not isinstance(source, (StructType, ArrayType, MapType))


def key_condition(keyed: KeyedOn, left: Sequence[str], right: Sequence[str]) -> Column:
    """ON's key equalities, each between ``left[i]`` and ``right[i]`` (qualified names) with its key's
    null-safety."""
    condition: Column | None = None
    for key, left_name, right_name in zip(keyed.keys, left, right, strict=True):
        left_col, right_col = F.col(left_name), F.col(right_name)
        equal = left_col.eqNullSafe(right_col) if key.null_safe else left_col == right_col
        condition = equal if condition is None else condition & equal
    assert condition is not None
    return condition


def qualified_column(alias: str, name: str) -> str:
    return f"{quote_identifier(alias)}.{quote_identifier(name)}"


def keyed_join(ctx: MergeContext) -> KeyedOn | None:
    """ON's key equalities when every distinct source key tuple is one value to the target: the two columns
    have one type (or both are integers), so no two distinct source keys can equal the same target value."""
    spec = ctx.spec
    target_types = {f.name.lower(): f.dataType for f in ctx.snapshot.spark_schema.fields}
    source_types = {f.name.lower(): f.dataType for f in ctx.source.schema.fields}
    sides = Sides(spec.target_alias, spec.source_alias, frozenset(target_types), frozenset(source_types))
    keyed = ctx.resolved.on_condition.keyed_on(sides)
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
