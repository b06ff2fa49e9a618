"""Delta's schema evolution in MERGE (``autoMerge``): with UPDATE SET * or INSERT *, the source's columns the
target lacks are added (with explicit assignments, those they assign), and struct columns gain the fields the
source's structs add, at any depth (in arrays and maps too); a type that cannot be stored into the existing column
is a schema mismatch."""

from __future__ import annotations

from pyspark.sql.types import ArrayType, DataType, MapType, NullType, StructField, StructType
from sqlglot import exp

from engine.delta.type_widening import is_schema_evolution_widening, widened_field
from engine.delta.values import strip_nullability
from engine.errors import MergeResolutionError, MergeSpecError, SchemaMismatchError
from engine.expressions import quote_identifier
from engine.spec import InsertAction, UpdateAction
from engine.store_assignment import can_evolve_into, needs_struct_by_name, sql_type, struct_by_name
from engine.validation import ParsedMerge, column_path


def evolved_schema(
    parsed: ParsedMerge, target_schema: StructType, source_schema: StructType, *, type_widening: bool = False
) -> tuple[list[StructField], list[str], dict[str, str]]:
    """The table schema after the merge, its new top-level columns, and the target's value of each column
    whose type changed (SQL, by lower-case name): a struct that gained fields, or, where the table allows type
    widening (``type_widening``), a column widened to the source's wider type as Delta's automatic widening does."""
    spec = parsed.spec
    fields = list(target_schema.fields)
    if not spec.schema_evolution:
        return fields, [], {}
    evolving = _evolving_source_fields(parsed, target_schema, source_schema)
    if not evolving:
        return fields, [], {}
    position = {f.name.lower(): i for i, f in enumerate(fields)}
    new: list[str] = []
    target_values: dict[str, str] = {}
    for f in evolving:
        index = position.get(f.name.lower())
        if index is None:
            fields.append(
                StructField(f.name, strip_nullability(f.dataType, keep_metadata=True), True, _carried_metadata(f))
            )
            new.append(f.name)
            continue
        existing = fields[index]
        if type_widening and is_schema_evolution_widening(existing.dataType, f.dataType):
            fields[index] = widened_field(existing, f.dataType)
            column = f"{quote_identifier(spec.target_alias)}.{quote_identifier(existing.name)}"
            target_values[existing.name.lower()] = f"CAST({column} AS {sql_type(f.dataType)})"
            continue
        merged = evolved_type(existing.dataType, f.dataType)
        if merged is not None:
            fields[index] = StructField(existing.name, merged, existing.nullable, existing.metadata)
            column = f"{quote_identifier(spec.target_alias)}.{quote_identifier(existing.name)}"
            target_values[existing.name.lower()] = struct_by_name(
                column, existing.dataType, merged, allow_missing=True, where=f"column {existing.name}"
            )
        target_type = fields[index].dataType
        if needs_struct_by_name(f.dataType, target_type):
            try:
                struct_by_name(
                    quote_identifier(f.name),
                    f.dataType,
                    target_type,
                    allow_missing=True,
                    where=f"column {existing.name}",
                )
            except MergeResolutionError as exc:
                raise SchemaMismatchError(f"Failed to merge fields '{existing.name}' and '{f.name}'. {exc}") from None
        elif target_type != f.dataType and not can_evolve_into(f.dataType, target_type):
            raise SchemaMismatchError(
                f"Failed to merge fields '{existing.name}' and '{f.name}'. Failed to merge incompatible data "
                f"types {existing.dataType.simpleString()} and {f.dataType.simpleString()}"
            )
    for f in fields:
        _refuse_null_type_inside(f.dataType, f.name)
    return fields, new, target_values


def _refuse_null_type_inside(dtype: DataType, path: str, inside: str | None = None) -> None:
    """Delta writes no NULL type inside an array or a map (a VOID column, or struct field, it does)."""
    if isinstance(dtype, NullType) and inside is not None:
        raise SchemaMismatchError(
            f"[DELTA_COMPLEX_TYPE_COLUMN_CONTAINS_NULL_TYPE] Found nested NullType in column {path} which is of "
            f"{inside}. Delta doesn't support writing NullType in complex types."
        )
    if isinstance(dtype, StructType):
        for f in dtype.fields:
            _refuse_null_type_inside(f.dataType, f"{path}.{f.name}", inside)
    elif isinstance(dtype, ArrayType):
        _refuse_null_type_inside(dtype.elementType, path, "ArrayType")
    elif isinstance(dtype, MapType):
        _refuse_null_type_inside(dtype.keyType, path, "MapType")
        _refuse_null_type_inside(dtype.valueType, path, "MapType")


def _carried_metadata(field: StructField) -> dict[str, object]:
    """The metadata a column schema evolution adds keeps from the source's: its comment, CHAR or VARCHAR type and
    default, as Delta keeps them; the source table's own Delta keys (column mapping, generation expression,
    identity, type changes) describe that table, not this one."""
    return {k: v for k, v in (field.metadata or {}).items() if not k.startswith("delta.")}


def _evolving_source_fields(
    parsed: ParsedMerge, target_schema: StructType, source_schema: StructType
) -> list[StructField]:
    """The source columns schema evolution takes into the table, in the source's order: every one with UPDATE SET
    * or INSERT *; else those an explicit ``set`` or ``values`` assigns (Delta 2.3 and later): a column the target
    lacks that the source has, whatever its value, and a target column assigned its source namesake as it is
    (``st = s.st``, so a struct gains the source's new fields and a type widens as a star clause's would)."""
    spec = parsed.spec
    actions = [c.action for c in spec.clauses if isinstance(c.action, (UpdateAction, InsertAction))]
    if any(a.star for a in actions):
        return list(source_schema.fields)
    target_names = {f.name.lower() for f in target_schema.fields}
    source_names = {f.name.lower() for f in source_schema.fields}
    chosen: set[str] = set()
    for action in actions:
        items = action.set if isinstance(action, UpdateAction) else action.values
        for column, value in items.items():
            try:
                path = column_path(column, spec.target_alias, target_names)
            except MergeSpecError:
                continue  # refused, with its field, where the clause is resolved
            name = path[0]
            if len(path) != 1 or name not in source_names:
                continue
            if name not in target_names or _is_source_column(parsed.tree(value), spec.source_alias, name):
                chosen.add(name)
    return [f for f in source_schema.fields if f.name.lower() in chosen]


def _is_source_column(node: exp.Expression, source_alias: str, name: str) -> bool:
    """Whether an assigned value's tree is the source's column ``name`` itself (``s.name`` or ``name``)."""
    if not isinstance(node, exp.Column) or node.name.lower() != name:
        return False
    qualifier = [p.name.lower() for p in node.parts[:-1]]
    return qualifier in ([], [source_alias.lower()])


def evolved_type(existing: DataType, source: DataType) -> DataType | None:
    """``existing`` with the fields the source's structs add appended, at any depth (Delta's schema evolution of
    nested fields); None when the source adds none."""
    if isinstance(existing, StructType) and isinstance(source, StructType):
        by_name = {f.name.lower(): f for f in source.fields}
        fields, changed = [], False
        for f in existing.fields:
            sf = by_name.get(f.name.lower())
            merged = evolved_type(f.dataType, sf.dataType) if sf is not None else None
            fields.append(f if merged is None else StructField(f.name, merged, f.nullable, f.metadata))
            changed = changed or merged is not None
        known = {f.name.lower() for f in existing.fields}
        added = [
            StructField(f.name, strip_nullability(f.dataType, keep_metadata=True), True, _carried_metadata(f))
            for f in source.fields
            if f.name.lower() not in known
        ]
        return StructType(fields + added) if changed or added else None
    if isinstance(existing, ArrayType) and isinstance(source, ArrayType):
        element = evolved_type(existing.elementType, source.elementType)
        return None if element is None else ArrayType(element, existing.containsNull)
    if isinstance(existing, MapType) and isinstance(source, MapType):
        key = evolved_type(existing.keyType, source.keyType)
        value = evolved_type(existing.valueType, source.valueType)
        if key is None and value is None:
            return None
        return MapType(key or existing.keyType, value or existing.valueType, existing.valueContainsNull)
    return None
