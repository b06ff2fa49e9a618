"""Column names as Spark reads and prints them: the one place a name is quoted for Spark, and the one reader of
a written column path (``a.b``, ```a.b```, ```a``b`.c``).

Spark quotes a name part in backticks and doubles any backtick inside (``quoteIdentifier``); a quoted name can
hold any character, so a name can never break out of its quotes. Error messages print names the same way
(Spark's ``toSQLId``).
"""

from __future__ import annotations

from collections.abc import Sequence


class ColumnPathError(ValueError):
    """A written column path that Spark's ``parseAttributeName`` would refuse; the message says why."""


def quote_identifier(name: str) -> str:
    """One name part for Spark SQL: ``a`b`` -> ```a``b```."""
    return "`" + name.replace("`", "``") + "`"


def quote_path(path: Sequence[str]) -> str:
    """A column path for Spark SQL, and as Spark prints it in its messages: ```a`.`b```."""
    return ".".join(quote_identifier(part) for part in path)


def parse_column_path(text: str) -> tuple[str, ...]:
    """The name parts of a written column path, as Spark's ``UnresolvedAttribute.parseAttributeName`` reads
    them: parts split at dots outside backticks, a backquoted part holding anything (a doubled backtick is one
    backtick). Whitespace around a part is dropped; an unquoted part holds no backtick."""
    parts: list[str] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i < n and text[i] == "`":
            part, i = _quoted_part(text, i + 1)
            while i < n and text[i].isspace():
                i += 1
        else:
            start = i
            while i < n and text[i] not in ".`":
                i += 1
            part = text[start:i].strip()
            if i < n and text[i] == "`":
                raise ColumnPathError("a backtick in an unquoted name: backquote the name and double the backtick")
            if not part:
                raise ColumnPathError("an empty name part" if parts or i < n else "the column name is empty")
        parts.append(part)
        if i == n:
            return tuple(parts)
        if text[i] != ".":
            raise ColumnPathError(f"unexpected {text[i:]!r} after the quoted name {quote_identifier(part)}")
        i += 1


def _quoted_part(text: str, i: int) -> tuple[str, int]:
    """The backquoted part that starts at ``text[i]`` (after its opening backtick), and the index after it."""
    chars: list[str] = []
    while i < len(text):
        if text[i] == "`":
            if text[i + 1 : i + 2] == "`":
                chars.append("`")
                i += 2
                continue
            return "".join(chars), i + 1
        chars.append(text[i])
        i += 1
    raise ColumnPathError("a backquoted name is not closed")
