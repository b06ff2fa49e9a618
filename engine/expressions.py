"""Spark SQL expressions of a merge, read with sqlglot: parsing, with the bounds on size and nesting that keep
any input from exhausting the parser's or Spark's stack, and the regenerated text Spark is sent.

Spark itself resolves names and types when the merge runs; the modules beside this one judge what can be judged
without a table: the rules on what an expression may call (``engine.expression_rules``), the spec as a whole
(``engine.validation``) and the ON condition that data skipping reads (``engine.merge_condition``).
"""

from __future__ import annotations

import re

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from engine.delta import quote_identifier as quote_identifier  # the one quoting of names, for the engine
from engine.errors import MergeSpecError
from engine.identifiers import quote_dereferenced_names
from engine.spark_dialect import DIALECT, check_kept, regenerate

MAX_EXPRESSION_CHARS = 65_536
"""The longest expression text a merge may give (ON, a condition, an assigned value)."""
MAX_EXPRESSION_NESTING = 32
"""The deepest nesting of parentheses and brackets in an expression. sqlglot's parser recurses some twenty
Python frames per level and gives up near fifty; the text is scanned before it is handed over."""
MAX_EXPRESSION_DEPTH = 128
"""The deepest expression tree (an ON of 20,000 OR terms is 20,000 deep): Spark's planning time grows with it
and the engine's own walks recurse along it."""
MAX_EXPRESSION_NODES = 10_000
"""The most parts (operators, columns, literals) an expression may have."""
_QUOTES = frozenset("'\"`")
_OPENING, _CLOSING = frozenset("(["), frozenset(")]")


def _excerpt(text: str, limit: int = 120) -> str:
    """``text`` quoted for an error message, cut short when long: an answer need not echo 60,000 characters."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} characters)"


def nesting_depth(text: str) -> int:
    """How deeply parentheses and brackets nest in ``text``, outside string literals and quoted names: a
    linear scan, cheap enough to run on any input before a recursive parser sees it."""
    depth = deepest = 0
    quote: str | None = None
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if quote is not None:
            if ch == "\\" and quote != "`":
                i += 1
            elif ch == quote:
                quote = None
        elif ch in _QUOTES:
            quote = ch
        elif ch in _OPENING:
            depth += 1
            deepest = max(deepest, depth)
        elif ch in _CLOSING:
            depth -= 1
        i += 1
    return deepest


def _check_size(text: str, where: str) -> None:
    if len(text) > MAX_EXPRESSION_CHARS:
        raise MergeSpecError(
            f"{where}: the expression is {len(text)} characters long; at most {MAX_EXPRESSION_CHARS} are accepted.",
            field=where,
        )
    nesting = nesting_depth(text)
    if nesting > MAX_EXPRESSION_NESTING:
        raise MergeSpecError(
            f"{where}: parentheses or brackets nest {nesting} levels deep in {_excerpt(text)}; "
            f"at most {MAX_EXPRESSION_NESTING} are accepted.",
            field=where,
        )


def _check_tree(node: exp.Expression, text: str, where: str) -> None:
    """Depth and size of the parsed tree, walked without recursion (it may be thousands deep)."""
    count = 0
    stack: list[tuple[exp.Expression, int]] = [(node, 1)]
    while stack:
        current, depth = stack.pop()
        count += 1
        if depth > MAX_EXPRESSION_DEPTH:
            raise MergeSpecError(
                f"{where}: {_excerpt(text)} nests more than {MAX_EXPRESSION_DEPTH} operations deep (a chain of "
                "AND or OR counts one level per term); split it or use IN (...).",
                field=where,
            )
        if count > MAX_EXPRESSION_NODES:
            raise MergeSpecError(
                f"{where}: {_excerpt(text)} has more than {MAX_EXPRESSION_NODES} parts; at most "
                f"{MAX_EXPRESSION_NODES} are accepted.",
                field=where,
            )
        stack.extend((child, depth + 1) for child in current.iter_expressions())


_TOKEN_REPR = re.compile(r"<Token token_type: TokenType\.(?P<type>\w+), text: (?P<text>.*?), line: \d+, col: \d+.*?>")
_MISSING_ARGUMENT = re.compile(r"Required keyword: '\w+' missing for <class '[\w.]+'>")


def parse_error_text(exc: Exception) -> str:
    """What went wrong parsing, in the caller's terms: where (line, and the text there) and what was expected,
    without the parser's own objects (its token and class reprs)."""
    if not isinstance(exc, ParseError) or not exc.errors:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if first.startswith("Error tokenizing"):
            return "a string or a quoted name is not closed"
        return first
    error = exc.errors[0]
    description = _MISSING_ARGUMENT.sub("incomplete or unexpected syntax", str(error.get("description") or ""))
    description = _TOKEN_REPR.sub(
        lambda m: "the end of the text" if m["type"] == "SENTINEL" else repr(m["text"]), description
    )
    highlight = str(error.get("highlight") or "")
    line = error.get("line")
    where = f"line {line}" if line else ""
    if highlight and highlight != "SENTINEL":
        where += f" near {highlight!r}"
    return f"{description} ({where.strip()})" if where.strip() else description


SUBQUERY_REFUSED = (
    "subqueries are not supported in a MERGE expression; a merge reads other tables in its source query "
    "(USING (SELECT ...))."
)


def parse_expression(text: str, where: str) -> exp.Expression:
    """One Spark SQL expression; ``where`` names its place in the spec for the error message. Its size is
    bounded (length, nesting, tree depth and parts) so no input can exhaust the parser's or Spark's stack."""
    if not isinstance(text, str) or not text.strip():
        raise MergeSpecError(f"{where}: the expression is empty.", field=where)
    _check_size(text, where)
    try:
        parsed = sqlglot.parse(quote_dereferenced_names(text), read=DIALECT)
    except RecursionError:
        raise MergeSpecError(f"{where}: {_excerpt(text)} nests too deeply to parse.", field=where) from None
    except Exception as exc:
        raise MergeSpecError(
            f"{where}: cannot parse {_excerpt(text)} as a Spark SQL expression: {parse_error_text(exc)}", field=where
        ) from None
    if len(parsed) != 1 or parsed[0] is None:
        raise MergeSpecError(f"{where}: expected one expression, got {_excerpt(text)}.", field=where)
    node = parsed[0]
    if isinstance(node, exp.Subquery):
        raise MergeSpecError(f"{where}: {SUBQUERY_REFUSED}", field=where)
    if isinstance(node, (exp.Query, exp.Command, exp.DDL, exp.DML, exp.Alias)) or not isinstance(node, exp.Expression):
        raise MergeSpecError(f"{where}: {_excerpt(text)} is not an expression.", field=where)
    _check_tree(node, text, where)
    check_kept(text, regenerate(node, where), where)
    return node


def parse_query(text: str, where: str) -> exp.Query:
    """One Spark SQL query (SELECT, set operations, WITH, VALUES)."""
    try:
        parsed = sqlglot.parse(text, read=DIALECT)
    except Exception as exc:
        raise MergeSpecError(f"{where}: cannot parse the source query: {parse_error_text(exc)}", field=where) from None
    if len(parsed) != 1 or not isinstance(parsed[0], exp.Query):
        raise MergeSpecError(f"{where}: the source query must be one SELECT.", field=where)
    return parsed[0]


def sql(node: exp.Expr, where: str = "expression") -> str:
    """Spark SQL text of a tree, without comments (Spark and sqlglot read comments differently)."""
    return regenerate(node, where)
