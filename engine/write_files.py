"""writeFiles for the merge: MergeOutputGeneration's rows written as data (and change) files, with the
actions' counts observed as the rows stream past, and Delta's write metrics recorded from them."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    StructType,
)

from engine import delta
from engine.context import MergeContext, observe
from engine.delta import AddCDCFile, AddFile
from engine.errors import MergeExecutionError
from engine.expressions import quote_identifier
from engine.output import (
    ACTION_COL,
    CDC_TYPE_COL,
    COPY,
    INSERT,
    MATCHED_DELETE,
    MATCHED_UPDATE,
    NOT_MATCHED_BY_SOURCE_DELETE,
    NOT_MATCHED_BY_SOURCE_UPDATE,
    ROW_DROPPED_COL,
    action_counts,
    generate_cdc_and_output_rows,
    generate_precomputed_conditions_and_df,
    generate_write_all_changes_output_cols,
    preimage_names,
    target_write_cols,
)
from engine.spark import Observation

WrittenFiles = tuple[list[AddFile], list[AddCDCFile]]
"""The data files and the change files a write added."""


def write_changes(
    ctx: MergeContext,
    joined: DataFrame,
    dedup_columns: Sequence[str],
    *,
    write_id: str,
    probes: Sequence[Column] = (),
    probe_metrics: Sequence[Column] = (),
) -> tuple[list[AddFile], list[AddCDCFile], Observation]:
    """MergeOutputGeneration over the joined rows, written; ``probes`` are columns computed on the joined
    rows only for ``probe_metrics`` to observe."""
    spec = ctx.spec
    cdc = ctx.cdc_enabled
    clauses = [*ctx.resolved.matched, *ctx.resolved.not_matched, *ctx.resolved.not_matched_by_source]
    joined, lookups = generate_precomputed_conditions_and_df(joined, clauses)
    existing = {f.name.lower() for f in ctx.snapshot.spark_schema.fields}
    tcols = target_write_cols(ctx.resolved.output_fields, spec.target_alias, existing, ctx.resolved.target_values)
    output_cols = generate_write_all_changes_output_cols(
        tcols,
        ctx.output_names,
        ctx.resolved.matched,
        ctx.resolved.not_matched,
        ctx.resolved.not_matched_by_source,
        lookups,
        cdc=cdc,
    )
    preimages = preimage_names(len(tcols)) if cdc else []
    projected = joined.select(
        *output_cols,
        *[c.alias(n) for c, n in zip(tcols, preimages, strict=False)],
        *dedup_columns,
        *probes,
    )
    projected = repartition_for_write(ctx, projected)
    obs = Observation("writeAllChanges")
    # Only the actions some clause can take are counted: each count is an aggregate on every output row.
    codes = [COPY]
    for clauses, update, delete in (
        (ctx.resolved.matched, MATCHED_UPDATE, MATCHED_DELETE),
        (ctx.resolved.not_matched_by_source, NOT_MATCHED_BY_SOURCE_UPDATE, NOT_MATCHED_BY_SOURCE_DELETE),
    ):
        codes += [
            c
            for c, present in (
                (update, any(not r.is_delete for r in clauses)),
                (delete, any(r.is_delete for r in clauses)),
            )
            if present
        ]
    if ctx.resolved.not_matched:
        codes.append(INSERT)
    observed = observe(
        projected,
        obs,
        *action_counts(codes),
        *probe_metrics,
    )
    added, cdc_files = write_output(ctx, observed, preimages, dedup_columns, write_id=write_id)
    return added, cdc_files, obs


def write_output(
    ctx: MergeContext, rows: DataFrame, preimages: Sequence[str], dedup_columns: Sequence[str], *, write_id: str
) -> WrittenFiles:
    """The output rows written, less the dropped ones; with Change Data Feed, with their change rows."""
    if not ctx.cdc_enabled:
        output = rows.where(~F.col(ROW_DROPPED_COL)).select(*[quote_identifier(n) for n in ctx.output_names])
        return delta.write_data_files(ctx.spark, output, ctx.snapshot, write_id=write_id, schema=output_schema(ctx)), []
    names = [*ctx.output_names, ROW_DROPPED_COL, ACTION_COL, CDC_TYPE_COL]
    changes = (
        generate_cdc_and_output_rows(
            rows,
            [F.col(quote_identifier(n)) for n in names],
            ctx.output_names,
            [F.col(n) for n in preimages],
            dedup_columns,
        )
        .where(~F.col(ROW_DROPPED_COL))
        .drop(ROW_DROPPED_COL, ACTION_COL)
    )
    # Data and change rows come out of one pass and go out in one write (Delta's __is_cdc partition).
    return delta.write_data_and_cdc_files(
        ctx.spark, changes, ctx.snapshot, write_id=write_id, schema=output_schema(ctx)
    )


def record_write_metrics(
    ctx: MergeContext, counts: dict[str, int], cdc_files: list[AddCDCFile], second_scan_rows: int
) -> None:
    m = ctx.metrics
    m["numTargetRowsMatchedUpdated"] = counts.get(MATCHED_UPDATE, 0)
    m["numTargetRowsNotMatchedBySourceUpdated"] = counts.get(NOT_MATCHED_BY_SOURCE_UPDATE, 0)
    m["numTargetRowsMatchedDeleted"] = counts.get(MATCHED_DELETE, 0) - ctx.multiple_match_delete_overcount
    m["numTargetRowsNotMatchedBySourceDeleted"] = counts.get(NOT_MATCHED_BY_SOURCE_DELETE, 0)
    m["numTargetRowsInserted"] = counts.get(INSERT, 0)
    m["numTargetRowsCopied"] = counts.get(COPY, 0)
    m["numSourceRowsInSecondScan"] = second_scan_rows
    m["numTargetChangeFilesAdded"] = len(cdc_files)
    m["numTargetChangeFileBytes"] = sum(f.size for f in cdc_files)


def observed_counts(obs: Observation, *, ignore: Sequence[str] = ()) -> dict[str, int]:
    """The counts an observation collected (less the ``ignore``d metrics). The merge decides whether to commit
    from them, so a missing observation is an error, never zero rows changed."""
    values = obs.get
    if not values:
        raise MergeExecutionError("Spark did not report the merge's row counts; nothing was committed.")
    return {k: int(v or 0) for k, v in values.items() if k not in ignore}


def repartition_for_write(ctx: MergeContext, df: DataFrame) -> DataFrame:
    """Delta's repartitionBeforeWrite: one task per partition value, so each touched partition gets one file set.
    It is applied below the metrics observation: an adaptive plan may drop a stage that follows an observation
    when that stage turns out empty, and the observed counts with it."""
    partition_columns = list(ctx.snapshot.partition_columns)
    if not partition_columns:
        return df
    return df.repartition(*[F.col(quote_identifier(c)) for c in partition_columns])


def output_schema(ctx: MergeContext) -> StructType | None:
    """The table schema after schema evolution, or None when the merge keeps the table's."""
    return StructType(ctx.resolved.output_fields) if ctx.resolved.schema_changed else None
