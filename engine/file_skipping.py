"""Data skipping for a merge: the predicate its commit records as read and the candidate files it leaves."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from pyspark.sql import DataFrame
from sqlglot import exp

from engine import delta
from engine.delta import AddFile, Snapshot
from engine.merge_condition import Sides, and_all, conjuncts, strip_qualifiers
from engine.source_keys import SourceKeyRanges
from engine.validation import ParsedMerge


def skip_files(
    parsed: ParsedMerge,
    source_keys: SourceKeyRanges,
    snapshot: Snapshot,
    source: DataFrame,
    sides: Sides,
    metrics: dict[str, int],
) -> tuple[exp.Expression | None, list[AddFile]]:
    """The predicate and the files it leaves; sets the skipping metrics."""
    all_files = list(snapshot.files)
    predicate = _skipping_predicate(parsed, source_keys, snapshot, source, sides, all_files)
    candidates = delta.prune_files(snapshot, all_files, predicate) if predicate is not None else all_files
    metrics["numTargetFilesBeforeSkipping"] = len(all_files)
    metrics["numTargetBytesBeforeSkipping"] = sum(f.size for f in all_files)
    metrics["numTargetFilesAfterSkipping"] = len(candidates)
    metrics["numTargetBytesAfterSkipping"] = sum(f.size for f in candidates)
    metrics["numTargetPartitionsAfterSkipping"] = partitions(snapshot, candidates)
    return predicate, candidates


def partitions(snapshot: Snapshot, files: Sequence[AddFile]) -> int:
    """How many partitions the files lie in (0 for a table without partition columns), as Delta counts them."""
    if not snapshot.partition_columns:
        return 0
    return len({tuple(sorted(f.partition_values.items(), key=lambda kv: kv[0])) for f in files})


def _skipping_predicate(
    parsed: ParsedMerge,
    source_keys: SourceKeyRanges,
    snapshot: Snapshot,
    source: DataFrame,
    sides: Sides,
    files: list[AddFile],
) -> exp.Expression | None:
    """Delta's getTargetOnlyPredicates (ON, and for matched-only merges the clause conditions), plus, beyond
    Delta on Spark, the source's join-key range and partition values. None with NOT MATCHED BY SOURCE
    clauses: every target row is then in scope."""
    spec = parsed.spec
    if spec.not_matched_by_source or not files:
        return None
    predicates = parsed.on.target_only_predicates(sides)
    if spec.is_matched_only:
        matched = _matched_conditions_predicate(parsed, sides)
        if matched is not None:
            predicates.append(matched)
    # A Spark aggregation for the source's key range pays only where it can leave some files out; for a table of
    # one file, only ranges known without one (inline rows, a Delta source's statistics): a source whose keys all
    # lie outside that file's then skips it, and its rows are written as inserts alone.
    predicates.extend(source_keys.source_key_predicates(snapshot, source, sides, without_spark=len(files) == 1))
    return cast("exp.Expression | None", and_all(predicates))


def _matched_conditions_predicate(parsed: ParsedMerge, sides: Sides) -> exp.Expr | None:
    """For a matched-only merge, the OR of each MATCHED clause's target-only conjuncts; None when a clause
    has none (it may act on any matched row)."""
    per_clause: list[exp.Expr] = []
    for clause in parsed.spec.matched:
        if clause.condition is None:
            return None
        parts = and_all(
            strip_qualifiers(c) for c in conjuncts(parsed.tree(clause.condition)) if sides.sides_of(c) == {"target"}
        )
        if parts is None:
            return None
        per_clause.append(parts)
    if not per_clause:
        return None
    if len(per_clause) == 1:
        return per_clause[0]
    return cast(exp.Expr, exp.or_(*per_clause))  # an exp.Or; sqlglot's hints say Condition
