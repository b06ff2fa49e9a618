"""A merge builder shaped like Delta's Python ``DeltaMergeBuilder``, producing the structured spec of
``POST /merges``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal


def table_source(path: str, format: str = "delta", options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A table source: a Delta table or files Spark reads (``parquet``, ``json``, ``csv``)."""
    return {"format": format, "path": path, "options": dict(options or {})}


def rows_source(rows: list[dict[str, Any]], schema: str | None = None) -> dict[str, Any]:
    """Inline rows, optionally typed by a Spark DDL column list."""
    source: dict[str, Any] = {"rows": rows}
    if schema is not None:
        source["schema"] = schema
    return source


def _clause(action: str, condition: str | None, **fields: Mapping[str, str]) -> dict[str, Any]:
    clause: dict[str, Any] = {"action": action}
    if condition is not None:
        clause["condition"] = condition
    clause.update({k: dict(v) for k, v in fields.items()})
    return clause


@dataclass(frozen=True)
class MergeBuilder:
    """Delta's ``DeltaMergeBuilder`` as a spec: each ``when_*`` call returns a new builder with one clause more,
    in order; ``to_spec()`` is the structured body ``POST /merges`` takes."""

    target: str
    source: Mapping[str, Any]
    on: str
    source_alias: str = "source"
    target_alias: str = "target"
    when_matched: tuple[dict[str, Any], ...] = ()
    when_not_matched: tuple[dict[str, Any], ...] = ()
    when_not_matched_by_source: tuple[dict[str, Any], ...] = ()
    schema_evolution: bool = False
    dry_run: bool = False
    deletion_vectors: Literal["auto", "off"] = "auto"

    def _add(self, kind: str, clause: dict[str, Any]) -> MergeBuilder:
        changes: dict[str, Any] = {kind: (*getattr(self, kind), clause)}
        return dataclasses.replace(self, **changes)

    def when_matched_update(self, set: Mapping[str, str], condition: str | None = None) -> MergeBuilder:
        return self._add("when_matched", _clause("update", condition, set=set))

    def when_matched_update_all(self, condition: str | None = None) -> MergeBuilder:
        return self._add("when_matched", _clause("update_all", condition))

    def when_matched_delete(self, condition: str | None = None) -> MergeBuilder:
        return self._add("when_matched", _clause("delete", condition))

    def when_not_matched_insert(self, values: Mapping[str, str], condition: str | None = None) -> MergeBuilder:
        return self._add("when_not_matched", _clause("insert", condition, values=values))

    def when_not_matched_insert_all(self, condition: str | None = None) -> MergeBuilder:
        return self._add("when_not_matched", _clause("insert_all", condition))

    def when_not_matched_by_source_update(self, set: Mapping[str, str], condition: str | None = None) -> MergeBuilder:
        return self._add("when_not_matched_by_source", _clause("update", condition, set=set))

    def when_not_matched_by_source_delete(self, condition: str | None = None) -> MergeBuilder:
        return self._add("when_not_matched_by_source", _clause("delete", condition))

    def with_schema_evolution(self) -> MergeBuilder:
        return dataclasses.replace(self, schema_evolution=True)

    def as_dry_run(self) -> MergeBuilder:
        return dataclasses.replace(self, dry_run=True)

    def rewriting_files(self) -> MergeBuilder:
        """Touched files rewritten even where the table enables deletion vectors (``deletion_vectors`` off)."""
        return dataclasses.replace(self, deletion_vectors="off")

    def to_spec(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "source": dict(self.source),
            "target_alias": self.target_alias,
            "source_alias": self.source_alias,
            "on": self.on,
            "when_matched": list(self.when_matched),
            "when_not_matched": list(self.when_not_matched),
            "when_not_matched_by_source": list(self.when_not_matched_by_source),
            "schema_evolution": self.schema_evolution,
            "dry_run": self.dry_run,
            "deletion_vectors": self.deletion_vectors,
        }


def merge(
    target: str, source: Mapping[str, Any], on: str, *, source_alias: str = "source", target_alias: str = "target"
) -> MergeBuilder:
    """Start a merge of ``source`` (``table_source`` or ``rows_source``) into the Delta table at ``target``."""
    return MergeBuilder(target, source, on, source_alias=source_alias, target_alias=target_alias)


Merge = MergeBuilder | Mapping[str, Any] | str


def request_body(request: Merge) -> dict[str, Any]:
    if isinstance(request, MergeBuilder):
        return request.to_spec()
    if isinstance(request, str):
        return {"sql": request}
    return dict(request)
