"""Delta's ClassicMergeExecutor over Spark Connect.

ClassicMergeExecutor: ``find_touched_files`` joins the data-skipped target with the source once, collecting
the touched files and the per-target-row match counts (the multiple-match check) in one Spark job: by target
row as Delta does, or, when ON pins each target row to one source key, with the source grouped by key and
broadcast so that no target row is shuffled; ``write_all_changes`` rewrites only those files, joined with the
source, through MergeOutputGeneration. When the key statistics say every candidate file will be touched, the
single pass (single_pass.py) folds the first pass into the write.
The merge-on-read variant (deletion vectors) is in merge_on_read.py, InsertOnlyMergeExecutor in insert_only.py.

Around them: the join plans and the unmatched source rows in joins.py, the key bitmap in key_bitmap.py, ON's
key equalities in join_keys.py, the written files and their metrics in write_files.py, and what the phases
share in context.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, GroupedData
from pyspark.sql import functions as F

from engine import delta, single_pass
from engine.context import MergeContext, observe, observed_source_rows, source_with_count
from engine.delta import AddFile
from engine.delta.internal_columns import internal_column
from engine.errors import MergeExecutionError, MultipleMatchError
from engine.expressions import quote_identifier, sql
from engine.join_keys import key_condition, keyed_join, qualified_column
from engine.joins import (
    broadcast_full_outer,
    source_fits_broadcast,
    unmatched_source_rows,
    unmatched_source_rows_by_matched_keys,
)
from engine.key_bitmap import KeyBitmap
from engine.merge_condition import KeyedOn
from engine.output import (
    SOURCE_ROW_INDEX_COL,
    SOURCE_ROW_PRESENT_COL,
    TARGET_ROW_INDEX_COL,
    TARGET_ROW_PRESENT_COL,
)
from engine.result import Phase
from engine.single_pass import touches_every_match
from engine.spark import Observation, static_plan
from engine.spec import DeleteAction, MergeSpec
from engine.write_files import (
    WrittenFiles,
    observed_counts,
    record_write_metrics,
    write_changes,
)

MULTIPLE_MATCH_EXAMPLES = 5


ONE_TASK_GROUPING_ROWS = 1_000_000
"""Sources known to have at most this many rows are grouped by key in one task."""


SOURCE_KEY_ROWS_COL = internal_column("source_rows_with_key")


def _observe_touched(rows: DataFrame, touched: Column, matches: Column) -> dict[str, Any]:
    """Touched files and multiple-match counts, observed as ``rows`` stream past in one Spark job."""
    obs = Observation("findTouchedFiles")
    observe(
        rows,
        obs,
        F.collect_set(F.when(touched, F.col(delta.FILE_NAME_COL))).alias("touched"),
        F.count_if(matches > 1).alias("multiple_match_rows"),
        F.sum(F.when(matches > 1, matches).otherwise(0)).alias("multiple_match_sum"),
    ).write.format("noop").mode("overwrite").save()
    found = obs.get
    if not found:
        raise MergeExecutionError("Spark did not report which files the merge touches; nothing was committed.")
    return found


def is_only_one_unconditional_delete(spec: MergeSpec) -> bool:
    only = spec.matched[0] if len(spec.matched) == 1 else None
    return only is not None and isinstance(only.action, DeleteAction) and only.condition is None


class ClassicMergeExecutor:
    def __init__(self, ctx: MergeContext) -> None:
        self.ctx = ctx

    def find_touched_files(self) -> list[AddFile]:
        """Files with a match that some clause may act on; fails on ambiguous multiple matches."""
        ctx = self.ctx
        spec = ctx.spec
        start = time.monotonic()
        if not ctx.candidate_files:
            # Known without a Spark job for inline rows and a Delta source (exact: every read gives those rows).
            known = ctx.source_rows_estimate
            ctx.metrics["numSourceRows"] = known if known is not None else ctx.source.count()
            ctx.metrics["scanTimeMs"] = int((time.monotonic() - start) * 1000)
            return []
        obs = Observation("numSourceRows")
        source = source_with_count(ctx, obs)
        with static_plan(ctx.spark, when=self._matches_in_one_job()):
            found = _observe_touched(*self._matches_per_target_row(source))
        ctx.metrics["numSourceRows"] = observed_source_rows(ctx, obs)
        self._check_multiple_matches(
            int(found.get("multiple_match_rows") or 0), int(found.get("multiple_match_sum") or 0)
        )
        if spec.not_matched_by_source:
            touched_names = {f.path for f in ctx.candidate_files}
        else:
            touched_names = set(found.get("touched") or [])
        ctx.touched_files = [f for f in ctx.candidate_files if f.path in touched_names]
        ctx.metrics["scanTimeMs"] = int((time.monotonic() - start) * 1000)
        return ctx.touched_files

    def _matches(self, source: DataFrame | None = None) -> DataFrame:
        """Every (source row, candidate target row) pair ON matches."""
        ctx = self.ctx
        spec = ctx.spec
        source = ctx.source if source is None else source
        target = ctx.target_df(ctx.candidate_files)
        return source.alias(spec.source_alias).join(target.alias(spec.target_alias), ctx.resolved.on, "inner")

    def _matches_per_target_row(
        self, source: DataFrame, *, row_indexes: bool = False
    ) -> tuple[DataFrame, Column, Column]:
        """The candidate target rows some source row matches, each once with its file's log path (and with
        ``row_indexes`` its row index): the rows, whether a clause acts on the row's match (it touches its file),
        and its number of matches."""
        keyed = keyed_join(self.ctx) if touches_every_match(self.ctx.spec) else None
        if keyed is None:
            return self._per_target_row(source)
        return self._per_source_key(source, keyed, row_indexes=row_indexes)

    def _matches_in_one_job(self) -> bool:
        """Whether the query over ``_matches_per_target_row`` shuffles nothing but its answers per file: the
        source grouped by key in one task and broadcast, the target's rows streamed past it. It is then planned
        statically, one Spark job. 1% of 5,000,000 rows in 20 files deleted by key, deletion vectors, warm server,
        alternate merges: median 0.66 s against 0.73 s adaptive."""
        ctx = self.ctx
        estimate = ctx.source_rows_estimate
        return (
            estimate is not None
            and estimate <= ONE_TASK_GROUPING_ROWS
            and touches_every_match(ctx.spec)
            and keyed_join(ctx) is not None
        )

    def _per_target_row(self, source: DataFrame) -> tuple[DataFrame, Column, Column]:
        """Delta's findTouchedFiles: the matches counted per target row (file, row index)."""
        ctx = self.ctx
        spec = ctx.spec
        joined = self._matches(source.withColumn(SOURCE_ROW_PRESENT_COL, F.lit(True)))
        if spec.is_matched_only:
            conditions = [c.condition for c in ctx.resolved.matched]
            matched_predicate: Column = F.lit(True)
            if all(c is not None for c in conditions):
                matched_predicate = conditions[0]  # type: ignore[assignment]
                for c in conditions[1:]:
                    matched_predicate = matched_predicate | c  # type: ignore[operator]
            touch = F.when(matched_predicate, 1).otherwise(0)
        else:
            touch = F.lit(1)
        per_row = joined.groupBy(delta.FILE_NAME_COL, delta.ROW_INDEX_COL).agg(
            F.count(F.lit(1)).alias("matches"), F.max(touch).alias("touch")
        )
        # One shuffle: the per-file answers are gathered as the per-row counts stream past, not aggregated again.
        return per_row, F.col("touch") == 1, F.col("matches")

    def _per_source_key(
        self, source: DataFrame, keyed: KeyedOn, *, row_indexes: bool = False
    ) -> tuple[DataFrame, Column, Column]:
        """findTouchedFiles without shuffling the target: the source is grouped by its join keys (rows that
        no target row can match left out) and broadcast; each target row meets at most one group, whose row
        count is that row's number of matches. The matched keys are kept for writeAllChanges when it will need
        the unmatched source rows."""
        ctx = self.ctx
        spec = ctx.spec
        s, t = spec.source_alias, spec.target_alias
        groups = self._grouped_by_key(source, keyed).agg(F.count(F.lit(1)).alias(SOURCE_KEY_ROWS_COL))
        condition = key_condition(
            keyed,
            [qualified_column(t, k.target_column) for k in keyed.keys],
            [qualified_column(s, k.source_column) for k in keyed.keys],
        )
        for predicate in keyed.target_only:
            condition = condition & F.expr(sql(predicate))
        target = ctx.target_df(ctx.candidate_files).alias(t)
        matched = target.join(F.broadcast(groups.alias(s)), condition, "inner").select(
            F.col(qualified_column(t, delta.FILE_NAME_COL)).alias(delta.FILE_NAME_COL),
            *([F.col(qualified_column(t, delta.ROW_INDEX_COL)).alias(delta.ROW_INDEX_COL)] if row_indexes else []),
            F.col(SOURCE_KEY_ROWS_COL),
            *[
                F.col(qualified_column(s, k.source_column)).alias(internal_column(f"key_{i}"))
                for i, k in enumerate(keyed.keys)
            ],
        )
        if spec.not_matched and self._may_broadcast_source():
            matched = matched.persist()
            ctx.matched_source_keys = (matched, keyed)
        return matched, F.lit(True), F.col(SOURCE_KEY_ROWS_COL)

    def _grouped_by_key(self, source: DataFrame, keyed: KeyedOn) -> GroupedData:
        """The source rows some target row may match (those failing a source-only conjunct of ON or holding a
        NULL ``=`` key left out), grouped by their join keys."""
        ctx = self.ctx
        keyable = source.alias(ctx.spec.source_alias)
        for predicate in keyed.source_only:
            keyable = keyable.where(F.expr(sql(predicate)))
        for key in keyed.keys:
            if not key.null_safe:
                keyable = keyable.where(F.col(quote_identifier(key.source_column)).isNotNull())
        key_columns = list({k.source_column.lower(): k.source_column for k in keyed.keys}.values())
        estimate = ctx.source_rows_estimate
        if estimate is not None and estimate <= ONE_TASK_GROUPING_ROWS:
            # One input partition needs no shuffle before the aggregation: a stage and a Spark job fewer.
            keyable = keyable.coalesce(1)
        return keyable.groupBy(*[F.col(quote_identifier(c)) for c in key_columns])

    def _may_broadcast_source(self) -> bool:
        """Whether writeAllChanges may take the broadcast plan, as far as is known before the source is read."""
        ctx = self.ctx
        estimate = ctx.source_rows_estimate
        return estimate is None or source_fits_broadcast(ctx, estimate, ctx.candidate_files)

    def _check_multiple_matches(self, rows: int, matches: int) -> None:
        """``rows`` target rows with several matches, ``matches`` in all. Only one unconditional delete may
        have them: each extra match deletes the same row again, an overcount Delta subtracts from the metrics."""
        if rows == 0:
            return
        ctx = self.ctx
        if not is_only_one_unconditional_delete(ctx.spec):
            raise MultipleMatchError(self._multiple_match_message(self._matches()))
        ctx.multiple_match_delete_overcount = matches - rows
        ctx.deduplicate_cdf_deletes = ctx.cdc_enabled

    def _multiple_match_message(self, joined: DataFrame) -> str:
        ctx = self.ctx
        base = (
            "Cannot perform Merge as multiple source rows matched and attempted to modify the same target row "
            "in the Delta table in possibly conflicting ways. By SQL semantics of Merge, when multiple source "
            "rows match on the same target row, the result may be ambiguous as it is unclear which source row "
            "should be used to update or delete the matching target row. You can preprocess the source table "
            "to eliminate the possibility of multiple matches."
        )
        exprs = list(ctx.key_exprs)
        if not exprs:
            return base
        key = F.struct(*[F.expr(e).alias(e) for e in exprs])
        examples = (
            joined.groupBy(delta.FILE_NAME_COL, delta.ROW_INDEX_COL)
            .agg(F.count(F.lit(1)).alias("n"), F.first(key).alias("key"))
            .where(F.col("n") > 1)
            # Rendered by Spark (timestamps in the session's UTC): Spark Connect would hand TIMESTAMP values
            # over as naive datetimes in this process's time zone.
            .select(F.to_json("key").alias("key"), "n")
            .limit(MULTIPLE_MATCH_EXAMPLES)
            .collect()
        )
        described = []
        for row in examples:
            key_values = json.loads(row["key"])
            values = ", ".join(f"{name}={json.dumps(key_values.get(name))}" for name in exprs)
            described.append(f"({values}) matched {row['n']} source rows")
        return base + " Duplicate source keys: " + "; ".join(described) + "."

    def _join_for_write(self, source: DataFrame, counted: DataFrame, target: DataFrame) -> DataFrame:
        """The touched target rows with their matching source rows (right outer for matched-only merges), plus
        the unmatched source rows (full outer). When the source fits a broadcast the full outer join is a
        broadcast left outer join of the target, united with the unmatched source rows: the target's rows are
        streamed once instead of shuffled. ``counted`` is ``source`` observed, read where every source row
        streams past once."""
        ctx = self.ctx
        spec = ctx.spec
        s, t, on = spec.source_alias, spec.target_alias, ctx.resolved.on
        if spec.is_matched_only:
            return counted.alias(s).join(target.alias(t), on, "right_outer")
        if not source_fits_broadcast(ctx, ctx.source_rows, ctx.touched_files):
            return counted.alias(s).join(target.alias(t), on, "full_outer")
        return self._broadcast_join_for_write(source, counted, target, keep_unmatched_target=True)

    def _broadcast_join_for_write(
        self,
        source: DataFrame,
        counted: DataFrame,
        target: DataFrame,
        *,
        keep_unmatched_target: bool,
        files: Sequence[AddFile] | None = None,
    ) -> DataFrame:
        """The source broadcast to the streamed target rows, united with the unmatched source rows; the target rows
        no source row matches are kept (left outer) or left out (inner). ``files``: the files ``target`` reads,
        where they are not the touched files."""
        ctx = self.ctx
        bitmap = KeyBitmap.for_merge(ctx, ctx.source_rows)
        if ctx.matched_source_keys is not None:
            matched, keyed = ctx.matched_source_keys
            unmatched = unmatched_source_rows_by_matched_keys(counted, matched, keyed, ctx.spec.source_alias)
        else:
            read = ctx.touched_files if files is None else files
            unmatched = unmatched_source_rows(ctx, counted, read, bitmap, probe=source)
        return broadcast_full_outer(ctx, source, target, unmatched, bitmap, keep_unmatched_target=keep_unmatched_target)

    def find_touched_files_or_write(
        self, on_progress: Callable[[Phase], None]
    ) -> tuple[list[AddFile], WrittenFiles | None]:
        """findTouchedFiles, folded into the write by the single pass where it is taken: the touched files, and
        the added data and change files when the single pass kept its write (else None: writeAllChanges is
        still to run)."""
        ctx = self.ctx
        single_pass_taken = single_pass.takes_single_pass(ctx)
        written = None
        if single_pass_taken:
            # findTouchedFiles folded into the write: the files it touches are known once it is written.
            on_progress("writing")
            written = single_pass.write_in_one_pass(ctx)
        if ctx.touched_files_known:
            touched = ctx.touched_files
        else:
            if single_pass_taken:
                # The single pass was given up before it knew the touched files (a multiple match).
                on_progress("finding_touched_files")
            touched = self.find_touched_files()
            on_progress("writing")
        return touched, written

    def _sides_for_write(
        self,
        *,
        file_columns: bool,
        files: Sequence[AddFile] | None = None,
        columns: frozenset[str] | None = None,
        prefilter: Callable[[DataFrame], DataFrame] | None = None,
    ) -> tuple[DataFrame, DataFrame, list[str]]:
        """The touched files (or ``files``) and the source for writeAllChanges' join, each marked present, with the
        row indexes Delta's DeduplicateCDFDeletes keeps one delete per target row by (even / odd: never equal).
        ``columns``: the only table columns to read (None: all); ``prefilter``: drops target rows (see
        ``MergeContext.target_df``)."""
        ctx = self.ctx
        target = ctx.target_df(
            ctx.touched_files if files is None else files,
            file_columns=file_columns,
            row_tracking=ctx.row_tracking_columns is not None,
            prefilter=prefilter,
        )
        if columns is not None:
            table = [f.name for f in ctx.snapshot.spark_schema.fields]
            extra = [delta.FILE_NAME_COL, delta.ROW_INDEX_COL] if file_columns else []
            if ctx.row_tracking_columns is not None:
                extra += [delta.ROW_ID_COL, delta.ROW_COMMIT_VERSION_COL]
            target = target.select(*[quote_identifier(n) for n in table if n in columns], *extra)
        target = target.withColumn(TARGET_ROW_PRESENT_COL, F.lit(True))
        source = ctx.source.withColumn(SOURCE_ROW_PRESENT_COL, F.lit(True))
        dedup_columns: list[str] = []
        if ctx.cdc_enabled and ctx.deduplicate_cdf_deletes:
            target = target.withColumn(TARGET_ROW_INDEX_COL, F.monotonically_increasing_id() * 2)
            dedup_columns.append(TARGET_ROW_INDEX_COL)
            if ctx.spec.not_matched:
                source = source.withColumn(SOURCE_ROW_INDEX_COL, F.monotonically_increasing_id() * 2 + 1)
                dedup_columns.append(SOURCE_ROW_INDEX_COL)
        return target, source, dedup_columns

    def write_all_changes(self) -> WrittenFiles:
        """Rewrite the touched files joined with the source; answers the added data and change files."""
        ctx = self.ctx
        start = time.monotonic()
        target, source, dedup_columns = self._sides_for_write(file_columns=False)
        # numSourceRowsInSecondScan: every source row the write reads, matched or not (Delta counts them on
        # the join's source side).
        second_scan = Observation("secondScan")
        counted = observe(source, second_scan, F.count(F.lit(1)).alias("rows"))
        joined = self._join_for_write(source, counted, target)
        added, cdc_files, observed = write_changes(ctx, joined, dedup_columns, write_id=ctx.write_id)
        record_write_metrics(ctx, observed_counts(observed), cdc_files, int(second_scan.get.get("rows", 0) or 0))
        ctx.metrics["rewriteTimeMs"] = int((time.monotonic() - start) * 1000)
        return added, cdc_files
