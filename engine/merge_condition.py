"""What the ON condition says about the two sides of a merge: which side each reference names, the conjuncts
over the target only (Delta's ``getTargetOnlyPredicates``), and the equalities between target and source keys that
data skipping, the key bitmap and the join plans use."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlglot import exp

from engine.expression_rules import NONDETERMINISTIC_FUNCTIONS, function_name


def conjuncts(node: exp.Expr) -> list[exp.Expr]:
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

    def sides_of(self, node: exp.Expr) -> set[str | None]:
        return {self.side(c) for c in node.find_all(exp.Column)}


def strip_qualifiers(node: exp.Expr) -> exp.Expr:
    """The expression over bare column names, as data skipping on the target reads it."""

    def unqualify(n: exp.Expr) -> exp.Expr:
        if isinstance(n, exp.Column) and n.table:
            return exp.column(n.name, quoted=True)
        return n

    return node.copy().transform(unqualify)


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
    target_only: tuple[exp.Expr, ...]
    source_only: tuple[exp.Expr, ...]


@dataclass(frozen=True)
class MergeCondition:
    """ON, parsed once per merge (``engine.validation.ParsedMerge``), and its conjuncts: data skipping, the
    source's key ranges and the join plans read these trees, never the text again. The trees are shared: what
    reads them copies before it changes anything."""

    tree: exp.Expression
    conjuncts: tuple[exp.Expr, ...]

    @classmethod
    def of(cls, tree: exp.Expression) -> MergeCondition:
        return cls(tree, tuple(conjuncts(tree)))

    def target_only_predicates(self, sides: Sides) -> list[exp.Expr]:
        """Conjuncts of ON that reference only the target (Delta's getTargetOnlyPredicates), unqualified."""
        result = []
        for conjunct in self.conjuncts:
            found = sides.sides_of(conjunct)
            if found == {"target"} and not any(function_name(n) in NONDETERMINISTIC_FUNCTIONS for n in conjunct.walk()):
                result.append(strip_qualifiers(conjunct))
        return result

    def equi_join_keys(self, sides: Sides) -> list[tuple[str, exp.Expr]]:
        """``target_col = <source-only expression>`` conjuncts of ON: the target column and the source side.
        Ranges and values of the source side bound the target files that can match."""
        keys: list[tuple[str, exp.Expr]] = []
        for conjunct in self.conjuncts:
            if not isinstance(conjunct, (exp.EQ, exp.NullSafeEQ)):
                continue
            for left, right in ((conjunct.left, conjunct.right), (conjunct.right, conjunct.left)):
                if (
                    isinstance(left, exp.Column)
                    and sides.side(left) == "target"
                    and sides.sides_of(right) == {"source"}
                ):
                    keys.append((str(left.name), right))
                    break
        return keys

    def null_safe_columns(self) -> set[str]:
        """The columns of ON's ``<=>`` equalities (lower case): a NULL key matches there."""
        null_safe_columns: set[str] = set()
        for c in self.conjuncts:
            if isinstance(c, exp.NullSafeEQ):
                null_safe_columns |= {
                    str(side.name).lower() for side in (c.left, c.right) if isinstance(side, exp.Column)
                }
        return null_safe_columns

    def keyed_on(self, sides: Sides) -> KeyedOn | None:
        """ON split into key equalities between a target column and a source column, and conjuncts that read one
        side only; None when some conjunct mixes the sides otherwise, or a reference cannot be placed. Such an ON
        matches a target row with at most one distinct source key, which lets findTouchedFiles count the source
        rows per key instead of the matches per target row."""
        aliases = {"target": sides.target_alias, "source": sides.source_alias}
        keys: list[KeyEquality] = []
        target_only: list[exp.Expr] = []
        source_only: list[exp.Expr] = []
        for conjunct in self.conjuncts:
            found = sides.sides_of(conjunct)
            if None in found:
                return None
            if found == {"target"}:
                target_only.append(_qualified_by_side(conjunct, sides, aliases))
                continue
            if found == {"source"}:
                source_only.append(_qualified_by_side(conjunct, sides, aliases))
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


def _qualified_by_side(node: exp.Expr, sides: Sides, aliases: dict[str, str]) -> exp.Expr:
    def qualify(n: exp.Expr) -> exp.Expr:
        if isinstance(n, exp.Column):
            side = sides.side(n)
            assert side is not None
            return exp.column(n.name, table=exp.to_identifier(aliases[side], quoted=True), quoted=True)
        return n

    return node.copy().transform(qualify)


def and_all(nodes: Iterable[exp.Expr]) -> exp.Expr | None:
    nodes = list(nodes)
    if not nodes:
        return None
    return exp.and_(*nodes) if len(nodes) > 1 else nodes[0]
