"""Giving a table features with deltalake without leaving its protocol short of what its metadata enables.

deltalake's ``alter.add_feature`` moves a legacy protocol to table features (reader 3 / writer 7) and lists only the
features it is given: a table whose ``delta.enableChangeDataFeed`` was carried by writer version 4 then enables a
feature its protocol no longer lists, and Delta (and this engine) refuse it. ``add_features`` lists those too.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from engine.delta.features import metadata_requires_features
from engine.delta.snapshot import load_snapshot

_DELTALAKE_NAMES = {"timestampNtz": "TimestampWithoutTimezone"}
"""Delta's feature names whose ``deltalake.TableFeatures`` member is not the name with a capital first letter."""


def add_features(table: str | os.PathLike[str], names: Iterable[str]) -> None:
    """Add Delta's features ``names`` (``deletionVectors``) to the table's protocol with every feature its
    metadata already enables. ValueError for a feature deltalake cannot add."""
    from deltalake import DeltaTable, TableFeatures

    wanted = sorted(set(names) | set(metadata_requires_features(load_snapshot(table).metadata)))
    members = []
    for name in wanted:
        member = getattr(TableFeatures, _DELTALAKE_NAMES.get(name, name[:1].upper() + name[1:]), None)
        if member is None:
            raise ValueError(f"deltalake cannot add the Delta feature {name!r}")
        members.append(member)
    DeltaTable(os.fspath(table)).alter.add_feature(members, allow_protocol_versions_increase=True)
