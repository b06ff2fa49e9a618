"""Delta's MergeOutputGeneration over Spark Connect: precomputed clause conditions and one CASE WHEN per
output column, turning each joined row into its output row plus ``_row_dropped_``.

Where Delta increments SQL metrics from inside the CASE branches (``incrementMetricAndReturnBool``), each
branch here also yields an action code in ``_merge_action_``; one ``DataFrame.observe`` over that column
counts the rows of every kind in the same pass as the write.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructField

from engine.expressions import quote_identifier
from engine.resolution import ResolvedClause

SOURCE_ROW_PRESENT_COL = "_source_row_present_"
TARGET_ROW_PRESENT_COL = "_target_row_present_"
ROW_DROPPED_COL = "_row_dropped_"
ACTION_COL = "_merge_action_"
PRECOMPUTED_CONDITION_COL = "_condition_"

# Action codes: the metric each output row counts towards.
MATCHED_UPDATE = "matchedUpdate"
MATCHED_DELETE = "matchedDelete"
NOT_MATCHED_BY_SOURCE_UPDATE = "notMatchedBySourceUpdate"
NOT_MATCHED_BY_SOURCE_DELETE = "notMatchedBySourceDelete"
INSERT = "insert"
COPY = "copy"
DROP_SOURCE = "dropSource"


@dataclass
class ProcessedClause:
    """A clause after its condition is precomputed: N output values, then _row_dropped_ and the action."""

    condition: Column | None
    actions: list[Column]


def generate_precomputed_conditions_and_df(
    df: DataFrame, clauses: Sequence[ResolvedClause]
) -> tuple[DataFrame, dict[int, Column]]:
    """Each clause condition becomes a boolean column computed once per row (``_<kind>_condition_<i>_``),
    not once per output column inside every CASE WHEN."""
    columns: list[Column] = []
    lookups: dict[int, Column] = {}
    for clause in clauses:
        if clause.condition is None:
            continue
        name = f"_{clause.kind}{PRECOMPUTED_CONDITION_COL}{len(columns)}_"
        columns.append(clause.condition.alias(name))
        lookups[id(clause)] = F.col(quote_identifier(name))
    if not columns:
        return df, lookups
    return df.select("*", *columns), lookups


def target_write_cols(fields: Sequence[StructField], target_alias: str, existing: set[str]) -> list[Column]:
    """The target row as it is (new columns from schema evolution are NULL for existing rows)."""
    cols = []
    for f in fields:
        if f.name.lower() in existing:
            cols.append(F.expr(f"{quote_identifier(target_alias)}.{quote_identifier(f.name)}"))
        else:
            cols.append(F.lit(None).cast(f.dataType))
    return cols


def generate_all_action_exprs(
    target_cols: Sequence[Column], clauses: Sequence[ResolvedClause], lookups: dict[int, Column]
) -> list[ProcessedClause]:
    processed = []
    for clause in clauses:
        ctype = clause.clause.clause_type
        if clause.is_delete:
            code = MATCHED_DELETE if ctype == "matched" else NOT_MATCHED_BY_SOURCE_DELETE
            actions = [*target_cols, F.lit(True), F.lit(code)]
        else:
            assert clause.values is not None
            code = {"matched": MATCHED_UPDATE, "notMatchedBySource": NOT_MATCHED_BY_SOURCE_UPDATE,
                    "notMatched": INSERT}[ctype]
            actions = [*clause.values, F.lit(False), F.lit(code)]
        processed.append(ProcessedClause(lookups.get(id(clause)), actions))
    return processed


def generate_clause_output_exprs(
    num_output_cols: int, clauses: Sequence[ProcessedClause], noop: Sequence[Column]
) -> list[Column]:
    """Delta's generateClauseOutputExprs: the noop values, one unconditional clause's values, IF, or CASE."""
    if not clauses:
        return list(noop)
    if clauses[0].condition is None:
        return list(clauses[0].actions)
    result = []
    for i in range(num_output_cols):
        expr = None
        for clause in clauses:
            cond = clause.condition if clause.condition is not None else F.lit(True)
            expr = F.when(cond, clause.actions[i]) if expr is None else expr.when(cond, clause.actions[i])
        assert expr is not None
        result.append(expr.otherwise(noop[i]))
    return result


def generate_write_all_changes_output_cols(
    target_cols: Sequence[Column],
    output_names: Sequence[str],
    matched: Sequence[ResolvedClause],
    not_matched: Sequence[ResolvedClause],
    not_matched_by_source: Sequence[ResolvedClause],
    lookups: dict[int, Column],
) -> list[Column]:
    """One CASE WHEN per output column, choosing the NOT MATCHED BY SOURCE, NOT MATCHED or MATCHED
    expressions by which side of the outer join is missing."""
    names = [*output_names, ROW_DROPPED_COL, ACTION_COL]
    n = len(names)
    noop_copy = [*target_cols, F.lit(False), F.lit(COPY)]
    delete_source_row = [*target_cols, F.lit(True), F.lit(DROP_SOURCE)]
    matched_exprs = generate_clause_output_exprs(n, generate_all_action_exprs(target_cols, matched, lookups),
                                                 noop_copy)
    not_matched_exprs = generate_clause_output_exprs(
        n, generate_all_action_exprs(target_cols, not_matched, lookups), delete_source_row)
    nmbs_exprs = generate_clause_output_exprs(
        n, generate_all_action_exprs(target_cols, not_matched_by_source, lookups), noop_copy)
    if_source_row_null = F.col(SOURCE_ROW_PRESENT_COL).isNull()
    if_target_row_null = F.col(TARGET_ROW_PRESENT_COL).isNull()
    return [
        F.when(if_source_row_null, nmbs_exprs[i]).when(if_target_row_null, not_matched_exprs[i])
        .otherwise(matched_exprs[i]).alias(name)
        for i, name in enumerate(names)
    ]


def generate_inserts_only_output_cols(
    output_names: Sequence[str], output_fields: Sequence[StructField], not_matched: Sequence[ResolvedClause],
    lookups: dict[int, Column],
) -> list[Column]:
    """InsertOnlyMergeExecutor's output: the first insert clause that holds, else the row is dropped."""
    nulls = [F.lit(None).cast(f.dataType) for f in output_fields]
    names = [*output_names, ROW_DROPPED_COL, ACTION_COL]
    exprs = generate_clause_output_exprs(
        len(names), generate_all_action_exprs(nulls, not_matched, lookups), [*nulls, F.lit(True), F.lit(DROP_SOURCE)]
    )
    return [e.alias(name) for e, name in zip(exprs, names, strict=True)]


def action_counts(codes: Sequence[str]) -> list[Column]:
    """Aggregates for ``observe``: how many output rows took each action."""
    return [F.sum(F.when(F.col(ACTION_COL) == F.lit(code), 1).otherwise(0)).alias(code) for code in codes]
