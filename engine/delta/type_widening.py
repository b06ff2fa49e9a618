"""Type widening (PROTOCOL.md "Type Widening"): a column's type changed to a wider one, files written before the
change keep the narrower type, readers convert their values, and ``delta.typeChanges`` in the field's metadata
records each change.

Spark's Parquet reader converts the narrower values when a scan asks for the wider type, so reads need nothing
more here; statistics of a widened column are not used for data skipping (files written before the change hold
them in the old type). Schema evolution widens a column where Delta's does
(``TypeWidening.isTypeChangeSupportedForSchemaEvolution``), only with ``delta.enableTypeWidening = true``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql import types as T

from engine.delta.actions import Metadata, Protocol

TYPE_CHANGES_KEY = "delta.typeChanges"
ENABLE_KEY = "delta.enableTypeWidening"
FEATURE_NAMES = ("typeWidening", "typeWidening-preview")

_INTEGRAL_SIZES: dict[str, int] = {"byte": 1, "short": 2, "integer": 4, "long": 8}


def _integral_size(dtype: T.DataType) -> int | None:
    return _INTEGRAL_SIZES.get(dtype.typeName()) if isinstance(dtype, T.IntegralType) else None


def _decimal_wider(to: T.DecimalType, frm: T.DecimalType) -> bool:
    """Spark's ``DecimalType.isWiderThan``: as many integral digits and as many fractional digits, or more."""
    return to.precision - to.scale >= frm.precision - frm.scale and to.scale >= frm.scale


def is_schema_evolution_widening(frm: T.DataType, to: T.DataType) -> bool:
    """A change of an atomic type that MERGE WITH SCHEMA EVOLUTION applies by itself: byte -> short -> int -> long,
    float -> double, decimal to a wider decimal, date -> timestamp_ntz."""
    if frm == to:
        return False
    small, large = _integral_size(frm), _integral_size(to)
    if small is not None and large is not None:
        return small < large
    if isinstance(frm, T.FloatType) and isinstance(to, T.DoubleType):
        return True
    if isinstance(frm, T.DecimalType) and isinstance(to, T.DecimalType):
        return _decimal_wider(to, frm)
    return isinstance(frm, T.DateType) and isinstance(to, T.TimestampNTZType)


def type_widening_enabled(protocol: Protocol, metadata: Metadata) -> bool:
    """The protocol supports the feature and ``delta.enableTypeWidening`` is true: writers may widen types."""
    listed = set(protocol.writer_features or ())
    enabled = str(metadata.configuration.get(ENABLE_KEY, "")).strip().lower() == "true"
    return enabled and any(name in listed for name in FEATURE_NAMES)


def widened_field(field: T.StructField, to: T.DataType) -> T.StructField:
    """``field`` with type ``to``, the change appended to its ``delta.typeChanges``."""
    metadata: dict[str, Any] = dict(field.metadata or {})
    changes = list(metadata.get(TYPE_CHANGES_KEY) or [])
    changes.append({"fromType": field.dataType.jsonValue(), "toType": to.jsonValue()})
    metadata[TYPE_CHANGES_KEY] = changes
    return T.StructField(field.name, to, field.nullable, metadata)


def has_type_changes(metadata: Mapping[str, Any] | None) -> bool:
    return bool(metadata and metadata.get(TYPE_CHANGES_KEY))
