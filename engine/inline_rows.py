"""Inline rows (a ``RowsSource``) as typed Arrow data: the schema's Spark DDL read into Arrow types, and every
value converted and checked against its column.

Inline rows are converted here, not in Spark, so the service can refuse a bad value at submission (naming the
row and column) with the same code that later builds the DataFrame.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import functools
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from engine.errors import SourceError, SourceRowError
from engine.expressions import parse_error_text
from engine.spark_dialect import DIALECT

MAX_NESTING = 32
"""The deepest nesting of structs, arrays and maps in inline rows and their schema: deeper data is refused at
submission rather than failing in Spark or in a parser's recursion."""
MAX_DECIMAL_PRECISION = 38
"""Spark's DECIMAL: precision 1 to 38, scale 0 to the precision."""
_DECIMAL_CONTEXT = decimal.Context(prec=2 * MAX_DECIMAL_PRECISION + 2)
"""Room for any DECIMAL(38, s) value while it is rounded to its scale (Python's default context holds 28 digits)."""
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

_SIMPLE_TYPES: Mapping[exp.DType, pa.DataType] = {
    exp.DataType.Type.BIGINT: pa.int64(),
    exp.DataType.Type.INT: pa.int32(),
    exp.DataType.Type.SMALLINT: pa.int16(),
    exp.DataType.Type.TINYINT: pa.int8(),
    exp.DataType.Type.DOUBLE: pa.float64(),
    exp.DataType.Type.FLOAT: pa.float32(),
    exp.DataType.Type.BOOLEAN: pa.bool_(),
    exp.DataType.Type.TEXT: pa.string(),
    exp.DataType.Type.VARCHAR: pa.string(),
    exp.DataType.Type.CHAR: pa.string(),
    exp.DataType.Type.DATE: pa.date32(),
    exp.DataType.Type.TIMESTAMP: pa.timestamp("us", tz="UTC"),
    exp.DataType.Type.TIMESTAMPTZ: pa.timestamp("us", tz="UTC"),
    exp.DataType.Type.TIMESTAMPLTZ: pa.timestamp("us", tz="UTC"),
    exp.DataType.Type.TIMESTAMPNTZ: pa.timestamp("us"),
    exp.DataType.Type.DATETIME: pa.timestamp("us"),
    exp.DataType.Type.BINARY: pa.binary(),
    exp.DataType.Type.VARBINARY: pa.binary(),
}


def _decimal_type(node: exp.DataType, column: str) -> pa.DataType:
    """DECIMAL, DECIMAL(p) or DECIMAL(p, s) within Spark's bounds."""
    written = node.sql(dialect=DIALECT)
    if len(node.expressions) > 2:
        raise SourceError(
            f"schema: {written} of column {column!r}: DECIMAL takes at most a precision and a scale.", field="schema"
        )
    try:
        params = [int(p.name) for p in node.expressions]
    except ValueError:
        raise SourceError(
            f"schema: {written} of column {column!r}: the precision and scale must be whole numbers.", field="schema"
        ) from None
    precision = params[0] if params else 10
    scale = params[1] if len(params) > 1 else 0
    if not 1 <= precision <= MAX_DECIMAL_PRECISION:
        raise SourceError(
            f"schema: {written} of column {column!r}: the precision must be 1 to {MAX_DECIMAL_PRECISION}, "
            "as Spark's DECIMAL takes it.",
            field="schema",
        )
    if not 0 <= scale <= precision:
        raise SourceError(
            f"schema: {written} of column {column!r}: the scale must be 0 to the precision ({precision}), "
            "as Spark's DECIMAL takes it.",
            field="schema",
        )
    return pa.decimal128(precision, scale)


def _arrow_type(node: exp.DataType, column: str, depth: int = 0) -> pa.DataType:
    kind = node.this
    if kind in _SIMPLE_TYPES:
        return _SIMPLE_TYPES[kind]
    if kind == exp.DataType.Type.DECIMAL:
        return _decimal_type(node, column)
    if depth >= MAX_NESTING:
        raise SourceError(
            f"schema: the type of column {column!r} nests more than {MAX_NESTING} levels deep.", field="schema"
        )
    if kind == exp.DataType.Type.ARRAY and node.expressions:
        return pa.list_(_arrow_type(node.expressions[0], column, depth + 1))
    if kind == exp.DataType.Type.MAP and len(node.expressions) == 2:
        return pa.map_(
            _arrow_type(node.expressions[0], column, depth + 1), _arrow_type(node.expressions[1], column, depth + 1)
        )
    if kind == exp.DataType.Type.STRUCT:
        fields = []
        for field in node.expressions:
            ftype = field.args.get("kind")
            if not isinstance(field, exp.ColumnDef) or ftype is None:
                raise SourceError(
                    f"schema: cannot read the struct field {field.sql()!r} of {column!r}.", field="schema"
                )
            fields.append(pa.field(field.name, _arrow_type(ftype, f"{column}.{field.name}", depth + 1)))
        return pa.struct(fields)
    raise SourceError(
        f"schema: the type {node.sql(dialect=DIALECT)} of column {column!r} is not supported.", field="schema"
    )


@functools.lru_cache(maxsize=256)
def ddl_to_arrow(ddl: str) -> pa.Schema:
    """A Spark DDL column list (``id BIGINT, name STRING``) as an Arrow schema. Cached: integrations send the
    same few schemas with every batch, and the parse costs more than typing the rows."""
    if re.search(r"(^\s*,)|(,\s*(,|$))", ddl):
        raise SourceError(f"schema: {ddl!r} has an empty column definition.", field="schema")
    try:
        create = sqlglot.parse_one(f"CREATE TABLE t ({ddl})", read=DIALECT)
    except ParseError as exc:
        detail = parse_error_text(exc)
        raise SourceError(
            f"schema: cannot parse {_text(ddl)} as a Spark DDL column list: {detail}", field="schema"
        ) from None
    except RecursionError:
        raise SourceError(f"schema: {_text(ddl)} nests more than {MAX_NESTING} levels deep.", field="schema") from None
    except Exception as exc:
        raise SourceError(
            f"schema: cannot parse {_text(ddl)} as a Spark DDL column list: {exc}", field="schema"
        ) from None
    schema = create.this if isinstance(create, exp.Create) else None
    if not isinstance(schema, exp.Schema) or not schema.expressions:
        raise SourceError(f"schema: {ddl!r} is not a column list such as 'id BIGINT, name STRING'.", field="schema")
    fields = []
    for column in schema.expressions:
        kind = column.args.get("kind") if isinstance(column, exp.ColumnDef) else None
        if kind is None:
            raise SourceError(f"schema: {column.sql()!r} needs a name and a type.", field="schema")
        not_null = any(
            isinstance(c.kind, exp.NotNullColumnConstraint) and not c.kind.args.get("allow_null")
            for c in column.args.get("constraints") or []
        )
        fields.append(pa.field(column.name, _arrow_type(kind, column.name), nullable=not not_null))
    names = [f.name.lower() for f in fields]
    if len(set(names)) != len(names):
        raise SourceError("schema: a column name appears twice.", field="schema")
    return pa.schema(fields)


def _parse_timestamp(value: Any, with_zone: bool) -> dt.datetime:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return dt.datetime.fromtimestamp(value, tz=dt.UTC)
    if not isinstance(value, str):
        raise ValueError("expected an ISO-8601 timestamp string")
    parsed = dt.datetime.fromisoformat(value.strip().replace(" ", "T", 1) if "T" not in value else value.strip())
    if with_zone:
        return parsed.replace(tzinfo=dt.UTC) if parsed.tzinfo is None else parsed.astimezone(dt.UTC)
    # TIMESTAMP_NTZ keeps the wall-clock time and drops an offset, as Spark's CAST of the same text does.
    return parsed.replace(tzinfo=None)


def _integer(value: Any, bits: int) -> int:
    if isinstance(value, bool):
        raise ValueError("expected an integer, got a boolean")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{value} is not an integer")
        value = int(value)
    number = int(value) if isinstance(value, (int, str)) else None
    if number is None:
        raise ValueError(f"expected an integer, got {type(value).__name__}")
    if not -(2 ** (bits - 1)) <= number < 2 ** (bits - 1):
        raise ValueError(f"{number} does not fit in a {bits}-bit integer")
    return number


def _converter(dtype: pa.DataType) -> Callable[[Any], Any]:
    """The function that turns one JSON value into the Arrow value of ``dtype``; ValueError when it cannot."""
    if pa.types.is_integer(dtype):
        return lambda v: _integer(v, dtype.bit_width)
    if pa.types.is_floating(dtype):
        return _to_float
    if pa.types.is_decimal(dtype):
        return _decimal_converter(dtype)
    if pa.types.is_boolean(dtype):
        return _to_bool
    if pa.types.is_string(dtype):
        return _to_str
    if pa.types.is_timestamp(dtype):
        return lambda v: _parse_timestamp(v, dtype.tz is not None)
    if pa.types.is_date(dtype):
        return lambda v: dt.date.fromisoformat(v) if isinstance(v, str) else _fail("expected a date string")
    if pa.types.is_binary(dtype):
        return lambda v: base64.b64decode(v, validate=True) if isinstance(v, str) else _fail("expected base64")
    if pa.types.is_list(dtype):
        inner = _converter(dtype.value_type)
        return lambda v: (
            [None if x is None else inner(x) for x in v] if isinstance(v, list) else _fail("expected a JSON array")
        )
    if pa.types.is_map(dtype):
        key, item = _converter(dtype.key_type), _converter(dtype.item_type)
        return lambda v: (
            [(key(k), None if x is None else item(x)) for k, x in v.items()]
            if isinstance(v, dict)
            else _fail("expected a JSON object")
        )
    if pa.types.is_struct(dtype):
        return _struct_converter(dtype)
    return lambda v: v


def _to_float(v: Any) -> float:
    if isinstance(v, bool):
        raise ValueError("expected a number, got a boolean")
    return float(v)


def _decimal_converter(dtype: pa.Decimal128Type) -> Callable[[Any], decimal.Decimal]:
    quantum = decimal.Decimal(1).scaleb(-dtype.scale)
    integer_digits = dtype.precision - dtype.scale

    def fits(number: decimal.Decimal) -> bool:
        return number.is_zero() or number.adjusted() < integer_digits

    def to_decimal(v: Any) -> decimal.Decimal:
        if isinstance(v, bool):
            raise ValueError("expected a decimal, got a boolean")
        try:
            number = decimal.Decimal(str(v))
        except decimal.InvalidOperation:
            raise ValueError("expected a decimal number") from None
        if not number.is_finite():
            raise ValueError("expected a finite decimal number")
        # Checked before rounding too: a number far too large would overflow any rounding context.
        if fits(number):
            rounded = number.quantize(quantum, rounding=decimal.ROUND_HALF_UP, context=_DECIMAL_CONTEXT)
            if fits(rounded):
                return rounded
        raise ValueError(f"{_number_text(v)} does not fit DECIMAL({dtype.precision},{dtype.scale})")

    return to_decimal


def _to_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false"):
        return v.lower() == "true"
    raise ValueError("expected true or false")


def _to_str(v: Any) -> str:
    if isinstance(v, (dict, list)):
        raise ValueError("expected a string")
    return v if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)


def _struct_converter(dtype: pa.StructType) -> Callable[[Any], dict[str, Any]]:
    fields = {dtype.field(i).name: _converter(dtype.field(i).type) for i in range(dtype.num_fields)}

    def to_struct(v: Any) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise ValueError("expected a JSON object")
        unknown = set(v) - set(fields)
        if unknown:
            raise ValueError(f"unknown struct fields {sorted(unknown)}")
        return {k: None if v.get(k) is None else conv(v[k]) for k, conv in fields.items()}

    return to_struct


def _fail(message: str) -> Any:
    raise ValueError(message)


def _text(ddl: str, limit: int = 120) -> str:
    """A schema quoted for an error message, cut short when long."""
    return repr(ddl) if len(ddl) <= limit else repr(ddl[:limit]) + f"... ({len(ddl)} characters)"


def _value_text(value: Any) -> str:
    """A row value quoted for an error message, cut short when long."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"


def _number_text(value: Any) -> str:
    """A number for an error message, cut short when it runs to hundreds of digits."""
    text = str(value)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"


def _integers_out_of_range(value: Any, path: str) -> Iterator[tuple[str, int]]:
    """Integers in a JSON value (at any depth) that no 64-bit integer holds, with their path."""
    stack = [(value, path)]
    while stack:
        current, where = stack.pop()
        if isinstance(current, int) and not isinstance(current, bool):
            if not INT64_MIN <= current <= INT64_MAX:
                yield where, current
        elif isinstance(current, Mapping):
            stack.extend((v, f"{where}.{k}") for k, v in current.items())
        elif isinstance(current, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(current))


def _inferred_integer_error(rows: Sequence[Mapping[str, Any]]) -> SourceRowError | None:
    """Without a schema a JSON integer is inferred as BIGINT: the first one beyond its range, named."""
    for index, row in enumerate(rows):
        for column, value in row.items():
            for where, number in _integers_out_of_range(value, f"rows[{index}].{column}"):
                return SourceRowError(
                    f"{where}: {_number_text(number)} does not fit a 64-bit integer (BIGINT, the type a JSON "
                    "integer is given without a schema); give a schema with a DECIMAL(38,0) or STRING column.",
                    row=index,
                    column=str(column),
                    field=where,
                )
    return None


def rows_to_arrow(rows: Sequence[Mapping[str, Any]], schema: str | None) -> pa.Table:
    """Typed Arrow data for inline rows; a value that does not convert raises SourceRowError naming it."""
    if not rows:
        if schema is None:
            raise SourceError("rows: an empty rows source needs a schema.", field="rows")
        return ddl_to_arrow(schema).empty_table()
    if schema is None:
        return _inferred_table(rows)
    return _typed_table(rows, ddl_to_arrow(schema))


def _inferred_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Rows without a schema: each column's type inferred from its JSON values."""
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise SourceRowError(f"rows[{index}] is not a JSON object.", row=index, column="")
    try:
        table = pa.Table.from_pylist([dict(r) for r in rows])
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        out_of_range = _inferred_integer_error(rows)
        if out_of_range is not None:
            raise out_of_range from None
        raise SourceError(f"rows: cannot infer one type per column ({exc}); give a schema.", field="rows") from None
    # A column that is NULL in every row has no type Spark can store; string is Spark's own choice.
    for i, field in enumerate(table.schema):
        if pa.types.is_null(field.type):
            table = table.set_column(i, field.name, table.column(i).cast(pa.string()))
    return table


def _typed_table(rows: Sequence[Mapping[str, Any]], arrow_schema: pa.Schema) -> pa.Table:
    """Rows typed by their schema, every value converted and checked."""
    by_name = {f.name.lower(): f for f in arrow_schema}
    converters = {f.name: _converter(f.type) for f in arrow_schema}
    columns: dict[str, list[Any]] = {f.name: [] for f in arrow_schema}
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise SourceRowError(f"rows[{index}] is not a JSON object.", row=index, column="")
        values = {}
        for key, value in row.items():
            field = by_name.get(str(key).lower())
            if field is None:
                raise SourceRowError(
                    f"rows[{index}].{key}: not a column of the schema.",
                    row=index,
                    column=str(key),
                    field=f"rows[{index}].{key}",
                )
            values[field.name] = value
        for name, convert in converters.items():
            value = values.get(name)
            if value is None:
                if not by_name[name.lower()].nullable:
                    raise SourceRowError(
                        f"rows[{index}].{name}: NULL in a NOT NULL column.",
                        row=index,
                        column=name,
                        field=f"rows[{index}].{name}",
                    )
                columns[name].append(None)
                continue
            try:
                columns[name].append(convert(value))
            except (ValueError, TypeError, ArithmeticError, decimal.InvalidOperation) as exc:
                declared = by_name[name.lower()].type
                raise SourceRowError(
                    f"rows[{index}].{name}: {_value_text(value)} does not convert to {declared}: {exc}",
                    row=index,
                    column=name,
                    field=f"rows[{index}].{name}",
                ) from None
    try:
        return pa.table(columns, schema=arrow_schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise SourceError(f"rows: {exc}", field="rows") from None
