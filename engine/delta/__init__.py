"""The Delta table layer: snapshots (read with deltalake), scans and writes over Spark Connect, data skipping,
statistics, and commits with Delta's optimistic concurrency (WriteSerializable) written by this process.

Delta's own JVM code cannot run on the Spark servers, so this package reads and commits the log itself.

Each export is imported on first use, so that a leaf such as ``engine.delta.values`` imports alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.exports import lazy_exports

if TYPE_CHECKING:
    from engine.delta.actions import (
        AddCDCFile,
        AddFile,
        Metadata,
        Protocol,
        RemoveFile,
        SetTransaction,
        known_num_records,
    )
    from engine.delta.app_transactions import commit_info, find_app_transaction_commit
    from engine.delta.change_feed import (
        COMMIT_TIMESTAMP_COL,
        COMMIT_VERSION_COL,
        ChangeFeedError,
        change_feed_schema,
        change_feed_versions,
        read_change_feed,
    )
    from engine.delta.commits import CommitEntry
    from engine.delta.constraints import GENERATION_KEY
    from engine.delta.features import DEFAULT_KEY, check_can_modify, check_readable, check_supported
    from engine.delta.file_stats import FileStats
    from engine.delta.names import ColumnPathError, parse_column_path, quote_identifier, quote_path
    from engine.delta.paths import ReadScope
    from engine.delta.row_groups import row_group_count
    from engine.delta.scan import (
        FILE_NAME_COL,
        FILE_PATH_COL,
        ROW_COMMIT_VERSION_COL,
        ROW_ID_COL,
        ROW_INDEX_COL,
        files_at_paths,
        scan_files,
        scan_files_with_path,
    )
    from engine.delta.skipping import FilePredicate, prune_files
    from engine.delta.snapshot import Snapshot, load_snapshot
    from engine.delta.time_travel import TimeTravelError, check_version, version_at, version_from
    from engine.delta.transaction import CommitAction, Transaction
    from engine.delta.values import INTEGRAL_TYPES
    from engine.delta.write import (
        CHANGE_TYPE_COL,
        check_no_reserved_cdc_columns,
        discard_write,
        target_partitions,
        write_data_and_cdc_files,
        write_data_files,
    )

_EXPORTS = {
    "AddCDCFile": "engine.delta.actions",
    "AddFile": "engine.delta.actions",
    "CommitEntry": "engine.delta.commits",
    "FileStats": "engine.delta.file_stats",
    "Metadata": "engine.delta.actions",
    "Protocol": "engine.delta.actions",
    "RemoveFile": "engine.delta.actions",
    "SetTransaction": "engine.delta.actions",
    "known_num_records": "engine.delta.actions",
    "commit_info": "engine.delta.app_transactions",
    "GENERATION_KEY": "engine.delta.constraints",
    "DEFAULT_KEY": "engine.delta.features",
    "INTEGRAL_TYPES": "engine.delta.values",
    "find_app_transaction_commit": "engine.delta.app_transactions",
    "check_can_modify": "engine.delta.features",
    "check_readable": "engine.delta.features",
    "check_supported": "engine.delta.features",
    "ColumnPathError": "engine.delta.names",
    "parse_column_path": "engine.delta.names",
    "quote_identifier": "engine.delta.names",
    "quote_path": "engine.delta.names",
    "ReadScope": "engine.delta.paths",
    "row_group_count": "engine.delta.row_groups",
    "FILE_NAME_COL": "engine.delta.scan",
    "FILE_PATH_COL": "engine.delta.scan",
    "ROW_INDEX_COL": "engine.delta.scan",
    "ROW_ID_COL": "engine.delta.scan",
    "ROW_COMMIT_VERSION_COL": "engine.delta.scan",
    "files_at_paths": "engine.delta.scan",
    "scan_files": "engine.delta.scan",
    "scan_files_with_path": "engine.delta.scan",
    "FilePredicate": "engine.delta.skipping",
    "prune_files": "engine.delta.skipping",
    "Snapshot": "engine.delta.snapshot",
    "load_snapshot": "engine.delta.snapshot",
    "TimeTravelError": "engine.delta.time_travel",
    "check_version": "engine.delta.time_travel",
    "version_at": "engine.delta.time_travel",
    "version_from": "engine.delta.time_travel",
    "COMMIT_TIMESTAMP_COL": "engine.delta.change_feed",
    "COMMIT_VERSION_COL": "engine.delta.change_feed",
    "ChangeFeedError": "engine.delta.change_feed",
    "change_feed_schema": "engine.delta.change_feed",
    "change_feed_versions": "engine.delta.change_feed",
    "read_change_feed": "engine.delta.change_feed",
    "CommitAction": "engine.delta.transaction",
    "Transaction": "engine.delta.transaction",
    "CHANGE_TYPE_COL": "engine.delta.write",
    "check_no_reserved_cdc_columns": "engine.delta.write",
    "discard_write": "engine.delta.write",
    "target_partitions": "engine.delta.write",
    "write_data_and_cdc_files": "engine.delta.write",
    "write_data_files": "engine.delta.write",
}

__all__ = [
    "CHANGE_TYPE_COL",
    "COMMIT_TIMESTAMP_COL",
    "COMMIT_VERSION_COL",
    "DEFAULT_KEY",
    "FILE_NAME_COL",
    "FILE_PATH_COL",
    "GENERATION_KEY",
    "INTEGRAL_TYPES",
    "ROW_COMMIT_VERSION_COL",
    "ROW_ID_COL",
    "ROW_INDEX_COL",
    "AddCDCFile",
    "AddFile",
    "ChangeFeedError",
    "ColumnPathError",
    "CommitAction",
    "CommitEntry",
    "FilePredicate",
    "FileStats",
    "Metadata",
    "Protocol",
    "ReadScope",
    "RemoveFile",
    "SetTransaction",
    "Snapshot",
    "TimeTravelError",
    "Transaction",
    "change_feed_schema",
    "change_feed_versions",
    "check_can_modify",
    "check_no_reserved_cdc_columns",
    "check_readable",
    "check_supported",
    "check_version",
    "commit_info",
    "discard_write",
    "files_at_paths",
    "find_app_transaction_commit",
    "known_num_records",
    "load_snapshot",
    "parse_column_path",
    "prune_files",
    "quote_identifier",
    "quote_path",
    "read_change_feed",
    "row_group_count",
    "scan_files",
    "scan_files_with_path",
    "target_partitions",
    "version_at",
    "version_from",
    "write_data_and_cdc_files",
    "write_data_files",
]


__getattr__ = lazy_exports(__name__, _EXPORTS)
