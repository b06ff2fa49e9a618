"""A table's state at one version, read with ``deltalake`` (log replay, checkpoints): Delta's ``Snapshot``.

deltalake parses statistics into typed values and partition values into typed values; both are converted here
to this layer's forms (typed statistics, Delta's partition value strings).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import types as T

from engine.delta.actions import AddFile, DomainMetadata, Metadata, Protocol, parse_schema
from engine.delta.column_mapping import has_physical_names, physical_name, rename_stats
from engine.delta.feature_table import feature as feature_row
from engine.delta.file_stats import FileStats, null_counts, typed_leaf_values
from engine.delta.log_replay import needs_log_replay, with_log_replay
from engine.delta.paths import ReadScope, normalize_table
from engine.delta.storage import Storage, storage_for
from engine.delta.type_widening import has_type_changes
from engine.delta.values import (
    field_at,
    leaf_fields,
    serialize_partition_value,
    to_arrow_schema,
)
from engine.errors import DeltaError, TableNotFoundError, UnsupportedTableFeatureError

if TYPE_CHECKING:
    from deltalake import DeltaTable

DEFAULT_CHECKPOINT_INTERVAL = 10
_COMMIT_NAME = re.compile(r"^(\d{20})\.json$")
_UNSUPPORTED_FEATURE = re.compile(r"Feature '([^']+)' is not supported")
_UNREADABLE_ROOT_CHARS = ("[", "]", "%")
"""deltalake 1.6 reads these in a table root as URL syntax (IPv6 brackets, percent escapes) and fails."""


@dataclass(frozen=True, eq=False)
class Snapshot:
    """The table at ``version``: metadata, protocol and live files (with statistics)."""

    table_uri: str
    root: str
    version: int
    metadata: Metadata
    protocol: Protocol
    files: tuple[AddFile, ...]
    has_deletion_vectors: bool = False
    _table: Any = field(default=None, repr=False)
    lake_roots: tuple[str, ...] = ()
    """Directories beyond the table's own where its log may name files (the lake roots)."""
    domains: Mapping[str, DomainMetadata] = field(default_factory=dict)
    """The live metadata domains by name (PROTOCOL.md "Domain Metadata"; tombstones left out)."""

    @property
    def spark_schema(self) -> T.StructType:
        """A fresh StructType on every access: pyspark's StructType.add mutates in place."""
        return parse_schema(self.metadata.schema_string)

    @cached_property
    def arrow_schema(self) -> pa.Schema:
        return to_arrow_schema(self.spark_schema)

    @property
    def partition_columns(self) -> tuple[str, ...]:
        return tuple(self.metadata.partition_columns)

    @property
    def configuration(self) -> Mapping[str, str]:
        return self.metadata.configuration

    @property
    def cdf_enabled(self) -> bool:
        return self.metadata.cdf_enabled

    @property
    def data_schema(self) -> T.StructType:
        """The table schema without partition columns: what the Parquet files hold."""
        parts = {c.lower() for c in self.partition_columns}
        return T.StructType([f for f in self.spark_schema.fields if f.name.lower() not in parts])

    @cached_property
    def read_scope(self) -> ReadScope:
        return ReadScope(self.root, self.lake_roots)

    def file_path(self, add: AddFile) -> str:
        """The local path of a live file, to be read: a DeltaError if the log puts it outside the
        table's directory and the lake roots."""
        return self.read_scope.check(add.absolute_path(self.root), add.path)

    @cached_property
    def files_by_path(self) -> dict[str, AddFile]:
        return {f.path: f for f in self.files}

    @property
    def storage(self) -> Storage:
        return storage_for(self.root)

    def app_transaction_version(self, app_id: str) -> int | None:
        """The latest ``txn`` version recorded for ``app_id`` at this snapshot, or None."""
        if self._table is None:
            return None
        version = self._table.transaction_version(app_id)
        return None if version is None else int(version)


def load_snapshot(
    table: str | os.PathLike[str], version: int | None = None, *, lake_roots: Sequence[str] = ()
) -> Snapshot:
    """Read the table at ``version`` (latest when None). TableNotFoundError if there is no Delta table there.
    Its files are read only from its own directory and ``lake_roots``."""
    table_uri, root = normalize_table(table)
    dt = _open_table(root, version)
    protocol_rs = dt.protocol()
    protocol = Protocol(
        min_reader_version=int(protocol_rs.min_reader_version),
        min_writer_version=int(protocol_rs.min_writer_version),
        reader_features=tuple(protocol_rs.reader_features) if protocol_rs.reader_features is not None else None,
        writer_features=tuple(protocol_rs.writer_features) if protocol_rs.writer_features is not None else None,
    )
    meta_rs = dt.metadata()
    metadata = Metadata(
        id=str(meta_rs.id),
        schema_string=dt.schema().to_json(),
        partition_columns=tuple(meta_rs.partition_columns),
        configuration={k: v for k, v in (meta_rs.configuration or {}).items() if v is not None},
        name=meta_rs.name,
        description=meta_rs.description,
        created_time=meta_rs.created_time,
    )
    schema = parse_schema(metadata.schema_string)
    files = _files(dt, schema, metadata.partition_columns)
    has_dvs = False
    domains: dict[str, DomainMetadata] = {}
    if needs_log_replay(protocol):
        files, domains = with_log_replay(files, root, int(dt.version()))
        _check_deletion_vector_paths(files, root, ReadScope(root, lake_roots))
        has_dvs = any(f.deletion_vector is not None for f in files)
    return Snapshot(
        table_uri=table_uri,
        root=root,
        version=int(dt.version()),
        metadata=metadata,
        protocol=protocol,
        files=files,
        has_deletion_vectors=has_dvs,
        _table=dt,
        lake_roots=tuple(lake_roots),
        domains=domains,
    )


def _open_table(root: str, version: int | None) -> DeltaTable:
    """delta-rs's table at ``root``, its errors told apart as the engine's."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError as RsDeltaError
    from deltalake.exceptions import DeltaProtocolError
    from deltalake.exceptions import TableNotFoundError as RsTableNotFoundError

    if any(c in root for c in _UNREADABLE_ROOT_CHARS):
        raise DeltaError(
            f"Table root {root!r} contains one of {' '.join(_UNREADABLE_ROOT_CHARS)}, which deltalake cannot open"
        )
    if not os.path.isdir(os.path.join(root, "_delta_log")):
        raise TableNotFoundError(f"No Delta table at {root} (no _delta_log folder)")
    try:
        return DeltaTable(root, version=version)
    except RsTableNotFoundError as exc:
        raise TableNotFoundError(f"No Delta table at {root}: {exc}") from exc
    except DeltaProtocolError as exc:
        raise UnsupportedTableFeatureError(f"Cannot read table {root}: {exc}") from exc
    except RsDeltaError as exc:
        unsupported = _UNSUPPORTED_FEATURE.search(str(exc))
        if "catalog-managed" in str(exc).lower() or unsupported:
            # deltalake refuses to open these; say which feature and why, as the protocol gate would.
            name = unsupported.group(1) if unsupported else _catalog_feature(root)
            row = feature_row(name)
            raise UnsupportedTableFeatureError(
                f"Table protocol requires Delta feature {name!r}, which this engine does not implement: it "
                f"cannot read such a table ({root}). {row.notes if row else 'The engine does not know the feature.'}"
            ) from exc
        if "Unsupported:" in str(exc):
            # deltalake's kernel refusing a table its protocol does not allow (a TIMESTAMP_NTZ column without the
            # timestampNtz feature): the table is at fault, not the service.
            raise UnsupportedTableFeatureError(f"Cannot read table {root}: {exc}") from exc
        if version is not None and "version" in str(exc).lower():
            raise TableNotFoundError(f"Table {root} has no version {version}: {exc}") from exc
        raise DeltaError(f"Cannot read table {root}: {exc}") from exc


def _catalog_feature(root: str) -> str:
    """The name the table's newest commit with a protocol gives its catalog feature (catalogManaged, or its
    preview name)."""
    log_dir = os.path.join(root, "_delta_log")
    commits = sorted((n for n in os.listdir(log_dir) if _COMMIT_NAME.match(n)), reverse=True)
    for name in commits:
        with open(os.path.join(log_dir, name), encoding="utf-8") as handle:
            for line in handle:
                if '"protocol"' in line:
                    listed = json.loads(line)["protocol"].get("readerFeatures") or []
                    return next((f for f in listed if f.startswith("catalog")), "catalogManaged")
    return "catalogManaged"


def _check_deletion_vector_paths(files: Sequence[AddFile], root: str, scope: ReadScope) -> None:
    """Every deletion vector file a live file names must lie in the read scope, as its data file must: a log is
    data, and a ``p`` path or a ``u`` prefix must not take a read outside the lake."""
    for add in files:
        dv = add.deletion_vector
        if dv is not None and not dv.is_inline:
            scope.check(dv.absolute_path(root), dv.path_or_inline_dv)


def _files(dt: Any, schema: T.StructType, partition_columns: tuple[str, ...]) -> tuple[AddFile, ...]:
    table = pa.table(dt.get_add_actions(flatten=False))
    part_types = {c: (_field(schema, c) or T.StringType()) for c in partition_columns}
    leaves = [
        (path, dtype)
        for path, dtype in leaf_fields(T.StructType([f for f in schema.fields if f.name not in part_types]))
        if not _type_changed(schema, path)
    ]
    # deltalake keys partition values by logical name but statistics by physical name (column mapping).
    physical = {f.name: physical_name(f) for f in schema.fields}
    mapped = has_physical_names(schema)
    rows = table.to_pylist()
    files = []
    for row in rows:
        partition = row.get("partition") or {}
        pvalues = {
            c: serialize_partition_value(partition.get(c, partition.get(physical.get(c, c))), part_types[c])
            for c in partition_columns
        }
        stats = None
        if row.get("num_records") is not None:
            stats = FileStats(
                num_records=int(row["num_records"]),
                min_values=typed_leaf_values(_logical(row.get("min"), schema, mapped), leaves),
                max_values=typed_leaf_values(_logical(row.get("max"), schema, mapped), leaves),
                null_count=null_counts(_logical(row.get("null_count"), schema, mapped)),
            )
        files.append(
            AddFile(
                path=row["path"],
                size=int(row["size_bytes"]),
                partition_values=pvalues,
                modification_time=int(row["modification_time"]),
                data_change=True,
                stats=stats,
            )
        )
    return tuple(files)


def _logical(values: Any, schema: T.StructType, mapped: bool) -> Any:
    """Statistics keyed by physical names (as the log and deltalake hold them) keyed by logical names."""
    return rename_stats(values, schema, to_physical=False) if mapped and isinstance(values, Mapping) else values


def _type_changed(schema: T.StructType, path: tuple[str, ...]) -> bool:
    """Whether a field on the path had its type widened: files written before the change hold its minimum and
    maximum in the old type, so they are not used for data skipping."""
    return any(
        has_type_changes(f.metadata) for depth in range(1, len(path) + 1) if (f := field_at(schema, path[:depth]))
    )


def _field(schema: T.StructType, name: str) -> T.DataType | None:
    for f in schema.fields:
        if f.name == name:
            return f.dataType
    return None
