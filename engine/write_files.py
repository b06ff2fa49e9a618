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
from engine.join_keys import qualified_column
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
    action,
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
    projected, preimages, codes = project_output(ctx, joined, dedup_columns, probes)
    obs = Observation("writeAllChanges")
    observed = observe(
        projected,
        obs,
        *action_counts(codes),
        *probe_metrics,
    )
    added, cdc_files = write_output(ctx, observed, preimages, dedup_columns, write_id=write_id)
    return added, cdc_files, obs


def project_output(
    ctx: MergeContext,
    joined: DataFrame,
    dedup_columns: Sequence[str],
    extra: Sequence[Column],
    target_columns: frozenset[str] | None = None,
) -> tuple[DataFrame, list[str], list[str]]:
    """The output rows of MergeOutputGeneration (with CDF, each with its target row as it was), the preimage
    columns, and the action codes some clause can yield. ``target_columns``: the only table columns ``joined``
    holds; a copied or deleted row carries NULL in the others (a write that keeps no such row)."""
    spec = ctx.spec
    cdc = ctx.cdc_enabled
    clauses = [*ctx.resolved.matched, *ctx.resolved.not_matched, *ctx.resolved.not_matched_by_source]
    joined, lookups = generate_precomputed_conditions_and_df(joined, clauses)
    existing = {
        f.name.lower() for f in ctx.snapshot.spark_schema.fields if target_columns is None or f.name in target_columns
    }
    converted = {k: v for k, v in ctx.resolved.target_values.items() if k in existing}
    tcols = target_write_cols(ctx.resolved.output_fields, spec.target_alias, existing, converted)
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
    # The target row's stable row id and commit version ride along for the materialized columns.
    tracking = (
        [
            F.col(qualified_column(spec.target_alias, c)).alias(c)
            for c in (delta.ROW_ID_COL, delta.ROW_COMMIT_VERSION_COL)
        ]
        if ctx.row_tracking_columns is not None
        else []
    )
    projected = joined.select(
        *output_cols,
        *[c.alias(n) for c, n in zip(tcols, preimages, strict=False)],
        *dedup_columns,
        *extra,
        *tracking,
    )
    projected = repartition_for_write(ctx, projected)
    # Only the actions some clause can take are counted: each count is an aggregate on every output row.
    codes = [COPY]
    for clauses_, update, delete in (
        (ctx.resolved.matched, MATCHED_UPDATE, MATCHED_DELETE),
        (ctx.resolved.not_matched_by_source, NOT_MATCHED_BY_SOURCE_UPDATE, NOT_MATCHED_BY_SOURCE_DELETE),
    ):
        codes += [
            c
            for c, present in (
                (update, any(not r.is_delete for r in clauses_)),
                (delete, any(r.is_delete for r in clauses_)),
            )
            if present
        ]
    if ctx.resolved.not_matched:
        codes.append(INSERT)
    return projected, preimages, codes


def write_output(
    ctx: MergeContext,
    rows: DataFrame,
    preimages: Sequence[str],
    dedup_columns: Sequence[str],
    *,
    write_id: str,
    copies: bool = True,
) -> WrittenFiles:
    """The output rows written, less the dropped ones; with Change Data Feed, with their change rows. Without
    ``copies`` the target rows no clause changed are left out of the data (they stay live in their files)."""
    rows, written_names = with_materialized_row_tracking(ctx, rows)
    tracked = len(written_names) > len(ctx.output_names)
    if not ctx.cdc_enabled:
        kept = ~F.col(ROW_DROPPED_COL)
        if not copies:
            kept = kept & (F.col(ACTION_COL) != action(COPY))
        output = rows.where(kept).select(*[quote_identifier(n) for n in written_names])
        added = delta.write_data_files(
            ctx.spark,
            output,
            ctx.snapshot,
            write_id=write_id,
            schema=output_schema(ctx),
            materialized_row_tracking=tracked,
        )
        return added, []
    names = [*written_names, ROW_DROPPED_COL, ACTION_COL, CDC_TYPE_COL]
    no_preimage = [F.lit(None).cast("long")] * (len(written_names) - len(ctx.output_names))
    changes = (
        generate_cdc_and_output_rows(
            rows,
            [F.col(quote_identifier(n)) for n in names],
            written_names,
            [*(F.col(n) for n in preimages), *no_preimage],
            dedup_columns,
        )
        .where(~F.col(ROW_DROPPED_COL) & (F.lit(copies) | ~_copied_data_row()))
        .drop(ROW_DROPPED_COL, ACTION_COL)
    )
    # Data and change rows come out of one pass and go out in one write (Delta's __is_cdc partition).
    return delta.write_data_and_cdc_files(
        ctx.spark,
        changes,
        ctx.snapshot,
        write_id=write_id,
        schema=output_schema(ctx),
        materialized_row_tracking=tracked,
    )


def with_materialized_row_tracking(ctx: MergeContext, rows: DataFrame) -> tuple[DataFrame, list[str]]:
    """Delta's MergeOutputGeneration with row tracking preserved: an updated row keeps its stable row id and
    gets the new commit version (NULL: the new file's ``defaultRowCommitVersion``), a copied row keeps both,
    an inserted row gets fresh ones (both NULL). Answers the rows with the materialized columns and the
    names of the columns to write."""
    if ctx.row_tracking_columns is None:
        return rows, list(ctx.output_names)
    row_id_name, version_name = ctx.row_tracking_columns
    keeps_row_id = F.col(ACTION_COL).isin([action(c) for c in (COPY, MATCHED_UPDATE, NOT_MATCHED_BY_SOURCE_UPDATE)])
    copied = F.col(ACTION_COL) == action(COPY)
    rows = rows.select(
        "*",
        F.when(keeps_row_id, F.col(delta.ROW_ID_COL)).otherwise(F.lit(None).cast("long")).alias(row_id_name),
        F.when(copied, F.col(delta.ROW_COMMIT_VERSION_COL)).otherwise(F.lit(None).cast("long")).alias(version_name),
    )
    return rows, [*ctx.output_names, row_id_name, version_name]


def _copied_data_row() -> Column:
    """A data row (not a change row) of a target row that no clause changed."""
    return F.col(CDC_TYPE_COL).isNull() & (F.col(ACTION_COL) == action(COPY))


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
