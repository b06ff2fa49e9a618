"""A table's state at one version, read with ``deltalake`` (log replay, checkpoints): Delta's ``Snapshot``.

deltalake parses statistics into typed values and partition values into typed values; both are converted here
to this layer's forms (typed statistics, Delta's partition value strings).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import types as T

from engine.delta.actions import AddFile, FileStats, Metadata, Protocol, parse_schema
from engine.delta.column_mapping import has_physical_names, physical_name, rename_stats
from engine.delta.deletion_vectors import DeletionVectorDescriptor, DeletionVectorError
from engine.delta.paths import ReadScope, normalize_table
from engine.delta.storage import Storage, storage_for
from engine.delta.values import (
    leaf_fields,
    normalize_stat_value,
    serialize_partition_value,
    to_arrow_schema,
)
from engine.errors import DeltaError, TableNotFoundError, UnsupportedTableFeatureError

DEFAULT_CHECKPOINT_INTERVAL = 10
_CHECKPOINT_NAME = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet$")
_COMMIT_NAME = re.compile(r"^(\d{20})\.json$")
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
        files = _with_deletion_vectors(files, root, int(dt.version()))
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
    )


def _with_deletion_vectors(files: tuple[AddFile, ...], root: str, version: int) -> tuple[AddFile, ...]:
    """``files`` with their deletion vector descriptors and ``tightBounds``. deltalake's add actions show
    neither, so the log is replayed for them: the newest checkpoint at or before ``version``, then the commits
    after it (PROTOCOL.md "Action Reconciliation": the last add or remove of a path wins)."""
    try:
        replayed = _replay_deletion_vectors(root, version)
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as exc:
        raise DeltaError(f"Cannot read the deletion vectors of table {root}: {type(exc).__name__}") from exc
    out = []
    for add in files:
        descriptor, tight = replayed.get(add.path, (None, None))
        stats = add.stats if add.stats is None or tight is None else replace(add.stats, tight_bounds=tight)
        out.append(replace(add, deletion_vector=descriptor, stats=stats))
    return tuple(out)


def _replay_deletion_vectors(root: str, version: int) -> dict[str, tuple[DeletionVectorDescriptor | None, bool | None]]:
    """Live path -> (its deletion vector, its statistics' ``tightBounds``) at ``version``."""
    log_dir = os.path.join(root, "_delta_log")
    names = os.listdir(log_dir)
    start, parts = _newest_checkpoint(names, version)
    live: dict[str, tuple[DeletionVectorDescriptor | None, bool | None]] = {}
    for part in parts:
        _replay_checkpoint(os.path.join(log_dir, part), live)
    commits = sorted(int(m.group(1)) for m in map(_COMMIT_NAME.match, names) if m)
    for number in commits:
        if start < number <= version:
            with open(os.path.join(log_dir, f"{number:020d}.json"), encoding="utf-8") as handle:
                for line in handle:
                    if line.strip():
                        _apply(json.loads(line), live)
    return live


def _newest_checkpoint(names: list[str], version: int) -> tuple[int, list[str]]:
    """(version, part file names) of the newest complete classic checkpoint at or before ``version``."""
    found: dict[tuple[int, int], list[str]] = {}
    for name in names:
        m = _CHECKPOINT_NAME.match(name)
        if m and int(m.group(1)) <= version:
            found.setdefault((int(m.group(1)), int(m.group(3) or 1)), []).append(name)
    complete = [(v, n) for (v, n), parts in found.items() if len(parts) == n]
    if not complete:
        return -1, []
    best = max(complete)
    return best[0], sorted(found[best])


def _replay_checkpoint(path: str, live: dict[str, tuple[DeletionVectorDescriptor | None, bool | None]]) -> None:

    adds = pq.read_table(path, columns=["add"]).column("add").to_pylist()
    for add in adds:
        if add:
            _apply({"add": add}, live)


def _apply(action: Mapping[str, Any], live: dict[str, tuple[DeletionVectorDescriptor | None, bool | None]]) -> None:
    if "add" in action:
        body = action["add"]
        raw = body.get("deletionVector")
        try:
            descriptor = DeletionVectorDescriptor.from_json(raw) if raw else None
        except DeletionVectorError as exc:
            raise DeltaError(f"File {body.get('path')!r} has a malformed deletion vector: {exc}") from exc
        live[body["path"]] = (descriptor, _tight_bounds(body.get("stats")))
    elif "remove" in action:
        # Delta keys file actions by (path, deletion vector id): a remove cancels only the add it names, so
        # Delta's own DELETE, which writes the new add before the remove of the old vector, keeps the new one.
        body = action["remove"]
        raw = body.get("deletionVector")
        try:
            removed = DeletionVectorDescriptor.from_json(raw).unique_id if raw else None
        except DeletionVectorError as exc:
            raise DeltaError(f"File {body.get('path')!r} has a malformed deletion vector: {exc}") from exc
        current = live.get(body["path"])
        if current is not None and (current[0].unique_id if current[0] is not None else None) == removed:
            del live[body["path"]]


def _tight_bounds(stats: Any) -> bool | None:
    if not isinstance(stats, str) or "tightBounds" not in stats:
        return None
    try:
        value = json.loads(stats).get("tightBounds")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, bool) else None


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
    leaves = list(leaf_fields(T.StructType([f for f in schema.fields if f.name not in part_types])))
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
                min_values=_typed(_logical(row.get("min"), schema, mapped), leaves),
                max_values=_typed(_logical(row.get("max"), schema, mapped), leaves),
                null_count=_counts(_logical(row.get("null_count"), schema, mapped)),
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
