"""The predicate data skipping evaluates: Spark SQL compiled once into a small tree in negation normal form
(NOT pushed down by exact three-valued duals), with every expression it does not model as Unknown."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlglot
from pyspark.sql import types as T
from sqlglot import exp

from engine.delta.skipping_literals import NO_LITERAL, coerce, literal_value
from engine.errors import MergeSpecError

# --- the compiled tree -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Col:
    path: tuple[str, ...]
    dtype: T.DataType
    is_partition: bool


@dataclass(frozen=True)
class Unknown:
    """Any expression we do not model: may be TRUE."""


@dataclass(frozen=True)
class Const:
    value: bool | None  # TRUE, FALSE or NULL for every row


@dataclass(frozen=True)
class Cmp:
    op: str  # one of = != < <= > >=
    col: Col
    value: Any  # never None


@dataclass(frozen=True)
class IsNull:
    col: Col


@dataclass(frozen=True)
class IsNotNull:
    col: Col


@dataclass(frozen=True)
class NullSafeEq:
    col: Col
    value: Any  # never None


@dataclass(frozen=True)
class NotNullSafeEq:
    col: Col
    value: Any  # never None


@dataclass(frozen=True)
class InList:
    col: Col
    values: tuple[Any, ...]  # non-null literals


@dataclass(frozen=True)
class NotInList:
    col: Col
    values: tuple[Any, ...]  # non-null literals (a NULL in the list makes NOT IN never TRUE: Const(None))


@dataclass(frozen=True)
class And:
    children: tuple[Node, ...]


@dataclass(frozen=True)
class Or:
    children: tuple[Node, ...]


Node = Unknown | Const | Cmp | IsNull | IsNotNull | NullSafeEq | NotNullSafeEq | InList | NotInList | And | Or

_NEGATED_OP = {"=": "!=", "!=": "=", "<": ">=", ">=": "<", "<=": ">", ">": "<="}
_FLIPPED_OP = {"=": "=", "!=": "!=", "<": ">", ">": "<", "<=": ">=", ">=": "<="}
_UNKNOWN = Unknown()


def negate(node: Node) -> Node:
    """The node that is TRUE exactly where ``node`` is FALSE (SQL NOT)."""
    if isinstance(node, Cmp):
        return Cmp(_NEGATED_OP[node.op], node.col, node.value)
    if isinstance(node, IsNull):
        return IsNotNull(node.col)
    if isinstance(node, IsNotNull):
        return IsNull(node.col)
    if isinstance(node, NullSafeEq):
        return NotNullSafeEq(node.col, node.value)
    if isinstance(node, NotNullSafeEq):
        return NullSafeEq(node.col, node.value)
    if isinstance(node, InList):
        return NotInList(node.col, node.values)
    if isinstance(node, NotInList):
        return InList(node.col, node.values)
    if isinstance(node, And):
        return Or(tuple(negate(c) for c in node.children))
    if isinstance(node, Or):
        return And(tuple(negate(c) for c in node.children))
    if isinstance(node, Const):
        return Const(None if node.value is None else not node.value)
    return _UNKNOWN


class PredicateCompiler:
    def __init__(self, schema: T.StructType, partition_columns: Sequence[str]) -> None:
        self.schema = schema
        self.partitions = {c.lower() for c in partition_columns}

    def column(self, node: exp.Expression) -> Col | None:
        parts: list[str]
        if isinstance(node, exp.Paren):
            return self.column(node.this)
        if isinstance(node, exp.Column):
            parts = [p.name for p in node.parts]
        elif isinstance(node, exp.Dot):
            base = self.column_parts(node)
            if base is None:
                return None
            parts = base
        else:
            return None
        current: T.DataType = self.schema
        resolved: list[str] = []
        for name in parts:
            if not isinstance(current, T.StructType):
                return None
            lowered = name.lower()
            match = next((f for f in current.fields if f.name == name), None) or next(
                (f for f in current.fields if f.name.lower() == lowered), None
            )
            if match is None:
                return None
            resolved.append(match.name)
            current = match.dataType
        if isinstance(current, (T.StructType, T.ArrayType, T.MapType)):
            return None
        is_partition = len(resolved) == 1 and resolved[0].lower() in self.partitions
        return Col(tuple(resolved), current, is_partition)

    def column_parts(self, node: exp.Expression) -> list[str] | None:
        if isinstance(node, exp.Column):
            return [p.name for p in node.parts]
        if isinstance(node, exp.Dot):
            left = self.column_parts(node.this)
            if left is None or not isinstance(node.expression, exp.Identifier):
                return None
            return [*left, node.expression.name]
        return None

    def comparison(self, op: str, left: exp.Expression, right: exp.Expression, null_safe: bool = False) -> Node:
        column, literal = self.column(left), literal_value(right)
        if column is None or literal is NO_LITERAL:
            column, literal = self.column(right), literal_value(left)
            op = _FLIPPED_OP[op]
        if column is None or literal is NO_LITERAL:
            return _UNKNOWN
        if literal is None:
            if null_safe:
                return IsNull(column) if op == "=" else IsNotNull(column)
            return Const(None)
        if coerce(column.dtype, literal) is None:
            return _UNKNOWN
        if null_safe:
            return NullSafeEq(column, literal) if op == "=" else NotNullSafeEq(column, literal)
        return Cmp(op, column, literal)

    def compile(self, node: exp.Expression) -> Node:
        simple_ops: list[tuple[type[exp.Expression], str]] = [
            (exp.EQ, "="),
            (exp.NEQ, "!="),
            (exp.LT, "<"),
            (exp.LTE, "<="),
            (exp.GT, ">"),
            (exp.GTE, ">="),
        ]
        if isinstance(node, exp.Paren):
            return self.compile(node.this)
        if isinstance(node, exp.And):
            return And((self.compile(node.this), self.compile(node.expression)))
        if isinstance(node, exp.Or):
            return Or((self.compile(node.this), self.compile(node.expression)))
        if isinstance(node, exp.Not):
            return negate(self.compile(node.this))
        for cls, op in simple_ops:
            if type(node) is cls:
                return self.comparison(op, node.this, node.expression)
        if isinstance(node, exp.NullSafeEQ):
            return self.comparison("=", node.this, node.expression, null_safe=True)
        null_safe_neq = getattr(exp, "NullSafeNEQ", None)
        if null_safe_neq is not None and isinstance(node, null_safe_neq):
            return self.comparison("!=", node.this, node.expression, null_safe=True)
        if isinstance(node, exp.Is):
            return self.is_(node)
        if isinstance(node, exp.In):
            return self.in_list(node)
        if isinstance(node, exp.Between):
            if node.args.get("symmetric"):
                return _UNKNOWN
            return And(
                (
                    self.comparison(">=", node.this, node.args["low"]),
                    self.comparison("<=", node.this, node.args["high"]),
                )
            )
        if isinstance(node, exp.Boolean):
            return Const(bool(node.this))
        if isinstance(node, exp.Null):
            return Const(None)
        if isinstance(node, (exp.Column, exp.Dot)):
            column = self.column(node)
            if column is not None and isinstance(column.dtype, T.BooleanType):
                return Cmp("=", column, True)
            return _UNKNOWN
        return _UNKNOWN

    def is_(self, node: exp.Is) -> Node:
        column = self.column(node.this)
        if column is None:
            return _UNKNOWN
        target = node.expression
        if isinstance(target, exp.Null):
            return IsNull(column)
        if isinstance(target, exp.Boolean) and isinstance(column.dtype, T.BooleanType):
            return NullSafeEq(column, bool(target.this))
        return _UNKNOWN

    def in_list(self, node: exp.In) -> Node:
        column = self.column(node.this)
        if column is None or node.args.get("query") or node.args.get("unnest") or node.args.get("field"):
            return _UNKNOWN
        values = [literal_value(item) for item in node.expressions]
        if any(v is NO_LITERAL for v in values):
            return _UNKNOWN
        present = tuple(v for v in values if v is not None)
        if any(coerce(column.dtype, v) is None for v in present):
            return _UNKNOWN
        if not present:
            return Const(None)
        in_list = InList(column, present)
        # x IN (1, NULL) is TRUE or NULL; its NOT is never TRUE: keep that through negation.
        return Or((in_list, Const(None))) if len(present) < len(values) else in_list


def parse_predicate(predicate: str | exp.Expression) -> exp.Expression:
    if isinstance(predicate, exp.Expression):
        return predicate
    try:
        parsed = sqlglot.parse_one(predicate, read="spark")
    except sqlglot.errors.ParseError as exc:
        raise MergeSpecError(f"Cannot parse predicate {predicate!r}: {exc}") from exc
    if not isinstance(parsed, exp.Expression):  # None for empty text
        raise MergeSpecError(f"Empty predicate {predicate!r}")
    return parsed


# --- evaluating against one file -------------------------------------------------------------------------------
