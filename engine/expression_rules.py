"""What a merge's expressions and source query may contain, judged without a table: Delta's rules for merge
expressions (no subqueries, aggregates or window functions; deterministic conditions), Spark's built-in functions
on the allowlist (``engine.functions``), and the relations a source query may read."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

import sqlglot
from sqlglot import exp
from sqlglot.tokens import Token, TokenType

from engine.errors import MergeSpecError
from engine.expressions import DIALECT, SUBQUERY_REFUSED, parse_expression, parse_query
from engine.functions import ALLOWED_FUNCTIONS, BARE_FUNCTION_NAMES, REFUSED_FUNCTIONS, SYNTAX_BEFORE_PAREN
from engine.spark_dialect import regenerate

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


def function_name(node: exp.Expr) -> str:
    if isinstance(node, exp.Anonymous):
        return str(node.name).lower()
    if isinstance(node, exp.Func):
        return node.sql_name().lower()
    return ""


def check_expression(node: exp.Expr, where: str, *, deterministic: bool) -> None:
    """Delta's rules for merge expressions: no subqueries, aggregates or window functions; conditions must
    be deterministic. Functions must be on the allowlist (``spark_text`` checks what Spark will be sent)."""
    for sub in node.walk():
        # ``exists(array, x -> ...)`` is a higher-order function, not EXISTS (subquery).
        if isinstance(sub, (exp.Subquery, exp.Query)) or (
            isinstance(sub, exp.Exists) and isinstance(sub.this, (exp.Subquery, exp.Query))
        ):
            raise MergeSpecError(f"{where}: {SUBQUERY_REFUSED}", field=where)
        if isinstance(sub, exp.Window):
            raise MergeSpecError(f"{where}: window functions are not supported in a MERGE expression.", field=where)
        if isinstance(sub, exp.AggFunc):
            raise MergeSpecError(
                f"{where}: aggregate functions are not supported in a MERGE expression ({sub.sql(dialect=DIALECT)}).",
                field=where,
            )
        name = function_name(sub)
        if isinstance(sub, exp.Anonymous):
            check_function_name(name, where)
        if deterministic and (name in NONDETERMINISTIC_FUNCTIONS or isinstance(sub, (exp.Rand, exp.Randn))):
            raise MergeSpecError(
                f"{where}: non-deterministic functions are not supported in a MERGE condition ({name}()).", field=where
            )


def is_deterministic(text: str) -> bool:
    """Whether every evaluation of the expression gives the same value for a row (False where it does not parse)."""
    try:
        node = parse_expression(text, "expression")
    except MergeSpecError:
        return False
    return not any(
        function_name(sub) in NONDETERMINISTIC_FUNCTIONS or isinstance(sub, (exp.Rand, exp.Randn))
        for sub in node.walk()
    )


_STRING_TOKENS = frozenset(
    {
        TokenType.STRING,
        TokenType.BIT_STRING,
        TokenType.HEX_STRING,
        TokenType.BYTE_STRING,
        TokenType.NATIONAL_STRING,
        TokenType.NATIONAL_RAW_STRING,
        TokenType.RAW_STRING,
        TokenType.HEREDOC_STRING,
        TokenType.UNICODE_STRING,
        TokenType.NUMBER,
    }
)
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_function_name(name: str, where: str) -> None:
    """A function a merge may call: one of Spark's built-ins over data (``engine.functions``)."""
    if name in ALLOWED_FUNCTIONS:
        return
    reason = REFUSED_FUNCTIONS.get(name, "it is not one of the Spark built-in functions a merge may call")
    raise MergeSpecError(f"{where}: the function {name}() is not allowed in a merge: {reason}.", field=where)


def spark_text(node: exp.Expr, where: str) -> str:
    """The Spark SQL text of a checked tree, as Spark will be sent it: regenerated (never the caller's own text,
    which Spark might read differently from sqlglot), without comments, and checked once more as Spark reads it."""
    text = regenerate(node, where)
    check_spark_text(text, where)
    return text


def check_spark_text(text: str, where: str) -> None:
    """The rules on what Spark will read: every ``name(`` is an allowed function or SQL syntax, no bare name
    Spark resolves as a function (``user``), no script transform, no ``${...}`` (Spark's variable substitution
    reads the server's environment)."""
    if "${" in text:
        raise MergeSpecError(
            f"{where}: '${{' is not allowed: Spark substitutes variables (including environment variables) there.",
            field=where,
        )
    try:
        tokens = sqlglot.Dialect.get_or_raise(DIALECT).tokenize(text)
    except Exception:
        raise MergeSpecError(f"{where}: cannot read the expression as Spark SQL.", field=where) from None
    for index, token in enumerate(tokens):
        before = tokens[index - 1] if index else None
        after = tokens[index + 1] if index + 1 < len(tokens) else None
        if token.token_type == TokenType.USING and (after is None or after.token_type != TokenType.L_PAREN):
            raise MergeSpecError(
                f"{where}: script transforms (... USING 'command') are not allowed: they run a command on the "
                "Spark server.",
                field=where,
            )
        if not _is_word(token):
            continue
        name = token.text.lower()
        if after is not None and after.token_type == TokenType.L_PAREN:
            _check_call(name, before, where)
        elif name in BARE_FUNCTION_NAMES and not _qualified_or_alias(before):
            raise MergeSpecError(
                f"{where}: {token.text} is not allowed unqualified: Spark reads it as the function {name}(), "
                f"{REFUSED_FUNCTIONS[name]}; qualify a column of that name with its table's alias.",
                field=where,
            )


def _is_word(token: Token) -> bool:
    if token.token_type == TokenType.IDENTIFIER:
        return True
    return token.token_type not in _STRING_TOKENS and _WORD.fullmatch(token.text) is not None


def _qualified_or_alias(before: Token | None) -> bool:
    return before is not None and before.token_type in (TokenType.DOT, TokenType.ALIAS)


def _check_call(name: str, before: Token | None, where: str) -> None:
    if before is not None and before.token_type == TokenType.DOT:
        raise MergeSpecError(
            f"{where}: qualified function names ({name}() after a '.') are not allowed: a merge calls Spark's "
            "built-in functions by their plain names.",
            field=where,
        )
    if before is not None and before.token_type == TokenType.ALIAS:
        return  # ``AS v(a, b)``: a relation's alias and its column names
    if name in SYNTAX_BEFORE_PAREN:
        return
    check_function_name(name, where)


_STATEMENTS = (exp.Command, exp.DDL, exp.DML)


def check_source_query(query: exp.Query, relations: Collection[str], where: str) -> None:
    """The rules for a source query: functions as for every expression, relations only the named ``relations``
    (tables read by path, under placeholder names), the query's own CTEs and inline VALUES; no script
    transforms, hints, sampling, recursive CTEs or table-valued functions."""
    names = {r.lower() for r in relations}
    for node in query.walk():
        if isinstance(node, exp.QueryTransform):
            raise MergeSpecError(
                f"{where}: script transforms (SELECT TRANSFORM(...) USING 'command') are not allowed: they run a "
                "command on the Spark server.",
                field=where,
            )
        if isinstance(node, (exp.Hint, exp.JoinHint)):
            raise MergeSpecError(f"{where}: query hints are not allowed in a merge's source query.", field=where)
        if isinstance(node, exp.TableSample):
            raise MergeSpecError(f"{where}: TABLESAMPLE is not supported in a merge's source query.", field=where)
        if isinstance(node, _STATEMENTS):
            raise MergeSpecError(f"{where}: only a SELECT may be the source of a merge.", field=where)
        if isinstance(node, exp.With) and node.args.get("recursive"):
            raise MergeSpecError(f"{where}: recursive CTEs (WITH RECURSIVE) are not supported.", field=where)
        if (
            isinstance(node, exp.CTE)
            and isinstance(node.args.get("alias"), exp.TableAlias)
            and node.args["alias"].columns
        ):
            raise MergeSpecError(
                f"{where}: CTE column lists ({node.alias_or_name}(...) AS) are not supported; name the columns in "
                "the CTE's SELECT.",
                field=where,
            )
        if isinstance(node, exp.Anonymous):
            check_function_name(function_name(node), where)
        if isinstance(node, exp.Table):
            check_relation(node, names, where)


def check_relation(table: exp.Table, relations: Collection[str], where: str) -> None:
    """A relation of a source query: a table read by path (by its placeholder name) or a CTE in scope."""
    if not isinstance(table.this, exp.Identifier):
        raise MergeSpecError(
            f"{where}: table-valued functions ({table.this.sql(dialect=DIALECT, comments=False)}) are not allowed; "
            "read tables by path, as delta.`/path`.",
            field=where,
        )
    name = table.name.lower()
    if (
        not table.args.get("db")
        and not table.args.get("catalog")
        and (name in relations or name in visible_ctes(table))
    ):
        return
    raise MergeSpecError(
        f"{where}: {table.sql(dialect=DIALECT, comments=False)!r} is neither a table read by path "
        "(delta.`/path`, parquet., json., csv.) nor a CTE of the query.",
        field=where,
    )


def visible_ctes(table: exp.Expr) -> set[str]:
    """The CTE names a table reference can mean, as Spark scopes them: the CTEs of every enclosing WITH, and
    inside a CTE's own definition only the CTEs defined before it (a name not in scope is a catalog table)."""
    names: set[str] = set()
    child: exp.Expr = table
    node = table.parent
    while node is not None:
        if isinstance(node, exp.With):
            ctes = list(node.expressions)
            before = next((i for i, cte in enumerate(ctes) if cte is child), len(ctes))
            names.update(cte.alias_or_name.lower() for cte in ctes[:before])
        elif isinstance(node, exp.Query):
            with_ = node.args.get("with_")
            if isinstance(with_, exp.With) and with_ is not child:
                names.update(cte.alias_or_name.lower() for cte in with_.expressions)
        child, node = node, node.parent
    return names


def source_query_sql(text: str, relations: Mapping[str, str], where: str) -> str:
    """The text Spark runs for a source query: parsed, checked by ``check_source_query``, each placeholder
    relation renamed as ``relations`` maps it, and regenerated by ``spark_text``."""
    query = parse_query(text, where)
    check_source_query(query, relations.keys(), where)
    renames = {k.lower(): v for k, v in relations.items()}
    for table in query.find_all(exp.Table):
        new = renames.get(table.name.lower())
        if new is not None and new != table.name and table.name.lower() not in visible_ctes(table):
            table.set("this", exp.to_identifier(new))
    return spark_text(query, where)
