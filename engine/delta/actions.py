"""Delta log actions as frozen values, and their JSON forms (PROTOCOL.md "Actions").

Field names are snake_case here and Delta's camelCase in the log; ``to_action()`` gives the log's dict.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pyspark.sql import types as T

from engine.delta.column_mapping import MAX_COLUMN_ID_KEY, assign_column_mapping
from engine.delta.deletion_vectors import DeletionVectorDescriptor
from engine.delta.file_stats import FileStats
from engine.delta.paths import log_path_to_local
from engine.delta.values import field_at


def now_millis() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class RemoveFile:
    path: str
    deletion_timestamp: int
    data_change: bool = True
    extended_file_metadata: bool = True
    partition_values: Mapping[str, str | None] = field(default_factory=dict)
    size: int | None = None
    tags: Mapping[str, str] | None = None
    deletion_vector: DeletionVectorDescriptor | None = None
    """The vector of the logical file removed: readers and conflict checks tell file versions apart by it."""
    base_row_id: int | None = None
    default_row_commit_version: int | None = None
    """Row tracking: a remove carries the ``baseRowId`` / ``defaultRowCommitVersion`` of the add it removes."""
    stats: FileStats | None = None
    """The removed file's statistics, as Delta's removes carry them (optional in the protocol)."""

    def __hash__(self) -> int:
        return hash(("remove", self.path))

    def to_action(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "path": self.path,
            "deletionTimestamp": self.deletion_timestamp,
            "dataChange": self.data_change,
            "extendedFileMetadata": self.extended_file_metadata,
            "partitionValues": dict(self.partition_values),
        }
        if self.size is not None:
            body["size"] = self.size
        if self.stats is not None:
            body["stats"] = self.stats.to_json()
        if self.tags:
            body["tags"] = dict(self.tags)
        if self.deletion_vector is not None:
            body["deletionVector"] = self.deletion_vector.to_json()
        _put_row_tracking(body, self.base_row_id, self.default_row_commit_version)
        return {"remove": body}


@dataclass(frozen=True)
class AddFile:
    """A live data file. ``path`` is exactly as in the log (URI-encoded, relative to the root or absolute)."""

    path: str
    size: int
    partition_values: Mapping[str, str | None]
    modification_time: int
    data_change: bool = True
    stats: FileStats | None = None
    tags: Mapping[str, str] | None = None
    deletion_vector: DeletionVectorDescriptor | None = None
    """The rows of the data file that are logically deleted (None: every row is live)."""
    base_row_id: int | None = None
    """Row tracking: the fresh row id of the file's first row; row ``i`` of the file has ``baseRowId + i``."""
    default_row_commit_version: int | None = None
    """Row tracking: the version that first committed this path."""
    clustering_provider: str | None = None
    """Clustered tables: the clustering implementation that clustered this file (None: not clustered)."""

    def __hash__(self) -> int:
        return hash(("add", self.path))

    def absolute_path(self, root: str) -> str:
        """The decoded local path of the file under the table root ``root``."""
        return log_path_to_local(self.path, root)

    @property
    def num_deleted_rows(self) -> int:
        return 0 if self.deletion_vector is None else self.deletion_vector.cardinality

    @property
    def num_live_records(self) -> int | None:
        """The logical file's rows: the statistics' physical ``numRecords`` less the deletion vector's."""
        if self.stats is None or self.stats.num_records is None:
            return None
        return self.stats.num_records - self.num_deleted_rows

    def to_remove(self, deletion_timestamp: int | None = None, *, data_change: bool = True) -> RemoveFile:
        return RemoveFile(
            path=self.path,
            deletion_timestamp=now_millis() if deletion_timestamp is None else deletion_timestamp,
            data_change=data_change,
            extended_file_metadata=True,
            partition_values=dict(self.partition_values),
            size=self.size,
            tags=self.tags,
            deletion_vector=self.deletion_vector,
            base_row_id=self.base_row_id,
            default_row_commit_version=self.default_row_commit_version,
            stats=self.stats,
        )

    def to_action(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "path": self.path,
            "partitionValues": dict(self.partition_values),
            "size": self.size,
            "modificationTime": self.modification_time,
            "dataChange": self.data_change,
        }
        if self.stats is not None:
            body["stats"] = self.stats.to_json()
        if self.tags:
            body["tags"] = dict(self.tags)
        if self.deletion_vector is not None:
            body["deletionVector"] = self.deletion_vector.to_json()
        _put_row_tracking(body, self.base_row_id, self.default_row_commit_version)
        if self.clustering_provider is not None:
            body["clusteringProvider"] = self.clustering_provider
        return {"add": body}


def _put_row_tracking(body: dict[str, Any], base_row_id: int | None, default_row_commit_version: int | None) -> None:
    if base_row_id is not None:
        body["baseRowId"] = base_row_id
    if default_row_commit_version is not None:
        body["defaultRowCommitVersion"] = default_row_commit_version


@dataclass(frozen=True)
class AddCDCFile:
    """A Change Data Feed file (``cdc`` action); readers of versions' changes use it instead of add/remove."""

    path: str
    partition_values: Mapping[str, str | None]
    size: int
    data_change: bool = False
    tags: Mapping[str, str] | None = None

    def __hash__(self) -> int:
        return hash(("cdc", self.path))

    def absolute_path(self, root: str) -> str:
        return log_path_to_local(self.path, root)

    def to_action(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "path": self.path,
            "partitionValues": dict(self.partition_values),
            "size": self.size,
            "dataChange": self.data_change,
        }
        if self.tags:
            body["tags"] = dict(self.tags)
        return {"cdc": body}


@dataclass(frozen=True)
class Metadata:
    """The ``metaData`` action: the full record, so a schema change writes every field back unchanged."""

    id: str
    schema_string: str
    partition_columns: tuple[str, ...] = ()
    configuration: Mapping[str, str] = field(default_factory=dict)
    name: str | None = None
    description: str | None = None
    format_provider: str = "parquet"
    format_options: Mapping[str, str] = field(default_factory=dict)
    created_time: int | None = None

    def __hash__(self) -> int:
        return hash(("metaData", self.id, self.schema_string))

    @property
    def schema(self) -> T.StructType:
        return parse_schema(self.schema_string)

    @property
    def cdf_enabled(self) -> bool:
        """Whether the table records its Change Data Feed (``delta.enableChangeDataFeed``)."""
        return str(self.configuration.get("delta.enableChangeDataFeed", "")).lower() == "true"

    def with_schema(self, schema: T.StructType | str | Mapping[str, Any]) -> Metadata:
        """This metadata with another table schema (schema evolution): a StructType or Delta's schema JSON."""
        if isinstance(schema, T.StructType):
            text = schema.json()
        elif isinstance(schema, str):
            text = schema
        else:
            text = json.dumps(schema)
        parsed = parse_schema(text)
        for column in self.partition_columns:
            if field_at(parsed, [column]) is None:
                raise ValueError(f"The new schema lacks partition column {column!r}")
        # Column mapping: new fields get ids and physical names, and maxColumnId rises with them.
        parsed, max_column_id = assign_column_mapping(parsed, self.configuration)
        if max_column_id is None:
            return replace(self, schema_string=parsed.json())
        configuration = {**self.configuration, MAX_COLUMN_ID_KEY: str(max_column_id)}
        return replace(self, schema_string=parsed.json(), configuration=configuration)

    def to_action(self) -> dict[str, Any]:
        return {
            "metaData": {
                "id": self.id,
                "name": self.name,
                "description": self.description,
                "format": {"provider": self.format_provider, "options": dict(self.format_options)},
                "schemaString": self.schema_string,
                "partitionColumns": list(self.partition_columns),
                "configuration": dict(self.configuration),
                "createdTime": self.created_time,
            }
        }

    @staticmethod
    def from_action(body: Mapping[str, Any]) -> Metadata:
        fmt = body.get("format") or {}
        return Metadata(
            id=body["id"],
            schema_string=body["schemaString"],
            partition_columns=tuple(body.get("partitionColumns") or ()),
            configuration=dict(body.get("configuration") or {}),
            name=body.get("name"),
            description=body.get("description"),
            format_provider=fmt.get("provider", "parquet"),
            format_options=dict(fmt.get("options") or {}),
            created_time=body.get("createdTime"),
        )


@dataclass(frozen=True)
class Protocol:
    min_reader_version: int
    min_writer_version: int
    reader_features: tuple[str, ...] | None = None
    writer_features: tuple[str, ...] | None = None

    def to_action(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "minReaderVersion": self.min_reader_version,
            "minWriterVersion": self.min_writer_version,
        }
        if self.reader_features is not None:
            body["readerFeatures"] = list(self.reader_features)
        if self.writer_features is not None:
            body["writerFeatures"] = list(self.writer_features)
        return {"protocol": body}

    @staticmethod
    def from_action(body: Mapping[str, Any]) -> Protocol:
        rf = body.get("readerFeatures")
        wf = body.get("writerFeatures")
        return Protocol(
            min_reader_version=int(body.get("minReaderVersion", 1)),
            min_writer_version=int(body.get("minWriterVersion", 2)),
            reader_features=tuple(rf) if rf is not None else None,
            writer_features=tuple(wf) if wf is not None else None,
        )


@dataclass(frozen=True)
class SetTransaction:
    """The ``txn`` action: the latest version of an application's idempotent writes."""

    app_id: str
    version: int
    last_updated: int | None = None

    def to_action(self) -> dict[str, Any]:
        body: dict[str, Any] = {"appId": self.app_id, "version": self.version}
        if self.last_updated is not None:
            body["lastUpdated"] = self.last_updated
        return {"txn": body}


@dataclass(frozen=True)
class DomainMetadata:
    """The ``domainMetadata`` action: one named domain's configuration, or its tombstone (``removed``).
    Domains named ``delta.*`` belong to the protocol's features; the others to users and applications."""

    domain: str
    configuration: str
    removed: bool = False

    @property
    def is_system(self) -> bool:
        return self.domain.startswith("delta.")

    def to_action(self) -> dict[str, Any]:
        return {"domainMetadata": {"domain": self.domain, "configuration": self.configuration, "removed": self.removed}}

    @staticmethod
    def from_action(body: Mapping[str, Any]) -> DomainMetadata:
        return DomainMetadata(
            domain=str(body["domain"]),
            configuration=str(body.get("configuration") or ""),
            removed=bool(body.get("removed", False)),
        )


Action = AddFile | RemoveFile | AddCDCFile | Metadata | Protocol | SetTransaction | DomainMetadata


def known_num_records(files: Sequence[AddFile]) -> int | None:
    """The live rows in ``files`` from their statistics and deletion vectors; None when a file has no row
    count."""
    total = 0
    for f in files:
        live = f.num_live_records
        if live is None:
            return None
        total += live
    return total


def parse_schema(schema_string: str) -> T.StructType:
    """Delta's schema JSON is Spark's: no server needed."""
    parsed = T.StructType.fromJson(json.loads(schema_string))
    return parsed


__all__ = [
    "Action",
    "AddCDCFile",
    "AddFile",
    "DomainMetadata",
    "Metadata",
    "Protocol",
    "RemoveFile",
    "SetTransaction",
    "now_millis",
    "parse_schema",
]
