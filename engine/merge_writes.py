"""What a merge writes: which executors run, copy-on-write or with deletion vectors, and the files they add,
remove and add back."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from engine.context import MergeContext
from engine.delta import AddCDCFile, AddFile, Snapshot
from engine.delta.dml_with_deletion_vectors import deletion_vectors_writable
from engine.executors import ClassicMergeExecutor
from engine.insert_only import InsertOnlyMergeExecutor
from engine.merge_on_read import MergeOnReadExecutor
from engine.result import Phase
from engine.spec import MergeSpec


class MergeWrites(NamedTuple):
    added: list[AddFile]
    cdc_files: list[AddCDCFile]
    removed: list[AddFile]
    """Files removed; with deletion vectors, also those removed with their old vector and added back."""
    readded: list[AddFile]
    """The same paths as some removed files, added back with their new deletion vectors."""

    @property
    def replaced(self) -> list[AddFile]:
        """The removed files that are not added back: gone from the table, as Delta's metrics count them."""
        back = {f.path for f in self.readded}
        return [f for f in self.removed if f.path not in back]


def writes_deletion_vectors(spec: MergeSpec, snapshot: Snapshot) -> bool:
    """Merge-on-read: the spec allows it, the table is deletionVectorsWritable, and some clause updates or
    deletes target rows."""
    return spec.deletion_vectors == "auto" and not spec.is_insert_only and deletion_vectors_writable(snapshot)


def write_merge(ctx: MergeContext, on_progress: Callable[[Phase], None]) -> MergeWrites:
    if ctx.write_deletion_vectors:
        return _write_with_deletion_vectors(ctx, on_progress)
    return _write(ctx, on_progress)


def _write(ctx: MergeContext, on_progress: Callable[[Phase], None]) -> MergeWrites:
    """Copy-on-write: every touched file is rewritten."""
    spec = ctx.spec
    if spec.is_insert_only:
        on_progress("writing")
        return MergeWrites(InsertOnlyMergeExecutor(ctx).write_only_inserts(), [], [], [])
    on_progress("finding_touched_files")
    executor = ClassicMergeExecutor(ctx)
    touched, written = executor.find_touched_files_or_write(on_progress)
    if written is not None:
        return MergeWrites(written[0], written[1], touched, [])
    if touched:
        added, cdc_files = executor.write_all_changes()
        return MergeWrites(added, cdc_files, touched, [])
    if spec.not_matched:
        return MergeWrites(_only_inserts(ctx), [], [], [])
    return MergeWrites([], [], [], [])


def _write_with_deletion_vectors(ctx: MergeContext, on_progress: Callable[[Phase], None]) -> MergeWrites:
    """Merge-on-read: the touched files' changed rows are marked in their deletion vectors (a file every row of
    which goes is removed outright), and the rows they become are written to new files."""
    on_progress("finding_touched_files")
    executor = MergeOnReadExecutor(ctx)
    if ctx.spec.is_delete_only and not ctx.cdc_enabled:
        changes = executor.delete_with_deletion_vectors()
    elif executor.takes_one_scan():
        on_progress("writing")
        found = executor.write_all_changes_in_one_scan()
        if found is None:
            return MergeWrites(_only_inserts(ctx) if ctx.spec.not_matched else [], [], [], [])
        changes = found
    else:
        touched, _ = executor.find_touched_files_or_write(on_progress)
        if not touched:
            return MergeWrites(_only_inserts(ctx) if ctx.spec.not_matched else [], [], [], [])
        changes = executor.write_all_changes_with_deletion_vectors()
    removed = [*changes.removed, *[old for old, _ in changes.updated]]
    return MergeWrites(changes.added, changes.cdc_files, removed, [new for _, new in changes.updated])


def _only_inserts(ctx: MergeContext) -> list[AddFile]:
    """No target row matched: the source's rows go through the NOT MATCHED clauses alone."""
    return InsertOnlyMergeExecutor(ctx).write_only_inserts(
        filter_matched_rows=False, source_rows_metric="numSourceRowsInSecondScan"
    )
