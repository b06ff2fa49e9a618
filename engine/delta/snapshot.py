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
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import types as T

from engine.delta.actions import AddFile, FileStats, Metadata, Protocol, parse_schema
from engine.delta.paths import ReadScope, deletion_vector_path, normalize_table
from engine.delta.storage import Storage, storage_for
from engine.delta.values import (
    leaf_fields,
    normalize_stat_value,
    serialize_partition_value,
    to_arrow_schema,
)
from engine.errors import DeltaError, TableNotFoundError, UnsupportedTableFeatureError

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
        return str(self.configuration.get("delta.enableChangeDataFeed", "")).lower() == "true"

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
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError as RsDeltaError
    from deltalake.exceptions import DeltaProtocolError
    from deltalake.exceptions import TableNotFoundError as RsTableNotFoundError

    table_uri, root = normalize_table(table)
    if any(c in root for c in _UNREADABLE_ROOT_CHARS):
        raise DeltaError(
            f"Table root {root!r} contains one of {' '.join(_UNREADABLE_ROOT_CHARS)}, which deltalake cannot open"
        )
    if not os.path.isdir(os.path.join(root, "_delta_log")):
        raise TableNotFoundError(f"No Delta table at {root} (no _delta_log folder)")
    try:
        dt = DeltaTable(root, version=version)
    except RsTableNotFoundError as exc:
        raise TableNotFoundError(f"No Delta table at {root}: {exc}") from exc
    except DeltaProtocolError as exc:
        raise UnsupportedTableFeatureError(f"Cannot read table {root}: {exc}") from exc
    except RsDeltaError as exc:
        if version is not None and "version" in str(exc).lower():
            raise TableNotFoundError(f"Table {root} has no version {version}: {exc}") from exc
        raise DeltaError(f"Cannot read table {root}: {exc}") from exc

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
    if "deletionVectors" in (protocol.reader_features or ()):
        _check_deletion_vector_paths(root, ReadScope(root, lake_roots))
        has_dvs = _has_deletion_vectors(dt)
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
    )


def _has_deletion_vectors(dt: Any) -> bool:
    """Whether any live file has a deletion vector. deltalake's add actions do not show them, so ask for the
    vectors themselves (only for tables whose protocol allows them); failing to tell counts as yes."""
    try:
        return pa.table(dt.deletion_vectors()).num_rows > 0
    except Exception:
        return True


_CHECKPOINT_FILE = re.compile(r"^(\d{20})\.checkpoint(\..+)?\.(parquet|json)$")
_COMMIT_FILE = re.compile(r"^(\d{20})\.json$")


def _check_deletion_vector_paths(root: str, scope: ReadScope) -> None:
    """Every deletion vector file the log names must be in the read scope: deltalake opens them to tell whether
    any file has one. Reads the adds of the latest checkpoint (and its sidecars) and of the commits after it;
    adds no longer live are checked too, which only refuses a table whose log once named a file outside."""
    try:
        descriptors = _deletion_vector_descriptors(os.path.join(root, "_delta_log"))
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as exc:
        raise DeltaError(f"Cannot read the deletion vectors of table {root}: {type(exc).__name__}") from exc
    for descriptor in descriptors:
        path = deletion_vector_path(descriptor, root)
        if path is not None:
            scope.check(path, str(descriptor.get("pathOrInlineDv")))


def _deletion_vector_descriptors(log: str) -> list[Mapping[str, Any]]:
    names = os.listdir(log)
    checkpoints = [(int(m.group(1)), n) for n in names if (m := _CHECKPOINT_FILE.match(n))]
    start = max((v for v, _ in checkpoints), default=-1)
    found: list[Mapping[str, Any]] = []
    for version, name in checkpoints:
        if version == start:
            found += _checkpoint_descriptors(log, os.path.join(log, name))
    for name in names:
        match = _COMMIT_FILE.match(name)
        if match and int(match.group(1)) > start:
            with open(os.path.join(log, name), encoding="utf-8") as f:
                found += _json_descriptors(f.read())
    return found


def _json_descriptors(text: str) -> list[Mapping[str, Any]]:
    found: list[Mapping[str, Any]] = []
    for line in text.splitlines():
        if '"deletionVector"' not in line:
            continue
        action = json.loads(line)
        dv = (action.get("add") or {}).get("deletionVector") if isinstance(action, dict) else None
        if isinstance(dv, dict):
            found.append(dv)
    return found


def _checkpoint_descriptors(log: str, path: str) -> list[Mapping[str, Any]]:
    if path.endswith(".json"):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        sidecars = [json.loads(line)["sidecar"]["path"] for line in text.splitlines() if '"sidecar"' in line]
        found = _json_descriptors(text)
    else:
        schema = pq.read_schema(path)
        columns = [c for c in ("add", "sidecar") if c in schema.names]
        table = pq.read_table(path, columns=columns)
        found = []
        if "add" in columns:
            found = [a["deletionVector"] for a in table.column("add").to_pylist() if a and a.get("deletionVector")]
        sidecars = [s["path"] for s in table.column("sidecar").to_pylist() if s] if "sidecar" in columns else []
    for sidecar in sidecars:
        found += _checkpoint_descriptors(log, os.path.join(log, "_sidecars", os.path.basename(unquote(sidecar))))
    return found


def _files(dt: Any, schema: T.StructType, partition_columns: tuple[str, ...]) -> tuple[AddFile, ...]:
    table = pa.table(dt.get_add_actions(flatten=False))
    part_types = {c: (_field(schema, c) or T.StringType()) for c in partition_columns}
    leaves = list(leaf_fields(T.StructType([f for f in schema.fields if f.name not in part_types])))
    rows = table.to_pylist()
    files = []
    for row in rows:
        partition = row.get("partition") or {}
        pvalues = {c: serialize_partition_value(partition.get(c), part_types[c]) for c in partition_columns}
        stats = None
        if row.get("num_records") is not None:
            stats = FileStats(
                num_records=int(row["num_records"]),
                min_values=_typed(row.get("min"), leaves),
                max_values=_typed(row.get("max"), leaves),
                null_count=_counts(row.get("null_count")),
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


def _field(schema: T.StructType, name: str) -> T.DataType | None:
    for f in schema.fields:
        if f.name == name:
            return f.dataType
    return None


def _typed(values: Any, leaves: list[tuple[tuple[str, ...], T.DataType]]) -> dict[str, Any]:
    if not isinstance(values, Mapping):
        return {}
    out: dict[str, Any] = {}
    for path, dtype in leaves:
        node: Any = values
        for name in path:
            node = node.get(name) if isinstance(node, Mapping) else None
        if node is None or isinstance(node, Mapping):
            continue
        value = normalize_stat_value(node, dtype)
        if value is None:
            continue
        target = out
        for name in path[:-1]:
            target = target.setdefault(name, {})
        target[path[-1]] = value
    return out


def _counts(values: Any) -> dict[str, Any]:
    if not isinstance(values, Mapping):
        return {}
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            nested = _counts(value)
            if nested:
                out[key] = nested
        elif isinstance(value, int):
            out[key] = value
    return out
