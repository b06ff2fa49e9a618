"""The AUTO CDC spec: a change feed's batch, how its events are keyed, ordered and read, and how the target keeps
them (SCD type 1 or 2). Names follow Databricks' AUTO CDC and Spark's AutoCDC (``ChangeArgs``); docs/auto-cdc.md
says what each means here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from engine.errors import MergeSpecError
from engine.spec import DeletionVectorsMode, Source, TableSource

START_AT = "__START_AT"
"""The sequence from which a row's values hold: SCD 1's current row and each SCD 2 version carry it."""
END_AT = "__END_AT"
"""The sequence at which an SCD 2 version stopped holding; null for a key's current version."""
DELETE_AT = "__DELETE_AT"
"""The sequence of a key's newest delete, in SCD 1's tombstones table."""
EVENT_AT = "__EVENT_AT"
"""An event's sequence, in SCD 2's events table."""
IS_DELETE = "__IS_DELETE"
"""Whether an event of SCD 2's events table is a delete."""
RESERVED_PREFIX = "__cdc_"
"""Columns the compiled merge adds to the batch while it runs; a source column may not start with it."""
STATE_DIRS = {1: "_auto_cdc_tombstones", 2: "_auto_cdc_events"}
"""The state table's directory inside the target's, by SCD type: Delta readers and VACUUM leave ``_`` directories
alone."""

ScdType = Literal[1, 2]


@dataclass(frozen=True)
class AutoCdcSpec:
    target: str
    source: Source
    keys: tuple[str, ...]
    sequence_by: tuple[str, ...]
    """One Spark SQL expression over the source's columns, or several compared in order (a struct of them)."""
    apply_as_deletes: str | None = None
    apply_as_truncates: str | None = None
    column_list: tuple[str, ...] | None = None
    except_column_list: tuple[str, ...] | None = None
    ignore_null_updates: bool = False
    ignore_null_updates_column_list: tuple[str, ...] | None = None
    ignore_null_updates_except_column_list: tuple[str, ...] | None = None
    stored_as_scd_type: ScdType = 1
    track_history_column_list: tuple[str, ...] | None = None
    track_history_except_column_list: tuple[str, ...] | None = None
    deletion_vectors: DeletionVectorsMode = "auto"
    lake_roots: tuple[str, ...] = ()

    @property
    def state(self) -> str:
        """The state table beside the target: SCD 1's tombstones, or SCD 2's events."""
        return self.target.rstrip("/") + "/" + STATE_DIRS[self.stored_as_scd_type]

    def validate(self) -> AutoCdcSpec:
        """The rules that need no table: each a ``MergeSpecError`` naming its field."""
        if isinstance(self.source, TableSource):
            self.source.delta_read()
        if not self.keys:
            raise MergeSpecError("keys: at least one key column is needed.", field="keys")
        _distinct(self.keys, "keys")
        if not self.sequence_by or any(not s.strip() for s in self.sequence_by):
            raise MergeSpecError(
                "sequence_by: a column or expression that orders the events is needed.", field="sequence_by"
            )
        for name in ("apply_as_deletes", "apply_as_truncates"):
            value = getattr(self, name)
            if value is not None and not value.strip():
                raise MergeSpecError(f"{name}: the condition is empty.", field=name)
        if self.apply_as_truncates is not None and self.stored_as_scd_type == 2:
            raise MergeSpecError(
                "apply_as_truncates: truncates apply to SCD type 1 only (SCD type 2 keeps history).",
                field="apply_as_truncates",
            )
        if self.stored_as_scd_type not in (1, 2):
            raise MergeSpecError(
                f"stored_as_scd_type: 1 or 2, not {self.stored_as_scd_type!r}.", field="stored_as_scd_type"
            )
        for include, exclude in (
            ("column_list", "except_column_list"),
            ("ignore_null_updates_column_list", "ignore_null_updates_except_column_list"),
            ("track_history_column_list", "track_history_except_column_list"),
        ):
            if getattr(self, include) is not None and getattr(self, exclude) is not None:
                raise MergeSpecError(f"{exclude}: give {include} or {exclude}, not both.", field=exclude)
            for name in (include, exclude):
                if getattr(self, name) is not None:
                    _distinct(getattr(self, name), name)
        if self.ignore_null_updates and (
            self.ignore_null_updates_column_list is not None or self.ignore_null_updates_except_column_list is not None
        ):
            raise MergeSpecError(
                "ignore_null_updates: give ignore_null_updates or one of its column lists, not both.",
                field="ignore_null_updates",
            )
        if self.stored_as_scd_type == 1:
            for name in ("track_history_column_list", "track_history_except_column_list"):
                if getattr(self, name) is not None:
                    raise MergeSpecError(f"{name}: history is tracked by SCD type 2 only.", field=name)
        if self.deletion_vectors not in ("auto", "off"):
            raise MergeSpecError(f"deletion_vectors is 'auto' or 'off', not {self.deletion_vectors!r}.")
        return self


def _distinct(names: Sequence[str], field: str) -> None:
    seen: set[str] = set()
    for index, name in enumerate(names):
        if not name:
            raise MergeSpecError(f"{field}[{index}]: a column name is empty.", field=f"{field}[{index}]")
        if name.lower() in seen:
            raise MergeSpecError(f"{field}[{index}]: {name!r} is named twice.", field=f"{field}[{index}]")
        seen.add(name.lower())
