"""writeFiles for the merge: MergeOutputGeneration's rows written as data (and change) files, with the
actions' counts observed as the rows stream past, and Delta's write metrics recorded from them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyroaring import BitMap64
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
    projected, preimages, codes = _project(ctx, joined, dedup_columns, probes)
    obs = Observation("writeAllChanges")
    observed = observe(
        projected,
        obs,
        *action_counts(codes),
        *probe_metrics,
    )
    added, cdc_files = write_output(ctx, observed, preimages, dedup_columns, write_id=write_id)
    return added, cdc_files, obs


def _project(
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


_ROW_INDEXES = "_row_indexes_"
_REPEATED_MATCHES = "_repeated_matches_"

ONE_FILE_ROWS = 100_000
"""A deletion-vector merge that writes at most this many rows (updates, inserts, change rows) writes them as one
file: else each touched file's few changed rows become a file of their own, and every later merge has to scan and
touch that trail of tiny files (Delta's adaptive plan coalesces such a small write to one task, too)."""

MODIFYING_ACTIONS = (MATCHED_UPDATE, MATCHED_DELETE, NOT_MATCHED_BY_SOURCE_UPDATE, NOT_MATCHED_BY_SOURCE_DELETE)
"""The actions whose target row leaves its file: marked deleted in the file's deletion vector."""


@dataclass(frozen=True)
class DeletionVectorOutput:
    """MergeOutputGeneration's rows for a merge-on-read write, cached (release with ``rows.unpersist()``), and
    what they hold per file: the write and the deletion vectors come from the same rows."""

    rows: DataFrame
    preimages: list[str]
    counts: dict[str, int]
    """The output rows of each action."""
    deleted: dict[str, BitMap64]
    """By file, the row indexes of the target rows updated or deleted."""
    target_files: frozenset[str]
    """The files with a target row among the output rows (matched, whether or not a clause changed it)."""
    repeated_matches: int
    """Matches of a target row beyond its first, over all rows (counted only when asked)."""


def project_changes_with_deletion_vectors(
    ctx: MergeContext,
    joined: DataFrame,
    dedup_columns: Sequence[str],
    *,
    count_repeated_matches: bool = False,
    target_columns: frozenset[str] | None = None,
) -> DeletionVectorOutput:
    """Merge-on-read writeAllChanges up to its write: ``joined`` carries each target row's ``_file_name_`` and
    ``_row_index_``. With ``count_repeated_matches`` the same aggregation also counts the target rows met more
    than once, so a join that holds every matched row checks for several matches before anything is written.
    ``target_columns``: the only table columns ``joined`` holds (without Change Data Feed)."""
    assert target_columns is None or not ctx.cdc_enabled, "change rows carry the whole target row"
    file_columns = [F.col(delta.FILE_NAME_COL), F.col(delta.ROW_INDEX_COL)]
    projected, preimages, codes = _project(ctx, joined, dedup_columns, file_columns, target_columns)
    projected = projected.persist()
    row_index = F.col(delta.ROW_INDEX_COL)
    repeated = (
        [(F.count(row_index) - F.size(F.array_distinct(F.collect_list(row_index)))).alias(_REPEATED_MATCHES)]
        if count_repeated_matches
        else []
    )
    try:
        modifying = F.col(ACTION_COL).isin([action(c) for c in MODIFYING_ACTIONS])
        summary = (
            projected.groupBy(delta.FILE_NAME_COL)
            .agg(*action_counts(codes), F.collect_list(F.when(modifying, row_index)).alias(_ROW_INDEXES), *repeated)
            .collect()
        )
    except BaseException:
        projected.unpersist()
        raise
    counts = dict.fromkeys(codes, 0)
    deleted: dict[str, BitMap64] = {}
    for row in summary:
        for code in codes:
            counts[code] += int(row[code] or 0)
        if row[_ROW_INDEXES]:
            deleted.setdefault(row[delta.FILE_NAME_COL], BitMap64()).update(row[_ROW_INDEXES])
    return DeletionVectorOutput(
        rows=projected,
        preimages=preimages,
        counts=counts,
        deleted=deleted,
        target_files=frozenset(r[delta.FILE_NAME_COL] for r in summary if r[delta.FILE_NAME_COL] is not None),
        repeated_matches=sum(int(r[_REPEATED_MATCHES] or 0) for r in summary) if count_repeated_matches else 0,
    )


def write_changes_with_deletion_vectors(
    ctx: MergeContext, output: DeletionVectorOutput, dedup_columns: Sequence[str], *, write_id: str
) -> WrittenFiles:
    """Only updated and inserted rows (and change rows) are written; copied rows stay where they are."""
    written_actions = (MATCHED_UPDATE, NOT_MATCHED_BY_SOURCE_UPDATE, INSERT)
    if not (ctx.cdc_enabled or any(output.counts.get(c, 0) for c in written_actions)):
        return [], []
    changed = sum(n for code, n in output.counts.items() if code != COPY)
    # The output is cached: one task reads it back without running the join again.
    rows = output.rows.coalesce(1) if changed <= ONE_FILE_ROWS else output.rows
    return write_output(ctx, rows, output.preimages, dedup_columns, write_id=write_id, copies=False)


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
