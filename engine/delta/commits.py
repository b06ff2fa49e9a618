"""Commit files: one ``_delta_log/<version>.json`` read into action values, and actions written as its lines."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import types as T

from engine.delta.actions import (
    AddCDCFile,
    AddFile,
    DomainMetadata,
    FileStats,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
)
from engine.delta.column_mapping import has_physical_names, rename_partition_values
from engine.delta.deletion_vectors import DeletionVectorDescriptor, DeletionVectorError
from engine.delta.errors import CorruptLogError


@dataclass(frozen=True)
class CommitEntry:
    """One parsed commit file: what conflict checks read of a winning commit."""

    version: int
    adds: tuple[AddFile, ...] = ()
    removes: tuple[RemoveFile, ...] = ()
    cdc: tuple[AddCDCFile, ...] = ()
    metadata: Metadata | None = None
    protocol: Protocol | None = None
    txns: tuple[SetTransaction, ...] = ()
    commit_info: Mapping[str, Any] | None = None
    other: tuple[str, ...] = ()
    """Names of actions this layer does not model (checkpointMetadata...)."""
    domains: tuple[DomainMetadata, ...] = ()


@dataclass
class _Reading:
    """The actions of one commit as they are read, line by line."""

    version: int
    schema: T.StructType
    adds: list[AddFile] = field(default_factory=list)
    removes: list[RemoveFile] = field(default_factory=list)
    cdcs: list[AddCDCFile] = field(default_factory=list)
    txns: list[SetTransaction] = field(default_factory=list)
    other: list[str] = field(default_factory=list)
    domains: list[DomainMetadata] = field(default_factory=list)
    metadata: Metadata | None = None
    protocol: Protocol | None = None
    commit_info: Mapping[str, Any] | None = None

    def take(self, number: int, kind: str, body: Mapping[str, Any]) -> None:
        if kind == "add":
            # An add after a metaData in the same commit has statistics of the new schema.
            self.adds.append(_add(body, self._schema, _descriptor(self.version, number, body)))
        elif kind == "remove":
            self.removes.append(_remove(body, self._schema, _descriptor(self.version, number, body)))
        elif kind == "cdc":
            self.cdcs.append(_cdc(body, self._schema))
        elif kind == "metaData":
            self.metadata = Metadata.from_action(body)
        elif kind == "protocol":
            self.protocol = Protocol.from_action(body)
        elif kind == "txn":
            self.txns.append(SetTransaction(body["appId"], int(body["version"]), body.get("lastUpdated")))
        elif kind == "commitInfo":
            self.commit_info = body
        elif kind == "domainMetadata":
            self.domains.append(DomainMetadata.from_action(body))
        else:
            self.other.append(kind)

    @property
    def _schema(self) -> T.StructType:
        return self.metadata.schema if self.metadata is not None else self.schema

    def entry(self) -> CommitEntry:
        return CommitEntry(
            self.version,
            tuple(self.adds),
            tuple(self.removes),
            tuple(self.cdcs),
            self.metadata,
            self.protocol,
            tuple(self.txns),
            self.commit_info,
            tuple(self.other),
            domains=tuple(self.domains),
        )


def parse_commit(version: int, text: str, schema: T.StructType) -> CommitEntry:
    """Parse ``_delta_log/<version>.json`` (newline-delimited actions). ``schema`` types add statistics."""
    reading = _Reading(version, schema)
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            action = json.loads(line)
        except ValueError as exc:
            raise CorruptLogError(f"Commit {version}, line {number} is not JSON: {exc}") from exc
        if not isinstance(action, dict) or len(action) != 1:
            raise CorruptLogError(f"Commit {version}, line {number} is not one action")
        ((kind, body),) = action.items()
        reading.take(number, kind, body)
    return reading.entry()


def _partition_values(body: Mapping[str, Any], schema: T.StructType) -> dict[str, str | None]:
    """``partitionValues`` by logical name (the log keys them by physical name under column mapping)."""
    values = dict(body.get("partitionValues") or {})
    return rename_partition_values(values, schema, to_physical=False) if has_physical_names(schema) else values


def _add(body: Mapping[str, Any], schema: T.StructType, dv: DeletionVectorDescriptor | None) -> AddFile:
    return AddFile(
        path=body["path"],
        size=int(body.get("size") or 0),
        partition_values=_partition_values(body, schema),
        modification_time=int(body.get("modificationTime") or 0),
        data_change=bool(body.get("dataChange", True)),
        stats=FileStats.from_json(body.get("stats"), schema),
        tags=body.get("tags"),
        deletion_vector=dv,
        base_row_id=_optional_int(body.get("baseRowId")),
        default_row_commit_version=_optional_int(body.get("defaultRowCommitVersion")),
        clustering_provider=body.get("clusteringProvider"),
    )


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _remove(body: Mapping[str, Any], schema: T.StructType, dv: DeletionVectorDescriptor | None) -> RemoveFile:
    return RemoveFile(
        path=body["path"],
        deletion_timestamp=int(body.get("deletionTimestamp") or 0),
        data_change=bool(body.get("dataChange", True)),
        extended_file_metadata=bool(body.get("extendedFileMetadata", False)),
        partition_values=_partition_values(body, schema),
        size=body.get("size"),
        tags=body.get("tags"),
        deletion_vector=dv,
        base_row_id=_optional_int(body.get("baseRowId")),
        default_row_commit_version=_optional_int(body.get("defaultRowCommitVersion")),
    )


def _cdc(body: Mapping[str, Any], schema: T.StructType) -> AddCDCFile:
    return AddCDCFile(
        path=body["path"],
        partition_values=_partition_values(body, schema),
        size=int(body.get("size") or 0),
        data_change=bool(body.get("dataChange", False)),
        tags=body.get("tags"),
    )


def _descriptor(version: int, number: int, body: Mapping[str, Any]) -> DeletionVectorDescriptor | None:
    raw = body.get("deletionVector")
    if not raw:
        return None
    if not isinstance(raw, Mapping):
        raise CorruptLogError(f"Commit {version}, line {number}: deletionVector is not a struct")
    try:
        return DeletionVectorDescriptor.from_json(raw)
    except DeletionVectorError as exc:
        raise CorruptLogError(f"Commit {version}, line {number}: {exc}") from exc


def actions_to_json_lines(actions: Sequence[Mapping[str, Any]]) -> bytes:
    """Newline-delimited JSON, as Delta commit files are written."""
    return ("\n".join(json.dumps(a, ensure_ascii=False, separators=(",", ":")) for a in actions) + "\n").encode()


__all__ = ["CommitEntry", "actions_to_json_lines", "parse_commit"]
