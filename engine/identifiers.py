"""Names in Spark SQL text that Spark's parser reads as names whatever the word, backquoted before sqlglot reads
the text, so that a column called ``comment``, ``select`` or ``null`` is read as Spark reads it.

Spark (without ``spark.sql.ansi.enforceReservedKeywords``) takes any keyword as a name where its grammar wants an
``identifier``: after a dot (``s.select``), in the column paths an ``UPDATE SET`` assigns and in an ``INSERT``
column list; and a keyword that has no meaning inside an expression (``comment``, ``desc``, ``from``...) is a
column there too. sqlglot reads many of those words as the start of a statement or a literal (``SET null = ...``
becomes ``SET NULL = ...``), so they are quoted first; plain names stay as written. A keyword that does mean
something inside an expression (``null``, ``true``, ``case``, ``not``...) keeps its meaning when bare, as in Spark.
"""

from __future__ import annotations

import re

from sqlglot.dialects.spark import Spark
from sqlglot.errors import TokenError
from sqlglot.tokens import Token, TokenType

from engine.delta import quote_identifier

_WORD = re.compile(r"\w+")


class InvalidIdentifierError(ValueError):
    """An unquoted name Spark's parser refuses (Spark's ``INVALID_IDENTIFIER``)."""


def _check_unquoted(tokens: list[Token]) -> None:
    """Spark reads unquoted names of ASCII letters, digits and underscores only; others must be backquoted."""
    for token in tokens:
        if _is_word(token) and not token.text.isascii():
            raise InvalidIdentifierError(
                f"[INVALID_IDENTIFIER] The unquoted identifier {token.text} is invalid and must be back quoted as: "
                f"{quote_identifier(token.text)}."
            )


_NAME_BEFORE_DOT = frozenset({TokenType.IDENTIFIER, TokenType.R_PAREN, TokenType.R_BRACKET})

STATEMENT_WORDS = frozenset(
    """alter analyze begin cache call comment commit create cross declare delete desc describe drop execute explain
    fetch for from grant having if inner insert intersect into join lateral load merge minus on outer pivot
    qualify refresh rename revoke rollback select serdeproperties set show tablesample truncate uncache union
    unpivot update use using values where while with""".split()  # noqa: SIM905
)
"""Spark keywords that sqlglot reads as a clause or statement where Spark reads a column: inside an expression
they mean nothing else to Spark."""

_COMPARISONS = (
    TokenType.EQ,
    TokenType.NEQ,
    TokenType.GT,
    TokenType.GTE,
    TokenType.LT,
    TokenType.LTE,
    TokenType.NULLSAFE_EQ,
    TokenType.PLUS,
    TokenType.DASH,
    TokenType.SLASH,
    TokenType.MOD,
    TokenType.DPIPE,
    TokenType.AND,
    TokenType.OR,
)
_BEFORE_OPERAND = frozenset(
    {
        TokenType.L_PAREN,
        TokenType.COMMA,
        TokenType.STAR,
        TokenType.NOT,
        TokenType.WHEN,
        TokenType.THEN,
        TokenType.ELSE,
        *_COMPARISONS,
    }
)
"""Tokens after which an operand starts."""
_ACTIONS = frozenset({"delete", "update", "insert"})
"""A MERGE clause's action after THEN, never a column."""
_AFTER_OPERAND = frozenset(
    {
        TokenType.R_PAREN,
        TokenType.COMMA,
        TokenType.IS,
        TokenType.IN,
        TokenType.NOT,
        TokenType.BETWEEN,
        TokenType.LIKE,
        TokenType.ILIKE,
        TokenType.RLIKE,
        TokenType.THEN,
        TokenType.WHEN,
        TokenType.ELSE,
        TokenType.END,
        *_COMPARISONS,
    }
)
"""Tokens that follow a whole operand (``*`` left out: ``SELECT *`` is no product)."""


def _is_word(token: Token) -> bool:
    return token.token_type not in (TokenType.STRING, TokenType.NUMBER, TokenType.IDENTIFIER) and bool(
        _WORD.fullmatch(token.text)
    )


def _is_keyword(token: Token) -> bool:
    """A word sqlglot reads as something other than a name (plain names are left as written)."""
    return token.token_type != TokenType.VAR and _is_word(token)


def _tokens(text: str) -> list[Token] | None:
    try:
        tokens = list(Spark().tokenize(text))
    except TokenError:
        return None  # the parser reports the text's own error
    _check_unquoted(tokens)
    return tokens


def _dereferenced(tokens: list[Token]) -> set[int]:
    """Words right after ``name.``: a column of a table or a field of a struct."""
    found = set()
    for i in range(2, len(tokens)):
        before = tokens[i - 2]
        if (
            tokens[i - 1].token_type == TokenType.DOT
            and _is_keyword(tokens[i])
            and (_is_word(before) or before.token_type in _NAME_BEFORE_DOT)
        ):
            found.add(i)
    return found


def _bare_operands(tokens: list[Token], start: int = 0) -> set[int]:
    """Statement words standing alone as an operand from ``tokens[start]`` on: ``from > 1``, ``a = desc``."""
    found = set()
    for i in range(start, len(tokens)):
        token = tokens[i]
        if not _is_word(token) or token.text.lower() not in STATEMENT_WORDS:
            continue
        before = tokens[i - 1].token_type if i > start else None
        after = tokens[i + 1].token_type if i + 1 < len(tokens) else None
        if before == TokenType.THEN and token.text.lower() in _ACTIONS:
            continue
        if (before is None or before in _BEFORE_OPERAND) and (after is None or after in _AFTER_OPERAND):
            found.add(i)
    return found


def _merge_on(tokens: list[Token]) -> int:
    """The index of the token after the MERGE's own ON (outside the USING query's parentheses)."""
    depth = 0
    for i, token in enumerate(tokens):
        if token.token_type == TokenType.L_PAREN:
            depth += 1
        elif token.token_type == TokenType.R_PAREN:
            depth -= 1
        elif token.token_type == TokenType.ON and depth == 0:
            return i + 1
    return len(tokens)


def _assigned(tokens: list[Token]) -> set[int]:
    """Words of the column paths a MERGE assigns: the keys of ``UPDATE SET k = v, ...`` and the ``INSERT (...)``
    column list. A word is a name at the start of a path and after its dots (``* EXCEPT`` is no path)."""
    found: set[int] = set()
    i = 0
    while i < len(tokens) - 1:
        kind, following = tokens[i].token_type, tokens[i + 1].token_type
        if kind == TokenType.INSERT and following == TokenType.L_PAREN:
            i += 2
            expect_name = True
            while i < len(tokens) and tokens[i].token_type != TokenType.R_PAREN:
                if expect_name and _is_keyword(tokens[i]):
                    found.add(i)
                expect_name = tokens[i].token_type in (TokenType.COMMA, TokenType.DOT)
                i += 1
        elif kind == TokenType.UPDATE and following == TokenType.SET:
            i = _set_list(tokens, i + 2, found)
        else:
            i += 1
    return found


def _set_list(tokens: list[Token], i: int, found: set[int]) -> int:
    """Marks the words of each key in the SET list that starts at ``tokens[i]``; answers where the list ends (the
    next WHEN outside any parenthesis or CASE)."""
    in_key, expect_name, depth, cases = True, True, 0, 0
    while i < len(tokens):
        token = tokens[i]
        kind = token.token_type
        after_dot = i > 0 and tokens[i - 1].token_type == TokenType.DOT
        if kind == TokenType.WHEN and depth == 0 and cases <= 0:
            return i
        if in_key:
            if kind == TokenType.EQ:
                in_key = False
            elif expect_name and _is_keyword(token):
                found.add(i)
            expect_name = kind == TokenType.DOT
        elif kind in (TokenType.L_PAREN, TokenType.L_BRACKET):
            depth += 1
        elif kind in (TokenType.R_PAREN, TokenType.R_BRACKET):
            depth -= 1
        elif kind == TokenType.CASE and not after_dot:
            cases += 1
        elif kind == TokenType.END and not after_dot:
            cases -= 1
        elif kind == TokenType.COMMA and depth == 0 and cases <= 0:
            in_key, expect_name = True, True
        i += 1
    return i


def _quoted(text: str, tokens: list[Token], marked: set[int], offset: int = 0) -> str:
    """``text`` with the marked tokens backquoted; the tokens were read from ``text`` behind ``offset``
    characters."""
    pieces, last = [], 0
    for i in sorted(marked):
        token = tokens[i]
        pieces.append(text[last : token.start - offset])
        pieces.append(quote_identifier(token.text))
        last = token.end + 1 - offset
    pieces.append(text[last:])
    return "".join(pieces)


def quote_dereferenced_names(text: str) -> str:
    """An expression with every word after ``name.`` and every statement word standing as an operand backquoted
    (``s.select`` -> ``s.`select```, ``desc > 1`` -> ```desc` > 1``); raises InvalidIdentifierError for an
    unquoted name Spark refuses."""
    # Read behind an opening parenthesis: sqlglot's tokenizer takes the rest of a text that starts with CALL,
    # SHOW, FETCH... as one string, and the parenthesis also starts the first operand.
    tokens = _tokens("(" + text)
    if tokens is None:
        return text
    return _quoted(text, tokens, _dereferenced(tokens) | _bare_operands(tokens), offset=1)


def quote_merge_names(text: str) -> str:
    """A MERGE statement with the words Spark reads as names whatever they are backquoted: after ``name.``, in
    the keys of UPDATE SET and in INSERT column lists, and statement words standing as operands from ON on.
    Raises InvalidIdentifierError for an unquoted name Spark refuses."""
    tokens = _tokens(text)
    if tokens is None:
        return text
    return _quoted(text, tokens, _dereferenced(tokens) | _assigned(tokens) | _bare_operands(tokens, _merge_on(tokens)))
