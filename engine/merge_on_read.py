"""Merge-on-read: Delta's ClassicMergeExecutor with deletion vectors (Delta 3.1+). Only updated and inserted rows
are written; the target rows they replace, and the deleted ones, are marked in their files' deletion vectors.

Copy-on-write needs findTouchedFiles before its write, to know which files to rewrite. Merge-on-read rewrites no
file, so where every match touches its file the write's own output rows hold every matched target row: the
aggregation that gathers their row indexes also gives the touched files and the multiple-match check, one scan of
the candidate files instead of two. A delete-only merge writes no row at all, and gathers its vectors in one Spark
job.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from pyroaring import BitMap64
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from engine import delta
from engine.context import observe, observed_source_rows, source_with_count
from engine.deletion_vector_output import (
    OBSERVED_FILES_MAX,
    OBSERVED_SOURCE_ROWS_MAX,
    ONE_FILE_ROWS,
    DeletionVectorOutput,
    project_changes_with_deletion_vectors,
    write_changes_observing_target_rows,
    write_changes_with_deletion_vectors,
)
from engine.delta import AddCDCFile, AddFile
from engine.delta.dml_with_deletion_vectors import mark_rows_deleted
from engine.delta.internal_columns import internal_column
from engine.errors import MultipleMatchError
from engine.executors import ClassicMergeExecutor, is_only_one_unconditional_delete
from engine.join_keys import keyed_join
from engine.joins import source_fits_broadcast
from engine.output import MATCHED_DELETE
from engine.single_pass import touches_every_match
from engine.source_key_filter import keep_rows_of_source_keys, source_key_filter
from engine.spark import Observation, static_plan
from engine.streamed_source import spread_streamed_source
from engine.write_files import record_write_metrics

_DELETED_ROWS = internal_column("deleted_row_indexes")
_DELETED_PAIRS = internal_column("deleted_pairs")


@dataclass(frozen=True)
class DeletionVectorChanges:
    """What a merge-on-read writeAllChanges leaves to commit."""

    added: list[AddFile]
    """The new data files: updated and inserted rows."""
    cdc_files: list[AddCDCFile]
    removed: list[AddFile]
    """Touched files every row of which is now deleted: removed outright."""
    updated: list[tuple[AddFile, AddFile]]
    """Touched files given a new deletion vector: (the file as it was, the same path with the new vector)."""


@dataclass(frozen=True)
class WriteJoin:
    """The source joined with the target rows a merge-on-read write reads."""

    joined: DataFrame
    dedup_columns: list[str]
    second_scan: Observation
    """The second scan's count of source rows."""
    source_keys_filtered: bool
    """The source's keys filtered the target's scan (``source_key_filter``), so both sides of the join are
    small where the source is."""
    source_preserved: bool
    """The join keeps every source row (NOT MATCHED clauses): the target side is never streamed through the
    join's own stage, since Spark broadcasts or shuffles the side a left outer join does not keep."""


class MergeOnReadExecutor(ClassicMergeExecutor):
    def takes_one_scan(self) -> bool:
        """Whether the write's join can find the touched files itself: every match touches its file (so a file is
        touched exactly when the join gives it a target row), no NOT MATCHED BY SOURCE clause (the join then holds
        only matched target rows), several matches are never allowed (no CDF deletes to deduplicate), and the
        source's size is known before it is read (to plan the join as findTouchedFiles' count would). A broadcast
        plan also needs ON as key equalities: else its unmatched source rows are found by reading the candidate
        files again, where the two passes read only the touched ones."""
        ctx = self.ctx
        spec = ctx.spec
        if not (
            ctx.candidate_files
            and not spec.not_matched_by_source
            and touches_every_match(spec)
            and not is_only_one_unconditional_delete(spec)
            and ctx.source_rows_estimate is not None
        ):
            return False
        broadcast = spec.not_matched and source_fits_broadcast(ctx, ctx.source_rows_estimate, ctx.candidate_files)
        return not broadcast or keyed_join(ctx) is not None

    def write_all_changes_with_deletion_vectors(self) -> DeletionVectorChanges:
        """writeAllChanges with deletion vectors over the touched files (findTouchedFiles has run)."""
        start = time.monotonic()
        columns = self._target_columns()
        join = self._join_for_write_with_deletion_vectors(self.ctx.touched_files, columns=columns)
        output = project_changes_with_deletion_vectors(
            self.ctx, join.joined, join.dedup_columns, target_columns=columns
        )
        try:
            return self._write_changes(output, join.dedup_columns, join.second_scan, start)
        finally:
            output.rows.unpersist()

    def write_all_changes_in_one_scan(self) -> DeletionVectorChanges | None:
        """writeAllChanges with deletion vectors over the candidate files, findTouchedFiles folded in
        (``takes_one_scan``): the write's output rows hold every matched target row, so the rows it observes as
        it writes them also give the touched files and the multiple-match check, judged before the commit. None:
        no file is touched and nothing was written; the source's rows are then only inserts."""
        ctx = self.ctx
        estimate = ctx.source_rows_estimate
        if len(ctx.candidate_files) >= OBSERVED_FILES_MAX or estimate is None or estimate > OBSERVED_SOURCE_ROWS_MAX:
            return self.write_all_changes_in_one_scan_after_aggregation()
        start = time.monotonic()
        columns = self._target_columns()
        join = self._one_scan_join(columns)
        # Each source row yields at most one written row, and with Change Data Feed two change rows.
        expected_rows = estimate * (3 if ctx.cdc_enabled else 1)
        # The source's keys filtered the scan and few rows are written: the join meets few rows on both sides, and
        # its stages run as one job. 1,000 upserts into 1,000,000 rows in one file, deletion vectors, warm server,
        # alternate merges of one sequence: median 0.71 s against 0.86 s adaptive.
        with static_plan(ctx.spark, when=join.source_keys_filtered and expected_rows <= ONE_FILE_ROWS):
            written = write_changes_observing_target_rows(
                ctx,
                join.joined,
                join.dedup_columns,
                ctx.candidate_files,
                expected_rows=expected_rows,
                target_columns=columns,
                written_where_joined=join.source_keys_filtered and join.source_preserved,
            )
        if written is None:
            # Spark did not report what the write saw (or it saw too many target rows): what it wrote goes, and an
            # aggregation answers first.
            delta.discard_write(ctx.snapshot, ctx.write_id)
            return self.write_all_changes_in_one_scan_after_aggregation()
        self._count_source_rows(join.second_scan)
        ctx.metrics["scanTimeMs"] = int((time.monotonic() - start) * 1000)
        if not written.target_files:
            # No file touched: what was written goes, and the source's rows are written as inserts alone.
            delta.discard_write(ctx.snapshot, ctx.write_id)
            return None
        self._refuse_several_matches(written.repeated_matches)
        ctx.touched_files = [f for f in ctx.candidate_files if f.path in written.target_files]
        removed, updated = mark_rows_deleted(ctx.snapshot, ctx.touched_files, written.deleted, prefix=ctx.write_id)
        record_write_metrics(ctx, written.counts, written.cdc_files, _observed_rows(join.second_scan))
        _record_deletion_vector_metrics(ctx.metrics, removed, updated)
        # One Spark job both found the touched files and wrote their changes: each time counts it.
        ctx.metrics["rewriteTimeMs"] = int((time.monotonic() - start) * 1000)
        return DeletionVectorChanges(written.added, written.cdc_files, removed, updated)

    def write_all_changes_in_one_scan_after_aggregation(self) -> DeletionVectorChanges | None:
        """``write_all_changes_in_one_scan`` with the touched files and the row indexes gathered by an aggregation
        over the cached output rows before the write."""
        ctx = self.ctx
        start = time.monotonic()
        columns = self._target_columns()
        join = self._one_scan_join(columns)
        output = project_changes_with_deletion_vectors(
            ctx, join.joined, join.dedup_columns, count_repeated_matches=True, target_columns=columns
        )
        try:
            self._count_source_rows(join.second_scan)
            self._refuse_several_matches(output.repeated_matches)
            ctx.touched_files = [f for f in ctx.candidate_files if f.path in output.target_files]
            ctx.metrics["scanTimeMs"] = int((time.monotonic() - start) * 1000)
            if not ctx.touched_files:
                return None
            return self._write_changes(output, join.dedup_columns, join.second_scan, time.monotonic())
        finally:
            output.rows.unpersist()

    def _one_scan_join(self, columns: frozenset[str] | None) -> WriteJoin:
        return self._join_for_write_with_deletion_vectors(self.ctx.candidate_files, one_scan=True, columns=columns)

    def _count_source_rows(self, second_scan: Observation) -> None:
        observed = second_scan.get
        ctx = self.ctx
        ctx.metrics["numSourceRows"] = int(observed["rows"]) if "rows" in observed else ctx.source.count()

    def _refuse_several_matches(self, repeated_matches: int) -> None:
        if repeated_matches:
            # Never allowed in the one scan: it leaves the lone unconditional delete to the two passes.
            raise MultipleMatchError(self._multiple_match_message(self._matches()))

    def _target_columns(self) -> frozenset[str] | None:
        """The table columns the write reads: a copied or deleted row is never written, so without Change Data
        Feed (whose change rows carry the whole target row) only those ON and the clauses read; None: all."""
        return None if self.ctx.cdc_enabled else self.ctx.resolved.target_columns_read

    def _join_for_write_with_deletion_vectors(
        self,
        files: Sequence[AddFile],
        *,
        one_scan: bool = False,
        columns: frozenset[str] | None = None,
    ) -> WriteJoin:
        """``files`` joined with the source as in the copy-on-write path, less the target rows no clause may act
        on; with the row indexes CDF deletes are deduplicated by, and the second scan's source count. ``one_scan``:
        the join holds no unmatched target row, so the source's keys may filter the scan (source_key_filter).
        ``columns``: the only table columns read."""
        ctx = self.ctx
        spec = ctx.spec
        source_rows = ctx.source_rows
        keys = source_key_filter(ctx) if one_scan else None
        # The source's keys filter the target's rows before their deletion vectors meet them.
        prefilter = None if keys is None else partial(keep_rows_of_source_keys, ctx, keyed=keys)
        target, source, dedup_columns = self._sides_for_write(
            file_columns=True, files=files, columns=columns, prefilter=prefilter
        )
        broadcast_source = keys is None and bool(spec.not_matched) and source_fits_broadcast(ctx, source_rows, files)
        # Unless it is broadcast, the source streams into the join (or is shuffled to it by its keys).
        streamed = source if broadcast_source else spread_streamed_source(ctx, source)
        second_scan = Observation("secondScan")
        counted = observe(streamed, second_scan, F.count(F.lit(1)).alias("rows"))
        s, t, on = spec.source_alias, spec.target_alias, ctx.resolved.on
        # A target row no source row matches is copied unless a NOT MATCHED BY SOURCE clause may change it, and a
        # copied row stays where it is: only the rows a clause may act on are joined, so a small source is
        # broadcast instead of every row of the touched files being shuffled, cached and aggregated.
        keeps_target = bool(spec.not_matched_by_source)
        if keys is not None:
            # The one scan holds no unmatched target row: the target rows the source's keys cannot match go in the
            # scan, and both small sides are joined whole.
            how = "left_outer" if spec.not_matched else "inner"
            joined = counted.alias(s).join(target.alias(t), on, how)
        elif broadcast_source:
            # The target rows stream past the broadcast source instead of being shuffled to meet it. (With ON's key
            # equalities the one scan sends only the source's keys instead: source_key_filter.)
            joined = self._broadcast_join_for_write(
                source, counted, target, keep_unmatched_target=keeps_target, files=files
            )
        else:
            how = {
                (False, False): "inner",
                (False, True): "left_outer",
                (True, False): "right_outer",
                (True, True): "full_outer",
            }[(keeps_target, bool(spec.not_matched))]
            joined = counted.alias(s).join(target.alias(t), on, how)
        return WriteJoin(joined, dedup_columns, second_scan, keys is not None, bool(spec.not_matched))

    def _write_changes(
        self, output: DeletionVectorOutput, dedup_columns: list[str], second_scan: Observation, start: float
    ) -> DeletionVectorChanges:
        ctx = self.ctx
        added, cdc_files = write_changes_with_deletion_vectors(ctx, output, dedup_columns, write_id=ctx.write_id)
        removed, updated = mark_rows_deleted(ctx.snapshot, ctx.touched_files, output.deleted, prefix=ctx.write_id)
        record_write_metrics(ctx, output.counts, cdc_files, _observed_rows(second_scan))
        _record_deletion_vector_metrics(ctx.metrics, removed, updated)
        ctx.metrics["rewriteTimeMs"] = int((time.monotonic() - start) * 1000)
        return DeletionVectorChanges(added, cdc_files, removed, updated)

    def delete_with_deletion_vectors(self) -> DeletionVectorChanges:
        """A merge whose every clause deletes matched rows, with deletion vectors and no Change Data Feed: no row
        is written, so findTouchedFiles and the deleted rows' indexes come from one Spark job. (Delta runs three
        over the same matches: findTouchedFiles, a writeAllChanges that writes nothing, and writeDVs.)"""
        ctx = self.ctx
        start = time.monotonic()
        if not ctx.candidate_files:
            self.find_touched_files()
            return DeletionVectorChanges([], [], [], [])
        obs = Observation("numSourceRows")
        source = source_with_count(ctx, obs)
        rows, touched, matches = self._matches_per_target_row(source, row_indexes=True)
        with static_plan(ctx.spark, when=self._matches_in_one_job()):
            per_file = (
                rows.groupBy(delta.FILE_NAME_COL)
                .agg(
                    F.collect_list(F.when(touched, F.col(delta.ROW_INDEX_COL))).alias(_DELETED_ROWS),
                    F.sum(F.when(touched, matches).otherwise(0)).alias(_DELETED_PAIRS),
                    F.count_if(matches > 1).alias("multiple_match_rows"),
                    F.sum(F.when(matches > 1, matches).otherwise(0)).alias("multiple_match_sum"),
                )
                .collect()
            )
        ctx.metrics["numSourceRows"] = observed_source_rows(ctx, obs)
        self._check_multiple_matches(
            sum(int(r["multiple_match_rows"] or 0) for r in per_file),
            sum(int(r["multiple_match_sum"] or 0) for r in per_file),
        )
        deleted = {r[delta.FILE_NAME_COL]: BitMap64(r[_DELETED_ROWS]) for r in per_file if r[_DELETED_ROWS]}
        ctx.touched_files = [f for f in ctx.candidate_files if f.path in deleted]
        ctx.metrics["scanTimeMs"] = int((time.monotonic() - start) * 1000)
        if not ctx.touched_files:
            return DeletionVectorChanges([], [], [], [])
        write_start = time.monotonic()
        removed, updated = mark_rows_deleted(ctx.snapshot, ctx.touched_files, deleted, prefix=ctx.write_id)
        pairs = sum(int(r[_DELETED_PAIRS] or 0) for r in per_file)
        # The writeAllChanges Delta runs here reads every source row: the second scan and the first are one.
        record_write_metrics(ctx, {MATCHED_DELETE: pairs}, [], ctx.metrics["numSourceRows"])
        _record_deletion_vector_metrics(ctx.metrics, removed, updated)
        ctx.metrics["rewriteTimeMs"] = int((time.monotonic() - write_start) * 1000)
        return DeletionVectorChanges([], [], removed, updated)


def _observed_rows(second_scan: Observation) -> int:
    observed = second_scan.get
    return int(observed.get("rows", 0) or 0) if observed else 0


def _record_deletion_vector_metrics(
    m: dict[str, int], removed: list[AddFile], updated: list[tuple[AddFile, AddFile]]
) -> None:
    """Delta's counts for a merge with deletion vectors (as Delta on Spark reports them): no row is copied;
    every new vector is added, every old vector of a touched file removed, and a new vector that replaces an
    old one is also counted as updated."""
    m["numTargetRowsCopied"] = 0
    m["numTargetDeletionVectorsAdded"] = len(updated)
    m["numTargetDeletionVectorsUpdated"] = sum(1 for old, _ in updated if old.deletion_vector is not None)
    m["numTargetDeletionVectorsRemoved"] = sum(
        1 for f in [*removed, *(old for old, _ in updated)] if f.deletion_vector is not None
    )
