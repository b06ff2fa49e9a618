"""The rules a Delta table declares for every row written to it, besides NOT NULL (PROTOCOL.md "Column
Invariants", "CHECK Constraints" and "Generated Columns"; Delta's ``Constraints.getAll``): CHECK constraints in
the table properties (``delta.constraints.<name>``), generated columns (which must equal their expression),
legacy column invariants in the schema's field metadata (``delta.invariants``), and the length limits of
CHAR/VARCHAR columns, at any depth, that Delta on Spark records as field metadata. Each is a Spark
SQL predicate over the table's columns; a row passes only when it is true (NULL fails, as in Delta).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from engine.delta.actions import Metadata
from engine.delta.names import quote_identifier, quote_path
from engine.errors import UnsupportedTableFeatureError

CHECK_PREFIX = "delta.constraints."
INVARIANTS_KEY = "delta.invariants"
CHAR_VARCHAR_KEY = "__CHAR_VARCHAR_TYPE_STRING"
GENERATION_KEY = "delta.generationExpression"
CHAR_VARCHAR_CHECK_NAME = "__CHAR_VARCHAR_STRING_LENGTH_CHECK__"


@dataclass(frozen=True)
class Constraint:
    kind: str
    """``check`` (a table property), ``invariant`` (column metadata) or ``length`` (CHAR/VARCHAR)."""
    name: str
    expression: str
    """A Spark SQL predicate over the table's columns."""
    columns: tuple[tuple[str, ...], ...] = ()
    """The column paths the predicate reads, whose values a violation reports."""
    shown: str = ""
    """The predicate as a violation names it."""


def referenced_columns(expression: str, schema_json: Mapping[str, Any]) -> tuple[tuple[str, ...], ...]:
    """The table columns (as paths, spelled as the schema spells them) an expression reads, in order of first
    use; empty when sqlglot cannot read the expression (Spark still evaluates it)."""
    try:
        parsed = sqlglot.parse_one(expression, read="spark")
    except SqlglotError:
        return ()
    top_level = {f["name"].lower(): f for f in schema_json.get("fields", [])}
    found: list[tuple[str, ...]] = []
    for column in parsed.find_all(exp.Column):
        parts = [p.name for p in column.parts]
        field = top_level.get(parts[0].lower()) if parts else None
        if field is None:
            continue
        path = [field["name"]]
        dtype = field.get("type")
        for part in parts[1:]:
            children = dtype.get("fields", []) if isinstance(dtype, Mapping) and dtype.get("type") == "struct" else []
            child = next((c for c in children if c["name"].lower() == part.lower()), None)
            if child is None:
                break
            path.append(child["name"])
            dtype = child.get("type")
        if tuple(path) not in found:
            found.append(tuple(path))
    return tuple(found)


def _fields(
    schema_json: Mapping[str, Any], prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Mapping[str, Any]]]:
    """Every field reached through structs only (Delta does not look into arrays and maps for invariants)."""
    for f in schema_json.get("fields", []):
        path = (*prefix, f["name"])
        yield path, f
        dtype = f.get("type")
        if isinstance(dtype, Mapping) and dtype.get("type") == "struct":
            yield from _fields(dtype, path)


def _invariant_expression(path: tuple[str, ...], raw: Any) -> str:
    try:
        rule = json.loads(raw) if isinstance(raw, str) else raw
        text = rule["expression"]["expression"]
    except (ValueError, KeyError, TypeError):
        text = None
    if not isinstance(text, str) or not text.strip():
        raise UnsupportedTableFeatureError(
            f"Column {'.'.join(path)!r} has an invariant this engine does not recognize: {raw!r}"
        )
    return text


def table_constraints(metadata: Metadata) -> list[Constraint]:
    """Every row rule of the table other than NOT NULL, as Delta's writers enforce them."""
    try:
        schema_json = json.loads(metadata.schema_string)
    except ValueError:
        schema_json = {}
    constraints = []
    for key, text in sorted(metadata.configuration.items()):
        if key.lower().startswith(CHECK_PREFIX):
            expression = str(text)
            constraints.append(
                Constraint(
                    "check",
                    key[len(CHECK_PREFIX) :],
                    expression,
                    referenced_columns(expression, schema_json),
                    f"({expression})",
                )
            )
    constraints += _generated_column_constraints(schema_json)
    for path, f in _fields(schema_json):
        constraints += _column_constraints(path, f.get("metadata") or {}, schema_json)
    return constraints


def _generated_column_constraints(schema_json: dict[str, Any]) -> list[Constraint]:
    """A generated column must hold its expression's value (Delta checks it as a CHECK constraint)."""
    constraints = []
    for f in schema_json.get("fields", []):
        generation = (f.get("metadata") or {}).get(GENERATION_KEY)
        if generation is not None:
            expression = str(generation)
            column = quote_path((f["name"],))
            constraints.append(
                Constraint(
                    "check",
                    "Generated Column",
                    f"{column} <=> ({expression})",
                    tuple(dict.fromkeys([(f["name"],), *referenced_columns(expression, schema_json)])),
                    f"({f['name']} <=> ({expression}))",
                )
            )
    return constraints


def _column_constraints(path: tuple[str, ...], meta: dict[str, Any], schema_json: dict[str, Any]) -> list[Constraint]:
    """A column's invariant and its CHAR/VARCHAR length limit."""
    constraints = []
    if INVARIANTS_KEY in meta:
        expression = _invariant_expression(path, meta[INVARIANTS_KEY])
        constraints.append(
            Constraint(
                "invariant",
                f"EXPRESSION({expression})",
                expression,
                referenced_columns(expression, schema_json),
                f"({expression})",
            )
        )
    raw_type = meta.get(CHAR_VARCHAR_KEY)
    if raw_type is None:
        return constraints
    try:
        declared = exp.DataType.build(str(raw_type), dialect="spark")
        checks = _length_checks(declared, quote_path(path), ".".join(path), depth=0)
    except (SqlglotError, ValueError, TypeError, AttributeError, IndexError):
        raise UnsupportedTableFeatureError(
            f"Column {'.'.join(path)!r} is {raw_type}: a CHAR/VARCHAR type this engine cannot read"
        ) from None
    for expression, shown in checks:
        constraints.append(Constraint("length", CHAR_VARCHAR_CHECK_NAME, expression, (path,), shown))
    return constraints


def _length_checks(declared: exp.DataType, value: str, shown: str, *, depth: int) -> list[tuple[str, str]]:
    """(predicate, as Delta shows it) for each CHAR/VARCHAR length inside a declared type, as Delta's
    ``CharVarcharConstraint`` builds them: one per string a struct holds, at any depth; one per array (and per map's
    keys and values) whose elements hold any, every element checked with ``forall``."""
    kind = declared.this
    if kind in (exp.DataType.Type.CHAR, exp.DataType.Type.VARCHAR):
        limit = int(declared.expressions[0].this.this)  # not a number: the caller refuses the column
        return [
            (f"({value} IS NULL OR length({value}) <= {limit})", f"(({shown} IS NULL) OR (length({shown}) <= {limit}))")
        ]
    if kind == exp.DataType.Type.STRUCT:
        checks = []
        for field in declared.expressions:
            name = field.name
            checks += _length_checks(
                field.args["kind"],
                f"{value}.{quote_identifier(name)}",
                f"{shown}.{quote_identifier(name)}",
                depth=depth,
            )
        return checks
    if kind == exp.DataType.Type.ARRAY:
        return _element_checks(declared.expressions[0], value, shown, depth=depth)
    if kind == exp.DataType.Type.MAP:
        key, item = declared.expressions
        return _element_checks(key, f"map_keys({value})", f"map_keys({shown})", depth=depth) + _element_checks(
            item, f"map_values({value})", f"map_values({shown})", depth=depth
        )
    return []


def _element_checks(element: exp.DataType, array: str, shown: str, *, depth: int) -> list[tuple[str, str]]:
    variable, named = f"__element{depth}", "namedlambdavariable()"
    inner = _length_checks(element, variable, named, depth=depth + 1)
    if not inner:
        return []
    body = " AND ".join(predicate for predicate, _ in inner)
    shown_body = inner[0][1]
    for _, more in inner[1:]:
        shown_body = f"({shown_body} AND {more})"
    return [
        (
            f"({array} IS NULL OR forall({array}, {variable} -> {body}))",
            f"(({shown} IS NULL) OR forall({shown}, lambdafunction({shown_body}, {named})))",
        )
    ]
