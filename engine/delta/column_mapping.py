"""Column mapping (PROTOCOL.md "Column Mapping"; Delta's DeltaColumnMapping): logical and physical names.

With ``delta.columnMapping.mode`` ``name`` or ``id`` every field of the schema, nested ones included, carries a
physical name (``delta.columnMapping.physicalName``) and an id (``delta.columnMapping.id``). Data files hold the
physical names, and the Parquet field ids in both modes, as Delta's writers write them; ``partitionValues`` and
statistics in the log are keyed by physical names. Readers resolve the files' columns by physical name (``name``)
or by field id (``id``). Renaming a column changes only its logical name; dropping one removes it from the
schema while its data stays in old files, unread.

This layer keeps statistics and partition values keyed by logical names in memory (so data skipping and the
merge ask by the names a user sees) and translates at the edges: the snapshot and commits read from the log,
the Parquet files written and read, and the actions serialized into a commit.

Without column mapping every function here is the identity: a field's physical name is its name.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from engine.delta.values import strip_nullability

MODE_KEY = "delta.columnMapping.mode"
MAX_COLUMN_ID_KEY = "delta.columnMapping.maxColumnId"
PHYSICAL_NAME_KEY = "delta.columnMapping.physicalName"
ID_KEY = "delta.columnMapping.id"
PARQUET_FIELD_ID_KEY = "parquet.field.id"
"""The Spark field metadata its Parquet writer writes as the field's ``field_id`` (and its reader matches by,
with ``spark.sql.parquet.fieldId.read.enabled``)."""

MODES = ("none", "name", "id")


def mapping_mode(configuration: Mapping[str, str]) -> str:
    """The table's ``delta.columnMapping.mode``: ``none``, ``name`` or ``id``."""
    return str(configuration.get(MODE_KEY, "none") or "none").strip().lower()


def is_mapped(configuration: Mapping[str, str]) -> bool:
    return mapping_mode(configuration) in ("name", "id")


def physical_name(field: T.StructField) -> str:
    """Delta's getPhysicalName: the field's physical name, else its name."""
    name = (field.metadata or {}).get(PHYSICAL_NAME_KEY)
    return str(name) if name else field.name


def has_physical_names(schema: T.StructType) -> bool:
    """Whether any top-level field names a physical name: the schema of a column-mapped table (Delta drops
    the names when mapping is turned off)."""
    return any((f.metadata or {}).get(PHYSICAL_NAME_KEY) for f in schema.fields)


def _column_id(field: T.StructField) -> int | None:
    value = (field.metadata or {}).get(ID_KEY)
    return int(value) if isinstance(value, (int, str)) and str(value).lstrip("-").isdigit() else None


def _physical_field(field: T.StructField, field_ids: bool) -> T.StructField:
    column_id = _column_id(field) if field_ids else None
    metadata = {PARQUET_FIELD_ID_KEY: column_id} if column_id is not None else {}
    return T.StructField(physical_name(field), physical_type(field.dataType, field_ids), field.nullable, metadata)


def physical_type(dtype: T.DataType, field_ids: bool = False) -> T.DataType:
    """``dtype`` with every struct field under its physical name (and its id as ``parquet.field.id`` when
    ``field_ids``): the type a data file stores."""
    if isinstance(dtype, T.StructType):
        return T.StructType([_physical_field(f, field_ids) for f in dtype.fields])
    if isinstance(dtype, T.ArrayType):
        return T.ArrayType(physical_type(dtype.elementType, field_ids), dtype.containsNull)
    if isinstance(dtype, T.MapType):
        return T.MapType(
            physical_type(dtype.keyType, field_ids), physical_type(dtype.valueType, field_ids), dtype.valueContainsNull
        )
    return dtype


def physical_schema(schema: T.StructType, configuration: Mapping[str, str]) -> T.StructType:
    """The schema of the table's data files: physical names, and field ids in ``id`` mode (for the reader to
    match the files' columns by)."""
    if not is_mapped(configuration):
        return schema
    result = physical_type(schema, mapping_mode(configuration) == "id")
    assert isinstance(result, T.StructType)
    return result


def _renames_nested(dtype: T.DataType) -> bool:
    return physical_type(dtype) != dtype


def logical_columns(schema: T.StructType) -> list[Column]:
    """Columns that turn rows read with the physical schema of ``schema`` back into its logical names: nested
    struct fields are renamed by a cast, which matches struct fields by position. Each keeps its field's metadata,
    as a read of an unmapped table does."""
    columns = []
    for f in schema.fields:
        column = F.col(_quote(physical_name(f)))
        if _renames_nested(f.dataType):
            column = column.cast(strip_nullability(f.dataType))
        columns.append(column.alias(f.name, metadata=f.metadata or {}))
    return columns


def read_columns(schema: T.StructType, configuration: Mapping[str, str]) -> tuple[T.StructType, list[Column]]:
    """The schema to read a table's data files with (physical names, ids in ``id`` mode) and the columns that
    answer ``schema``'s logical names from them."""
    if not is_mapped(configuration):
        return schema, [F.col(_quote(f.name)) for f in schema.fields]
    return physical_schema(schema, configuration), logical_columns(schema)


def physical_columns(schema: T.StructType, configuration: Mapping[str, str]) -> list[Column]:
    """Columns that turn rows with the logical names of ``schema`` into the physical rows a data file holds,
    with the field ids Spark's Parquet writer writes in both modes (Delta's writers always write them)."""
    columns = []
    for f in schema.fields:
        column = F.col(_quote(f.name))
        stored = physical_type(f.dataType, field_ids=True)
        if stored != f.dataType:
            column = column.cast(stored)
        column_id = _column_id(f)
        metadata = {PARQUET_FIELD_ID_KEY: column_id} if column_id is not None else None
        columns.append(column.alias(physical_name(f), metadata=metadata))
    return columns


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _lookup(schema: T.StructType, name: str, *, by_physical: bool) -> T.StructField | None:
    """The field of ``schema`` whose logical (or physical) name is ``name``; exact case first."""
    key = physical_name if by_physical else (lambda f: f.name)
    exact = next((f for f in schema.fields if key(f) == name), None)
    if exact is not None:
        return exact
    lowered = name.lower()
    return next((f for f in schema.fields if key(f).lower() == lowered), None)


def rename_stats(values: Mapping[str, Any], schema: T.StructType, *, to_physical: bool) -> dict[str, Any]:
    """Nested statistics (``minValues``, ``maxValues``, ``nullCount``) re-keyed from logical to physical names
    or back. Keys the schema does not know (a dropped column's statistics in an old file) are left out."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        field = _lookup(schema, key, by_physical=not to_physical)
        if field is None:
            continue
        name = physical_name(field) if to_physical else field.name
        if isinstance(value, Mapping):
            if isinstance(field.dataType, T.StructType):
                nested = rename_stats(value, field.dataType, to_physical=to_physical)
                if nested:
                    out[name] = nested
            continue
        out[name] = value
    return out


def rename_partition_values(
    values: Mapping[str, str | None], schema: T.StructType, *, to_physical: bool
) -> dict[str, str | None]:
    """``partitionValues`` re-keyed from logical to physical names or back; unknown keys kept as they are."""
    out: dict[str, str | None] = {}
    for key, value in values.items():
        field = _lookup(schema, key, by_physical=not to_physical)
        if field is None:
            out[key] = value
        else:
            out[physical_name(field) if to_physical else field.name] = value
    return out


def physical_path(schema: T.StructType, path: tuple[str, ...]) -> tuple[str, ...]:
    """The physical path of a (struct) column path; names the schema does not know are kept."""
    out = []
    current: T.DataType = schema
    for name in path:
        field = _lookup(current, name, by_physical=False) if isinstance(current, T.StructType) else None
        if field is None:
            out.append(name)
            current = T.NullType()
            continue
        out.append(physical_name(field))
        current = field.dataType
    return tuple(out)


def _max_id(dtype: T.DataType) -> int:
    if isinstance(dtype, T.StructType):
        return max((max(_column_id(f) or 0, _max_id(f.dataType)) for f in dtype.fields), default=0)
    if isinstance(dtype, T.ArrayType):
        return _max_id(dtype.elementType)
    if isinstance(dtype, T.MapType):
        return max(_max_id(dtype.keyType), _max_id(dtype.valueType))
    return 0


def _max_column_id(schema: T.StructType, configuration: Mapping[str, str]) -> int:
    try:
        configured = int(configuration.get(MAX_COLUMN_ID_KEY, 0) or 0)
    except ValueError:
        configured = 0
    return max(configured, _max_id(schema))


class _Assigner:
    """Delta's assignColumnIdAndPhysicalName for fields that lack them: the next id above the table's maximum
    and a fresh ``col-<uuid>`` physical name, so a physical path is never reused across the table's versions."""

    def __init__(self, next_id: int) -> None:
        self.max_id = next_id

    def field(self, f: T.StructField) -> T.StructField:
        metadata = dict(f.metadata or {})
        if _column_id(f) is None:
            self.max_id += 1
            metadata[ID_KEY] = self.max_id
        if not metadata.get(PHYSICAL_NAME_KEY):
            metadata[PHYSICAL_NAME_KEY] = f"col-{uuid.uuid4()}"
        return T.StructField(f.name, self.type(f.dataType), f.nullable, metadata)

    def type(self, dtype: T.DataType) -> T.DataType:
        if isinstance(dtype, T.StructType):
            return T.StructType([self.field(f) for f in dtype.fields])
        if isinstance(dtype, T.ArrayType):
            return T.ArrayType(self.type(dtype.elementType), dtype.containsNull)
        if isinstance(dtype, T.MapType):
            return T.MapType(self.type(dtype.keyType), self.type(dtype.valueType), dtype.valueContainsNull)
        return dtype


def assign_column_mapping(schema: T.StructType, configuration: Mapping[str, str]) -> tuple[T.StructType, int | None]:
    """``schema`` with an id and a physical name on every field that lacks them (new columns of schema
    evolution), and the table's new ``delta.columnMapping.maxColumnId``; unchanged (and None) without column
    mapping."""
    if not is_mapped(configuration):
        return schema, None
    assigner = _Assigner(_max_column_id(schema, configuration))
    result = assigner.type(schema)
    assert isinstance(result, T.StructType)
    return result, assigner.max_id


def check_mode(configuration: Mapping[str, str]) -> str | None:
    """Why the table's column mapping mode cannot be served, or None."""
    mode = mapping_mode(configuration)
    if mode not in MODES:
        return f"{MODE_KEY} = {configuration.get(MODE_KEY)!r} is not a column mapping mode ({', '.join(MODES)})"
    return None
