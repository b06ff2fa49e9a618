"""Delta's InsertOnlyMergeExecutor: a merge with only NOT MATCHED clauses appends the source rows no target row
matches (a left-anti join, or the key bitmap for a small source); no file is rewritten."""

from __future__ import annotations

import time

from pyspark.sql import functions as F

from engine import delta
from engine.context import MergeContext, observe
from engine.delta import AddFile
from engine.joins import source_fits_broadcast, unmatched_source_rows
from engine.key_bitmap import KeyBitmap
from engine.output import (
    ACTION_COL,
    DROP_SOURCE,
    INSERT,
    ROW_DROPPED_COL,
    action_counts,
    generate_inserts_only_output_cols,
    generate_precomputed_conditions_and_df,
)
from engine.spark import Observation
from engine.write_files import observed_counts, output_schema, repartition_for_write


class InsertOnlyMergeExecutor:
    def __init__(self, ctx: MergeContext) -> None:
        self.ctx = ctx

    def write_only_inserts(
        self, *, filter_matched_rows: bool = True, source_rows_metric: str = "numSourceRows"
    ) -> list[AddFile]:
        """``filter_matched_rows`` is off when findTouchedFiles already showed that no source row matches."""
        ctx = self.ctx
        spec = ctx.spec
        start = time.monotonic()
        obs_source = Observation(source_rows_metric)
        source = observe(ctx.source, obs_source, F.count(F.lit(1)).alias("n")).alias(spec.source_alias)
        if ctx.candidate_files and filter_matched_rows:
            target = ctx.target_df(ctx.candidate_files, file_columns=False)
            if source_fits_broadcast(ctx, ctx.source_rows_estimate, ctx.candidate_files):
                new_rows = unmatched_source_rows(
                    ctx,
                    source,
                    ctx.candidate_files,
                    KeyBitmap.for_merge(ctx, ctx.source_rows_estimate),
                    probe=ctx.source,
                )
            else:
                new_rows = source.join(target.alias(spec.target_alias), ctx.resolved.on, "left_anti")
        else:
            new_rows = source
        new_rows, lookups = generate_precomputed_conditions_and_df(new_rows, ctx.resolved.not_matched)
        output_cols = generate_inserts_only_output_cols(
            ctx.output_names, ctx.resolved.output_fields, ctx.resolved.not_matched, lookups
        )
        obs = Observation("writeOnlyInserts")
        projected = repartition_for_write(ctx, new_rows.select(*output_cols))
        projected = observe(projected, obs, *action_counts([INSERT, DROP_SOURCE]))
        output = projected.where(~F.col(ROW_DROPPED_COL)).drop(ROW_DROPPED_COL, ACTION_COL)
        added = delta.write_data_files(
            ctx.spark, output, ctx.snapshot, write_id=ctx.write_id, schema=output_schema(ctx)
        )
        ctx.metrics["numTargetRowsInserted"] = observed_counts(obs).get(INSERT, 0)
        ctx.metrics[source_rows_metric] = int(obs_source.get.get("n", 0) or 0)
        ctx.metrics["rewriteTimeMs"] = int((time.monotonic() - start) * 1000)
        return added
