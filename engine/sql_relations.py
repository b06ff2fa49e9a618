"""The tables a MERGE statement names, as sources: ``delta.`/lake/t``` (or parquet., json., csv.), a Delta table at
an earlier version (``VERSION AS OF``, ``TIMESTAMP AS OF``), or a Delta table's Change Data Feed (Delta's
``table_changes('delta.`/lake/t`', start[, end])`` and ``table_changes_by_path('/lake/t', start[, end])``).
Each becomes a TableSource whose reader options say what is read."""

from __future__ import annotations

from typing import Literal, cast

import sqlglot
from sqlglot import exp

from engine.errors import MergeSpecError
from engine.expressions import DIALECT, sql
from engine.spec import TableSource

FORMATS = ("delta", "parquet", "json", "csv")
CHANGE_FEED_FUNCTIONS = ("table_changes", "table_changes_by_path")


def table_source(table: exp.Table, where: str) -> TableSource:
    if table.args.get("sample") is not None:
        raise MergeSpecError(f"{where}: TABLESAMPLE is not supported; got {sql(table)!r}.", field=where)
    travel = table.args.get("version")
    if travel is not None and where == "MERGE INTO":
        raise MergeSpecError(
            f"{where}: a merge writes the table's latest version; time travel (VERSION/TIMESTAMP AS OF) reads "
            f"sources only; got {sql(table)!r}.",
            field=where,
        )
    function = table.this
    if isinstance(function, exp.Anonymous) and str(function.name).lower() in CHANGE_FEED_FUNCTIONS:
        if where == "MERGE INTO":
            raise MergeSpecError(f"{where}: a merge writes a table, not its changes; got {sql(table)!r}.", field=where)
        if travel is not None:
            raise MergeSpecError(
                f"{where}: [DELTA_UNSUPPORTED_TIME_TRAVEL_VIEWS] Cannot time travel views, subqueries, streams or "
                f"change data feed queries; got {sql(table)!r}.",
                field=where,
            )
        return _change_feed_source(function, where)
    if not isinstance(function, exp.Identifier):
        raise MergeSpecError(
            f"{where}: table-valued functions ({sql(function)}) are not allowed; read tables by path, as "
            "delta.`/path`, or a Delta table's changes with table_changes or table_changes_by_path.",
            field=where,
        )
    fmt = (table.db or "").lower()
    if fmt not in FORMATS or not table.name or table.catalog:
        raise MergeSpecError(
            f"{where}: name tables by path, as delta.`/path` (or parquet., json., csv.); got {sql(table)!r}.",
            field=where,
        )
    options = _time_travel_options(travel, fmt, where) if travel is not None else {}
    return TableSource(format=cast(Literal["delta", "parquet", "json", "csv"], fmt), path=table.name, options=options)


def _time_travel_options(travel: exp.Expr, fmt: str, where: str) -> dict[str, str]:
    """``VERSION AS OF 3`` or ``TIMESTAMP AS OF '2024-01-01'`` on a Delta source, as its reader options; a
    timestamp is a literal, read in the session's time zone as Delta reads it."""
    kind = str(travel.this).upper()
    value = _literal(travel.expression)
    if fmt != "delta":
        raise MergeSpecError(f"{where}: time travel reads Delta tables only; got {sql(travel)!r}.", field=where)
    if kind == "VERSION" and isinstance(value, exp.Literal):
        return {"versionAsOf": str(value.this)}
    if kind == "TIMESTAMP" and isinstance(value, exp.Literal) and value.is_string:
        return {"timestampAsOf": str(value.this)}
    expected = "a version number" if kind == "VERSION" else "a timestamp literal such as '2024-01-01 00:00:00'"
    raise MergeSpecError(f"{where}: {kind} AS OF takes {expected}; got {sql(travel)!r}.", field=where)


def _literal(value: exp.Expr) -> exp.Expr:
    """A literal, unwrapped from ``TIMESTAMP '2024-01-01 00:00:00'`` (a cast to a temporal type)."""
    if isinstance(value, exp.Cast) and value.to.is_type(*exp.DataType.TEMPORAL_TYPES):
        return value.this
    return value


def _change_feed_source(function: exp.Anonymous, where: str) -> TableSource:
    """``table_changes`` names the table as ``delta.`/path```, ``table_changes_by_path`` by its path; a bound is
    a version (an integer) or a timestamp (a string or TIMESTAMP literal), as in Delta."""
    name = str(function.name).lower()
    args = list(function.expressions)
    if len(args) not in (2, 3):
        raise MergeSpecError(
            f"{where}: {name} takes the table, a starting version or timestamp, and optionally an ending one; "
            f"got {sql(function)!r}.",
            field=where,
        )
    table = args[0]
    if not (isinstance(table, exp.Literal) and table.is_string):
        raise MergeSpecError(f"{where}: {name}'s first argument is a string literal; got {sql(table)!r}.", field=where)
    path = str(table.this) if name == "table_changes_by_path" else _delta_path(str(table.this), where)
    options = {"readChangeFeed": "true"}
    for bound, arg in zip(("starting", "ending"), args[1:], strict=False):
        value = _literal(arg)
        if isinstance(value, exp.Neg) and isinstance(value.this, exp.Literal) and not value.this.is_string:
            options[f"{bound}Version"] = f"-{value.this.this}"
        elif isinstance(value, exp.Literal) and not value.is_string:
            options[f"{bound}Version"] = str(value.this)
        elif isinstance(value, exp.Literal):
            options[f"{bound}Timestamp"] = str(value.this)
        else:
            raise MergeSpecError(
                f"{where}: {name} takes a version number or a timestamp literal as its {bound} bound; got "
                f"{sql(arg)!r}.",
                field=where,
            )
    return TableSource(format="delta", path=path, options=options)


def _delta_path(name: str, where: str) -> str:
    """The path in ``delta.`/path```: tables are named by path, there being no catalog."""
    try:
        parsed = sqlglot.parse_one(name, read=DIALECT, into=exp.Table)
    except sqlglot.errors.ParseError:
        parsed = None
    if (
        not isinstance(parsed, exp.Table)
        or (parsed.db or "").lower() != "delta"
        or parsed.catalog
        or not isinstance(parsed.this, exp.Identifier)
        or not parsed.name
    ):
        raise MergeSpecError(
            f"{where}: table_changes names a Delta table by path, as 'delta.`/path`'; got {name!r}.", field=where
        )
    return parsed.name
