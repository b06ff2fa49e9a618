"""Resolving the clauses against the two tables (Delta's ResolveDeltaMergeInto and PreprocessTableMerge).

Scopes: ON and MATCHED clauses see both tables, NOT MATCHED clauses the source only, NOT MATCHED BY SOURCE
clauses the target only. Bare column names in a one-sided clause are qualified with that side's alias, so
Spark resolves them where Delta would. Every expression is analyzed by Spark (one round trip per scope) to
learn its type; assigned values are cast to the target column's type under ANSI store assignment.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from pyspark.errors import PySparkException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DataType,
    NullType,
    StructField,
    StructType,
)
from sqlglot import exp

from engine.assignments import assigned_values
from engine.delta import DEFAULT_KEY, GENERATION_KEY, quote_path
from engine.errors import MergeResolutionError
from engine.expressions import parse_expression, quote_identifier, sql
from engine.identity_values import identity_values
from engine.resolved import ResolvedClause, ResolvedMerge
from engine.schema_evolution import evolved_schema
from engine.spec import InsertAction, MergeClause, UpdateAction
from engine.store_assignment import sql_string, sql_type, stored_columns, stored_sql
from engine.update_star import BuiltSql, lacks_fields, star_update_tree
from engine.validation import ParsedMerge, check_scope, clause_where


def _column_default(column: StructField) -> str:
    """The column's default value as SQL (allowColumnDefaults' CURRENT_DEFAULT), else NULL."""
    default = (column.metadata or {}).get(DEFAULT_KEY)
    return "NULL" if default is None else str(default)


def _qualified_with(node: exp.Expression, alias: str) -> exp.Expression:
    """Bare columns belong to ``alias``, the one side a NOT MATCHED [BY SOURCE] clause sees; so does a struct's
    field named without it (``st.b``), which the other side's column of the same name must not make ambiguous."""
    lambda_vars: set[str] = set()
    for lam in node.find_all(exp.Lambda):
        lambda_vars.update(str(e.name).lower() for e in lam.expressions)
    qualifier = exp.to_identifier(alias, quoted=True)

    def visit(n: exp.Expression) -> exp.Expression:
        if not isinstance(n, exp.Column):
            return n
        parts = [cast(exp.Identifier, p.copy()) for p in n.parts]
        first = str(parts[0].name).lower()
        if first in lambda_vars or first == alias.lower() or len(parts) > 3:
            return n
        if len(parts) == 1:
            return exp.column(n.this.copy(), table=qualifier.copy())
        if len(parts) == 2:
            return exp.column(n.this.copy(), table=parts[0], db=qualifier.copy())
        return exp.column(n.this.copy(), table=parts[1], db=parts[0], catalog=qualifier.copy())

    return node.copy().transform(visit)


class Resolver:
    """Resolves one merge against the source DataFrame and an (empty) target DataFrame of the table schema."""

    def __init__(
        self,
        parsed: ParsedMerge,
        source: DataFrame,
        target: DataFrame,
        target_schema: StructType,
        *,
        type_widening: bool = False,
    ) -> None:
        spec = parsed.spec
        self.parsed = parsed
        self.spec = spec
        self.type_widening = type_widening
        """The table allows type widening: schema evolution widens a column to a wider source type."""
        self.s = spec.source_alias
        self.t = spec.target_alias
        self.source = source.alias(self.s)
        self.target = target.alias(self.t)
        self.target_schema = target_schema
        self.source_schema = source.schema
        self.target_values: dict[str, str] = {}
        self.identity_generated: set[str] = set()

    # --- expressions, scoped --------------------------------------------------------------------------------

    def _scoped_sql(self, text: str, clause_type: str, where: str) -> str:
        node = self.parsed.tree(text)
        check_scope(node, clause_type, self.t, self.s, where)
        if clause_type == "notMatched":
            node = _qualified_with(node, self.s)
        elif clause_type == "notMatchedBySource":
            node = _qualified_with(node, self.t)
        return sql(node)

    def _frame(self, clause_type: str) -> DataFrame:
        if clause_type == "notMatched":
            return self.source
        if clause_type == "notMatchedBySource":
            return self.target
        return self.source.crossJoin(self.target)

    def _analyze(self, clause_type: str, items: Sequence[tuple[str, str]]) -> list[DataType]:
        """Spark's types for ``(where, sql)`` items in one scope; on failure, name the item at fault."""
        return self._analyze_scoped([(clause_type, where, text) for where, text in items])

    def _analyze_scoped(self, items: Sequence[tuple[str, str, str]]) -> list[DataType]:
        """Spark's types for ``(clause type, where, sql)`` items in one round trip to the server: the joined
        rows see both sides, and a NOT MATCHED [BY SOURCE] clause's bare columns are qualified with its one side
        already. On failure each item is analyzed in its own scope, to name the item at fault."""
        if not items:
            return []
        scopes = {clause_type for clause_type, _, _ in items}
        frame = self._frame(scopes.pop()) if len(scopes) == 1 else self._frame("matched")
        try:
            schema = frame.select(*[F.expr(text).alias(f"_e{i}") for i, (_, _, text) in enumerate(items)]).schema
            return [f.dataType for f in schema.fields]
        except PySparkException:
            for clause_type, where, text in items:
                try:
                    self._frame(clause_type).select(F.expr(text)).schema  # noqa: B018
                except PySparkException as exc:
                    raise MergeResolutionError(
                        f"{where}: cannot resolve {text!r}: {_spark_message(exc)}", field=where
                    ) from None
            raise

    # --- star expansion and schema evolution -----------------------------------------------------------------

    def _source_field(self, name: str) -> StructField | None:
        for f in self.source_schema.fields:
            if f.name.lower() == name.lower():
                return f
        return None

    # --- the whole merge ---------------------------------------------------------------------------------------

    def resolve(self) -> ResolvedMerge:
        spec = self.spec
        out_fields, new_columns, target_values = evolved_schema(
            self.parsed, self.target_schema, self.source_schema, type_widening=self.type_widening
        )
        self.target_values = target_values
        clauses = [
            (clause, index, self._clause_items(clause, index, out_fields, new_columns))
            for group in (spec.matched, spec.not_matched, spec.not_matched_by_source)
            for index, clause in enumerate(group)
        ]
        # ON and every clause's conditions and values are typed in one analysis.
        items = [("matched", "on", spec.on)]
        for clause, _, (_, _, clause_items) in clauses:
            items += [(clause.clause_type, where, text) for where, text in clause_items]
        types = self._analyze_scoped(items)
        on_type, offset = types[0], 1
        if not isinstance(on_type, (BooleanType, NullType)):
            raise MergeResolutionError(
                f"on: the merge condition must be boolean, not {on_type.simpleString()}.", field="on"
            )
        resolved = ResolvedMerge(
            on=F.expr(spec.on),
            on_sql=spec.on,
            on_condition=self.parsed.on,
            output_fields=out_fields,
            new_columns=new_columns,
            target_values=target_values,
        )
        by_type = {
            "matched": resolved.matched,
            "notMatched": resolved.not_matched,
            "notMatchedBySource": resolved.not_matched_by_source,
        }
        for clause, index, (cond_sql, values, clause_items) in clauses:
            clause_types = types[offset : offset + len(clause_items)]
            offset += len(clause_items)
            by_type[clause.clause_type].append(
                self._resolved_clause(clause, index, cond_sql, values, clause_types, out_fields)
            )
        resolved.identity_generated = sorted(self.identity_generated)
        resolved.clause_sql = tuple(text for _, _, text in items[1:])
        resolved.target_names = tuple(self.target_schema.fieldNames())
        resolved.target_alias, resolved.source_alias = self.t, self.s
        return resolved

    def _clause_items(
        self, clause: MergeClause, index: int, out_fields: list[StructField], new_columns: list[str]
    ) -> tuple[str | None, list[tuple[str, bool]] | None, list[tuple[str, str]]]:
        """A clause's condition and values as SQL in its scope, and the ``(where, sql)`` items to type."""
        where = clause_where(clause, index)
        items: list[tuple[str, str]] = []
        cond_sql = None
        if clause.condition is not None:
            cond_sql = self._scoped_sql(clause.condition, clause.clause_type, f"{where}.condition")
            items.append((f"{where}.condition", cond_sql))
        values = (
            self._clause_values(clause, index, where, out_fields, new_columns)
            if isinstance(clause.action, (UpdateAction, InsertAction))
            else None
        )
        if values is not None:
            items.extend((f"{where} column {f.name}", text) for f, (text, _) in zip(out_fields, values, strict=True))
        return cond_sql, values, items

    def _resolved_clause(
        self,
        clause: MergeClause,
        index: int,
        cond_sql: str | None,
        values: list[tuple[str, bool]] | None,
        types: list[DataType],
        out_fields: list[StructField],
    ) -> ResolvedClause:
        """A clause with its condition checked boolean and its values as the columns store them."""
        where = clause_where(clause, index)
        condition = None
        if cond_sql is not None:
            if not isinstance(types[0], (BooleanType, NullType)):
                raise MergeResolutionError(
                    f"{where}.condition: must be boolean, not {types[0].simpleString()} ({clause.condition!r}).",
                    field=f"{where}.condition",
                )
            condition = F.expr(cond_sql)
        value_types = types[1:] if cond_sql is not None else types
        columns = (
            None
            if values is None
            else stored_columns(values, value_types, out_fields, where, schema_evolution=self.spec.schema_evolution)
        )
        return ResolvedClause(clause=clause, index=index, condition=condition, condition_sql=cond_sql, values=columns)

    def _clause_values(
        self,
        clause: MergeClause,
        index: int,
        where: str,
        out_fields: list[StructField],
        new_columns: list[str],
    ) -> list[tuple[str, bool]]:
        """One value per output column: its SQL text, and whether it is an assignment to cast and check."""
        action = clause.action
        assert isinstance(action, (UpdateAction, InsertAction))
        ctype = clause.clause_type
        new_lower = {n.lower() for n in new_columns}
        generated = {
            f.name.lower(): str(f.metadata[GENERATION_KEY])
            for f in out_fields
            if f.metadata and f.metadata.get(GENERATION_KEY) is not None
        }
        is_update = isinstance(action, UpdateAction)
        assigned = {} if action.star else assigned_values(action, where, out_fields, self.t)
        values: list[tuple[str, bool]] = []
        given: set[str] = set()  # the columns the clause gives a value
        for f in out_fields:
            key = f.name.lower()
            # A column the clause gives no value keeps it on UPDATE; on INSERT it takes the column's default
            # value (allowColumnDefaults), else NULL; a column new by schema evolution is NULL.
            if is_update and key not in new_lower:
                default = (f"{quote_identifier(self.t)}.{quote_identifier(f.name)}", False)
            else:
                default = ("NULL" if key in new_lower else _column_default(f), True)
            if action.star:
                value = self._star_value(f, is_update, where)
            else:
                value = self._assigned_value(f, assigned, is_update, ctype, where)
            if value is None:
                values.append(default)
            else:
                values.append(value)
                given.add(key)
        self.identity_generated |= identity_values(self.spec, clause, index, out_fields, values, given, where)
        # Delta's generated columns: a clause that gives one no value computes it from the row's new values
        # (the write then checks any value given against the expression).
        for i, f in enumerate(out_fields):
            if f.name.lower() in generated and f.name.lower() not in given:
                values[i] = (
                    self._generated_sql(generated[f.name.lower()], out_fields, values, f"{where} column {f.name}"),
                    True,
                )
        return values

    def _star_value(self, f: StructField, is_update: bool, where: str) -> tuple[str, bool] | None:
        """UPDATE SET * and INSERT *: the source column of the same name; None where the source lacks the column
        under schema evolution, which then keeps its default (a generated column is computed later). Without it,
        Delta refuses a star clause whose source lacks a column, a generated one too. Under schema evolution an
        UPDATE keeps the target's value of the struct fields the source lacks."""
        src = self._source_field(f.name)
        if src is not None:
            text = f"{quote_identifier(self.s)}.{quote_identifier(src.name)}"
            if (
                is_update
                and self.spec.schema_evolution
                and isinstance(src.dataType, StructType)
                and isinstance(f.dataType, StructType)
                and lacks_fields(src.dataType, f.dataType)
            ):
                # Delta assigns such a struct field by field: what the source lacks keeps the target's value.
                tree = star_update_tree(src.dataType, f.dataType, text)
                return (self._nested_update_sql(f, tree, "matched", f"{where}.set"), True)
            return (text, True)
        if self.spec.schema_evolution:
            return None
        kind = "UPDATE SET" if is_update else "INSERT"
        raise MergeResolutionError(
            f"{where}: {kind} * needs every target column in the source; cannot resolve "
            f"{quote_path((self.t, f.name))} in {kind.split()[0]} clause given columns "
            f"{', '.join(quote_path((self.s, c.name)) for c in self.source_schema.fields)}.",
            field=where,
        )

    def _assigned_value(
        self, f: StructField, assigned: dict[str, Any], is_update: bool, ctype: str, where: str
    ) -> tuple[str, bool] | None:
        """The value an UPDATE SET or INSERT assigns the column; None where it assigns none."""
        key = f.name.lower()
        field_name = "set" if is_update else "values"
        if isinstance(assigned.get(key), dict):
            return (self._nested_update_sql(f, assigned[key], ctype, f"{where}.{field_name}"), True)
        if key in assigned and str(assigned[key]).strip().upper() == "DEFAULT":
            # The DEFAULT keyword: the column's default value (allowColumnDefaults), else NULL.
            return (_column_default(f), True)
        if key in assigned:
            return (self._scoped_sql(assigned[key], ctype, f"{where}.{field_name}.{f.name}"), True)
        return None

    def _generated_sql(
        self, expression: str, out_fields: list[StructField], values: list[tuple[str, bool]], where: str
    ) -> str:
        """A generated column's expression over the values a clause gives the row's other columns."""
        by_name = {f.name.lower(): (f, text) for f, (text, _) in zip(out_fields, values, strict=True)}

        def visit(node: exp.Expression) -> exp.Expression:
            if isinstance(node, exp.Column) and not node.table and node.name.lower() in by_name:
                f, text = by_name[node.name.lower()]
                return exp.paren(parse_expression(f"CAST(({text}) AS {sql_type(f.dataType)})", where))
            return node

        return sql(parse_expression(expression, where).transform(visit))

    def _nested_update_sql(self, column: StructField, tree: dict[str, Any], clause_type: str, where: str) -> str:
        """UPDATE SET of fields inside a struct column (Delta's nested assignment): the column rebuilt with the
        assigned fields replaced and every other field kept."""
        leaves: list[tuple[str, str]] = []

        def collect(dtype: StructType, node: dict[str, Any], prefix: str) -> None:
            for f in dtype.fields:
                sub = node.get(f.name.lower())
                if isinstance(sub, dict):
                    collect(f.dataType, sub, f"{prefix}.{f.name}")  # type: ignore[arg-type]
                elif isinstance(sub, BuiltSql):
                    leaves.append((f"{prefix}.{f.name}", sub))
                elif sub is not None:
                    leaf_where = f"{prefix}.{f.name}"
                    leaves.append((leaf_where, self._scoped_sql(sub, clause_type, leaf_where)))

        assert isinstance(column.dataType, StructType)
        collect(column.dataType, tree, f"{where}.{column.name}")
        types = iter(self._analyze(clause_type, leaves))
        texts = iter(leaves)

        def build(base: str, dtype: StructType, node: dict[str, Any]) -> str:
            parts = []
            for f in dtype.fields:
                sub = node.get(f.name.lower())
                kept = f"({base}).{quote_identifier(f.name)}"
                if isinstance(sub, dict):
                    value = build(kept, f.dataType, sub)  # type: ignore[arg-type]
                elif sub is not None:
                    leaf_where, text = next(texts)
                    value = stored_sql(
                        text, next(types), f.dataType, leaf_where, "the field", allow_missing=self.spec.schema_evolution
                    )
                else:
                    value = kept
                parts.append(f"{sql_string(f.name)}, {value}")
            return f"named_struct({', '.join(parts)})"

        # A column whose type schema evolution widened is read in the wider type.
        base = self.target_values.get(
            column.name.lower(), f"{quote_identifier(self.t)}.{quote_identifier(column.name)}"
        )
        return build(base, column.dataType, tree)


def _spark_message(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return first[:500]
