"""MERGE INTO statements in the Delta Lake dialect of Spark SQL, read with sqlglot into a MergeSpec.

Tables are named by path: ``delta.`/lake/t```, ``parquet.`/lake/f``` (and json, csv). The source may also be a
parenthesised SELECT over such tables; each table it reads becomes a named relation of a QuerySource.
"""

from __future__ import annotations

import re
from typing import Literal, cast

import sqlglot
from sqlglot import exp

from engine.delta import quote_identifier, quote_path
from engine.errors import MergeSpecError
from engine.expression_rules import check_source_query, spark_text, visible_ctes
from engine.expressions import DIALECT, MAX_EXPRESSION_NESTING, nesting_depth, parse_error_text, sql
from engine.identifiers import InvalidIdentifierError, quote_merge_names
from engine.spark_dialect import check_kept
from engine.spec import (
    Action,
    DeleteAction,
    InsertAction,
    MergeClause,
    MergeSpec,
    QuerySource,
    Source,
    TableSource,
    UpdateAction,
)
from engine.sql_relations import table_source

MAX_STATEMENT_NESTING = MAX_EXPRESSION_NESTING + 8
"""A statement nests its expressions inside its own parentheses (a source query, a subquery in it); each
expression is held to MAX_EXPRESSION_NESTING afterwards. Checked by a scan before sqlglot recurses."""


def _alias(node: exp.Expr, default: str) -> str:
    alias = node.args.get("alias")
    return str(alias.name) if alias is not None and alias.name else default


def _source(using: exp.Expr) -> Source:
    if isinstance(using, exp.Table):
        return table_source(using, "USING")
    if isinstance(using, exp.Subquery) and isinstance(using.this, exp.Query):
        where = "USING (SELECT ...)"
        query = using.this.copy()
        relations: dict[str, TableSource] = {}
        unaliased: dict[tuple[str, ...], str] = {}
        for table in list(query.find_all(exp.Table)):
            if not table.args.get("db") and table.name.lower() in visible_ctes(table):
                continue  # a name the query's own WITH defines, in scope here
            if table.find_ancestor(exp.Hint, exp.JoinHint) is not None:
                continue  # check_source_query refuses the hint itself
            source = table_source(table, where)
            name = f"__merge_source_{len(relations)}"
            relations[name] = source
            replacement = exp.to_table(name)
            alias = table.args.get("alias")
            if alias is not None:
                replacement.set("alias", alias.copy())
            elif table.name:  # not a table-valued function such as table_changes
                replacement.set("alias", exp.TableAlias(this=exp.to_identifier(table.name, quoted=True)))
                unaliased[(source.format, table.name)] = table.name
            table.replace(replacement)
        _requalify(query, unaliased)
        check_source_query(query, relations.keys(), where)
        return QuerySource(query=spark_text(query, where), relations=relations)
    raise MergeSpecError(
        "USING: expected delta.`/path`, a file format and path, or a parenthesised SELECT.", field="USING"
    )


_PLAIN_NAME = re.compile(r"\w+")


def _column_parts(column: exp.Expression, where: str) -> list[str]:
    """The name parts of a column an assignment or an INSERT column list names."""
    if not isinstance(column, exp.Column) or not all(isinstance(p, exp.Identifier) for p in column.parts):
        raise MergeSpecError(f"{where}: expected a column name, got {sql(column)!r}.", field=where)
    return [str(p.name) for p in column.parts]


def _column_key(parts: list[str]) -> str:
    """A column path as the spec holds it, a part backquoted unless it is a plain word: read back by
    ``column_path``, it names the same parts whatever characters or keywords they are."""
    return ".".join(n if _PLAIN_NAME.fullmatch(n) else quote_identifier(n) for n in parts)


def _assignments(pairs: list[exp.Expression], where: str) -> dict[str, str]:
    result: dict[str, str] = {}
    seen: set[tuple[str, ...]] = set()
    for pair in pairs:
        if not isinstance(pair, exp.EQ) or not isinstance(pair.left, exp.Column):
            raise MergeSpecError(f"{where}: expected column = expression, got {sql(pair)!r}.", field=where)
        parts = _column_parts(pair.left, where)
        if tuple(p.lower() for p in parts) in seen:
            raise MergeSpecError(f"{where}: the column {quote_path(parts)} is assigned twice.", field=where)
        seen.add(tuple(p.lower() for p in parts))
        result[_column_key(parts)] = sql(pair.right)
    return result


def _star(node: exp.Expr, where: str) -> bool:
    """Whether ``node`` is ``*``; a ``* EXCEPT (...)`` is refused rather than read as every column."""
    if not isinstance(node, exp.Star):
        return False
    if any(node.args.get(k) for k in ("except_", "except", "replace", "rename", "ilike")):
        raise MergeSpecError(
            f"{where}: {sql(node)!r} is not supported; list the columns to assign instead.", field=where
        )
    return True


def _action(when: exp.When, where: str) -> Action:
    then = when.args.get("then")
    if isinstance(then, exp.Var) and then.name.upper() == "DELETE":
        return DeleteAction()
    if isinstance(then, exp.Update):
        items = then.expressions
        if len(items) == 1 and _star(items[0], where):
            return UpdateAction(star=True)
        if not items:
            raise MergeSpecError(f"{where}: UPDATE SET needs at least one column = expression.", field=where)
        return UpdateAction(set=_assignments(items, where))
    if isinstance(then, exp.Insert):
        if _star(then.this, where):
            return InsertAction(star=True)
        columns = then.this.expressions if isinstance(then.this, exp.Tuple) else []
        values = then.expression.expressions if isinstance(then.expression, exp.Tuple) else []
        if not columns or len(columns) != len(values):
            raise MergeSpecError(f"{where}: INSERT needs a column list and as many VALUES.", field=where)
        names = [_column_key(_column_parts(c, where)) for c in columns]
        if len({n.lower() for n in names}) != len(names):
            raise MergeSpecError(f"{where}: a column appears twice in the INSERT column list.", field=where)
        return InsertAction(values=dict(zip(names, (sql(v) for v in values), strict=True)))
    raise MergeSpecError(f"{where}: unsupported action {sql(then) if then else 'none'!r}.", field=where)


def _qualifiers(table: exp.Expr, alias: str) -> dict[tuple[str, ...], str]:
    """The names an unaliased path table answers to in expressions, as Spark resolves them: ``delta.`/p`.col``
    and `` `/p`.col``."""
    if not isinstance(table, exp.Table) or table.args.get("alias") is not None:
        return {}
    return {(table.db.lower(), table.name): alias, ("", table.name): alias}


def _requalify(node: exp.Expr, qualifiers: dict[tuple[str, ...], str]) -> None:
    """Columns qualified by an unaliased table's name, qualified by the alias the spec uses for it instead."""
    if not qualifiers:
        return
    for column in node.find_all(exp.Column):
        if not column.table or column.catalog:
            continue
        alias = qualifiers.get(((column.db or "").lower(), column.table))
        if alias is not None:
            column.set("db", None)
            column.set("table", exp.to_identifier(alias))


_WITH_SCHEMA_EVOLUTION = re.compile(
    r"^((?:\s|--[^\n]*(?:\n|$)|/\*.*?\*/)*MERGE)\s+WITH\s+SCHEMA\s+EVOLUTION(\s+INTO\b)", re.IGNORECASE | re.DOTALL
)
"""The clause sqlglot does not read, after any leading whitespace and comments."""


def parse_merge_sql(text: str) -> MergeSpec:
    """The spec of one MERGE INTO statement; anything else is a MergeSpecError naming what is wrong.
    ``MERGE WITH SCHEMA EVOLUTION INTO`` (Spark 4 and Delta's syntax) is the merge with schema evolution."""
    text, evolution = _WITH_SCHEMA_EVOLUTION.subn(r"\1\2", text, count=1)
    merge = _merge_statement(text)
    target = merge.this
    if not isinstance(target, exp.Table):
        raise MergeSpecError("sql: MERGE INTO must name the target as delta.`/path`.", field="sql")
    target_source = table_source(target, "MERGE INTO")
    if target_source.format != "delta":
        raise MergeSpecError("sql: the target of a merge must be a Delta table: delta.`/path`.", field="sql")
    using = merge.args.get("using")
    on = merge.args.get("on")
    if using is None or not isinstance(on, exp.Expression):
        raise MergeSpecError("sql: MERGE needs USING and ON.", field="sql")
    target_alias, source_alias = _alias(target, "target"), _alias(using, "source")
    source_names, target_names = _qualifiers(using, source_alias), _qualifiers(target, target_alias)
    # A table merged into itself without aliases leaves its name ambiguous, as Spark finds it.
    qualifiers = {
        k: v for k, v in {**source_names, **target_names}.items() if not (k in source_names and k in target_names)
    }
    whens = merge.args.get("whens")
    for node in (on, whens):
        if node is not None:
            _requalify(node, qualifiers)
    groups = _clauses(whens)
    return MergeSpec(
        target=target_source.path,
        source=_source(using),
        on=sql(on),
        matched=tuple(groups["matched"]),
        not_matched=tuple(groups["notMatched"]),
        not_matched_by_source=tuple(groups["notMatchedBySource"]),
        target_alias=target_alias,
        source_alias=source_alias,
        schema_evolution=bool(evolution),
    )


_MERGE_GRAMMAR = frozenset({"by", "target"})
"""``WHEN NOT MATCHED BY TARGET`` is ``WHEN NOT MATCHED``; sqlglot reads the two words as names."""


def _merge_statement(text: str) -> exp.Merge:
    """The one MERGE statement of ``text``, parsed once its nesting is known to be bounded."""
    nesting = nesting_depth(text)
    if nesting > MAX_STATEMENT_NESTING:
        raise MergeSpecError(
            f"sql: parentheses or brackets nest {nesting} levels deep; at most {MAX_STATEMENT_NESTING} are accepted.",
            field="sql",
        )
    try:
        text = quote_merge_names(text)
    except InvalidIdentifierError as exc:
        raise MergeSpecError(f"sql: {exc}", field="sql") from None
    try:
        statements = [s for s in sqlglot.parse(text, read=DIALECT) if s is not None]
    except Exception as exc:
        raise MergeSpecError(f"sql: cannot parse the MERGE statement: {parse_error_text(exc)}", field="sql") from None
    if len(statements) != 1 or not isinstance(statements[0], exp.Merge):
        raise MergeSpecError("sql: expected exactly one MERGE INTO statement.", field="sql")
    check_kept(text, sql(statements[0], "sql"), "sql", grammar=_MERGE_GRAMMAR)
    return statements[0]


def _clauses(whens: exp.Expr | None) -> dict[str, list[MergeClause]]:
    """The WHEN clauses by Delta's clause type, in their order."""
    groups: dict[str, list[MergeClause]] = {"matched": [], "notMatched": [], "notMatchedBySource": []}
    for when in whens.expressions if whens is not None else []:
        if when.args.get("matched"):
            kind = "matched"
        elif when.args.get("source"):
            kind = "notMatchedBySource"
        else:
            kind = "notMatched"
        where = f"sql: clause {sum(len(g) for g in groups.values()) + 1}"
        condition = when.args.get("condition")
        groups[kind].append(
            MergeClause(
                clause_type=cast(Literal["matched", "notMatched", "notMatchedBySource"], kind),
                action=_action(when, where),
                condition=sql(condition) if condition is not None else None,
            )
        )
    return groups
