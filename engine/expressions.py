"""Spark SQL expressions of a merge, read with sqlglot: parsing, safety rules, and the analysis of the ON
condition that data skipping needs (Delta's ``getTargetOnlyPredicates``, plus join keys for source ranges).

Spark itself resolves names and types when the merge runs; this module only judges what can be judged
without a table: syntax, forbidden constructs, and which side of the merge a reference names.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from engine.delta.names import ColumnPathError, parse_column_path, quote_path
from engine.delta.names import quote_identifier as quote_identifier  # the one quoting of names, for the engine
from engine.errors import MergeResolutionError, MergeSpecError
from engine.identifiers import quote_dereferenced_names
from engine.spec import InsertAction, MergeClause, MergeSpec, UpdateAction

DIALECT = "spark"

FORBIDDEN_FUNCTIONS = frozenset(
    {
        "reflect",
        "java_method",
        "try_reflect",
        "input_file_name",
        "input_file_block_start",
        "input_file_block_length",
        "spark_partition_id",
        "current_user",
        "session_user",
        "user",
    }
)
"""Functions that reach outside the data (JVM reflection) or depend on how Spark happens to run the merge."""

NONDETERMINISTIC_FUNCTIONS = frozenset(
    {
        "rand",
        "random",
        "randn",
        "uuid",
        "shuffle",
        "monotonically_increasing_id",
        "rand_str",
        "randstr",
        "uniform",
        "try_aes_decrypt",
    }
)


def parse_expression(text: str, where: str) -> exp.Expression:
    """One Spark SQL expression; ``where`` names its place in the spec for the error message."""
    if not isinstance(text, str) or not text.strip():
        raise MergeSpecError(f"{where}: the expression is empty.")
    try:
        parsed = sqlglot.parse(quote_dereferenced_names(text), read=DIALECT)
    except ParseError as exc:
        first = exc.errors[0]["description"] if exc.errors else str(exc)
        raise MergeSpecError(f"{where}: cannot parse {text!r} as a Spark SQL expression: {first}") from None
    except Exception as exc:
        first = f"{type(exc).__name__}: {exc}"
        raise MergeSpecError(f"{where}: cannot parse {text!r} as a Spark SQL expression: {first}") from None
    if len(parsed) != 1 or parsed[0] is None:
        raise MergeSpecError(f"{where}: expected one expression, got {text!r}.")
    node = parsed[0]
    if isinstance(node, (exp.Query, exp.Command, exp.DDL, exp.DML, exp.Alias)) or not isinstance(node, exp.Expression):
        raise MergeSpecError(f"{where}: {text!r} is not an expression.")
    return node


def function_name(node: exp.Expression) -> str:
    if isinstance(node, exp.Anonymous):
        return str(node.name).lower()
    if isinstance(node, exp.Func):
        return node.sql_name().lower()
    return ""


def check_expression(node: exp.Expression, where: str, *, deterministic: bool) -> None:
    """Delta's rules for merge expressions: no subqueries, aggregates or window functions; conditions must
    be deterministic. Also refuses functions that reach outside the data."""
    for sub in node.walk():
        # ``exists(array, x -> ...)`` is a higher-order function, not EXISTS (subquery).
        if isinstance(sub, (exp.Subquery, exp.Query)) or (
            isinstance(sub, exp.Exists) and isinstance(sub.this, (exp.Subquery, exp.Query))
        ):
            raise MergeSpecError(f"{where}: subqueries are not supported in a MERGE expression.")
        if isinstance(sub, exp.Window):
            raise MergeSpecError(f"{where}: window functions are not supported in a MERGE expression.")
        if isinstance(sub, exp.AggFunc):
            raise MergeSpecError(
                f"{where}: aggregate functions are not supported in a MERGE expression ({sub.sql(dialect=DIALECT)})."
            )
        name = function_name(sub)
        if name in FORBIDDEN_FUNCTIONS:
            raise MergeSpecError(f"{where}: the function {name}() is not allowed in a merge.")
        if deterministic and (name in NONDETERMINISTIC_FUNCTIONS or isinstance(sub, (exp.Rand, exp.Randn))):
            raise MergeSpecError(
                f"{where}: non-deterministic functions are not supported in a MERGE condition ({name}())."
            )


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


def check_scope(node: exp.Expression, clause_type: str, target_alias: str, source_alias: str, where: str) -> None:
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
                f"{where}: {column.sql(dialect='spark')} cannot be resolved: {clause_name} clauses can only refer "
                f"to the {side} ({alias})."
            )


def validate_spec(spec: MergeSpec) -> MergeSpec:
    """Everything that can be judged before the tables are read; raises MergeSpecError naming the field."""
    spec.validate()
    check_expression(parse_expression(spec.on, "on"), "on", deterministic=True)
    for group in (spec.matched, spec.not_matched, spec.not_matched_by_source):
        for index, clause in enumerate(group):
            where = clause_where(clause, index)
            if clause.condition is not None:
                cond_where = f"{where}.condition"
                node = parse_expression(clause.condition, cond_where)
                check_expression(node, cond_where, deterministic=True)
                check_scope(node, clause.clause_type, spec.target_alias, spec.source_alias, cond_where)
            action = clause.action
            if isinstance(action, (UpdateAction, InsertAction)) and not action.star:
                assignments = action.set if isinstance(action, UpdateAction) else action.values
                field = "set" if isinstance(action, UpdateAction) else "values"
                if not assignments:
                    raise MergeSpecError(f"{where}.{field}: at least one column must be assigned.")
                seen: set[tuple[str, ...]] = set()
                for column, value in assignments.items():
                    path = column_path(column, spec.target_alias, where=f"{where}.{field}.{column}")
                    if len(path) > 1 and isinstance(action, InsertAction):
                        raise MergeSpecError(
                            f"{where}.{field}: Nested field is not supported in the INSERT clause "
                            f"of MERGE operation (field = {quote_path(path)})."
                        )
                    # A column and a field inside it, or one field twice, would each set the same value.
                    other = next((p for p in seen if p[: len(path)] == path or path[: len(p)] == p), None)
                    if other is not None:
                        kind = "UPDATE" if isinstance(action, UpdateAction) else "INSERT"
                        raise MergeSpecError(
                            f"{where}.{field}: there is a conflict from these SET columns: "
                            f"{quote_path(other)} and {quote_path(path)}; a column may be assigned only once in one "
                            f"{kind}."
                        )
                    seen.add(path)
                    value_where = f"{where}.{field}.{column}"
                    node = parse_expression(value, value_where)
                    check_expression(node, value_where, deterministic=False)
                    check_scope(node, clause.clause_type, spec.target_alias, spec.source_alias, value_where)
    return spec


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
        raise MergeSpecError(f"{where}: a column name must be a string.")
    try:
        parts = tuple(p.lower() for p in parse_column_path(column))
    except ColumnPathError as exc:
        raise MergeSpecError(f"{where}: {exc}.") from None
    if len(parts) > 1 and parts[0] == target_alias.lower() and (columns is None or parts[1] in columns):
        return parts[1:]
    return parts


def conjuncts(node: exp.Expression) -> list[exp.Expression]:
    node = node.unnest() if isinstance(node, exp.Paren) else node
    if isinstance(node, exp.And):
        return conjuncts(node.left) + conjuncts(node.right)
    return [node]


@dataclass(frozen=True)
class Sides:
    """How a merge names its two tables, to tell which side a column reference belongs to."""

    target_alias: str
    source_alias: str
    target_columns: frozenset[str]
    source_columns: frozenset[str]

    def side(self, column: exp.Column) -> str | None:
        """``target``, ``source``, or None when the reference cannot be placed (Spark reports it later)."""
        table = column.table.lower() if column.table else ""
        name = str(column.name).lower()
        if table:
            if table == self.target_alias.lower():
                return "target"
            if table == self.source_alias.lower():
                return "source"
            return None
        in_target = name in self.target_columns
        in_source = name in self.source_columns
        if in_target and not in_source:
            return "target"
        if in_source and not in_target:
            return "source"
        return None

    def sides_of(self, node: exp.Expression) -> set[str | None]:
        return {self.side(c) for c in node.find_all(exp.Column)}


def strip_qualifiers(node: exp.Expression) -> exp.Expression:
    """The expression over bare column names, as data skipping on the target reads it."""

    def unqualify(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Column) and n.table:
            return exp.column(n.name, quoted=True)
        return n

    return node.copy().transform(unqualify)


def target_only_predicates(on: str, sides: Sides) -> list[exp.Expression]:
    """Conjuncts of ON that reference only the target (Delta's getTargetOnlyPredicates), unqualified."""
    result = []
    for conjunct in conjuncts(parse_expression(on, "on")):
        found = sides.sides_of(conjunct)
        if found == {"target"} and not any(function_name(n) in NONDETERMINISTIC_FUNCTIONS for n in conjunct.walk()):
            result.append(strip_qualifiers(conjunct))
    return result


def equi_join_keys(on: str, sides: Sides) -> list[tuple[str, exp.Expression]]:
    """``target_col = <source-only expression>`` conjuncts of ON: the target column and the source side.
    Ranges and values of the source side bound the target files that can match."""
    keys: list[tuple[str, exp.Expression]] = []
    for conjunct in conjuncts(parse_expression(on, "on")):
        if not isinstance(conjunct, (exp.EQ, exp.NullSafeEQ)):
            continue
        for left, right in ((conjunct.left, conjunct.right), (conjunct.right, conjunct.left)):
            if isinstance(left, exp.Column) and sides.side(left) == "target" and sides.sides_of(right) == {"source"}:
                keys.append((str(left.name), right))
                break
    return keys


@dataclass(frozen=True)
class KeyEquality:
    """``target_col = source_col`` (or ``<=>``) in ON, both sides plain columns."""

    target_column: str
    source_column: str
    null_safe: bool


@dataclass(frozen=True)
class KeyedOn:
    """ON as column equalities plus conjuncts over one side only; references qualified with their alias."""

    keys: tuple[KeyEquality, ...]
    target_only: tuple[exp.Expression, ...]
    source_only: tuple[exp.Expression, ...]


def keyed_on(on: str, sides: Sides) -> KeyedOn | None:
    """ON split into key equalities between a target column and a source column, and conjuncts that read one
    side only; None when some conjunct mixes the sides otherwise, or a reference cannot be placed. Such an ON
    matches a target row with at most one distinct source key, which lets findTouchedFiles count the source
    rows per key instead of the matches per target row."""
    aliases = {"target": sides.target_alias, "source": sides.source_alias}
    keys: list[KeyEquality] = []
    target_only: list[exp.Expression] = []
    source_only: list[exp.Expression] = []
    for conjunct in conjuncts(parse_expression(on, "on")):
        found = sides.sides_of(conjunct)
        if None in found:
            return None
        if found == {"target"}:
            target_only.append(_qualified(conjunct, sides, aliases))
            continue
        if found == {"source"}:
            source_only.append(_qualified(conjunct, sides, aliases))
            continue
        if not isinstance(conjunct, (exp.EQ, exp.NullSafeEQ)):
            return None
        left, right = conjunct.left, conjunct.right
        if not (isinstance(left, exp.Column) and isinstance(right, exp.Column)):
            return None
        if sides.side(left) == "source":
            left, right = right, left
        keys.append(KeyEquality(str(left.name), str(right.name), isinstance(conjunct, exp.NullSafeEQ)))
    if not keys:
        return None
    return KeyedOn(tuple(keys), tuple(target_only), tuple(source_only))


def _qualified(node: exp.Expression, sides: Sides, aliases: dict[str, str]) -> exp.Expression:
    def qualify(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Column):
            side = sides.side(n)
            assert side is not None
            return exp.column(n.name, table=exp.to_identifier(aliases[side], quoted=True), quoted=True)
        return n

    return node.copy().transform(qualify)


def sql(node: exp.Expression) -> str:
    return node.sql(dialect=DIALECT)


def and_all(nodes: Iterable[exp.Expression]) -> exp.Expression | None:
    nodes = list(nodes)
    if not nodes:
        return None
    return exp.and_(*nodes) if len(nodes) > 1 else nodes[0]


def referenced_columns(text: str, where: str) -> Sequence[exp.Column]:
    return list(parse_expression(text, where).find_all(exp.Column))
