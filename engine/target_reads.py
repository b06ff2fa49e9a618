"""Which of the target's columns a merge's ON and clauses read.

A merge-on-read write never writes a copied or deleted target row, so it needs of the target only the columns
ON, the conditions and the values read: an ``UPDATE SET *`` and ``INSERT *`` upsert reads the key alone. The
answer errs on the side of reading: any name that may be a target column counts, and where a text cannot be read
all columns are.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlglot import exp

from engine.errors import MergeSpecError
from engine.expressions import parse_expression


def target_columns_read(
    expressions: Iterable[exp.Expression | str], target_columns: Sequence[str], *, target_alias: str, source_alias: str
) -> frozenset[str] | None:
    """The target columns (by their names in ``target_columns``) the ``expressions`` (trees, or SQL texts) may read;
    None: all of them."""
    by_lower = {c.lower(): c for c in target_columns}
    t, s = target_alias.lower(), source_alias.lower()
    read: set[str] = set()
    for expression in expressions:
        if isinstance(expression, exp.Expression):
            node = expression
        else:
            try:
                node = parse_expression(expression, "expression")
            except (MergeSpecError, RecursionError):
                return None
        if any(True for _ in node.find_all(exp.Star)):
            return None
        for column in node.find_all(exp.Column):
            names = [p.name.lower() for p in column.parts]
            if len(names) >= 2 and names[0] == s:
                # The source's column (or the field of a target struct column named like the source's alias).
                candidates = names[:1]
            elif len(names) >= 2 and names[0] == t:
                candidates = names[:2]
            else:
                # Unqualified, or a struct's field: any part may name a target column.
                candidates = names
            read.update(by_lower[n] for n in candidates if n in by_lower)
    return frozenset(read)
