"""Resolving the clauses against the two tables (Delta's ResolveDeltaMergeInto and PreprocessTableMerge).

Scopes: ON and MATCHED clauses see both tables, NOT MATCHED clauses the source only, NOT MATCHED BY SOURCE
clauses the target only. Bare column names in a one-sided clause are qualified with that side's alias, so
Spark resolves them where Delta would. Every expression is analyzed by Spark (one round trip per scope) to
learn its type; assigned values are cast to the target column's type under ANSI store assignment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    MapType,
    NullType,
    NumericType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)
from sqlglot import exp

from engine.delta import DEFAULT_KEY, GENERATION_KEY, quote_path
from engine.delta.identity import identity_columns
from engine.delta.type_widening import is_schema_evolution_widening, widened_field
from engine.errors import MergeResolutionError, SchemaMismatchError
from engine.expressions import check_scope, clause_where, column_path, parse_expression, quote_identifier, sql
from engine.spec import DeleteAction, InsertAction, MergeClause, MergeSpec, UpdateAction


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


def can_ansi_store_assign(source: DataType, target: DataType) -> bool:
    """Spark's ``Cast.canANSIStoreAssign``: the type changes schema evolution accepts for an existing column
    (a stricter rule than the casts of assigned values)."""
    if source == target or isinstance(source, NullType):
        return True
    if isinstance(source, NumericType) and isinstance(target, NumericType):
        return True
    if isinstance(target, StringType) and not isinstance(source, (ArrayType, MapType, StructType)):
        return True
    if isinstance(source, (DateType, TimestampType, TimestampNTZType)) and isinstance(
        target, (DateType, TimestampType, TimestampNTZType)
    ):
        return True
    if isinstance(source, ArrayType) and isinstance(target, ArrayType):
        return can_ansi_store_assign(source.elementType, target.elementType)
    if isinstance(source, MapType) and isinstance(target, MapType):
        return can_ansi_store_assign(source.keyType, target.keyType) and can_ansi_store_assign(
            source.valueType, target.valueType
        )
    if isinstance(source, StructType) and isinstance(target, StructType):
        return len(source.fields) == len(target.fields) and all(
            can_ansi_store_assign(s.dataType, t.dataType) for s, t in zip(source.fields, target.fields, strict=True)
        )
    return False


def _column_default(column: StructField) -> str:
    """The column's default value as SQL (allowColumnDefaults' CURRENT_DEFAULT), else NULL."""
    default = (column.metadata or {}).get(DEFAULT_KEY)
    return "NULL" if default is None else str(default)


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
                "match."
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
        element = f"_element_{depth}_"
        inner = struct_by_name(
            element, source.elementType, target.elementType, allow_missing=allow_missing, where=where, depth=depth + 1
        )
        return f"transform({text}, {element} -> {inner})"
    if source != target and not can_ansi_cast(source, target):
        raise MergeResolutionError(
            f"{where}: cannot store {source.simpleString()} into {target.simpleString()} under ANSI store assignment."
        )
    return text


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
        known = set(_field_names(existing))
        added = [StructField(f.name, f.dataType, True) for f in source.fields if f.name.lower() not in known]
        return StructType(fields + added) if changed or added else None
    if isinstance(existing, ArrayType) and isinstance(source, ArrayType):
        element = evolved_type(existing.elementType, source.elementType)
        return None if element is None else ArrayType(element, existing.containsNull)
    return None


@dataclass
class ResolvedClause:
    """A clause ready for output generation: its condition and one value per target output column."""

    clause: MergeClause
    index: int
    condition: Column | None
    condition_sql: str | None
    values: list[Column] | None = None
    """One per output column for updates and inserts; None for deletes."""

    @property
    def kind(self) -> str:
        """Delta's clause kinds; also the prefix of the precomputed condition column."""
        name = self.clause.action_name.removesuffix("All")
        return name if self.clause.clause_type != "notMatchedBySource" else f"{name}NotMatchedBySource"

    @property
    def is_delete(self) -> bool:
        return isinstance(self.clause.action, DeleteAction)


@dataclass
class ResolvedMerge:
    on: Column
    on_sql: str
    output_fields: list[StructField]
    """The table schema after the merge: the target's columns, then new columns from schema evolution."""
    new_columns: list[str]
    target_values: dict[str, str] = field(default_factory=dict)
    """For columns whose type schema evolution changed (lower-case name): the target's value in the new type, as
    SQL (fields a struct gained NULL; a widened type cast)."""
    matched: list[ResolvedClause] = field(default_factory=list)
    not_matched: list[ResolvedClause] = field(default_factory=list)
    not_matched_by_source: list[ResolvedClause] = field(default_factory=list)
    identity_generated: list[str] = field(default_factory=list)
    """Identity columns some INSERT generates values for: the commit raises their high-water marks."""

    @property
    def schema_changed(self) -> bool:
        return bool(self.new_columns or self.target_values)


def _qualify(node: exp.Expression, alias: str) -> exp.Expression:
    """Bare columns belong to ``alias``, the one side a NOT MATCHED [BY SOURCE] clause sees."""
    lambda_vars: set[str] = set()
    for lam in node.find_all(exp.Lambda):
        lambda_vars.update(str(e.name).lower() for e in lam.expressions)

    def visit(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Column) and not n.table and str(n.name).lower() not in lambda_vars:
            return exp.column(n.this.copy(), table=exp.to_identifier(alias, quoted=True))
        return n

    return node.copy().transform(visit)


class Resolver:
    """Resolves one merge against the source DataFrame and an (empty) target DataFrame of the table schema."""

    def __init__(
        self,
        spec: MergeSpec,
        source: DataFrame,
        target: DataFrame,
        target_schema: StructType,
        *,
        type_widening: bool = False,
    ) -> None:
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
        node = parse_expression(text, where)
        check_scope(node, clause_type, self.t, self.s, where)
        if clause_type == "notMatched":
            node = _qualify(node, self.s)
        elif clause_type == "notMatchedBySource":
            node = _qualify(node, self.t)
        return sql(node)

    def _frame(self, clause_type: str) -> DataFrame:
        if clause_type == "notMatched":
            return self.source
        if clause_type == "notMatchedBySource":
            return self.target
        return self.source.crossJoin(self.target)

    def _analyze(self, clause_type: str, items: Sequence[tuple[str, str]]) -> list[DataType]:
        """Spark's types for ``(where, sql)`` items in one scope; on failure, name the item at fault."""
        if not items:
            return []
        frame = self._frame(clause_type)
        try:
            schema = frame.select(*[F.expr(text).alias(f"_e{i}") for i, (_, text) in enumerate(items)]).schema
            return [f.dataType for f in schema.fields]
        except PySparkException:
            for where, text in items:
                try:
                    frame.select(F.expr(text)).schema  # noqa: B018
                except PySparkException as exc:
                    raise MergeResolutionError(f"{where}: cannot resolve {text!r}: {_spark_message(exc)}") from None
            raise

    # --- star expansion and schema evolution -----------------------------------------------------------------

    def _source_field(self, name: str) -> StructField | None:
        for f in self.source_schema.fields:
            if f.name.lower() == name.lower():
                return f
        return None

    def output_fields(self) -> tuple[list[StructField], list[str], dict[str, str]]:
        """The table schema after the merge, its new top-level columns, and the target's value of each column
        whose struct type gained fields (SQL, by lower-case name)."""
        fields = list(self.target_schema.fields)
        if not self.spec.schema_evolution:
            return fields, [], {}
        stars = [c for c in self.spec.clauses if isinstance(c.action, (UpdateAction, InsertAction)) and c.action.star]
        if not stars:
            return fields, [], {}
        position = {f.name.lower(): i for i, f in enumerate(fields)}
        new: list[str] = []
        target_values: dict[str, str] = {}
        for f in self.source_schema.fields:
            index = position.get(f.name.lower())
            if index is None:
                fields.append(StructField(f.name, f.dataType, True))
                new.append(f.name)
                continue
            existing = fields[index]
            if self.type_widening and is_schema_evolution_widening(existing.dataType, f.dataType):
                # Delta's automatic type widening: the column takes the source's wider type.
                fields[index] = widened_field(existing, f.dataType)
                column = f"{quote_identifier(self.t)}.{quote_identifier(existing.name)}"
                target_values[existing.name.lower()] = f"CAST({column} AS {sql_type(f.dataType)})"
                continue
            merged = evolved_type(existing.dataType, f.dataType)
            if merged is not None:
                fields[index] = StructField(existing.name, merged, existing.nullable, existing.metadata)
                column = f"{quote_identifier(self.t)}.{quote_identifier(existing.name)}"
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
                    raise SchemaMismatchError(
                        f"Failed to merge fields '{existing.name}' and '{f.name}'. {exc}"
                    ) from None
            elif target_type != f.dataType and not can_ansi_store_assign(f.dataType, target_type):
                raise SchemaMismatchError(
                    f"Failed to merge fields '{existing.name}' and '{f.name}'. Failed to merge incompatible data "
                    f"types {existing.dataType.simpleString()} and {f.dataType.simpleString()}"
                )
        return fields, new, target_values

    # --- the whole merge ---------------------------------------------------------------------------------------

    def resolve(self) -> ResolvedMerge:
        spec = self.spec
        out_fields, new_columns, target_values = self.output_fields()
        self.target_values = target_values
        on_types = self._analyze("matched", [("on", spec.on)])
        if not isinstance(on_types[0], (BooleanType, NullType)):
            raise MergeResolutionError(f"on: the merge condition must be boolean, not {on_types[0].simpleString()}.")
        resolved = ResolvedMerge(
            on=F.expr(spec.on),
            on_sql=spec.on,
            output_fields=out_fields,
            new_columns=new_columns,
            target_values=target_values,
        )
        for group, target_list in (
            (spec.matched, resolved.matched),
            (spec.not_matched, resolved.not_matched),
            (spec.not_matched_by_source, resolved.not_matched_by_source),
        ):
            for index, clause in enumerate(group):
                target_list.append(self._resolve_clause(clause, index, out_fields, new_columns))
        resolved.identity_generated = sorted(self.identity_generated)
        return resolved

    def _resolve_clause(
        self, clause: MergeClause, index: int, out_fields: list[StructField], new_columns: list[str]
    ) -> ResolvedClause:
        where = clause_where(clause, index)
        ctype = clause.clause_type
        items: list[tuple[str, str]] = []
        cond_sql = None
        if clause.condition is not None:
            cond_sql = self._scoped_sql(clause.condition, ctype, f"{where}.condition")
            items.append((f"{where}.condition", cond_sql))
        # One value per output column: (sql text, whether it is an assignment to cast and check).
        values: list[tuple[str, bool]] | None = None
        action = clause.action
        new_lower = {n.lower() for n in new_columns}
        generated = {
            f.name.lower(): str(f.metadata[GENERATION_KEY])
            for f in out_fields
            if f.metadata and f.metadata.get(GENERATION_KEY) is not None
        }
        if isinstance(action, (UpdateAction, InsertAction)):
            is_update = isinstance(action, UpdateAction)
            kind, field_name = ("UPDATE SET", "set") if is_update else ("INSERT", "values")
            assigned = {} if action.star else self._assignments(action, where, out_fields)
            values = []
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
                    src = self._source_field(f.name)
                    if src is not None:
                        values.append((f"{quote_identifier(self.s)}.{quote_identifier(src.name)}", True))
                        given.add(key)
                    elif key in generated:
                        values.append(default)  # computed below
                    elif self.spec.schema_evolution:
                        values.append(default)
                    else:
                        raise MergeResolutionError(
                            f"{where}: {kind} * needs every target column in the source; cannot resolve "
                            f"{quote_path((self.t, f.name))} in {kind.split()[0]} clause given columns "
                            f"{', '.join(quote_path((self.s, c.name)) for c in self.source_schema.fields)}."
                        )
                elif isinstance(assigned.get(key), dict):
                    values.append((self._nested_update_sql(f, assigned[key], ctype, f"{where}.{field_name}"), True))
                    given.add(key)
                elif key in assigned and str(assigned[key]).strip().upper() == "DEFAULT":
                    # The DEFAULT keyword: the column's default value (allowColumnDefaults), else NULL.
                    values.append((_column_default(f), True))
                    given.add(key)
                elif key in assigned:
                    values.append((self._scoped_sql(assigned[key], ctype, f"{where}.{field_name}.{f.name}"), True))
                    given.add(key)
                else:
                    values.append(default)
            self._identity_values(clause, index, out_fields, values, given, where)
            # Delta's generated columns: a clause that gives one no value computes it from the row's new values
            # (the write then checks any value given against the expression).
            for i, f in enumerate(out_fields):
                if f.name.lower() in generated and f.name.lower() not in given:
                    values[i] = (
                        self._generated_sql(generated[f.name.lower()], out_fields, values, f"{where} column {f.name}"),
                        True,
                    )
        value_offset = len(items)
        if values is not None:
            items.extend((f"{where} column {f.name}", text) for f, (text, _) in zip(out_fields, values, strict=True))
        types = self._analyze(ctype, items)
        condition = None
        if cond_sql is not None:
            if not isinstance(types[0], (BooleanType, NullType)):
                raise MergeResolutionError(
                    f"{where}.condition: must be boolean, not {types[0].simpleString()} ({clause.condition!r})."
                )
            condition = F.expr(cond_sql)
        columns: list[Column] | None = None
        if values is not None:
            columns = []
            for f, (text, check), vtype in zip(out_fields, values, types[value_offset:], strict=True):
                # A kept target value (unchecked) misses only the fields schema evolution added.
                columns.append(
                    F.expr(
                        self._stored(
                            text,
                            vtype,
                            f.dataType,
                            where,
                            f"column {f.name}",
                            allow_missing=self.spec.schema_evolution or not check,
                            check=check,
                        )
                    )
                )
        return ResolvedClause(clause=clause, index=index, condition=condition, condition_sql=cond_sql, values=columns)

    def _identity_values(
        self,
        clause: MergeClause,
        index: int,
        out_fields: list[StructField],
        values: list[tuple[str, bool]],
        given: set[str],
        where: str,
    ) -> None:
        """Delta's rules for identity columns: never updated; an INSERT that gives one no value generates it, one
        that gives a value needs ``delta.identity.allowExplicitInsert``."""
        identities = identity_columns(StructType(out_fields))
        for i, f in enumerate(out_fields):
            column = identities.get(f.name.lower())
            if column is None:
                continue
            if isinstance(clause.action, UpdateAction):
                if f.name.lower() in given:
                    raise MergeResolutionError(f"{where}: UPDATE on IDENTITY column {f.name} is not supported.")
            elif f.name.lower() not in given:
                values[i] = (column.generated_values_sql(max(1, len(self.spec.not_matched)), index), True)
                self.identity_generated.add(f.name)
            elif not column.allow_explicit_insert:
                raise MergeResolutionError(
                    f"{where}: Providing values for GENERATED ALWAYS AS IDENTITY column {f.name} is not supported."
                )

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

    def _assignments(
        self, action: UpdateAction | InsertAction, where: str, out_fields: list[StructField]
    ) -> dict[str, Any]:
        """The assigned value of each column (lower-case name): its SQL, or for assignments to fields inside a
        struct column, the tree of assigned fields (nested dicts by lower-case field name, SQL at the leaves)."""
        fields = {f.name.lower(): f for f in out_fields}
        items = action.set if isinstance(action, UpdateAction) else action.values
        field_name = "set" if isinstance(action, UpdateAction) else "values"
        result: dict[str, Any] = {}
        for column, value in items.items():
            path = column_path(column, self.t, fields, where=f"{where}.{field_name}.{column}")
            shown = quote_path(path)
            if path[0] not in fields:
                raise MergeResolutionError(
                    f"{where}.{field_name}: {shown} is not a column of the target table "
                    f"(columns: {', '.join(quote_identifier(f.name) for f in out_fields)})."
                )
            if len(path) == 1:
                if path[0] in result:
                    raise MergeResolutionError(f"{where}.{field_name}: the column {shown} is assigned twice.")
                result[path[0]] = value
                continue
            if isinstance(action, InsertAction):
                raise MergeResolutionError(
                    f"{where}.{field_name}: Nested field is not supported in the INSERT clause of MERGE operation "
                    f"(field = {shown})."
                )
            node = result.setdefault(path[0], {})
            dtype = fields[path[0]].dataType
            for depth, part in enumerate(path[1:], start=1):
                names = {f.name.lower(): f for f in dtype.fields} if isinstance(dtype, StructType) else {}
                if not isinstance(node, dict) or part not in names:
                    raise MergeResolutionError(
                        f"{where}.{field_name}: {shown}: {quote_path(path[:depth])} ({dtype.simpleString()}) has no "
                        f"field {quote_identifier(part)} to assign, or it is assigned twice."
                    )
                dtype = names[part].dataType
                if depth == len(path) - 1:
                    if part in node:
                        raise MergeResolutionError(f"{where}.{field_name}: {shown} is assigned twice.")
                    node[part] = value
                else:
                    node = node.setdefault(part, {})
        return result

    def _stored(
        self,
        text: str,
        vtype: DataType,
        target: DataType,
        where: str,
        what: str,
        *,
        allow_missing: bool,
        check: bool = True,
    ) -> str:
        """``text`` as a value of ``target`` (``what`` is the column or field it goes to): structs by name, the
        rest cast as Delta's MERGE casts them (``can_ansi_cast``; checked unless ``check`` is off)."""
        if needs_struct_by_name(vtype, target):
            return struct_by_name(text, vtype, target, allow_missing=allow_missing, where=f"{where} {what}")
        if vtype == target:
            return text
        if check and not can_ansi_cast(vtype, target):
            raise MergeResolutionError(
                f"{where}: cannot assign {text!r} ({vtype.simpleString()}) to {what} ({target.simpleString()}): "
                f"cannot cast {vtype.simpleString()} to {target.simpleString()} under ANSI store assignment."
            )
        return f"CAST(({text}) AS {sql_type(target)})"

    def _nested_update_sql(self, column: StructField, tree: dict[str, Any], clause_type: str, where: str) -> str:
        """UPDATE SET of fields inside a struct column (Delta's nested assignment): the column rebuilt with the
        assigned fields replaced and every other field kept."""
        leaves: list[tuple[str, str]] = []

        def collect(dtype: StructType, node: dict[str, Any], prefix: str) -> None:
            for f in dtype.fields:
                sub = node.get(f.name.lower())
                if isinstance(sub, dict):
                    collect(f.dataType, sub, f"{prefix}.{f.name}")  # type: ignore[arg-type]
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
                    value = self._stored(
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
