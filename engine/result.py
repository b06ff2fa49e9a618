"""What a merge returns to its caller, and the names of Delta's MERGE metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Phase = Literal["preparing_source", "finding_touched_files", "writing", "committing"]
"""Progress phases reported through ``on_progress``; raising from the ``committing`` call aborts the merge
before anything reaches the log."""

COMMIT_METRICS: tuple[str, ...] = (
    "numSourceRows",
    "numTargetRowsInserted",
    "numTargetRowsUpdated",
    "numTargetRowsMatchedUpdated",
    "numTargetRowsNotMatchedBySourceUpdated",
    "numTargetRowsDeleted",
    "numTargetRowsMatchedDeleted",
    "numTargetRowsNotMatchedBySourceDeleted",
    "numTargetRowsCopied",
    "numTargetBytesAdded",
    "numTargetBytesRemoved",
    "numOutputRows",
    "numTargetFilesAdded",
    "numTargetFilesRemoved",
    "numTargetChangeFilesAdded",
    "executionTimeMs",
    "materializeSourceTimeMs",
    "scanTimeMs",
    "rewriteTimeMs",
    "numTargetDeletionVectorsAdded",
    "numTargetDeletionVectorsRemoved",
    "numTargetDeletionVectorsUpdated",
)
"""The keys Delta's MERGE commit records as ``operationMetrics`` (as strings)."""

UI_METRICS: tuple[str, ...] = (
    "numSourceRowsInSecondScan",
    "numTargetChangeFileBytes",
    "numTargetFilesBeforeSkipping",
    "numTargetFilesAfterSkipping",
    "numTargetBytesBeforeSkipping",
    "numTargetBytesAfterSkipping",
    "numTargetPartitionsAfterSkipping",
    "numTargetPartitionsRemovedFrom",
    "numTargetPartitionsAddedTo",
)
"""Metrics Delta shows only in its UI; the job reports them too."""

ALL_METRICS = COMMIT_METRICS + UI_METRICS


@dataclass(frozen=True)
class AppTransaction:
    """Delta's ``txn`` action: ``version`` is already applied when the table's version for ``app_id`` is at
    least ``version``; such a merge finishes without committing again."""

    app_id: str
    version: int


@dataclass(frozen=True)
class MergeResult:
    table_version: int | None
    """The version this merge committed; None for a dry run or a merge that touched no file (nothing to commit)."""
    result: dict[str, int]
    """MergeIntoCommand's output row: num_affected_rows, num_updated_rows, num_deleted_rows, num_inserted_rows."""
    metrics: dict[str, int] = field(default_factory=dict)
    already_applied: bool = False
    """The table already held this merge's ``txn`` version: nothing was done and ``table_version`` is the
    table's version that carries it."""
