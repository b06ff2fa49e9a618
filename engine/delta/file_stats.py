"""Delta's per-file statistics (PROTOCOL.md "Per-file Statistics") as a value, read from and written to the
``stats`` JSON of an ``add`` action."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from pyspark.sql import types as T

from engine.delta.column_mapping import has_physical_names, rename_stats
from engine.delta.values import leaf_fields, normalize_stat_value, put_at_path, stat_value_json


@dataclass(frozen=True)
class FileStats:
    """Delta's per-file statistics: ``numRecords``, ``minValues``, ``maxValues``, ``nullCount``; nested dicts for
    struct columns, keyed by (physical = logical) column name. Values are typed (see engine.delta.values).

    A file with a deletion vector keeps the statistics of its physical rows: ``numRecords`` counts them all, and
    with ``tightBounds`` false min/max are bounds of the live rows and ``nullCount`` tells only "none" (0) or
    "all" (``numRecords``) (PROTOCOL.md "Per-file Statistics"). Data skipping asks exactly those questions."""

    num_records: int | None
    min_values: Mapping[str, Any] = field(default_factory=dict)
    max_values: Mapping[str, Any] = field(default_factory=dict)
    null_count: Mapping[str, Any] = field(default_factory=dict)
    tight_bounds: bool | None = None
    """None when the statistics do not say, which the protocol reads as true."""

    def to_json(self) -> str:
        parts = []
        if self.num_records is not None:
            parts.append(f'"numRecords":{self.num_records}')
        if self.tight_bounds is not None:
            parts.append(f'"tightBounds":{"true" if self.tight_bounds else "false"}')
        for key, values in (
            ("minValues", self.min_values),
            ("maxValues", self.max_values),
            ("nullCount", self.null_count),
        ):
            if values:
                parts.append(f'"{key}":{_nested_json(values)}')
        return "{" + ",".join(parts) + "}"

    @staticmethod
    def from_json(text: str | None, schema: T.StructType) -> FileStats | None:
        """Parse an ``add.stats`` string against the table schema; unknown or unparsable values are dropped."""
        if not text:
            return None
        try:
            raw = json.loads(text, parse_float=Decimal)
        except ValueError:
            return None
        if not isinstance(raw, dict):
            return None
        num = raw.get("numRecords")
        tight = raw.get("tightBounds")
        mapped = has_physical_names(schema)

        def logical(values: Any) -> Any:
            # Column mapping: the log keys statistics by physical names.
            return rename_stats(values, schema, to_physical=False) if mapped and isinstance(values, Mapping) else values

        return FileStats(
            num_records=int(num) if isinstance(num, (int, Decimal)) else None,
            min_values=typed_stats(logical(raw.get("minValues")), schema),
            max_values=typed_stats(logical(raw.get("maxValues")), schema),
            null_count=null_counts(logical(raw.get("nullCount"))),
            tight_bounds=tight if isinstance(tight, bool) else None,
        )

    def value(self, kind: str, path: Sequence[str]) -> Any:
        """One statistic by column path (``kind``: min_values, max_values or null_count); None if absent."""
        node: Any = getattr(self, kind)
        for name in path:
            if not isinstance(node, Mapping):
                return None
            if name in node:
                node = node[name]
            else:
                lowered = name.lower()
                node = next((v for k, v in node.items() if k.lower() == lowered), None)
        return None if isinstance(node, Mapping) else node


def typed_stats(raw: Any, schema: T.StructType) -> dict[str, Any]:
    """min/max values typed by the schema's leaf types; values of unknown columns are dropped."""
    return typed_leaf_values(raw, leaf_fields(schema))


def typed_leaf_values(raw: Any, leaves: Iterable[tuple[tuple[str, ...], T.DataType]]) -> dict[str, Any]:
    """min/max values at the given leaf paths, typed by their types; anything else dropped."""
    if not isinstance(raw, Mapping):
        return {}
    out: dict[str, Any] = {}
    for path, dtype in leaves:
        node: Any = raw
        for name in path:
            node = node.get(name) if isinstance(node, Mapping) else None
        if node is None or isinstance(node, Mapping):
            continue
        value = normalize_stat_value(node, dtype)
        if value is not None:
            put_at_path(out, path, value)
    return out


def null_counts(raw: Any) -> dict[str, Any]:
    """``nullCount`` as nested dicts of ints; anything else in it (a bool, a string) dropped."""
    if not isinstance(raw, Mapping):
        return {}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if isinstance(value, Mapping):
            nested = null_counts(value)
            if nested:
                out[key] = nested
        elif isinstance(value, (int, Decimal)) and not isinstance(value, bool):
            out[key] = int(value)
    return out


def _nested_json(values: Mapping[str, Any]) -> str:
    items = []
    for key, value in values.items():
        if isinstance(value, float) and not math.isfinite(value):
            continue  # not representable in JSON; a missing statistic is always safe
        text = _nested_json(value) if isinstance(value, Mapping) else stat_value_json(value)
        items.append(json.dumps(key, ensure_ascii=False) + ":" + text)
    return "{" + ",".join(items) + "}"
