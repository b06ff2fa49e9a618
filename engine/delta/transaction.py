"""Delta's OptimisticTransaction with WriteSerializable conflict checks, writing the log ourselves.

A commit is one JSON file ``_delta_log/<version:020>.json`` created put-if-absent. Losing the race means
another writer committed that version first: its actions are read back and checked against what this
transaction read and removes (ConflictChecker); without a conflict the same actions are retried at the next
version (a rebase), up to ``max_attempts`` times.

Conflict rules (stricter than Delta where noted, never weaker):
- winning ``metaData`` -> MetadataChangedError; ``protocol`` -> ProtocolChangedError;
- winning ``txn`` for one of our app ids -> ConcurrentTransactionError;
- winning ``remove`` of a file we remove -> ConcurrentDeleteDeleteError; of a file we read ->
  ConcurrentDeleteReadError;
- winning ``add`` (dataChange) that a recorded read predicate could select (partition values and statistics,
  as data skipping judges them) -> ConcurrentAppendError. Unlike Delta, blind appends are checked too;
- winning ``domainMetadata`` of a domain this commit also sets -> ConcurrentDomainMetadataError, except the
  row-id high-water mark (``delta.rowTracking``), which is not a conflict: the retry reassigns row ids above
  the winner's mark, as Delta's ConflictChecker.reassignOverlappingRowIds does.

Each attempt's commit is written for its version: new files' ``defaultRowCommitVersion`` is that version, their
``baseRowId`` lies above the latest high-water mark, and an in-commit timestamp follows the previous commit's.
"""

from __future__ import annotations

import json
import logging
import os
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlglot import exp

from engine.delta import row_tracking
from engine.delta.actions import (
    AddCDCFile,
    AddFile,
    DomainMetadata,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
    now_millis,
)
from engine.delta.column_mapping import has_physical_names, rename_partition_values, rename_stats
from engine.delta.commit_rules import check_domains, check_vector_counts
from engine.delta.commits import CommitEntry, actions_to_json_lines, parse_commit
from engine.delta.errors import CommitRetriesExhaustedError, ConcurrentDomainMetadataError
from engine.delta.features import (
    check_can_modify,
    check_protocol_and_metadata,
    check_supported,
    features_in_use,
    has_type,
)
from engine.delta.skipping import FilePredicate
from engine.delta.snapshot import Snapshot
from engine.delta.storage import CommitOutcomeUnknown, Storage, may_pass
from engine.errors import (
    CommitFailedError,
    CommitStateUnknownError,
    CommitStorageError,
    ConcurrentAppendError,
    ConcurrentDeleteDeleteError,
    ConcurrentDeleteReadError,
    ConcurrentTransactionError,
    DeltaError,
    MetadataChangedError,
    ProtocolChangedError,
    UnsupportedTableFeatureError,
)

log = logging.getLogger(__name__)


ENGINE_INFO = "merge-service/0.1.0"
ISOLATION_LEVEL = "WriteSerializable"
LOG_DIR = "_delta_log"
_COMMIT_NAME = re.compile(r"^\d{20}\.json$")

CommitAction = AddFile | RemoveFile | AddCDCFile | Metadata | Protocol | DomainMetadata


def commit_key(version: int) -> str:
    return f"{LOG_DIR}/{version:020d}.json"


@dataclass(frozen=True)
class _ReadScope:
    predicate: FilePredicate | None  # None: the whole table


class Transaction:
    """One optimistic transaction on a snapshot: record what was read, then ``commit`` the actions."""

    def __init__(self, snapshot: Snapshot, *, engine_info: str = ENGINE_INFO) -> None:
        check_supported(snapshot)
        self.snapshot = snapshot
        self.engine_info = engine_info
        self.txn_id = str(uuid.uuid4())
        self._read_paths: set[str] = set()
        self._scopes: list[_ReadScope] = []
        self._app_txns: dict[str, int] = {}
        self._committed_version: int | None = None
        self.attempts = 0
        self._high_water_mark = row_tracking.high_water_mark(snapshot.domains)
        """The row-id high-water mark of the latest version seen: the snapshot's, then each winner's."""
        self._previous_timestamp: int | None = None
        """The commit timestamp of the latest version seen (its in-commit timestamp, else its file's time)."""

    @property
    def read_version(self) -> int:
        return self.snapshot.version

    @property
    def committed_version(self) -> int | None:
        return self._committed_version

    def record_read(self, files: Sequence[AddFile], predicate: str | exp.Expression | None) -> None:
        """Files this transaction read and the predicate that selected them (None: the whole table). Appends
        by others that the predicate would have selected conflict with this transaction."""
        self._read_paths.update(f.path for f in files)
        compiled = (
            None
            if predicate is None
            else FilePredicate(predicate, self.snapshot.spark_schema, self.snapshot.partition_columns)
        )
        self._scopes.append(_ReadScope(compiled))

    def set_app_transaction(self, app_id: str, version: int) -> None:
        """Record ``txn(app_id, version)`` in the commit: Delta's idempotent-write marker."""
        self._app_txns[app_id] = int(version)

    # --- commit ------------------------------------------------------------------------------------------------

    def commit(
        self,
        actions: Sequence[CommitAction],
        *,
        operation: str,
        operation_parameters: Mapping[str, Any],
        operation_metrics: Mapping[str, Any] | None = None,
        is_blind_append: bool = False,
        max_attempts: int = 10,
        tags: Mapping[str, str] | None = None,
    ) -> int:
        """Write the commit; answer the version it landed at. Raises a ConcurrentModificationError subclass
        on a conflict, CommitFailedError when nothing was written (CommitStorageError when the storage failed),
        CommitStateUnknownError when the outcome cannot be told."""
        if self._committed_version is not None:
            raise DeltaError("This transaction has already committed")
        storage = self.snapshot.storage
        new_metadata, new_protocol = self._validate(actions)
        commit_info = self._commit_info(operation, operation_parameters, operation_metrics, is_blind_append, tags)
        checked_through = self.read_version
        version = self.read_version + 1
        for attempt in range(1, max(1, max_attempts) + 1):
            self.attempts = attempt
            # Commits that landed since our snapshot (all of them, not only the one that beat us last time,
            # so a long-running transaction does not spend its attempts catching up).
            version = max(version, self._latest_version(storage) + 1)
            for winner in range(checked_through + 1, version):
                entry = self._read_winner(storage, winner)
                self._check_conflicts(entry, actions)
                self._rebase(entry)
            checked_through = version - 1
            body = self._serialize(actions, commit_info, new_metadata, new_protocol, version)
            try:
                storage.put_if_absent(commit_key(version), body)
            except FileExistsError:
                version += 1
                continue
            except CommitOutcomeUnknown as exc:
                raise CommitStateUnknownError(
                    f"Commit of version {version} to {self.snapshot.root} may or may not have landed: {exc}"
                ) from exc
            except OSError as exc:
                raise _storage_failure(
                    exc, f"Cannot write commit {version} to {self.snapshot.root}; nothing was committed: {exc}"
                ) from exc
            self._committed_version = version
            self._post_commit(version, new_metadata)
            return version
        raise CommitRetriesExhaustedError(
            f"Gave up committing to {self.snapshot.root} after {max_attempts} attempts: versions up to "
            f"{version - 1} were taken by other writers (none conflicted)"
        )

    def _validate(self, actions: Sequence[CommitAction]) -> tuple[Metadata | None, Protocol | None]:
        metadata = [a for a in actions if isinstance(a, Metadata)]
        protocols = [a for a in actions if isinstance(a, Protocol)]
        if len(metadata) > 1 or len(protocols) > 1:
            raise DeltaError("A commit holds at most one metaData and one protocol action")
        for action in actions:
            if not isinstance(action, (AddFile, RemoveFile, AddCDCFile, Metadata, Protocol, DomainMetadata)):
                raise TypeError(f"Cannot commit {type(action).__name__}")
        new_metadata = metadata[0] if metadata else None
        new_protocol = protocols[0] if protocols else None
        check_domains([a for a in actions if isinstance(a, DomainMetadata)], new_protocol or self.snapshot.protocol)
        if any(isinstance(a, RemoveFile) and a.data_change for a in actions):
            check_can_modify(self.snapshot)
        if (
            any(isinstance(a, AddCDCFile) for a in actions)
            and not self.snapshot.cdf_enabled
            and (new_metadata is None or not new_metadata.cdf_enabled)
        ):
            raise DeltaError("cdc actions need delta.enableChangeDataFeed = true on the table")
        if new_metadata is not None or new_protocol is not None:
            meta = new_metadata or self.snapshot.metadata
            if meta.id != self.snapshot.metadata.id:
                raise DeltaError("A metaData action must keep the table id")
            if tuple(meta.partition_columns) != tuple(self.snapshot.partition_columns):
                raise DeltaError("Changing partition columns is not supported")
            protocol = new_protocol or self.snapshot.protocol
            check_protocol_and_metadata(protocol, meta, where="new metadata")
            if has_type(meta.schema_string, "timestamp_ntz") and "timestampNtz" not in (protocol.writer_features or ()):
                raise UnsupportedTableFeatureError(
                    "A TIMESTAMP_NTZ column needs the timestampNtz table feature, which this table lacks"
                )
            variant = features_in_use(meta).get("variantType")
            if variant and not {"variantType", "variantType-preview"} & set(protocol.writer_features or ()):
                raise UnsupportedTableFeatureError(
                    f"A VARIANT column needs the variantType table feature, which this table lacks ({variant})"
                )
        adds = [a for a in actions if isinstance(a, AddFile)]
        if len({a.path for a in adds}) != len(adds):
            raise DeltaError("The same file is added twice")
        check_vector_counts(adds)
        live = self.snapshot.files_by_path
        missing = [a.path for a in actions if isinstance(a, RemoveFile) and a.path not in live]
        if missing:
            raise DeltaError(f"Cannot remove files that are not in version {self.read_version}: {missing[:3]}")
        return new_metadata, new_protocol

    def _commit_info(
        self,
        operation: str,
        parameters: Mapping[str, Any],
        metrics: Mapping[str, Any] | None,
        is_blind_append: bool,
        tags: Mapping[str, str] | None,
    ) -> dict[str, Any]:
        commit_info: dict[str, Any] = {
            "timestamp": now_millis(),
            "operation": operation,
            "operationParameters": {k: _as_string(v) for k, v in parameters.items()},
            "readVersion": self.read_version,
            "isolationLevel": ISOLATION_LEVEL,
            "isBlindAppend": bool(is_blind_append),
        }
        if metrics is not None:
            commit_info["operationMetrics"] = {k: _as_string(v) for k, v in metrics.items()}
        if tags:
            commit_info["tags"] = dict(tags)
        commit_info["engineInfo"] = self.engine_info
        commit_info["txnId"] = self.txn_id
        return commit_info

    def _serialize(
        self,
        actions: Sequence[CommitAction],
        commit_info: Mapping[str, Any],
        metadata: Metadata | None,
        protocol: Protocol | None,
        version: int,
    ) -> bytes:
        """The commit file for ``version``. commitInfo comes first, as in-commit timestamps require."""
        now = now_millis()
        table_metadata = metadata or self.snapshot.metadata
        table_protocol = protocol or self.snapshot.protocol
        info = dict(commit_info)
        if row_tracking.in_commit_timestamps_enabled(table_metadata):
            previous = self._previous_commit_timestamp()
            info = {"inCommitTimestamp": row_tracking.next_in_commit_timestamp(now, previous), **info}
        lines: list[Mapping[str, Any]] = [{"commitInfo": info}]
        if protocol is not None:
            lines.append(protocol.to_action())
        if metadata is not None:
            lines.append(metadata.to_action())
        for app_id, app_version in self._app_txns.items():
            lines.append(SetTransaction(app_id, app_version, now).to_action())
        files = [a for a in actions if isinstance(a, (AddFile, RemoveFile, AddCDCFile))]
        domains = [a for a in actions if isinstance(a, DomainMetadata)]
        if row_tracking.assigns_row_ids(table_protocol, table_metadata):
            adds, mark = row_tracking.assign_fresh_row_ids(
                [a for a in files if isinstance(a, AddFile)], self._high_water_mark, version
            )
            if mark != self._high_water_mark:
                domains.append(row_tracking.high_water_mark_domain(mark))
            assigned = iter(adds)
            files = [next(assigned) if isinstance(a, AddFile) else a for a in files]
        lines.extend(d.to_action() for d in domains)
        lines.extend(_physical(a, table_metadata.schema).to_action() for a in files)
        return actions_to_json_lines(lines)

    def _previous_commit_timestamp(self) -> int:
        """The timestamp of the version before the one being written: the latest winner's, else the snapshot's."""
        if self._previous_timestamp is None:
            storage = self.snapshot.storage
            try:
                text = storage.read(commit_key(self.read_version)).decode("utf-8")
            except OSError as exc:
                raise _storage_failure(
                    exc,
                    f"Cannot read commit {self.read_version} of {self.snapshot.root} for its in-commit timestamp: "
                    f"{exc}",
                ) from exc
            entry = parse_commit(self.read_version, text, self.snapshot.spark_schema)
            self._previous_timestamp = self._commit_timestamp(entry)
        return self._previous_timestamp

    def _commit_timestamp(self, entry: CommitEntry) -> int:
        """A commit's in-commit timestamp, else (a commit from before the feature) its file's modification time."""
        ict = (entry.commit_info or {}).get("inCommitTimestamp")
        if isinstance(ict, int):
            return ict
        return int(os.path.getmtime(os.path.join(self.snapshot.root, *commit_key(entry.version).split("/"))) * 1000)

    def _rebase(self, winner: CommitEntry) -> None:
        """Take in a winner that does not conflict: its high-water mark and its timestamp."""
        mark = row_tracking.domain_high_water_mark(winner.domains)
        if mark is not None:
            self._high_water_mark = max(self._high_water_mark, mark)
        if row_tracking.in_commit_timestamps_enabled(self.snapshot.metadata):
            self._previous_timestamp = self._commit_timestamp(winner)

    def _latest_version(self, storage: Storage) -> int:
        try:
            names = storage.list(LOG_DIR)
        except OSError as exc:
            raise _storage_failure(exc, f"Cannot list the log of {self.snapshot.root}: {exc}") from exc
        versions = [int(n[:20]) for n in names if _COMMIT_NAME.match(n)]
        return max(versions, default=self.read_version)

    def _read_winner(self, storage: Storage, version: int) -> CommitEntry:
        try:
            text = storage.read(commit_key(version)).decode("utf-8")
        except FileNotFoundError as exc:
            raise CommitFailedError(
                f"Commit {version} of {self.snapshot.root} vanished while checking for conflicts"
            ) from exc
        except OSError as exc:
            raise _storage_failure(exc, f"Cannot read commit {version} of {self.snapshot.root}: {exc}") from exc
        return parse_commit(version, text, self.snapshot.spark_schema)

    def _check_conflicts(self, winner: CommitEntry, actions: Sequence[CommitAction]) -> None:
        """Delta's ConflictChecker for one winning commit."""
        who = _describe(winner)
        if winner.protocol is not None:
            raise ProtocolChangedError(f"{who} changed the table protocol after version {self.read_version}")
        if winner.metadata is not None:
            raise MetadataChangedError(
                f"{who} changed the table metadata (schema or properties) after version {self.read_version}"
            )
        for txn in winner.txns:
            if txn.app_id in self._app_txns:
                raise ConcurrentTransactionError(
                    f"{who} committed application transaction {txn.app_id!r} version {txn.version} concurrently"
                )
        ours_domains = {a.domain for a in actions if isinstance(a, DomainMetadata)}
        for domain in winner.domains:
            if domain.domain in ours_domains:
                raise ConcurrentDomainMetadataError(
                    f"{who} set metadata domain {domain.domain!r}, which this commit sets too"
                )
        ours_removed = {a.path for a in actions if isinstance(a, RemoveFile)}
        for remove in winner.removes:
            if remove.path in ours_removed:
                raise ConcurrentDeleteDeleteError(f"{who} also removed file {remove.path} that this commit removes")
        for remove in winner.removes:
            if remove.path in self._read_paths:
                raise ConcurrentDeleteReadError(f"{who} removed file {remove.path} that this transaction read")
        for add in winner.adds:
            if not add.data_change:
                continue
            for scope in self._scopes:
                if scope.predicate is None:
                    raise ConcurrentAppendError(
                        f"{who} added file {add.path} to the table this transaction read in full"
                    )
                if scope.predicate.might_match(add):
                    raise ConcurrentAppendError(
                        f"{who} added file {add.path}, which may hold rows matching this transaction's read "
                        f"predicate {scope.predicate.text!r}"
                    )

    def _post_commit(self, version: int, new_metadata: Metadata | None) -> None:
        """Checkpoint every ``delta.checkpointInterval`` versions; best effort."""
        config = (new_metadata or self.snapshot.metadata).configuration
        try:
            interval = max(1, int(config.get("delta.checkpointInterval", 10)))
        except ValueError:
            interval = 10
        if version % interval != 0:
            return
        try:
            from deltalake import DeltaTable

            DeltaTable(self.snapshot.root, version=version).create_checkpoint()
        except Exception as exc:  # a missing checkpoint only slows readers down
            log.warning("Checkpoint at version %s of %s failed: %s", version, self.snapshot.root, exc)


def _storage_failure(exc: OSError, message: str) -> CommitFailedError:
    """The error for a commit the storage stopped: CommitStorageError (retried) when the failure may pass,
    CommitFailedError otherwise."""
    return CommitStorageError(message) if may_pass(exc) else CommitFailedError(message)


def _as_string(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(value)


def _describe(winner: CommitEntry) -> str:
    info = winner.commit_info or {}
    operation = info.get("operation", "a commit")
    engine = info.get("engineInfo") or info.get("clientVersion")
    return f"Concurrent {operation} (version {winner.version}{', ' + str(engine) if engine else ''})"


FileAction = AddFile | RemoveFile | AddCDCFile


def _physical(action: FileAction, schema: Any) -> FileAction:
    """A file action as the log holds it: under column mapping, partition values and statistics keyed by
    physical names (this layer keys them by logical names)."""
    if not has_physical_names(schema):
        return action
    values = rename_partition_values(action.partition_values, schema, to_physical=True)
    if isinstance(action, (AddFile, RemoveFile)) and action.stats is not None:
        stats = replace(
            action.stats,
            min_values=rename_stats(action.stats.min_values, schema, to_physical=True),
            max_values=rename_stats(action.stats.max_values, schema, to_physical=True),
            null_count=rename_stats(action.stats.null_count, schema, to_physical=True),
        )
        return replace(action, partition_values=values, stats=stats)
    return replace(action, partition_values=values)
