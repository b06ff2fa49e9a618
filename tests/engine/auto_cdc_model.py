"""The reference model of AUTO CDC's documented semantics (docs/auto-cdc.md): a change feed applied event by event
in sequence order, to a plain dict. The engine's batches must end where this ends."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Event:
    key: int | None
    seq: int
    delete: bool
    values: tuple[Any, ...]
    truncate: bool = False
    """A truncate (SCD 1): every row goes; its key is null."""


@dataclass
class Model:
    """``values`` are the value columns' names in order; ``null_kept`` those a null update leaves alone;
    ``tracked`` those whose change starts a new SCD 2 version."""

    values: Sequence[str]
    scd_type: int = 1
    null_kept: frozenset[str] = frozenset()
    tracked: Sequence[str] | None = None
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)
    """SCD 1: the current row of each key (values and ``__START_AT``)."""
    history: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    """SCD 2: every version of each key, oldest first (values, ``__START_AT``, ``__END_AT``)."""

    def apply(self, events: Iterable[Event]) -> Model:
        # At one sequence a delete or truncate comes before an upsert: the upsert wins, as in Spark's AutoCDC.
        for event in sorted(events, key=lambda e: (e.seq, not (e.delete or e.truncate))):
            if event.truncate:
                self.rows.clear()
            elif self.scd_type == 1:
                self._scd1(event)
            else:
                self._scd2(event)
        return self

    def _merged(self, current: dict[str, Any] | None, event: Event) -> dict[str, Any]:
        new = dict(zip(self.values, event.values, strict=True))
        if current is not None:
            for name in self.null_kept:
                if new[name] is None:
                    new[name] = current[name]
        return new

    def _scd1(self, event: Event) -> None:
        assert event.key is not None
        if event.delete:
            self.rows.pop(event.key, None)
            return
        row = self._merged(self.rows.get(event.key), event)
        row["__START_AT"] = event.seq
        self.rows[event.key] = row

    def _scd2(self, event: Event) -> None:
        assert event.key is not None
        versions = self.history.setdefault(event.key, [])
        current = versions[-1] if versions and versions[-1]["__END_AT"] is None else None
        if event.delete:
            if current is not None:
                current["__END_AT"] = event.seq
            return
        row = self._merged(current, event)
        tracked = self.values if self.tracked is None else self.tracked
        if current is not None and all(current[c] == row[c] for c in tracked):
            current.update(row)  # only untracked columns changed: the version is updated in place
            return
        if current is not None:
            current["__END_AT"] = event.seq
        versions.append({**row, "__START_AT": event.seq, "__END_AT": None})

    def table(self) -> list[tuple[Any, ...]]:
        """The target's rows as sorted tuples: key, values, ``__START_AT`` (and ``__END_AT`` for SCD 2)."""
        out: list[tuple[Any, ...]] = []
        if self.scd_type == 1:
            for key, row in self.rows.items():
                out.append((key, *(row[c] for c in self.values), row["__START_AT"]))
        else:
            for key, versions in self.history.items():
                for v in versions:
                    out.append((key, *(v[c] for c in self.values), v["__START_AT"], v["__END_AT"]))
        return sorted(out, key=repr)
