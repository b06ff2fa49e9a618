"""Delta's DMLWithDeletionVectorsHelper: a merge that deletes or rewrites rows of a file marks them deleted in
the file's deletion vector instead of copying the file's other rows (merge-on-read)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow.parquet as pq
from pyroaring import BitMap64

from engine.delta.actions import AddFile
from engine.delta.deletion_vectors import read_deletion_vector, write_deletion_vector_file
from engine.delta.errors import InvalidWriteError
from engine.delta.features import protocol_features
from engine.delta.file_stats import FileStats
from engine.delta.snapshot import Snapshot


def deletion_vectors_writable(snapshot: Snapshot) -> bool:
    """Delta's deletionVectorsWritable: the protocol has the deletionVectors feature and the table's
    ``delta.enableDeletionVectors`` is true."""
    enabled = str(snapshot.configuration.get("delta.enableDeletionVectors", "")).lower() == "true"
    return enabled and "deletionVectors" in protocol_features(snapshot.protocol)


def _physical_rows(snapshot: Snapshot, add: AddFile) -> int:
    """The file's physical rows: its statistics' ``numRecords``, else its Parquet footer's count."""
    if add.stats is not None and add.stats.num_records is not None:
        return add.stats.num_records
    return int(pq.ParquetFile(snapshot.file_path(add)).metadata.num_rows)


def mark_rows_deleted(
    snapshot: Snapshot, files: Sequence[AddFile], deleted: Mapping[str, BitMap64], *, prefix: str
) -> tuple[list[AddFile], list[tuple[AddFile, AddFile]]]:
    """Delta's DMLWithDeletionVectorsHelper.processUnmodifiedData: each file in ``files`` with rows in
    ``deleted`` (by log path) gets a new vector, its old deletions and the new ones. Answers the files every
    row of which is now deleted (to be removed outright) and, for the others, (old file, same path with the new
    vector, statistics kept with ``tightBounds`` false). The new vectors go into one DV file in the folder
    ``prefix`` (the write's own, so an uncommitted write's vectors are discarded with its data files)."""
    removed: list[AddFile] = []
    kept: list[tuple[AddFile, BitMap64, int]] = []
    for add in files:
        rows = deleted.get(add.path)
        if not rows:
            continue
        bitmap = BitMap64(rows)
        if add.deletion_vector is not None:
            bitmap |= read_deletion_vector(add.deletion_vector, snapshot.root)
        physical = _physical_rows(snapshot, add)
        if bitmap.max() >= physical:
            raise InvalidWriteError(f"Row index {bitmap.max()} is past the {physical} rows of {add.path}")
        if len(bitmap) == physical:
            removed.append(add)
        else:
            kept.append((add, bitmap, physical))
    if not kept:
        return removed, []
    descriptors = write_deletion_vector_file(snapshot.root, [b for _, b, _ in kept], prefix=prefix)
    updated = []
    for (add, _, physical), descriptor in zip(kept, descriptors, strict=True):
        stats = _wide_stats(add, physical)
        updated.append((add, dataclasses.replace(add, data_change=True, stats=stats, deletion_vector=descriptor)))
    return removed, updated


def _wide_stats(add: AddFile, physical: int) -> FileStats:
    """Delta's updateStatsToWideBounds: the statistics of a file that now has a vector describe its physical
    rows with ``tightBounds`` false. ``numRecords`` must be there (PROTOCOL.md: a file with a deletion vector has
    it), so a file added without statistics gets its footer's count; a tight ``nullCount`` that counted every live
    row (the column is all null) becomes ``numRecords``, the one "all null" wide bounds can say."""
    if add.stats is None:
        return FileStats(num_records=physical, tight_bounds=False)
    stats = add.stats
    if stats.tight_bounds is False:
        return stats if stats.num_records is not None else dataclasses.replace(stats, num_records=physical)
    live = physical - (add.deletion_vector.cardinality if add.deletion_vector is not None else 0)

    def widened(counts: Mapping[str, Any]) -> dict[str, Any]:
        return {
            name: widened(value) if isinstance(value, Mapping) else physical if value == live else value
            for name, value in counts.items()
        }

    return dataclasses.replace(stats, num_records=physical, null_count=widened(stats.null_count), tight_bounds=False)
