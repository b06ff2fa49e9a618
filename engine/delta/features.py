"""The protocol gate: which tables this layer may read and write (PROTOCOL.md "Table Features").

The rule: never write a table whose rules we would break. A feature is accepted when it is implemented:
appendOnly, changeDataFeed, timestampNtz, allowColumnDefaults (``DEFAULT_KEY``, for the writer of new rows to
fill in), deletionVectors (every scan drops the rows a file's vector deletes, and a rewrite of such a file drops
them for good: copy-on-write, which the protocol allows even where ``delta.enableDeletionVectors`` is true), and
the row rules of invariants, checkConstraints and generatedColumns, which every write enforces
(see ``constraints``). It is also accepted when the table does not actually use it (a legacy protocol version
implies identity columns: those are refused only when the schema uses them). columnMapping (modes ``name`` and
``id``) is implemented: see ``column_mapping``.
Unknown features are refused.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from engine.delta.actions import Metadata, Protocol
from engine.delta.column_mapping import check_mode
from engine.delta.constraints import table_constraints
from engine.errors import AppendOnlyTableError, UnsupportedTableFeatureError

MAX_READER_VERSION = 3
MAX_WRITER_VERSION = 7

IMPLEMENTED_FEATURES = frozenset(
    {
        "appendOnly",
        "changeDataFeed",
        "timestampNtz",
        "invariants",
        "checkConstraints",
        "generatedColumns",
        "allowColumnDefaults",
        "deletionVectors",
        "columnMapping",
    }
)
"""Features whose rules this layer follows."""

DEFAULT_KEY = "CURRENT_DEFAULT"
"""Field metadata of allowColumnDefaults: the SQL of the value an INSERT gives a column it names no value for."""

USE_CHECKED_FEATURES = frozenset({"identityColumns", "variantType"})
"""Features accepted while the table does not use them (checked against metadata and files)."""

_TRUE = "true"


def _is_true(config: Mapping[str, str], key: str) -> bool:
    return str(config.get(key, "")).strip().lower() == _TRUE


def _field_metadata(schema_json: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any], Any]]:
    """(column path, field metadata, type) for every field, nested ones included."""

    def walk(dtype: Any, prefix: str) -> Iterator[tuple[str, Mapping[str, Any], Any]]:
        if isinstance(dtype, Mapping):
            kind = dtype.get("type")
            if kind == "struct":
                for f in dtype.get("fields", []):
                    name = f"{prefix}{f['name']}"
                    yield name, f.get("metadata") or {}, f.get("type")
                    yield from walk(f.get("type"), name + ".")
            elif kind == "array":
                yield from walk(dtype.get("elementType"), prefix + "element.")
            elif kind == "map":
                yield from walk(dtype.get("keyType"), prefix + "key.")
                yield from walk(dtype.get("valueType"), prefix + "value.")

    yield from walk(schema_json, "")


def features_in_use(metadata: Metadata) -> dict[str, str]:
    """Features the metadata actually uses, each with the evidence (a property or a column)."""
    used: dict[str, str] = {}
    config = metadata.configuration
    for key in config:
        if key.startswith("delta.constraints."):
            used.setdefault("checkConstraints", f"CHECK constraint {key[len('delta.constraints.') :]!r}")
    mode = str(config.get("delta.columnMapping.mode", "none")).strip().lower()
    if mode not in ("", "none"):
        used["columnMapping"] = f"delta.columnMapping.mode = {mode}"
    for key, feature in (
        ("delta.enableRowTracking", "rowTracking"),
        ("delta.enableInCommitTimestamps", "inCommitTimestamp"),
        ("delta.enableTypeWidening", "typeWidening"),
        ("delta.enableIcebergCompatV1", "icebergCompatV1"),
        ("delta.enableIcebergCompatV2", "icebergCompatV2"),
        ("delta.enableIcebergCompatV3", "icebergCompatV3"),
        ("delta.enableVariantShredding", "variantShredding"),
    ):
        if _is_true(config, key):
            used[feature] = f"{key} = true"
    if config.get("delta.universalFormat.enabledFormats"):
        used["icebergCompat"] = "delta.universalFormat.enabledFormats"
    if str(config.get("delta.checkpointPolicy", "classic")).lower() == "v2":
        used["v2Checkpoint"] = "delta.checkpointPolicy = v2"

    try:
        schema_json = json.loads(metadata.schema_string)
    except ValueError:
        schema_json = {}
    for column, meta, dtype in _field_metadata(schema_json):
        if "delta.invariants" in meta:
            used.setdefault("invariants", f"column {column!r} has an invariant")
        if "delta.generationExpression" in meta:
            used.setdefault("generatedColumns", f"column {column!r} is generated")
        if any(k.startswith("delta.identity.") for k in meta):
            used.setdefault("identityColumns", f"column {column!r} is an identity column")
        if "__COLLATIONS" in meta:
            used.setdefault("collations", f"column {column!r} has a collation")
        if "delta.typeChanges" in meta:
            used.setdefault("typeWidening", f"column {column!r} had its type widened")
        if dtype == "variant":
            used.setdefault("variantType", f"column {column!r} is a VARIANT")
        if isinstance(dtype, str) and ("collate" in dtype.lower()):
            used.setdefault("collations", f"column {column!r} has a collation")
    return used


def protocol_features(protocol: Protocol) -> set[str]:
    """Features a protocol enables: the explicit lists (reader 3 / writer 7) or those legacy versions imply."""
    features: set[str] = set(protocol.reader_features or ()) | set(protocol.writer_features or ())
    writer = protocol.min_writer_version
    if protocol.writer_features is None or writer < 7:
        if writer >= 2:
            features |= {"appendOnly", "invariants"}
        if writer >= 3:
            features.add("checkConstraints")
        if writer >= 4:
            features |= {"changeDataFeed", "generatedColumns"}
        if writer >= 5:
            features.add("columnMapping")
        if writer >= 6:
            features.add("identityColumns")
    if protocol.reader_features is None and protocol.min_reader_version == 2:
        features.add("columnMapping")
    return features


def check_protocol_and_metadata(protocol: Protocol, metadata: Metadata, *, where: str = "") -> None:
    """Raise UnsupportedTableFeatureError naming the first feature we cannot honour."""
    suffix = f" ({where})" if where else ""
    if protocol.min_reader_version > MAX_READER_VERSION:
        raise UnsupportedTableFeatureError(
            f"Table needs reader version {protocol.min_reader_version}; this engine reads up to "
            f"{MAX_READER_VERSION}{suffix}"
        )
    if protocol.min_writer_version > MAX_WRITER_VERSION:
        raise UnsupportedTableFeatureError(
            f"Table needs writer version {protocol.min_writer_version}; this engine writes up to "
            f"{MAX_WRITER_VERSION}{suffix}"
        )
    enabled = protocol_features(protocol)
    used = features_in_use(metadata)
    unknown_mode = check_mode(metadata.configuration)
    if unknown_mode:
        raise UnsupportedTableFeatureError(f"Table uses an unknown column mapping mode: {unknown_mode}{suffix}")
    for feature, evidence in sorted(used.items()):
        if feature not in IMPLEMENTED_FEATURES:
            raise UnsupportedTableFeatureError(
                f"Table uses Delta feature {feature!r} ({evidence}), which this engine does not implement{suffix}"
            )
    for feature in sorted(enabled):
        if feature in IMPLEMENTED_FEATURES or feature in USE_CHECKED_FEATURES:
            continue
        raise UnsupportedTableFeatureError(
            f"Table protocol requires Delta feature {feature!r}, which this engine does not implement{suffix}"
        )
    table_constraints(metadata)  # refuses row rules it cannot enforce


def check_supported(snapshot: Any) -> None:
    """Protocol gate for reading and writing a snapshot's table (see the module docstring)."""
    check_protocol_and_metadata(snapshot.protocol, snapshot.metadata, where=snapshot.root)


def is_append_only(metadata: Metadata) -> bool:
    return _is_true(metadata.configuration, "delta.appendOnly")


def check_can_modify(snapshot: Any) -> None:
    """``delta.appendOnly = true`` tables accept only appends: no update, delete or rewrite."""
    if is_append_only(snapshot.metadata):
        raise AppendOnlyTableError(
            f"Table {snapshot.root} is append-only (delta.appendOnly = true): rows cannot be updated or deleted"
        )
