"""Storing a value of one type into a column of another, as Delta's MERGE does under Spark's ANSI store
assignment policy: which casts are allowed, structs paired by field name, and the SQL that stores a clause's
values in their columns."""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    NumericType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from engine.delta.internal_columns import internal_column
from engine.errors import MergeResolutionError
from engine.expression_rules import is_deterministic
from engine.expressions import quote_identifier

CAST_OVERFLOW_MARKER = "DELTA_CAST_OVERFLOW_IN_TABLE_WRITE"
"""Delta's error class for a value too large for the column it is written to, which names the column."""

_DIGITS_NEEDED: dict[type[DataType], int] = {ByteType: 3, ShortType: 5, IntegerType: 10, LongType: 19}
"""The integer digits an integral type's largest values have."""
_DIGITS_HELD: dict[type[DataType], int] = {ByteType: 2, ShortType: 4, IntegerType: 9, LongType: 18}
"""The integer digits every value of which an integral type holds."""


def can_ansi_cast(source: DataType, target: DataType) -> bool:
    """Spark's ``Cast.canAnsiCast``: the casts Delta's MERGE puts on assigned values under the ANSI store
    assignment policy (UpdateExpressionsSupport.castIfNeeded builds an ANSI ``Cast``, so ``'42'`` goes into an
    INT column and ``'x'`` fails the merge when the row is written). Nullability is left to the NOT NULL checks
    of the write."""
    if source == target or isinstance(source, NullType) or isinstance(target, StringType):
        return True
    numeric = isinstance(source, NumericType)
    text = isinstance(source, StringType)
    if isinstance(target, BinaryType):
        return text
    if isinstance(target, BooleanType):
        return text or numeric
    if isinstance(target, TimestampType):
        return text or numeric or isinstance(source, (DateType, TimestampNTZType))
    if isinstance(target, TimestampNTZType):
        return text or isinstance(source, (DateType, TimestampType))
    if isinstance(target, DateType):
        return text or isinstance(source, (TimestampType, TimestampNTZType))
    if isinstance(target, NumericType):
        return text or numeric or isinstance(source, (BooleanType, TimestampType))
    if isinstance(source, ArrayType) and isinstance(target, ArrayType):
        return can_ansi_cast(source.elementType, target.elementType)
    if isinstance(source, MapType) and isinstance(target, MapType):
        return can_ansi_cast(source.keyType, target.keyType) and can_ansi_cast(source.valueType, target.valueType)
    if isinstance(source, StructType) and isinstance(target, StructType):
        return len(source.fields) == len(target.fields) and all(
            can_ansi_cast(s.dataType, t.dataType) for s, t in zip(source.fields, target.fields, strict=True)
        )
    return False


def can_evolve_into(source: DataType, target: DataType) -> bool:
    """Whether schema evolution keeps an existing column of type ``target`` for a source column of type
    ``source``, the values then stored as an assignment stores them. Delta merges the schemas with implicit
    conversions (``SchemaMergingUtils.mergeSchemas`` with ``allowImplicitConversions``, Spark's
    ``TypeCoercion.implicitCast``): numbers into numbers, any atomic value into a string, dates and timestamps
    into each other, and a string into a number, a date, a timestamp or binary; never a boolean into anything
    but a string."""
    if source == target or isinstance(source, NullType):
        return True
    if isinstance(source, NumericType) and isinstance(target, NumericType):
        return True
    if isinstance(target, StringType) and not isinstance(source, (ArrayType, MapType, StructType)):
        return True
    datetimes = (DateType, TimestampType, TimestampNTZType)
    if isinstance(source, datetimes) and isinstance(target, datetimes):
        return True
    if isinstance(source, StringType) and isinstance(target, (NumericType, BinaryType, *datetimes)):
        return True
    if isinstance(source, ArrayType) and isinstance(target, ArrayType):
        return can_evolve_into(source.elementType, target.elementType)
    if isinstance(source, MapType) and isinstance(target, MapType):
        return can_evolve_into(source.keyType, target.keyType) and can_evolve_into(source.valueType, target.valueType)
    if isinstance(source, StructType) and isinstance(target, StructType):
        return len(source.fields) == len(target.fields) and all(
            can_evolve_into(s.dataType, t.dataType) for s, t in zip(source.fields, target.fields, strict=True)
        )
    return False


def sql_string(text: str) -> str:
    """A Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def sql_type(dtype: DataType) -> str:
    """A type as CAST reads it, field names quoted (``simpleString`` leaves them bare)."""
    if isinstance(dtype, StructType):
        return "struct<" + ",".join(f"{quote_identifier(f.name)}:{sql_type(f.dataType)}" for f in dtype.fields) + ">"
    if isinstance(dtype, ArrayType):
        return f"array<{sql_type(dtype.elementType)}>"
    if isinstance(dtype, MapType):
        return f"map<{sql_type(dtype.keyType)},{sql_type(dtype.valueType)}>"
    return dtype.simpleString()


def _field_names(struct: StructType) -> list[str]:
    return [f.name.lower() for f in struct.fields]


def needs_struct_by_name(source: DataType, target: DataType) -> bool:
    """Whether a positional cast would pair the wrong fields: some struct (or struct in an array) in ``source``
    names its fields otherwise, or in another order, than the target's."""
    if isinstance(source, StructType) and isinstance(target, StructType):
        if _field_names(source) != _field_names(target):
            return True
        return any(
            needs_struct_by_name(a.dataType, b.dataType) for a, b in zip(source.fields, target.fields, strict=True)
        )
    if isinstance(source, ArrayType) and isinstance(target, ArrayType):
        return needs_struct_by_name(source.elementType, target.elementType)
    if isinstance(source, MapType) and isinstance(target, MapType):
        return needs_struct_by_name(source.keyType, target.keyType) or needs_struct_by_name(
            source.valueType, target.valueType
        )
    return False


def struct_by_name(
    text: str, source: DataType, target: DataType, *, allow_missing: bool, where: str, depth: int = 0
) -> str:
    """SQL that stores ``text`` (of type ``source``) into ``target`` pairing struct fields by name, as Delta's
    MERGE does (resolveMergeUpdateStructsByName): every source field must exist in the target, and a target
    field the source lacks is NULL only under schema evolution. Leaves keep ANSI store assignment."""
    if isinstance(source, StructType) and isinstance(target, StructType):
        by_name = {f.name.lower(): f for f in source.fields}
        target_names = set(_field_names(target))
        missing = [f for f in target.fields if f.name.lower() not in by_name]
        if any(name not in target_names for name in by_name) or (missing and not allow_missing):
            raise MergeResolutionError(
                f"{where}: Cannot cast {source.simpleString()} to {target.simpleString()}. All nested columns must "
                "match.",
                field=where,
            )
        parts = []
        for f in target.fields:
            sf = by_name.get(f.name.lower())
            value = (
                "NULL"
                if sf is None
                else struct_by_name(
                    f"({text}).{quote_identifier(sf.name)}",
                    sf.dataType,
                    f.dataType,
                    allow_missing=allow_missing,
                    where=where,
                    depth=depth + 1,
                )
            )
            parts.append(f"{sql_string(f.name)}, CAST({value} AS {sql_type(f.dataType)})")
        return f"CASE WHEN ({text}) IS NULL THEN NULL ELSE named_struct({', '.join(parts)}) END"
    if isinstance(source, ArrayType) and isinstance(target, ArrayType) and needs_struct_by_name(source, target):
        element = internal_column(f"element_{depth}")
        inner = struct_by_name(
            element, source.elementType, target.elementType, allow_missing=allow_missing, where=where, depth=depth + 1
        )
        return f"transform({text}, {element} -> {inner})"
    if isinstance(source, MapType) and isinstance(target, MapType) and needs_struct_by_name(source, target):
        return _map_by_name(text, source, target, allow_missing=allow_missing, where=where, depth=depth)
    if source != target and not can_ansi_cast(source, target):
        raise MergeResolutionError(
            f"{where}: cannot store {source.simpleString()} into {target.simpleString()} under ANSI store assignment.",
            field=where,
        )
    return text


def _map_by_name(text: str, source: MapType, target: MapType, *, allow_missing: bool, where: str, depth: int) -> str:
    """A map's values, then its keys, stored by name where they hold structs (a positional cast would pair the
    wrong fields of a struct inside a map as it would anywhere else)."""
    key, value = internal_column(f"key_{depth}"), internal_column(f"value_{depth}")
    if needs_struct_by_name(source.valueType, target.valueType):
        inner = struct_by_name(
            value, source.valueType, target.valueType, allow_missing=allow_missing, where=where, depth=depth + 1
        )
        text = f"transform_values({text}, ({key}, {value}) -> {inner})"
    if needs_struct_by_name(source.keyType, target.keyType):
        inner = struct_by_name(
            key, source.keyType, target.keyType, allow_missing=allow_missing, where=where, depth=depth + 1
        )
        text = f"transform_keys({text}, ({key}, {value}) -> {inner})"
    return text


def stored_columns(
    values: list[tuple[str, bool]],
    types: list[DataType],
    out_fields: list[StructField],
    where: str,
    *,
    schema_evolution: bool,
) -> list[Column]:
    """Each of a clause's values (SQL, and whether it is an assignment to check) as its column's type stores it."""
    columns = []
    for f, (text, check), vtype in zip(out_fields, values, types, strict=True):
        # A kept target value (unchecked) misses only the fields schema evolution added.
        columns.append(
            F.expr(
                stored_sql(
                    text,
                    vtype,
                    f.dataType,
                    where,
                    f"column {f.name}",
                    allow_missing=schema_evolution or not check,
                    check=check,
                    column=f.name if check else None,
                )
            )
        )
    return columns


def stored_sql(
    text: str,
    vtype: DataType,
    target: DataType,
    where: str,
    what: str,
    *,
    allow_missing: bool,
    check: bool = True,
    column: str | None = None,
) -> str:
    """``text`` as a value of ``target`` (``what`` is the column or field it goes to): structs by name, the
    rest cast as Delta's MERGE casts them (``can_ansi_cast``; checked unless ``check`` is off). A value too large
    for the top-level ``column`` fails with Delta's error, which names it."""
    if needs_struct_by_name(vtype, target):
        return struct_by_name(text, vtype, target, allow_missing=allow_missing, where=f"{where} {what}")
    if vtype == target:
        return text
    if check and not can_ansi_cast(vtype, target):
        raise MergeResolutionError(
            f"{where}: cannot assign {text!r} ({vtype.simpleString()}) to {what} ({target.simpleString()}): "
            f"cannot cast {vtype.simpleString()} to {target.simpleString()} under ANSI store assignment.",
            field=where,
        )
    stored_type = sql_type(target)
    cast = f"CAST(({text}) AS {stored_type})"
    if column is None or not may_overflow(vtype, target) or not is_deterministic(text):
        return cast
    # Spark's CAST_OVERFLOW names the value and the types; Delta's write names the column, and so does this check
    # (try_cast is NULL for a non-NULL value only where the ANSI cast would overflow). It evaluates the value more
    # than once, so a value that may differ between evaluations keeps Spark's check alone.
    message = (
        f'[{CAST_OVERFLOW_MARKER}] Failed to write a value of "{vtype.simpleString().upper()}" type into the '
        f'"{target.simpleString().upper()}" type column {quote_identifier(column)} due to an overflow. Use '
        "`try_cast` on the value to store NULL instead."
    )
    return (
        f"CASE WHEN try_cast(({text}) AS {stored_type}) IS NULL AND ({text}) IS NOT NULL "
        f"THEN raise_error({sql_string(message)}) ELSE {cast} END"
    )


def may_overflow(source: DataType, target: DataType) -> bool:
    """Whether the ANSI cast from one numeric type to another can fail on a value too large for ``target``; a
    cast between other types fails on malformed input, not an overflow."""
    if not isinstance(source, NumericType) or not isinstance(target, NumericType):
        return False
    if isinstance(target, (FloatType, DoubleType)):
        return False
    if isinstance(source, (FloatType, DoubleType)):
        return True
    held = target.precision - target.scale if isinstance(target, DecimalType) else _DIGITS_HELD[type(target)]
    needed = source.precision - source.scale if isinstance(source, DecimalType) else _DIGITS_NEEDED[type(source)]
    if isinstance(source, DecimalType) and isinstance(target, DecimalType) and target.scale < source.scale:
        needed += 1  # rounding to fewer decimals can carry into one more integer digit (999.99 to 1000)
    return needed > held
