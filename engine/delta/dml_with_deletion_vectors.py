"""Delta's DMLWithDeletionVectorsHelper: a merge that deletes or rewrites rows of a file marks them deleted in
the file's deletion vector instead of copying the file's other rows (merge-on-read)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import pyarrow.parquet as pq
from pyroaring import BitMap64

from engine.delta.actions import AddFile
from engine.delta.deletion_vectors import read_deletion_vector, write_deletion_vector_file
from engine.delta.errors import InvalidWriteError
from engine.delta.features import protocol_features
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
    kept: list[tuple[AddFile, BitMap64]] = []
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
            kept.append((add, bitmap))
    if not kept:
        return removed, []
    descriptors = write_deletion_vector_file(snapshot.root, [b for _, b in kept], prefix=prefix)
    updated = []
    for (add, _), descriptor in zip(kept, descriptors, strict=True):
        stats = None if add.stats is None else dataclasses.replace(add.stats, tight_bounds=False)
        updated.append((add, dataclasses.replace(add, data_change=True, stats=stats, deletion_vector=descriptor)))
    return removed, updated
