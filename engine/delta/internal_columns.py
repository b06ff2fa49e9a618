"""The names of the columns the service adds to a table's rows while it reads, joins and writes them.

Every one carries one prefix, so no column a table or a source may hold can be taken for one of them: a user's
column of the same name would be shadowed, or overwritten, mid-plan. A table or source column under the prefix is
refused before anything is read (``docs/engine.md``, "Internal columns").
"""

from __future__ import annotations

from collections.abc import Iterable

INTERNAL_PREFIX = "__merge_service_"


def internal_column(name: str) -> str:
    """The column ``name`` under the internal prefix."""
    return INTERNAL_PREFIX + name


def internal_names(names: Iterable[str]) -> list[str]:
    """The names among ``names`` under the internal prefix, as Spark compares names: without regard to case."""
    prefix = INTERNAL_PREFIX.lower()
    return [n for n in names if n.lower().startswith(prefix)]
