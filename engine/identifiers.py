"""Names in Spark SQL text that Spark's parser reads as names whatever the word, backquoted before sqlglot reads
the text, so that a column called ``comment``, ``select`` or ``null`` is read as Spark reads it.

Spark (without ``spark.sql.ansi.enforceReservedKeywords``) takes any keyword as a name where its grammar wants an
``identifier``: after a dot (``s.select``), in the column paths an ``UPDATE SET`` assigns and in an ``INSERT``
column list. sqlglot reads many keywords there as the start of a statement or a literal (``SET null = ...``
becomes ``SET NULL = ...``), so those words are quoted first; plain names stay as written. A bare keyword
inside an expression is left to the parser: there Spark itself reads ``null``, ``true`` or ``case`` as what the
keyword means.
"""

from __future__ import annotations

import re

from sqlglot.dialects.spark import Spark
from sqlglot.errors import TokenError
from sqlglot.tokens import Token, TokenType

from engine.delta.names import quote_identifier

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


def _quoted(text: str, tokens: list[Token], marked: set[int]) -> str:
    pieces, last = [], 0
    for i in sorted(marked):
        token = tokens[i]
        pieces.append(text[last : token.start])
        pieces.append(quote_identifier(token.text))
        last = token.end + 1
    pieces.append(text[last:])
    return "".join(pieces)


def quote_dereferenced_names(text: str) -> str:
    """An expression with every word after ``name.`` backquoted (``s.select`` -> ``s.`select```); raises
    InvalidIdentifierError for an unquoted name Spark refuses."""
    tokens = _tokens(text)
    return text if tokens is None else _quoted(text, tokens, _dereferenced(tokens))


def quote_merge_names(text: str) -> str:
    """A MERGE statement with the words Spark reads as names whatever they are backquoted: after ``name.``, in
    the keys of UPDATE SET and in INSERT column lists; raises InvalidIdentifierError for an unquoted name Spark
    refuses."""
    tokens = _tokens(text)
    return text if tokens is None else _quoted(text, tokens, _dereferenced(tokens) | _assigned(tokens))
