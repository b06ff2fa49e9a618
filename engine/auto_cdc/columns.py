"""Which of the batch's columns the target keeps, which are keys, which a null leaves alone and which SCD 2
versions on: the spec's column lists resolved against the batch's schema, as Spark matches names (ignoring case)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from engine.auto_cdc.spec import DELETE_AT, END_AT, EVENT_AT, IS_DELETE, RESERVED_PREFIX, START_AT, AutoCdcSpec
from engine.errors import MergeSpecError

Fields = Mapping[str, "Fields | None"]
"""A struct's fields by name: a nested struct's own fields, or None for any other type."""


@dataclass(frozen=True)
class Columns:
    keys: tuple[str, ...]
    kept: tuple[str, ...]
    """Every column the target keeps from the batch, keys included, in the batch's order."""
    null_kept: frozenset[str]
    """Value columns whose null in an update keeps the value the row had."""
    tracked: tuple[str, ...]
    """Value columns whose change starts a new SCD 2 version."""
    structs: Mapping[str, Fields] = field(default_factory=dict)
    """The fields of each struct value column (nested structs as their own fields): a null field of an update
    keeps the row's value of that field, as a null column does."""
    unordered: frozenset[str] = frozenset()
    """Value columns whose type holds a MAP or a VARIANT, which Spark cannot compare (``<=>``): SCD 2 compares
    their JSON."""

    @property
    def values(self) -> tuple[str, ...]:
        return tuple(c for c in self.kept if c not in self.keys)


def resolve_columns(spec: AutoCdcSpec, batch_columns: Sequence[str]) -> Columns:
    by_lower = {c.lower(): c for c in batch_columns}
    for column in batch_columns:
        reserved = (START_AT, END_AT, DELETE_AT, EVENT_AT, IS_DELETE)
        if column.lower().startswith(RESERVED_PREFIX) or column.lower() in {r.lower() for r in reserved}:
            raise MergeSpecError(
                f"source: the column {column!r} has a name the AUTO CDC merge keeps for itself "
                f"({', '.join(reserved)} and names starting {RESERVED_PREFIX}); rename it or leave it out with "
                "except_column_list.",
                field="source",
            )

    def find(names: Sequence[str], field: str) -> tuple[str, ...]:
        missing = [n for n in names if n.lower() not in by_lower]
        if missing:
            raise MergeSpecError(
                f"{field}: {', '.join(repr(m) for m in missing)} not among the source's columns "
                f"({', '.join(batch_columns)}).",
                field=field,
            )
        return tuple(by_lower[n.lower()] for n in names)

    keys = find(spec.keys, "keys")
    if spec.column_list is not None:
        chosen = set(find(spec.column_list, "column_list"))
        kept = tuple(c for c in batch_columns if c in chosen)
    elif spec.except_column_list is not None:
        dropped = set(find(spec.except_column_list, "except_column_list"))
        kept = tuple(c for c in batch_columns if c not in dropped)
    else:
        kept = tuple(batch_columns)
    lost = [k for k in keys if k not in kept]
    if lost:
        field = "column_list" if spec.column_list is not None else "except_column_list"
        raise MergeSpecError(f"{field}: the key column(s) {', '.join(lost)} must be kept in the target.", field=field)
    values = [c for c in kept if c not in keys]
    null_kept = frozenset(
        _subset(
            spec.ignore_null_updates,
            spec.ignore_null_updates_column_list,
            spec.ignore_null_updates_except_column_list,
            values,
            find,
            "ignore_null_updates",
        )
    )
    tracked = tuple(
        _subset(
            True, spec.track_history_column_list, spec.track_history_except_column_list, values, find, "track_history"
        )
    )
    return Columns(keys=keys, kept=kept, null_kept=null_kept, tracked=tracked)


def _subset(
    every: bool,
    include: tuple[str, ...] | None,
    exclude: tuple[str, ...] | None,
    values: list[str],
    find: object,
    prefix: str,
) -> list[str]:
    """``values`` narrowed by an include or exclude list (named for errors as ``prefix_column_list``)."""
    assert callable(find)
    if include is not None:
        field = f"{prefix}_column_list"
        chosen = set(find(include, field))
        outside = sorted(chosen - set(values))
        if outside:
            raise MergeSpecError(f"{field}: {', '.join(outside)} are keys or not kept in the target.", field=field)
        return [c for c in values if c in chosen]
    if exclude is not None:
        dropped = set(find(exclude, f"{prefix}_except_column_list"))
        return [c for c in values if c not in dropped]
    return list(values) if every else []
