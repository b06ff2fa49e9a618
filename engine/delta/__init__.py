"""The Delta table layer: snapshots (read with deltalake), scans and writes over Spark Connect, data skipping,
statistics, and commits with Delta's optimistic concurrency (WriteSerializable) written by this process.

Delta's own JVM code cannot run on the Spark servers, so this package reads and commits the log itself.
"""

from engine.delta.actions import (
    AddCDCFile,
    AddFile,
    CommitEntry,
    FileStats,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
    known_num_records,
)
from engine.delta.app_transactions import commit_info, find_app_transaction_commit
from engine.delta.features import check_can_modify, check_supported
from engine.delta.scan import (
    FILE_NAME_COL,
    FILE_PATH_COL,
    ROW_INDEX_COL,
    files_at_paths,
    scan_files,
    scan_files_with_path,
)
from engine.delta.skipping import FilePredicate, prune_files
from engine.delta.snapshot import Snapshot, load_snapshot
from engine.delta.transaction import Transaction
from engine.delta.write import (
    CHANGE_TYPE_COL,
    check_no_reserved_cdc_columns,
    discard_write,
    target_partitions,
    write_data_and_cdc_files,
    write_data_files,
)

__all__ = [
    "CHANGE_TYPE_COL",
    "FILE_NAME_COL",
    "FILE_PATH_COL",
    "ROW_INDEX_COL",
    "AddCDCFile",
    "AddFile",
    "CommitEntry",
    "FilePredicate",
    "FileStats",
    "Metadata",
    "Protocol",
    "RemoveFile",
    "SetTransaction",
    "Snapshot",
    "Transaction",
    "check_can_modify",
    "check_no_reserved_cdc_columns",
    "check_supported",
    "commit_info",
    "discard_write",
    "files_at_paths",
    "find_app_transaction_commit",
    "known_num_records",
    "load_snapshot",
    "prune_files",
    "scan_files",
    "scan_files_with_path",
    "target_partitions",
    "write_data_and_cdc_files",
    "write_data_files",
]
