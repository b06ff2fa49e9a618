"""The Spark SQL the engine regenerates from a parsed expression: sqlglot's Spark dialect, with the rewrites that
would change what an expression means corrected, and a check that regenerating kept everything the caller wrote.

The engine never sends a caller's text to Spark as given; it sends the text of the tree it checked. sqlglot's Spark
generator is written for transpiling, and a few of its rewrites are not faithful in Spark itself: it drops
``parse_json`` (leaving the string), turns ``to_char(x, fmt)`` into a plain cast, and reads ``levenshtein``'s
threshold as an insertion cost it then drops. Arguments a function does not take are dropped at parsing
(``hex(a, b)``). Each would run something other than what was written, so a rewrite is corrected here, an argument
the generator cannot express is an error, and a name the regenerated text lost refuses the expression.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import ClassVar

from sqlglot import exp
from sqlglot.dialects.spark import Spark
from sqlglot.errors import ErrorLevel, UnsupportedError
from sqlglot.generator import Generator
from sqlglot.generators.spark import SparkGenerator
from sqlglot.tokens import Token, TokenType

from engine.errors import MergeSpecError


def _to_char(self: Generator, expression: exp.ToChar) -> str:
    fmt = expression.args.get("format")
    if fmt is None:
        return self.sql(exp.cast(expression.this, exp.DataType.build("string")))
    return self.func("TO_CHAR", expression.this, fmt)


def _levenshtein(self: Generator, expression: exp.Levenshtein) -> str:
    """Spark's third argument is a threshold, which sqlglot reads as ``ins_cost``."""
    costs = ("del_cost", "sub_cost", "max_dist")
    if any(expression.args.get(name) is not None for name in costs):
        self.unsupported("levenshtein takes a string, a string and a threshold in Spark")
    return self.func("LEVENSHTEIN", expression.this, expression.expression, expression.args.get("ins_cost"))


class SparkMerge(Spark):
    """Spark SQL as this engine sends it to Spark."""

    class Generator(SparkGenerator):
        PARSE_JSON_NAME = "PARSE_JSON"
        TRANSFORMS: ClassVar[dict[type[exp.Expr], Callable[..., str]]] = {
            **SparkGenerator.TRANSFORMS,
            exp.ToChar: _to_char,
            exp.Levenshtein: _levenshtein,
        }


DIALECT = SparkMerge
"""The dialect the engine reads Spark SQL with and writes it for Spark."""

_NAMES = frozenset({TokenType.VAR, TokenType.IDENTIFIER})


def regenerate(node: exp.Expr, where: str) -> str:
    """Spark SQL text of a tree, without comments (Spark and sqlglot read comments differently); an argument the
    generator cannot write for Spark is a MergeSpecError rather than dropped."""
    try:
        return node.sql(dialect=DIALECT, comments=False, unsupported_level=ErrorLevel.RAISE)
    except UnsupportedError as exc:
        raise MergeSpecError(
            f"{where}: {node.sql(dialect=DIALECT)!r} cannot be sent to Spark as written: {exc}", field=where
        ) from None


def _names(tokens: list[Token]) -> Counter[str]:
    """The names in a token stream, but those called as functions, case-folded."""
    names: Counter[str] = Counter()
    for index, token in enumerate(tokens):
        after = tokens[index + 1] if index + 1 < len(tokens) else None
        if token.token_type in _NAMES and not (after is not None and after.token_type == TokenType.L_PAREN):
            names[token.text.lower()] += 1
    return names


def check_kept(text: str, regenerated: str, where: str, grammar: frozenset[str] = frozenset()) -> None:
    """Every name the caller wrote is still in the text Spark gets: none dropped with an argument a function does
    not take (``hex(a, b)``), none turned into a string (``date_trunc(unit_column, ts)``). Literals may go where
    they are a function's default (``to_date(s, 'yyyy-MM-dd')``) and rewrites may add to the text. ``grammar``
    names words of a statement's syntax that sqlglot reads as names and may leave out (``NOT MATCHED BY TARGET``)."""
    dialect = DIALECT()
    lost = _names(dialect.tokenize(text)) - _names(dialect.tokenize(regenerated))
    names = sorted(set(lost) - grammar)
    if names:
        raise MergeSpecError(
            f"{where}: {text!r} would reach Spark as {regenerated!r}, without {', '.join(names)}: a "
            "function was given arguments it does not take, or a name where it takes a literal.",
            field=where,
        )
