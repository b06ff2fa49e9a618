"""Row tracking, metadata domains and in-commit timestamps: the rules a commit follows for them (PROTOCOL.md
"Row Tracking", "Domain Metadata", "Clustered Table", "In-Commit Timestamps"); Delta's RowId, RowCommitVersion,
MaterializedRowTrackingColumn and InCommitTimestampUtils.

Row tracking gives every row a row id and a row commit version. The fresh ones come from the file's ``add``:
``baseRowId`` + the row's physical index, and ``defaultRowCommitVersion``. The stable ones, which survive an
update or a rewrite, are the materialized columns (hidden, named in the table's configuration) where they are
not NULL, else the fresh ones. A writer gives each new ``add`` a ``baseRowId`` above the ``delta.rowTracking``
domain's ``rowIdHighWaterMark`` and raises the mark in the same commit.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace

from engine.delta.actions import AddFile, DomainMetadata, Metadata, Protocol
from engine.delta.errors import DeltaError

ROW_TRACKING_DOMAIN = "delta.rowTracking"
CLUSTERING_DOMAIN = "delta.clustering"
MISSING_HIGH_WATER_MARK = -1
MATERIALIZED_ROW_ID_KEY = "delta.rowTracking.materializedRowIdColumnName"
MATERIALIZED_ROW_COMMIT_VERSION_KEY = "delta.rowTracking.materializedRowCommitVersionColumnName"
PRESERVED_TAG = "delta.rowTracking.preserved"
"""The commitInfo tag that says the commit kept the stable row ids and commit versions of the rows it touched."""
ICT_ENABLED_KEY = "delta.enableInCommitTimestamps"
ICT_ENABLEMENT_VERSION_KEY = "delta.inCommitTimestampEnablementVersion"
ICT_ENABLEMENT_TIMESTAMP_KEY = "delta.inCommitTimestampEnablementTimestamp"


def _is_true(configuration: Mapping[str, str], key: str) -> bool:
    return str(configuration.get(key, "")).strip().lower() == "true"


def _writer_features(protocol: Protocol) -> set[str]:
    return set(protocol.writer_features or ())


def is_supported(protocol: Protocol) -> bool:
    """rowTracking in the protocol: new files get fresh row ids and commit versions (unless suspended)."""
    return "rowTracking" in _writer_features(protocol)


def is_suspended(metadata: Metadata) -> bool:
    """``delta.rowTrackingSuspended``: writers assign no row ids; it may not be on with row tracking enabled."""
    suspended = _is_true(metadata.configuration, "delta.rowTrackingSuspended")
    if suspended and _is_true(metadata.configuration, "delta.enableRowTracking"):
        raise DeltaError(
            "Table has both delta.enableRowTracking and delta.rowTrackingSuspended set to true, which the protocol "
            "forbids"
        )
    return suspended


def assigns_row_ids(protocol: Protocol, metadata: Metadata) -> bool:
    """Whether a commit gives its new files ``baseRowId`` and ``defaultRowCommitVersion``."""
    return is_supported(protocol) and not is_suspended(metadata)


def is_enabled(protocol: Protocol, metadata: Metadata) -> bool:
    """``delta.enableRowTracking``: every row has a stable row id that writers preserve."""
    enabled = _is_true(metadata.configuration, "delta.enableRowTracking")
    if enabled and not is_supported(protocol):
        raise DeltaError("Table sets delta.enableRowTracking but its protocol lacks the rowTracking feature")
    return enabled


def materialized_columns(protocol: Protocol, metadata: Metadata) -> tuple[str, str] | None:
    """(materialized row id column, materialized row commit version column) of a table whose row tracking is
    enabled, whose writers preserve both; None when it is not enabled."""
    if not is_enabled(protocol, metadata) or is_suspended(metadata):
        return None
    config = metadata.configuration
    row_id = config.get(MATERIALIZED_ROW_ID_KEY)
    version = config.get(MATERIALIZED_ROW_COMMIT_VERSION_KEY)
    if not row_id or not version:
        raise DeltaError(
            f"Row tracking is enabled but the table's configuration lacks {MATERIALIZED_ROW_ID_KEY} or "
            f"{MATERIALIZED_ROW_COMMIT_VERSION_KEY}"
        )
    return row_id, version


def high_water_mark(domains: Mapping[str, DomainMetadata]) -> int:
    """The highest fresh row id assigned so far (-1 before any)."""
    domain = domains.get(ROW_TRACKING_DOMAIN)
    return MISSING_HIGH_WATER_MARK if domain is None or domain.removed else _parse_high_water_mark(domain)


def domain_high_water_mark(domains: Sequence[DomainMetadata]) -> int | None:
    """The high-water mark a commit's domain actions set, if one does."""
    for domain in domains:
        if domain.domain == ROW_TRACKING_DOMAIN and not domain.removed:
            return _parse_high_water_mark(domain)
    return None


def _parse_high_water_mark(domain: DomainMetadata) -> int:
    try:
        return int(json.loads(domain.configuration)["rowIdHighWaterMark"])
    except (ValueError, KeyError, TypeError) as exc:
        raise DeltaError(f"The {ROW_TRACKING_DOMAIN} domain has no readable rowIdHighWaterMark") from exc


def high_water_mark_domain(mark: int) -> DomainMetadata:
    return DomainMetadata(ROW_TRACKING_DOMAIN, json.dumps({"rowIdHighWaterMark": mark}, separators=(",", ":")))


def assign_fresh_row_ids(adds: Sequence[AddFile], mark: int, version: int) -> tuple[list[AddFile], int]:
    """Delta's assignFreshRowIds: each add without a ``baseRowId`` (a new file) gets the next ids above ``mark``
    and ``defaultRowCommitVersion`` ``version``; a re-added file (a new deletion vector) keeps both of its own.
    Answers the adds and the new high-water mark."""
    out = []
    for add in adds:
        if add.base_row_id is None:
            records = add.stats.num_records if add.stats is not None else None
            if records is None:
                raise DeltaError(f"Cannot assign row ids to {add.path}: its statistics have no numRecords")
            add = replace(add, base_row_id=mark + 1)
            mark += records
        if add.default_row_commit_version is None:
            add = replace(add, default_row_commit_version=version)
        out.append(add)
    return out, mark


def in_commit_timestamps_enabled(metadata: Metadata) -> bool:
    return _is_true(metadata.configuration, ICT_ENABLED_KEY)


def next_in_commit_timestamp(now: int, previous: int) -> int:
    """PROTOCOL.md: the larger of the attempt's time and one millisecond after the previous commit's."""
    return max(now, previous + 1)


__all__ = [
    "CLUSTERING_DOMAIN",
    "MISSING_HIGH_WATER_MARK",
    "PRESERVED_TAG",
    "ROW_TRACKING_DOMAIN",
    "assign_fresh_row_ids",
    "assigns_row_ids",
    "domain_high_water_mark",
    "high_water_mark",
    "high_water_mark_domain",
    "in_commit_timestamps_enabled",
    "is_enabled",
    "is_supported",
    "materialized_columns",
    "next_in_commit_timestamp",
]
