"""The protocol gate: which tables this layer may read and write (PROTOCOL.md "Table Features").

The rule: never write a table whose rules we would break, never read one whose rows we would read wrong. What
this layer does with each feature is one row of ``feature_table.FEATURES`` (read, merge: yes, while unused, no),
and the gate reads those rows only. A feature "while unused" is accepted when the table does not actually use it
(a legacy protocol version implies identity columns: they are refused only where the schema uses them in a way
this engine cannot serve). Feature names this engine has never heard of are refused for merges, and for reads when
they are reader features.

``python -m engine.delta.features --markdown`` prints docs/features.md from the same rows.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from engine.delta.actions import Metadata, Protocol
from engine.delta.column_mapping import check_mode
from engine.delta.constraints import table_constraints
from engine.delta.feature_table import Support, markdown
from engine.delta.feature_table import feature as feature_row
from engine.errors import AppendOnlyTableError, UnsupportedTableFeatureError

MAX_READER_VERSION = 3
MAX_WRITER_VERSION = 7

DEFAULT_KEY = "CURRENT_DEFAULT"
"""Field metadata of allowColumnDefaults: the SQL of the value an INSERT gives a column it names no value for."""

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


ENABLED_BY_PROPERTY: Mapping[str, str] = {
    "delta.appendOnly": "appendOnly",
    "delta.enableChangeDataFeed": "changeDataFeed",
    "delta.enableDeletionVectors": "deletionVectors",
    "delta.enableRowTracking": "rowTracking",
    "delta.enableInCommitTimestamps": "inCommitTimestamp",
    "delta.enableTypeWidening": "typeWidening",
    "delta.enableIcebergCompatV1": "icebergCompatV1",
    "delta.enableIcebergCompatV2": "icebergCompatV2",
    "delta.enableIcebergCompatV3": "icebergCompatV3",
    "delta.enableVariantShredding": "variantShredding",
}
"""Table properties that turn a feature on when ``true`` (Delta's ``FeatureAutomaticallyEnabledByMetadata``)."""

_REQUIRED_WHEN_USED = (
    "checkConstraints",
    "columnMapping",
    "v2Checkpoint",
    "invariants",
    "generatedColumns",
    "identityColumns",
    "variantType",
)
"""Features Delta enables for what the metadata holds beyond a property (a constraint, a column's metadata)."""


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
    for key, feature in ENABLED_BY_PROPERTY.items():
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


_ALSO_LISTED_AS = {
    "typeWidening": {"typeWidening-preview"},
    "variantType": {"variantType-preview"},
    "variantShredding": {"variantShredding-preview"},
}
"""A feature whose preview name in ``writerFeatures`` serves as well (Delta accepts either)."""


def metadata_requires_features(metadata: Metadata) -> dict[str, str]:
    """The features Delta enables automatically for this metadata (``FeatureAutomaticallyEnabledByMetadata``),
    each with the evidence: a table-features protocol must list every one of them."""
    config = metadata.configuration
    required = {name: f"{key} = true" for key, name in ENABLED_BY_PROPERTY.items() if _is_true(config, key)}
    used = features_in_use(metadata)
    for name in _REQUIRED_WHEN_USED:
        if name in used:
            required.setdefault(name, used[name])
    if has_type(metadata.schema_string, "timestamp_ntz"):
        required["timestampNtz"] = "a TIMESTAMP_NTZ column"
    return required


def has_type(schema_string: str, name: str) -> bool:
    """Whether a primitive type (``timestamp_ntz``) appears anywhere in the schema, nested types included."""

    def walk(dtype: Any) -> bool:
        if isinstance(dtype, str):
            return dtype == name
        if not isinstance(dtype, Mapping):
            return False
        kind = dtype.get("type")
        if kind == "struct":
            return any(walk(f.get("type")) for f in dtype.get("fields", []))
        if kind == "array":
            return walk(dtype.get("elementType"))
        if kind == "map":
            return walk(dtype.get("keyType")) or walk(dtype.get("valueType"))
        return False

    try:
        return walk(json.loads(schema_string))
    except ValueError:
        return False


def check_protocol_lists_metadata_features(protocol: Protocol, metadata: Metadata, suffix: str = "") -> None:
    """Delta's ``assertTableFeaturesMatchMetadata``: with a table-features protocol (reader 3 or writer 7), a
    feature the metadata enables but ``writerFeatures`` does not list makes the table inconsistent; Delta refuses
    to load it (``DELTA_FEATURES_PROTOCOL_METADATA_MISMATCH``), and so does this engine."""
    if protocol.min_reader_version < 3 and protocol.min_writer_version < 7:
        return
    listed = set(protocol.writer_features or ())
    missing = {
        name: evidence
        for name, evidence in metadata_requires_features(metadata).items()
        if not ({name} | _ALSO_LISTED_AS.get(name, set())) & listed
    }
    if missing:
        named = ", ".join(f"{name!r} ({evidence})" for name, evidence in sorted(missing.items()))
        raise UnsupportedTableFeatureError(
            f"Table metadata enables Delta features its protocol does not list in writerFeatures: {named}. Delta "
            f"refuses such a table (DELTA_FEATURES_PROTOCOL_METADATA_MISMATCH) and so does this engine; add the "
            f"features to the protocol (ALTER TABLE ... SET TBLPROPERTIES ('delta.feature.<name>' = 'supported')) "
            f"or turn the property off{suffix}"
        )


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


def reader_protocol_features(protocol: Protocol) -> set[str]:
    """Features a reader must implement: ``readerFeatures`` (reader 3), or column mapping at reader 2."""
    features: set[str] = set(protocol.reader_features or ())
    if protocol.reader_features is None and protocol.min_reader_version == 2:
        features.add("columnMapping")
    return features


def _check_versions(protocol: Protocol, suffix: str, *, writing: bool) -> None:
    if protocol.min_reader_version > MAX_READER_VERSION:
        raise UnsupportedTableFeatureError(
            f"Table needs reader version {protocol.min_reader_version}; this engine reads up to "
            f"{MAX_READER_VERSION}{suffix}"
        )
    if writing and protocol.min_writer_version > MAX_WRITER_VERSION:
        raise UnsupportedTableFeatureError(
            f"Table needs writer version {protocol.min_writer_version}; this engine writes up to "
            f"{MAX_WRITER_VERSION}{suffix}"
        )


def _support(name: str, *, writing: bool) -> tuple[Support, str]:
    """How this engine supports a feature for the operation, and why (the feature table's notes)."""
    row = feature_row(name)
    if row is None:
        return Support.NO, "this engine does not know the feature"
    return (row.merge if writing else row.read), row.notes


def _check_features(protocol: Protocol, metadata: Metadata, suffix: str, *, writing: bool) -> None:
    """Refuse, naming it, the first feature the table uses or its protocol lists that the operation cannot
    honour: used features first (they say what in the table uses them), then the protocol's list."""
    verb = "merge into" if writing else "read"
    check_protocol_lists_metadata_features(protocol, metadata, suffix)
    unknown_mode = check_mode(metadata.configuration)
    if unknown_mode:
        raise UnsupportedTableFeatureError(f"Table uses an unknown column mapping mode: {unknown_mode}{suffix}")
    for name, evidence in sorted(features_in_use(metadata).items()):
        support, why = _support(name, writing=writing)
        if support is not Support.YES and (writing or feature_row(name) is not None):
            raise UnsupportedTableFeatureError(
                f"Table uses Delta feature {name!r} ({evidence}), which this engine does not implement: it cannot "
                f"{verb} such a table{suffix}. {why}"
            )
    listed = protocol_features(protocol) if writing else reader_protocol_features(protocol) | _unreadable(protocol)
    for name in sorted(listed):
        support, why = _support(name, writing=writing)
        if support is Support.NO:
            raise UnsupportedTableFeatureError(
                f"Table protocol requires Delta feature {name!r}, which this engine does not implement: it cannot "
                f"{verb} such a table{suffix}. {why}"
            )


def _unreadable(protocol: Protocol) -> set[str]:
    """Writer features whose table cannot be read right without them (the feature table's ``read`` is no)."""
    return {name for name in protocol_features(protocol) if (row := feature_row(name)) and row.read is Support.NO}


def check_protocol_and_metadata(protocol: Protocol, metadata: Metadata, *, where: str = "") -> None:
    """The merge gate: UnsupportedTableFeatureError naming the first feature we cannot honour in a write."""
    suffix = f" ({where})" if where else ""
    _check_versions(protocol, suffix, writing=True)
    _check_features(protocol, metadata, suffix, writing=True)
    table_constraints(metadata)  # refuses row rules it cannot enforce


def check_readable(snapshot: Any) -> None:
    """The read gate, for a table a merge reads but does not write (its source)."""
    suffix = f" ({snapshot.root})"
    _check_versions(snapshot.protocol, suffix, writing=False)
    _check_features(snapshot.protocol, snapshot.metadata, suffix, writing=False)


def check_supported(snapshot: Any) -> None:
    """The merge gate for a snapshot's table (see the module docstring)."""
    check_protocol_and_metadata(snapshot.protocol, snapshot.metadata, where=snapshot.root)


def is_append_only(metadata: Metadata) -> bool:
    return _is_true(metadata.configuration, "delta.appendOnly")


def check_can_modify(snapshot: Any) -> None:
    """``delta.appendOnly = true`` tables accept only appends: no update, delete or rewrite."""
    if is_append_only(snapshot.metadata):
        raise AppendOnlyTableError(
            f"Table {snapshot.root} is append-only (delta.appendOnly = true): rows cannot be updated or deleted"
        )


def main(argv: list[str]) -> int:
    if argv == ["--markdown"]:
        sys.stdout.write(markdown())
        return 0
    sys.stderr.write("usage: python -m engine.delta.features --markdown\n")
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
