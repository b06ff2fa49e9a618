"""UPDATE SET * under schema evolution of a struct column the source lacks fields of, as Delta resolves it: one
assignment per source field (nested where that field's struct lacks fields too), so the fields the source lacks
keep the target's value. The resolution builds the struct from these assignments as from nested SET ones."""

from __future__ import annotations

from typing import Any

from pyspark.sql.types import StructType

from engine.expressions import quote_identifier


class BuiltSql(str):
    """SQL the resolution wrote itself (qualified, names quoted), not a text of the spec's."""

    __slots__ = ()


def lacks_fields(source: StructType, target: StructType) -> bool:
    """Whether the source struct lacks a field of the target's, at any depth through structs."""
    by_name = {f.name.lower(): f for f in source.fields}
    for f in target.fields:
        sf = by_name.get(f.name.lower())
        if sf is None:
            return True
        if (
            isinstance(sf.dataType, StructType)
            and isinstance(f.dataType, StructType)
            and lacks_fields(sf.dataType, f.dataType)
        ):
            return True
    return False


def star_update_tree(source: StructType, target: StructType, text: str) -> dict[str, Any]:
    """UPDATE SET * under schema evolution of a struct the source lacks fields of, as Delta resolves it: one
    assignment per source field, nested where that field's struct lacks fields too (the shape
    ``_nested_update_sql`` takes). A field the source has whole is assigned whole, NULL included."""
    by_name = {f.name.lower(): f for f in source.fields}
    tree: dict[str, Any] = {}
    for f in target.fields:
        sf = by_name.get(f.name.lower())
        if sf is None:
            continue
        value = BuiltSql(f"{text}.{quote_identifier(sf.name)}")
        if (
            isinstance(sf.dataType, StructType)
            and isinstance(f.dataType, StructType)
            and lacks_fields(sf.dataType, f.dataType)
        ):
            tree[f.name.lower()] = star_update_tree(sf.dataType, f.dataType, value)
        else:
            tree[f.name.lower()] = value
    return tree
