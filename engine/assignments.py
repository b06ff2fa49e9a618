"""What a clause's UPDATE SET or INSERT assigns: each target column it names, or the fields it names inside a
struct column (Delta's nested assignment), every column and field at most once."""

from __future__ import annotations

from typing import Any

from pyspark.sql.types import StructField, StructType

from engine.delta import quote_path
from engine.errors import MergeResolutionError
from engine.expressions import quote_identifier
from engine.spec import InsertAction, UpdateAction
from engine.validation import column_path


def assigned_values(
    action: UpdateAction | InsertAction, where: str, out_fields: list[StructField], target_alias: str
) -> dict[str, Any]:
    """The assigned value of each column (lower-case name): its SQL, or for assignments to fields inside a
    struct column, the tree of assigned fields (nested dicts by lower-case field name, SQL at the leaves)."""
    fields = {f.name.lower(): f for f in out_fields}
    items = action.set if isinstance(action, UpdateAction) else action.values
    field_name = "set" if isinstance(action, UpdateAction) else "values"
    result: dict[str, Any] = {}
    for column, value in items.items():
        path = column_path(column, target_alias, fields, where=f"{where}.{field_name}.{column}")
        shown = quote_path(path)
        if path[0] not in fields:
            raise MergeResolutionError(
                f"{where}.{field_name}: {shown} is not a column of the target table "
                f"(columns: {', '.join(quote_identifier(f.name) for f in out_fields)}).",
                field=f"{where}.{field_name}",
            )
        if len(path) == 1:
            if path[0] in result:
                raise MergeResolutionError(
                    f"{where}.{field_name}: the column {shown} is assigned twice.", field=f"{where}.{field_name}"
                )
            result[path[0]] = value
            continue
        if isinstance(action, InsertAction):
            raise MergeResolutionError(
                f"{where}.{field_name}: Nested field is not supported in the INSERT clause of MERGE operation "
                f"(field = {shown}).",
                field=f"{where}.{field_name}",
            )
        node = result.setdefault(path[0], {})
        dtype = fields[path[0]].dataType
        for depth, part in enumerate(path[1:], start=1):
            names = {f.name.lower(): f for f in dtype.fields} if isinstance(dtype, StructType) else {}
            if not isinstance(node, dict) or part not in names:
                raise MergeResolutionError(
                    f"{where}.{field_name}: {shown}: {quote_path(path[:depth])} ({dtype.simpleString()}) has no "
                    f"field {quote_identifier(part)} to assign, or it is assigned twice.",
                    field=f"{where}.{field_name}",
                )
            dtype = names[part].dataType
            if depth == len(path) - 1:
                if part in node:
                    raise MergeResolutionError(
                        f"{where}.{field_name}: {shown} is assigned twice.", field=f"{where}.{field_name}"
                    )
                node[part] = value
            else:
                node = node.setdefault(part, {})
    return result
