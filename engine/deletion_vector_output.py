"""Merge-on-read's output rows: MergeOutputGeneration's rows for a write with deletion vectors, and what they hold
per file (the row indexes of the target rows they replace), so that the write and the deletion vectors come from
the same rows. Gathered by an aggregation before the write, or observed as the write streams them past."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyroaring import BitMap64
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from engine import delta
from engine.context import MergeContext, observe
from engine.delta import AddCDCFile, AddFile
from engine.delta.internal_columns import internal_column
from engine.output import (
    ACTION_COL,
    COPY,
    INSERT,
    MATCHED_DELETE,
    MATCHED_UPDATE,
    NOT_MATCHED_BY_SOURCE_DELETE,
    NOT_MATCHED_BY_SOURCE_UPDATE,
    action,
    action_counts,
)
from engine.spark import Observation
from engine.write_files import WrittenFiles, project_output, write_output

_ROW_INDEXES = internal_column("row_indexes")
_REPEATED_MATCHES = internal_column("repeated_matches")

ONE_FILE_ROWS = 100_000
"""A deletion-vector merge that writes at most this many rows (updates, inserts, change rows) writes them as one
file: else each touched file's few changed rows become a file of their own, and every later merge has to scan and
touch that trail of tiny files (Delta's adaptive plan coalesces such a small write to one task, too)."""

MODIFYING_ACTIONS = (MATCHED_UPDATE, MATCHED_DELETE, NOT_MATCHED_BY_SOURCE_UPDATE, NOT_MATCHED_BY_SOURCE_DELETE)
"""The actions whose target row leaves its file: marked deleted in the file's deletion vector."""


@dataclass(frozen=True)
class RowsPerFile:
    """What a merge-on-read write's output rows hold per file: the write and the deletion vectors come from the
    same rows."""

    counts: dict[str, int]
    """The output rows of each action."""
    deleted: dict[str, BitMap64]
    """By file, the row indexes of the target rows updated or deleted."""
    target_files: frozenset[str]
    """The files with a target row among the output rows (matched, whether or not a clause changed it)."""
    repeated_matches: int
    """Matches of a target row beyond its first, over all rows (counted only when asked)."""


@dataclass(frozen=True)
class DeletionVectorOutput(RowsPerFile):
    """MergeOutputGeneration's rows for a merge-on-read write, cached (release with ``rows.unpersist()``), and
    what an aggregation over them answered."""

    rows: DataFrame
    preimages: list[str]


def project_changes_with_deletion_vectors(
    ctx: MergeContext,
    joined: DataFrame,
    dedup_columns: Sequence[str],
    *,
    count_repeated_matches: bool = False,
    target_columns: frozenset[str] | None = None,
) -> DeletionVectorOutput:
    """Merge-on-read writeAllChanges up to its write: ``joined`` carries each target row's ``FILE_NAME_COL`` and
    ``ROW_INDEX_COL``. With ``count_repeated_matches`` the same aggregation also counts the target rows met more
    than once, so a join that holds every matched row checks for several matches before anything is written.
    ``target_columns``: the only table columns ``joined`` holds (without Change Data Feed)."""
    assert target_columns is None or not ctx.cdc_enabled, "change rows carry the whole target row"
    file_columns = [F.col(delta.FILE_NAME_COL), F.col(delta.ROW_INDEX_COL)]
    projected, preimages, codes = project_output(ctx, joined, dedup_columns, file_columns, target_columns)
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


_FILE_NUMBER_COL = internal_column("target_file_number")
_TARGET_ROWS = internal_column("target_rows")
_ROW_BITS = 40
"""Every Parquet file's row indexes fit below this bit."""
OBSERVED_FILES_MAX = 1 << 22
"""A target row is observed as one long: its row index times the number of candidate files plus its file's number
(short numbers write out faster), negated (less one) when the row leaves its file. With more files a row index
might not fit beside the file's number: the aggregation gathers them instead."""
OBSERVED_TARGET_ROWS_MAX = 1_000_000
"""Beyond this many target rows among the output rows (a few source rows can match many target rows), the
observation is not brought back: the write is discarded and the aggregation gathers them."""
OBSERVED_SOURCE_ROWS_MAX = OBSERVED_TARGET_ROWS_MAX
"""The write observes the target rows it replaces for sources up to this many rows, and so needs neither a cache
of its output rows nor an aggregation over them. The observed list comes back as one string (250,000 rows in some
0.26 s against 0.60 s as a list of literals, each a protobuf message of its own): its JSON, which Spark writes faster
than a cast to text (see docs/benchmarks.md, (3v))."""
_TARGET_ROW_COUNT = internal_column("target_row_count")


FILE_NUMBERS_INLINE_MAX = 100
"""Up to this many candidate files are numbered by a map literal in the plan; more by a broadcast join with a
table of their numbers (a Spark job of its own)."""


def _with_file_numbers(ctx: MergeContext, rows: DataFrame, paths: Sequence[str]) -> DataFrame:
    """``rows`` with the number of their file among ``paths`` (NULL for a row of no target file)."""
    if len(paths) <= FILE_NUMBERS_INLINE_MAX:
        numbers = F.create_map(*[F.lit(x) for i, path in enumerate(paths) for x in (path, i)])
        return rows.withColumn(_FILE_NUMBER_COL, F.try_element_at(numbers, F.col(delta.FILE_NAME_COL)).cast("long"))
    file_numbers = ctx.spark.createDataFrame(
        pa.table(
            {
                delta.FILE_NAME_COL: pa.array(paths, pa.string()),
                _FILE_NUMBER_COL: pa.array(np.arange(len(paths), dtype=np.int64), pa.int64()),
            }
        )
    )
    return rows.join(F.broadcast(file_numbers), on=delta.FILE_NAME_COL, how="left")


@dataclass(frozen=True)
class ObservedWrite(RowsPerFile):
    """A merge-on-read write whose output rows were observed as they were written: the files it added, and what
    the aggregation of ``project_changes_with_deletion_vectors`` would have answered."""

    added: list[AddFile]
    cdc_files: list[AddCDCFile]


def write_changes_observing_target_rows(
    ctx: MergeContext,
    joined: DataFrame,
    dedup_columns: Sequence[str],
    files: Sequence[AddFile],
    *,
    expected_rows: int | None,
    target_columns: frozenset[str] | None = None,
    written_where_joined: bool = False,
) -> ObservedWrite | None:
    """Merge-on-read's writeAllChanges in one Spark job: the updated and inserted rows are written while an
    observation gathers every target row among the output rows (its file and row index), so the touched files,
    the deletion vectors and the multiple-match check come after the write instead of from an aggregation over
    cached output rows before it. The caller judges them before committing; a merge that then fails leaves only
    uncommitted files, removed as a failed write's are. ``expected_rows``: at most this many rows are written
    (then, if few, as one file). None: Spark did not report the observation (an adaptive plan may drop an empty
    stage), or too many target rows to bring back: what was written must be discarded. ``written_where_joined``:
    the target's rows reach the join from another stage (shuffled or broadcast), so the join's own task writes the
    few rows instead of shuffling them to one task."""
    assert target_columns is None or not ctx.cdc_enabled, "change rows carry the whole target row"
    paths = list(dict.fromkeys(f.path for f in files))
    assert len(paths) < OBSERVED_FILES_MAX, "the aggregation gathers so many files"
    projected, preimages, codes = project_output(
        ctx, joined, dedup_columns, [F.col(delta.FILE_NAME_COL), F.col(delta.ROW_INDEX_COL)], target_columns
    )
    numbered = _with_file_numbers(ctx, projected, paths)
    file_count = max(len(paths), 1)
    row = F.col(delta.ROW_INDEX_COL) * F.lit(file_count) + F.col(_FILE_NUMBER_COL)
    modifying = F.col(ACTION_COL).isin([action(c) for c in MODIFYING_ACTIONS])
    obs = Observation("writeAllChangesWithDeletionVectors")
    observed = observe(
        numbered,
        obs,
        *action_counts(codes),
        F.count(F.col(_FILE_NUMBER_COL)).alias(_TARGET_ROW_COUNT),
        F.to_json(
            F.slice(F.collect_list(F.when(modifying, -row - 1).otherwise(row)), 1, OBSERVED_TARGET_ROWS_MAX)
        ).alias(_TARGET_ROWS),
    )
    if expected_rows is not None and expected_rows <= ONE_FILE_ROWS:
        # One task writes the few rows; the join above it keeps its parallelism (the scan's, where the target
        # streams through it).
        observed = observed.coalesce(1) if written_where_joined else observed.repartition(1)
    added, cdc_files = write_output(
        ctx, observed.drop(_FILE_NUMBER_COL), preimages, dedup_columns, write_id=ctx.write_id, copies=False
    )
    values = obs.get
    if not values or int(values.get(_TARGET_ROW_COUNT) or 0) > OBSERVED_TARGET_ROWS_MAX:
        return None
    counts = {code: int(values.get(code) or 0) for code in codes}
    # "[1,-2,3]": the array's JSON.
    encoded = np.fromstring(str(values.get(_TARGET_ROWS) or "[]")[1:-1], dtype=np.int64, sep=",")
    modified = encoded < 0
    row_indexes, file_numbers = np.divmod(np.where(modified, -encoded - 1, encoded), file_count)
    rows = (file_numbers << _ROW_BITS) + row_indexes
    # Sorted, a long orders by file and then by row index: each file's rows are one run.
    changed = np.sort(rows[modified])
    changed_files, starts = np.unique(changed >> _ROW_BITS, return_index=True)
    runs = np.split(changed, starts[1:]) if len(changed) else []
    deleted = {
        paths[int(number)]: BitMap64((run & ((1 << _ROW_BITS) - 1)).tolist())
        for number, run in zip(changed_files, runs, strict=True)
    }
    distinct = np.unique(rows)
    return ObservedWrite(
        added=added,
        cdc_files=cdc_files,
        counts=counts,
        deleted=deleted,
        target_files=frozenset(paths[int(n)] for n in np.unique(distinct >> _ROW_BITS)),
        repeated_matches=len(rows) - len(distinct),
    )
