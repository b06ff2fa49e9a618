"""Everything about a merge spec that can be judged before the tables are read: each expression parsed and
checked, one-sided clauses kept to their side, assignments that name each column once, and the spec rewritten to
the text Spark will run."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from sqlglot import exp

from engine.delta import ColumnPathError, parse_column_path, quote_identifier, quote_path
from engine.delta.internal_columns import INTERNAL_PREFIX, internal_names
from engine.errors import MergeResolutionError, MergeSpecError
from engine.expression_rules import check_expression, source_query_sql, spark_text
from engine.expressions import DIALECT, parse_expression
from engine.merge_condition import MergeCondition
from engine.spec import InsertAction, MergeClause, MergeSpec, QuerySource, UpdateAction


def clause_where(clause: MergeClause, index: int) -> str:
    group = {
        "matched": "when_matched",
        "notMatched": "when_not_matched",
        "notMatchedBySource": "when_not_matched_by_source",
    }[clause.clause_type]
    return f"{group}[{index}]"


CLAUSE_SCOPES = {
    "notMatched": ("WHEN NOT MATCHED", "source"),
    "notMatchedBySource": ("WHEN NOT MATCHED BY SOURCE", "target"),
}
"""The clauses that see one side only, as Delta names them, and the side they see."""


def check_scope(node: exp.Expr, clause_type: str, target_alias: str, source_alias: str, where: str) -> None:
    """Refuse a column qualified by the alias a clause cannot see (NOT MATCHED sees only the source, NOT MATCHED
    BY SOURCE only the target): that needs no schema, so it is judged before any table is read."""
    if clause_type not in CLAUSE_SCOPES:
        return
    clause_name, side = CLAUSE_SCOPES[clause_type]
    alias, other = (source_alias, target_alias) if side == "source" else (target_alias, source_alias)
    # A lambda variable may share the other alias's name (``s -> s.price``): its fields are not the other side.
    lambda_vars = {str(v.name).lower() for lam in node.find_all(exp.Lambda) for v in lam.expressions}
    if other.lower() in lambda_vars:
        return
    for column in node.find_all(exp.Column):
        if column.table and str(column.table).lower() == other.lower() and not column.args.get("db"):
            raise MergeResolutionError(
                f"{where}: {column.sql(dialect=DIALECT)} cannot be resolved: {clause_name} clauses can only refer "
                f"to the {side} ({alias}).",
                field=where,
            )


@dataclass(frozen=True)
class ParsedMerge:
    """A spec that passed validation, in the text Spark runs, with the tree each of its expressions was parsed
    into: a merge parses each expression once, and resolution, data skipping and the join plans read these trees
    (shared: what reads them copies before it changes anything)."""

    spec: MergeSpec
    on: MergeCondition
    trees: Mapping[str, exp.Expression]
    """The tree of each clause condition and assigned value, by its text in ``spec``."""

    def tree(self, text: str) -> exp.Expression:
        """The tree of a condition or an assigned value of ``spec``, by its text there."""
        return self.trees[text]


def check_no_internal_columns(side: str, names: Iterable[str]) -> None:
    """A table or source column under the internal prefix would be taken for one the merge adds while it works
    (``docs/engine.md``, "Internal columns"). ``side`` names where the columns are, as the error's field."""
    taken = internal_names(names)
    if taken:
        raise MergeSpecError(
            f"{side}: column {quote_identifier(taken[0])} is under the prefix {INTERNAL_PREFIX!r}, which the "
            "service reserves for the columns it adds while merging; rename the column to merge this table.",
            field=side,
        )


def validate_spec(spec: MergeSpec) -> MergeSpec:
    """Everything that can be judged before the tables are read; raises MergeSpecError naming the field."""
    return parse_merge(spec).spec


def parse_merge(spec: MergeSpec, *, checked: bool = False) -> ParsedMerge:
    """``validate_spec``, keeping the parsed trees for the merge that runs the spec. ``checked``: ``spec`` is what
    ``validate_spec`` returned in this process, so its expressions are parsed but not judged again."""
    if not checked:
        spec.validate()
    trees = {"on": parse_expression(spec.on, "on")}
    if not checked:
        check_expression(trees["on"], "on", deterministic=True)
    for group in (spec.matched, spec.not_matched, spec.not_matched_by_source):
        for index, clause in enumerate(group):
            where = clause_where(clause, index)
            if clause.condition is not None:
                cond_where = f"{where}.condition"
                trees[cond_where] = node = parse_expression(clause.condition, cond_where)
                if not checked:
                    check_expression(node, cond_where, deterministic=True)
                    check_scope(node, clause.clause_type, spec.target_alias, spec.source_alias, cond_where)
            action = clause.action
            if isinstance(action, (UpdateAction, InsertAction)) and not action.star:
                trees.update(_checked_assignments(spec, clause, action, where, checked=checked))
    return _canonical(spec, trees)


def _checked_assignments(
    spec: MergeSpec, clause: MergeClause, action: UpdateAction | InsertAction, where: str, *, checked: bool = False
) -> dict[str, exp.Expression]:
    """The trees of a clause's assigned values, by their place in the spec, once each column is known to be
    assigned once."""
    assignments = action.set if isinstance(action, UpdateAction) else action.values
    field = "set" if isinstance(action, UpdateAction) else "values"
    if not assignments:
        raise MergeSpecError(f"{where}.{field}: at least one column must be assigned.", field=f"{where}.{field}")
    trees: dict[str, exp.Expression] = {}
    seen: set[tuple[str, ...]] = set()
    for column, value in assignments.items():
        path = column_path(column, spec.target_alias, where=f"{where}.{field}.{column}")
        if len(path) > 1 and isinstance(action, InsertAction):
            raise MergeSpecError(
                f"{where}.{field}: Nested field is not supported in the INSERT clause "
                f"of MERGE operation (field = {quote_path(path)}).",
                field=f"{where}.{field}",
            )
        # A column and a field inside it, or one field twice, would each set the same value.
        other = next((p for p in seen if p[: len(path)] == path or path[: len(p)] == p), None)
        if other is not None:
            kind = "UPDATE" if isinstance(action, UpdateAction) else "INSERT"
            raise MergeSpecError(
                f"{where}.{field}: there is a conflict from these SET columns: "
                f"{quote_path(other)} and {quote_path(path)}; a column may be assigned only once in one "
                f"{kind}.",
                field=f"{where}.{field}",
            )
        seen.add(path)
        value_where = f"{where}.{field}.{column}"
        trees[value_where] = node = parse_expression(value, value_where)
        if not checked:
            check_expression(node, value_where, deterministic=False)
            check_scope(node, clause.clause_type, spec.target_alias, spec.source_alias, value_where)
    return trees


def _canonical(spec: MergeSpec, trees: Mapping[str, exp.Expression]) -> ParsedMerge:
    """The spec with every expression and the source query as ``spark_text`` regenerates them from their checked
    trees (``trees``, by place in the spec): what runs in Spark is exactly what was checked."""
    by_text: dict[str, exp.Expression] = {}

    def text(where: str) -> str:
        canonical = spark_text(trees[where], where)
        by_text.setdefault(canonical, trees[where])
        return canonical

    def clause(c: MergeClause, index: int) -> MergeClause:
        where = clause_where(c, index)
        condition = None if c.condition is None else text(f"{where}.condition")
        action = c.action
        if isinstance(action, UpdateAction) and not action.star:
            action = dataclasses.replace(action, set={k: text(f"{where}.set.{k}") for k in action.set})
        elif isinstance(action, InsertAction) and not action.star:
            action = dataclasses.replace(action, values={k: text(f"{where}.values.{k}") for k in action.values})
        return dataclasses.replace(c, condition=condition, action=action)

    source = spec.source
    if isinstance(source, QuerySource):
        identity = {name: name for name in source.relations}
        source = dataclasses.replace(source, query=source_query_sql(source.query, identity, "source.query"))
    canonical = dataclasses.replace(
        spec,
        on=spark_text(trees["on"], "on"),
        source=source,
        matched=tuple(clause(c, i) for i, c in enumerate(spec.matched)),
        not_matched=tuple(clause(c, i) for i, c in enumerate(spec.not_matched)),
        not_matched_by_source=tuple(clause(c, i) for i, c in enumerate(spec.not_matched_by_source)),
    )
    return ParsedMerge(canonical, MergeCondition.of(trees["on"]), by_text)


def column_path(
    column: str, target_alias: str, columns: Collection[str] | None = None, *, where: str | None = None
) -> tuple[str, ...]:
    """The target column (or nested field) an assignment names, lower case: a name, a dotted path into structs,
    backquoted parts (a backtick doubled inside). ``amount``, ```AMOUNT``` and ``t.amount`` name ``("amount",)``;
    ``t.address.city`` and ``address.city`` name ``("address", "city")``. Any word is a name here, keywords too.

    A first part equal to the target's alias is read as Spark resolves a name (``AttributeSeq.resolve``): as the
    alias when the part after it is a column of the target (``columns``, lower case), else as a column of that
    name (a struct column ``t`` with a field ``col``). Without ``columns`` the alias is taken as the alias.
    ``where`` names the key's place in the spec for the error message."""
    where = where or f"column {column!r}"
    if not isinstance(column, str):
        raise MergeSpecError(f"{where}: a column name must be a string.", field=where)
    try:
        parts = tuple(p.lower() for p in parse_column_path(column))
    except ColumnPathError as exc:
        raise MergeSpecError(f"{where}: {exc}.", field=where) from None
    if len(parts) > 1 and parts[0] == target_alias.lower() and (columns is None or parts[1] in columns):
        return parts[1:]
    return parts
