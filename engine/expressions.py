"""Spark SQL expressions of a merge, read with sqlglot: parsing, safety rules, and the analysis of the ON
condition that data skipping needs (Delta's ``getTargetOnlyPredicates``, plus join keys for source ranges).

Spark itself resolves names and types when the merge runs; this module only judges what can be judged
without a table: syntax, forbidden constructs, and which side of the merge a reference names.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError
from sqlglot.tokens import Token, TokenType

from engine.delta import ColumnPathError, parse_column_path, quote_path
from engine.delta import quote_identifier as quote_identifier  # the one quoting of names, for the engine
from engine.errors import MergeResolutionError, MergeSpecError
from engine.functions import ALLOWED_FUNCTIONS, BARE_FUNCTION_NAMES, REFUSED_FUNCTIONS, SYNTAX_BEFORE_PAREN
from engine.identifiers import quote_dereferenced_names
from engine.spec import InsertAction, MergeClause, MergeSpec, QuerySource, UpdateAction

DIALECT = "spark"

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
            f"{where}: the expression is {len(text)} characters long; at most {MAX_EXPRESSION_CHARS} are accepted."
        )
    nesting = nesting_depth(text)
    if nesting > MAX_EXPRESSION_NESTING:
        raise MergeSpecError(
            f"{where}: parentheses or brackets nest {nesting} levels deep in {_excerpt(text)}; "
            f"at most {MAX_EXPRESSION_NESTING} are accepted."
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
                "AND or OR counts one level per term); split it or use IN (...)."
            )
        if count > MAX_EXPRESSION_NODES:
            raise MergeSpecError(
                f"{where}: {_excerpt(text)} has more than {MAX_EXPRESSION_NODES} parts; at most "
                f"{MAX_EXPRESSION_NODES} are accepted."
            )
        stack.extend((child, depth + 1) for child in current.iter_expressions())


def parse_expression(text: str, where: str) -> exp.Expression:
    """One Spark SQL expression; ``where`` names its place in the spec for the error message. Its size is
    bounded (length, nesting, tree depth and parts) so no input can exhaust the parser's or Spark's stack."""
    if not isinstance(text, str) or not text.strip():
        raise MergeSpecError(f"{where}: the expression is empty.")
    _check_size(text, where)
    try:
        parsed = sqlglot.parse(quote_dereferenced_names(text), read=DIALECT)
    except ParseError as exc:
        first = exc.errors[0]["description"] if exc.errors else str(exc)
        raise MergeSpecError(f"{where}: cannot parse {_excerpt(text)} as a Spark SQL expression: {first}") from None
    except RecursionError:
        raise MergeSpecError(f"{where}: {_excerpt(text)} nests too deeply to parse.") from None
    except Exception as exc:
        first = f"{type(exc).__name__}: {exc}"
        raise MergeSpecError(f"{where}: cannot parse {_excerpt(text)} as a Spark SQL expression: {first}") from None
    if len(parsed) != 1 or parsed[0] is None:
        raise MergeSpecError(f"{where}: expected one expression, got {_excerpt(text)}.")
    node = parsed[0]
    if isinstance(node, (exp.Query, exp.Command, exp.DDL, exp.DML, exp.Alias)) or not isinstance(node, exp.Expression):
        raise MergeSpecError(f"{where}: {_excerpt(text)} is not an expression.")
    _check_tree(node, text, where)
    return node


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
            raise MergeSpecError(f"{where}: subqueries are not supported in a MERGE expression.")
        if isinstance(sub, exp.Window):
            raise MergeSpecError(f"{where}: window functions are not supported in a MERGE expression.")
        if isinstance(sub, exp.AggFunc):
            raise MergeSpecError(
                f"{where}: aggregate functions are not supported in a MERGE expression ({sub.sql(dialect=DIALECT)})."
            )
        name = function_name(sub)
        if isinstance(sub, exp.Anonymous):
            check_function_name(name, where)
        if deterministic and (name in NONDETERMINISTIC_FUNCTIONS or isinstance(sub, (exp.Rand, exp.Randn))):
            raise MergeSpecError(
                f"{where}: non-deterministic functions are not supported in a MERGE condition ({name}())."
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
    raise MergeSpecError(f"{where}: the function {name}() is not allowed in a merge: {reason}.")


def spark_text(node: exp.Expr, where: str) -> str:
    """The Spark SQL text of a checked tree, as Spark will be sent it: regenerated (never the caller's own text,
    which Spark might read differently from sqlglot), without comments, and checked once more as Spark reads it."""
    text = node.sql(dialect=DIALECT, comments=False)
    check_spark_text(text, where)
    return text


def check_spark_text(text: str, where: str) -> None:
    """The rules on what Spark will read: every ``name(`` is an allowed function or SQL syntax, no bare name
    Spark resolves as a function (``user``), no script transform, no ``${...}`` (Spark's variable substitution
    reads the server's environment)."""
    if "${" in text:
        raise MergeSpecError(
            f"{where}: '${{' is not allowed: Spark substitutes variables (including environment variables) there."
        )
    try:
        tokens = sqlglot.Dialect.get_or_raise(DIALECT).tokenize(text)
    except Exception:
        raise MergeSpecError(f"{where}: cannot read the expression as Spark SQL.") from None
    for index, token in enumerate(tokens):
        before = tokens[index - 1] if index else None
        after = tokens[index + 1] if index + 1 < len(tokens) else None
        if token.token_type == TokenType.USING and (after is None or after.token_type != TokenType.L_PAREN):
            raise MergeSpecError(
                f"{where}: script transforms (... USING 'command') are not allowed: they run a command on the "
                "Spark server."
            )
        if not _is_word(token):
            continue
        name = token.text.lower()
        if after is not None and after.token_type == TokenType.L_PAREN:
            _check_call(name, before, where)
        elif name in BARE_FUNCTION_NAMES and not _qualified_or_alias(before):
            raise MergeSpecError(
                f"{where}: {token.text} is not allowed unqualified: Spark reads it as the function {name}(), "
                f"{REFUSED_FUNCTIONS[name]}; qualify a column of that name with its table's alias."
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
            "built-in functions by their plain names."
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
                "command on the Spark server."
            )
        if isinstance(node, (exp.Hint, exp.JoinHint)):
            raise MergeSpecError(f"{where}: query hints are not allowed in a merge's source query.")
        if isinstance(node, exp.TableSample):
            raise MergeSpecError(f"{where}: TABLESAMPLE is not supported in a merge's source query.")
        if isinstance(node, _STATEMENTS):
            raise MergeSpecError(f"{where}: only a SELECT may be the source of a merge.")
        if isinstance(node, exp.With) and node.args.get("recursive"):
            raise MergeSpecError(f"{where}: recursive CTEs (WITH RECURSIVE) are not supported.")
        if (
            isinstance(node, exp.CTE)
            and isinstance(node.args.get("alias"), exp.TableAlias)
            and node.args["alias"].columns
        ):
            raise MergeSpecError(
                f"{where}: CTE column lists ({node.alias_or_name}(...) AS) are not supported; name the columns in "
                "the CTE's SELECT."
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
            "read tables by path, as delta.`/path`."
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
        "(delta.`/path`, parquet., json., csv.) nor a CTE of the query."
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


def parse_query(text: str, where: str) -> exp.Query:
    """One Spark SQL query (SELECT, set operations, WITH, VALUES)."""
    try:
        parsed = sqlglot.parse(text, read=DIALECT)
    except ParseError as exc:
        first = exc.errors[0]["description"] if exc.errors else str(exc)
        raise MergeSpecError(f"{where}: cannot parse the source query: {first}") from None
    except Exception as exc:
        raise MergeSpecError(f"{where}: cannot parse the source query: {type(exc).__name__}") from None
    if len(parsed) != 1 or not isinstance(parsed[0], exp.Query):
        raise MergeSpecError(f"{where}: the source query must be one SELECT.")
    return parsed[0]


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
    return canonical_spec(spec)


def canonical_spec(spec: MergeSpec) -> MergeSpec:
    """The spec with every expression and the source query as ``spark_text`` regenerates them: what runs in
    Spark is exactly what was checked."""

    def text(value: str, where: str) -> str:
        return spark_text(parse_expression(value, where), where)

    def clause(c: MergeClause, index: int) -> MergeClause:
        where = clause_where(c, index)
        condition = None if c.condition is None else text(c.condition, f"{where}.condition")
        action = c.action
        if isinstance(action, UpdateAction) and not action.star:
            action = dataclasses.replace(action, set={k: text(v, f"{where}.set.{k}") for k, v in action.set.items()})
        elif isinstance(action, InsertAction) and not action.star:
            action = dataclasses.replace(
                action, values={k: text(v, f"{where}.values.{k}") for k, v in action.values.items()}
            )
        return dataclasses.replace(c, condition=condition, action=action)

    source = spec.source
    if isinstance(source, QuerySource):
        identity = {name: name for name in source.relations}
        source = dataclasses.replace(source, query=source_query_sql(source.query, identity, "source.query"))
    return dataclasses.replace(
        spec,
        on=text(spec.on, "on"),
        source=source,
        matched=tuple(clause(c, i) for i, c in enumerate(spec.matched)),
        not_matched=tuple(clause(c, i) for i, c in enumerate(spec.not_matched)),
        not_matched_by_source=tuple(clause(c, i) for i, c in enumerate(spec.not_matched_by_source)),
    )


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


def target_only_predicates(on: str, sides: Sides) -> list[exp.Expr]:
    """Conjuncts of ON that reference only the target (Delta's getTargetOnlyPredicates), unqualified."""
    result = []
    for conjunct in conjuncts(parse_expression(on, "on")):
        found = sides.sides_of(conjunct)
        if found == {"target"} and not any(function_name(n) in NONDETERMINISTIC_FUNCTIONS for n in conjunct.walk()):
            result.append(strip_qualifiers(conjunct))
    return result


def equi_join_keys(on: str, sides: Sides) -> list[tuple[str, exp.Expr]]:
    """``target_col = <source-only expression>`` conjuncts of ON: the target column and the source side.
    Ranges and values of the source side bound the target files that can match."""
    keys: list[tuple[str, exp.Expr]] = []
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
    target_only: tuple[exp.Expr, ...]
    source_only: tuple[exp.Expr, ...]


def keyed_on(on: str, sides: Sides) -> KeyedOn | None:
    """ON split into key equalities between a target column and a source column, and conjuncts that read one
    side only; None when some conjunct mixes the sides otherwise, or a reference cannot be placed. Such an ON
    matches a target row with at most one distinct source key, which lets findTouchedFiles count the source
    rows per key instead of the matches per target row."""
    aliases = {"target": sides.target_alias, "source": sides.source_alias}
    keys: list[KeyEquality] = []
    target_only: list[exp.Expr] = []
    source_only: list[exp.Expr] = []
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


def _qualified(node: exp.Expr, sides: Sides, aliases: dict[str, str]) -> exp.Expr:
    def qualify(n: exp.Expr) -> exp.Expr:
        if isinstance(n, exp.Column):
            side = sides.side(n)
            assert side is not None
            return exp.column(n.name, table=exp.to_identifier(aliases[side], quoted=True), quoted=True)
        return n

    return node.copy().transform(qualify)


def sql(node: exp.Expr) -> str:
    """Spark SQL text of a tree, without comments (Spark and sqlglot read comments differently)."""
    return node.sql(dialect=DIALECT, comments=False)


def and_all(nodes: Iterable[exp.Expr]) -> exp.Expr | None:
    nodes = list(nodes)
    if not nodes:
        return None
    return exp.and_(*nodes) if len(nodes) > 1 else nodes[0]


def referenced_columns(text: str, where: str) -> Sequence[exp.Column]:
    return list(parse_expression(text, where).find_all(exp.Column))
