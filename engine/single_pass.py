"""The single pass: findTouchedFiles folded into writeAllChanges when the key statistics say every candidate
file will be touched. Every candidate is rewritten while the touched files and the rows the join gave each
target row are observed; the write is kept only if the guess held."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from engine import delta
from engine.context import MergeContext, observe, observed_source_rows, source_with_count
from engine.delta.internal_columns import internal_column
from engine.expressions import quote_identifier
from engine.join_keys import one_integer_key, qualified_column
from engine.joins import broadcast_full_outer, holds_few_target_rows, source_fits_broadcast, unmatched_source_rows
from engine.key_bitmap import PROBE_KEY_COL, KeyBitmap
from engine.merge_condition import KeyedOn
from engine.output import (
    ACTION_COL,
    CDC_TYPE_COL,
    CDC_TYPE_INSERT,
    COPY,
    INSERT,
    MATCHED_DELETE,
    MATCHED_UPDATE,
    NOT_MATCHED_BY_SOURCE_DELETE,
    NOT_MATCHED_BY_SOURCE_UPDATE,
    SOURCE_ROW_PRESENT_COL,
    TARGET_ROW_PRESENT_COL,
    action,
    action_counts,
    generate_inserts_only_output_cols,
    generate_precomputed_conditions_and_df,
    generate_write_all_changes_output_cols,
    preimage_names,
    target_write_cols,
)
from engine.spark import Observation
from engine.spec import MergeSpec
from engine.write_files import (
    WrittenFiles,
    observed_counts,
    record_write_metrics,
    repartition_for_write,
    write_changes,
    write_output,
)

SINGLE_PASS_MIN_MATCHES_PER_FILE = 16
"""The single pass is taken when every candidate file is expected to hold at least this many matched rows
(source keys in its key range times the share of that range its rows fill): with random keys the chance that
such a file has none is below e**-16."""


SINGLE_PASS_MAX_GUESSED_ROWS = 10_000
"""Candidate files holding at most this many rows in all are rewritten in one pass whatever the key statistics
expect: a wrong guess costs the rewrite of these few rows, discarded, while findTouchedFiles' own Spark job costs
more than rewriting them; a right one spares that job, most of a small merge's time."""


TOUCHED_FILE_COL = internal_column("touched_file")


FILE_HASH_COL = internal_column("file_hash")


TARGET_SIDE_ACTIONS = (COPY, MATCHED_UPDATE, MATCHED_DELETE, NOT_MATCHED_BY_SOURCE_UPDATE, NOT_MATCHED_BY_SOURCE_DELETE)
"""The actions a row of the target takes: one each."""


def touches_every_match(spec: MergeSpec) -> bool:
    """Whether every match touches its file: the write reads every matched row when the merge has more than
    MATCHED clauses, and a MATCHED clause without condition acts on every match."""
    return not spec.is_matched_only or any(c.condition is None for c in spec.matched)


def takes_single_pass(ctx: MergeContext) -> bool:
    """Whether findTouchedFiles can be folded into writeAllChanges. Every candidate needs a row count in its
    statistics (the multiple-match check). With NOT MATCHED BY SOURCE clauses every candidate file is
    touched, as Delta rewrites them all, so nothing else is guessed. Otherwise every match must touch its
    file, and either the candidates hold few rows or ON is one integer key equality (plus source-only
    conjuncts) and the key statistics expect every candidate file to be touched."""
    spec = ctx.spec
    if ctx.write_deletion_vectors:
        return False  # The single pass rewrites whole files; a deletion-vector merge writes only changed rows.
    if ctx.row_tracking_columns is not None:
        return False  # Its plans read the target without the rows' files and indexes, which stable row ids need.
    candidate_rows = delta.known_num_records(ctx.candidate_files)
    if not ctx.candidate_files or candidate_rows is None:
        return False
    if spec.not_matched_by_source:
        return True
    if not touches_every_match(spec):
        return False
    if candidate_rows <= SINGLE_PASS_MAX_GUESSED_ROWS:
        return True
    if ctx.source_rows_estimate is None:
        return False
    keyed = one_integer_key(ctx)
    return keyed is not None and not keyed.target_only and expects_every_candidate_touched(ctx, keyed)


def expects_every_candidate_touched(ctx: MergeContext, keyed: KeyedOn) -> bool:
    """Whether each candidate file should hold SINGLE_PASS_MIN_MATCHES_PER_FILE matched rows, taking the
    source's keys as spread evenly over their range and a file's keys over its statistics' range."""
    column = keyed.keys[0].target_column
    source_range = ctx.source_key_ranges.get(column.lower())
    rows = ctx.source_rows_estimate
    if source_range is None or rows is None or None in source_range:
        return False
    low, high = (int(v) for v in source_range)
    for f in ctx.candidate_files:
        st = f.stats
        if st is None or not st.num_records:
            return False
        file_low, file_high = st.value("min_values", [column]), st.value("max_values", [column])
        if not isinstance(file_low, int) or not isinstance(file_high, int):
            return False
        overlap = min(high, file_high) - max(low, file_low) + 1
        if overlap <= 0:
            return False
        keys_in_range = rows * overlap / (high - low + 1)
        filled = min(1.0, st.num_records / (file_high - file_low + 1))
        if keys_in_range * filled < SINGLE_PASS_MIN_MATCHES_PER_FILE:
            return False
    return True


def write_in_one_pass(ctx: MergeContext) -> WrittenFiles | None:
    """findTouchedFiles folded into writeAllChanges: every candidate file is rewritten, joined with the
    source as writeAllChanges joins it, while the touched files are observed. A target row matched more
    than once comes out of the join more than once, so the multiple-match check is the join's target rows
    against the rows the statistics count. The write is kept only when every candidate was touched and no
    target row matched twice; else it is discarded and None answered, with ``touched_files`` set when they
    are known (no multiple match), for writeAllChanges to rewrite only those."""
    spec = ctx.spec
    s, t, on = spec.source_alias, spec.target_alias, ctx.resolved.on
    start = time.monotonic()
    obs_source = Observation("numSourceRows")
    observed_source = source_with_count(ctx, obs_source).withColumn(SOURCE_ROW_PRESENT_COL, F.lit(True))
    # NOT MATCHED BY SOURCE clauses touch every candidate: only a guess needs the touched files observed,
    # and only then is the file read with its rows (unused, ``_metadata`` would be read whole).
    guessed = not spec.not_matched_by_source
    scanned = (
        delta.scan_files_with_path(ctx.spark, ctx.snapshot, ctx.candidate_files)
        if guessed
        else ctx.target_df(ctx.candidate_files, file_columns=False)
    )
    target = scanned.withColumn(TARGET_ROW_PRESENT_COL, F.lit(True))
    if not source_fits_broadcast(ctx, ctx.source_rows_estimate, ctx.candidate_files):
        how = "right_outer" if spec.is_matched_only else "full_outer"
        joined = observed_source.alias(s).join(target.alias(t), on, how)
    elif spec.not_matched:
        # The source is counted where the unmatched source rows stream past; an observation may
        # appear once in a plan.
        bitmap = KeyBitmap.for_merge(ctx, ctx.source_rows_estimate, any_size=guessed)
        if bitmap is not None and guessed and holds_few_target_rows(bitmap, ctx.candidate_files):
            return write_in_one_pass_counting_pairs(ctx, observed_source, obs_source, target, bitmap, start)
        unmatched = unmatched_source_rows(ctx, observed_source, ctx.candidate_files, bitmap, probe=ctx.source)
        joined = broadcast_full_outer(
            ctx, ctx.source.withColumn(SOURCE_ROW_PRESENT_COL, F.lit(True)), target, unmatched, bitmap
        )
    else:
        # A matched-only merge writes no source row: its pairs would have to be counted in a Spark job of
        # their own, which measured no faster than observing the target's rows as they stream past.
        bitmap = KeyBitmap.for_merge(ctx, ctx.source_rows_estimate)
        if bitmap is not None:
            target, on = bitmap.probe_keys(target), bitmap.on(t, s)
        joined = target.alias(t).join(F.broadcast(observed_source.alias(s)), on, "left_outer")
    probes, probe_metrics = _touched_file_probes(t) if guessed else ([], [])
    added, cdc_files, obs = write_changes(
        ctx, joined, (), write_id=ctx.write_id, probes=probes, probe_metrics=probe_metrics
    )
    counts = observed_counts(obs, ignore=(TOUCHED_FILE_COL,))
    source_rows = ctx.metrics["numSourceRows"] = observed_source_rows(ctx, obs_source)
    if not _keeps_write(ctx, counts, obs, guessed=guessed, start=start):
        return None
    # The write read the source once, every row of it: the second scan and the first are one.
    record_write_metrics(ctx, counts, cdc_files, source_rows)
    ctx.metrics["rewriteTimeMs"] = int((time.monotonic() - start) * 1000)
    return added, cdc_files


def _touched_file_probes(target_alias: str) -> tuple[list[Column], list[Column]]:
    """The file path of each matched target row, and the set of them observed: the touched files."""
    target_present = F.col(TARGET_ROW_PRESENT_COL).isNotNull()
    matched = target_present & F.col(SOURCE_ROW_PRESENT_COL).isNotNull()
    probe = F.when(matched, F.col(qualified_column(target_alias, delta.FILE_PATH_COL))).alias(TOUCHED_FILE_COL)
    return [probe], [F.collect_set(TOUCHED_FILE_COL).alias(TOUCHED_FILE_COL)]


def _keeps_write(ctx: MergeContext, counts: dict[str, int], obs: Observation, *, guessed: bool, start: float) -> bool:
    """Whether the single pass's write stands: no target row matched twice and every candidate touched. Else
    the write is discarded, with ``touched_files`` set when they are known (no multiple match)."""
    # Every target row the join gave takes one target-side action. The statistics' row count (required by
    # takes_single_pass) spares observing the scan, which would stop whole-stage code generation there.
    target_rows_out = sum(counts.get(c, 0) for c in TARGET_SIDE_ACTIONS)
    if target_rows_out != delta.known_num_records(ctx.candidate_files):
        delta.discard_write(ctx.snapshot, ctx.write_id)
        return False
    if guessed:
        ctx.touched_files = delta.files_at_paths(ctx.snapshot, ctx.candidate_files, obs.get.get(TOUCHED_FILE_COL) or [])
    else:
        ctx.touched_files = list(ctx.candidate_files)
    ctx.touched_files_known = True
    if len(ctx.touched_files) < len(ctx.candidate_files):
        delta.discard_write(ctx.snapshot, ctx.write_id)
        # The pass did findTouchedFiles' work, and that is all that is kept of it.
        ctx.metrics["scanTimeMs"] = int((time.monotonic() - start) * 1000)
        return False
    return True


def write_in_one_pass_counting_pairs(
    ctx: MergeContext,
    observed_source: DataFrame,
    obs_source: Observation,
    target: DataFrame,
    bitmap: KeyBitmap,
    start: float,
) -> WrittenFiles | None:
    """The single pass with nothing counted where the target's rows stream past the broadcast source: an
    observation there breaks the write's generated code in two and updates its aggregates on every row,
    the costliest part of the write after Parquet itself. The source rows meet the target rows the key
    bitmap holds instead (broadcast: their key, their file's hash and the columns the clauses' conditions
    read). Each matched pair takes the action its target row takes in the write, so the pairs count the
    matched actions and the touched files, and the unmatched source rows are the inserts. The copies
    are the rows written (the files' footers) less the updates and inserts; the target rows the join gave
    are the copies, updates and deletes (change files are not counted). Needs no NOT MATCHED BY SOURCE
    clause: its actions fall on the uncounted rows."""
    resolved = ctx.resolved
    existing = {f.name.lower() for f in ctx.snapshot.spark_schema.fields}
    tcols = target_write_cols(resolved.output_fields, ctx.spec.target_alias, existing, resolved.target_values)
    cdc = ctx.cdc_enabled
    preimages = preimage_names(len(tcols)) if cdc else []

    def output_cols(lookups: dict[int, Column]) -> list[Column]:
        return generate_write_all_changes_output_cols(
            tcols, ctx.output_names, resolved.matched, resolved.not_matched, (), lookups, cdc=cdc
        )

    rewritten = _rewritten_through_bitmap(ctx, bitmap, output_cols, tcols, preimages)
    # The source's own schema is known already: asking the observed frame would cost the server a round trip.
    source_names = [*(f.name for f in ctx.source.schema.fields), SOURCE_ROW_PRESENT_COL]
    acted = _acted_pairs(ctx, observed_source, target, bitmap, output_cols, source_names)
    obs = Observation("writeAllChanges")
    codes = [MATCHED_UPDATE, MATCHED_DELETE, INSERT]
    counted = observe(acted, obs, *action_counts(codes), F.collect_set(TOUCHED_FILE_COL).alias(TOUCHED_FILE_COL))
    rows = repartition_for_write(ctx, rewritten.union(_inserted_rows(ctx, counted, source_names, preimages)))
    added, cdc_files = write_output(ctx, rows, preimages, (), write_id=ctx.write_id)
    counts = observed_counts(obs, ignore=(TOUCHED_FILE_COL,))
    source_rows = ctx.metrics["numSourceRows"] = observed_source_rows(ctx, obs_source)
    written = delta.known_num_records(added)
    assert written is not None, "the files a merge writes carry their footers' row counts"
    counts[COPY] = written - counts[MATCHED_UPDATE] - counts[INSERT]
    target_rows_out = written - counts[INSERT] + counts[MATCHED_DELETE]
    touched = len(obs.get.get(TOUCHED_FILE_COL) or [])
    # A target row matched twice, or a candidate file untouched (or two files' hashes alike): the write
    # is given up, and findTouchedFiles tells which.
    if target_rows_out != delta.known_num_records(ctx.candidate_files) or touched < len(ctx.candidate_files):
        delta.discard_write(ctx.snapshot, ctx.write_id)
        return None
    ctx.touched_files = list(ctx.candidate_files)
    ctx.touched_files_known = True
    record_write_metrics(ctx, counts, cdc_files, source_rows)
    ctx.metrics["rewriteTimeMs"] = int((time.monotonic() - start) * 1000)
    return added, cdc_files


def _rewritten_through_bitmap(
    ctx: MergeContext,
    bitmap: KeyBitmap,
    output_cols: Callable[[dict[int, Column]], list[Column]],
    tcols: Sequence[Column],
    preimages: Sequence[str],
) -> DataFrame:
    """Every candidate file's rows joined with the broadcast source through the key bitmap, as output rows."""
    s, t = ctx.spec.source_alias, ctx.spec.target_alias
    clauses = [*ctx.resolved.matched, *ctx.resolved.not_matched]
    source = ctx.source.withColumn(SOURCE_ROW_PRESENT_COL, F.lit(True))
    # The rewrite reads no file column: left unused, ``_metadata`` would be read whole, row index and all.
    rewrite = bitmap.probe_keys(
        ctx.target_df(ctx.candidate_files, file_columns=False).withColumn(TARGET_ROW_PRESENT_COL, F.lit(True))
    )
    rewritten, lookups = generate_precomputed_conditions_and_df(
        rewrite.alias(t).join(F.broadcast(source.alias(s)), bitmap.on(t, s), "left_outer"), clauses
    )
    return rewritten.select(*output_cols(lookups), *[c.alias(n) for c, n in zip(tcols, preimages, strict=False)])


def _acted_pairs(
    ctx: MergeContext,
    observed_source: DataFrame,
    target: DataFrame,
    bitmap: KeyBitmap,
    output_cols: Callable[[dict[int, Column]], list[Column]],
    source_names: Sequence[str],
) -> DataFrame:
    """Each source row met with the target rows the bitmap holds: the source's columns, the action the pair
    takes, and the hash of the matched target row's file (NULL for an unmatched source row)."""
    s, t = ctx.spec.source_alias, ctx.spec.target_alias
    clauses = [*ctx.resolved.matched, *ctx.resolved.not_matched]
    held = (
        bitmap.probe_keys(target)
        .where(F.col(PROBE_KEY_COL).isNotNull())
        .withColumn(FILE_HASH_COL, F.xxhash64(F.col(delta.FILE_PATH_COL)))
    )
    pairs, lookups = generate_precomputed_conditions_and_df(
        observed_source.alias(s).join(F.broadcast(held.alias(t)), bitmap.on(t, s), "left_outer"), clauses
    )
    return pairs.select(
        *[F.col(qualified_column(s, n)) for n in source_names],
        # Only the action: the target's other columns stay out of the broadcast.
        output_cols(lookups)[len(ctx.output_names) + 1],
        F.when(
            F.col(qualified_column(t, TARGET_ROW_PRESENT_COL)).isNotNull(), F.col(qualified_column(t, FILE_HASH_COL))
        ).alias(TOUCHED_FILE_COL),
    )


def _inserted_rows(
    ctx: MergeContext, counted: DataFrame, source_names: Sequence[str], preimages: Sequence[str]
) -> DataFrame:
    """The unmatched source rows among the counted pairs, as the NOT MATCHED clauses' output rows."""
    resolved = ctx.resolved
    unmatched = (
        counted.where(F.col(ACTION_COL) == action(INSERT))
        .select(*[quote_identifier(n) for n in source_names])
        .alias(ctx.spec.source_alias)
    )
    unmatched, insert_lookups = generate_precomputed_conditions_and_df(unmatched, resolved.not_matched)
    insert_cols = generate_inserts_only_output_cols(
        ctx.output_names, resolved.output_fields, resolved.not_matched, insert_lookups
    )
    if ctx.cdc_enabled:
        insert_cols += [
            F.lit(CDC_TYPE_INSERT).alias(CDC_TYPE_COL),
            *[F.lit(None).cast(f.dataType).alias(n) for f, n in zip(resolved.output_fields, preimages, strict=True)],
        ]
    return unmatched.select(*insert_cols)
