"""Delta's MergeOutputGeneration over Spark Connect: precomputed clause conditions and one CASE WHEN per
output column, turning each joined row into its output row plus ``ROW_DROPPED_COL``.

Where Delta increments SQL metrics from inside the CASE branches (``incrementMetricAndReturnBool``), each
branch here also yields an action code in ``ACTION_COL``; one ``DataFrame.observe`` over that column
counts the rows of every kind in the same pass as the write (or, in the single pass with a key bitmap, over
the source rows met with the target rows the bitmap holds: see ClassicMergeExecutor).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructField

from engine.delta.internal_columns import internal_column
from engine.expressions import quote_identifier
from engine.resolved import ResolvedClause

SOURCE_ROW_PRESENT_COL = internal_column("source_row_present")
TARGET_ROW_PRESENT_COL = internal_column("target_row_present")
ROW_DROPPED_COL = internal_column("row_dropped")
ACTION_COL = internal_column("merge_action")
CDC_TYPE_COL = "_change_type"
TARGET_ROW_INDEX_COL = internal_column("target_row_index")
SOURCE_ROW_INDEX_COL = internal_column("source_row_index")
DATA_ROW_KEY_COL = internal_column("data_row_key")

# Change Data Feed row kinds (CDCReader); NULL marks a row of the table's own data.
CDC_TYPE_INSERT = "insert"
CDC_TYPE_UPDATE_PREIMAGE = "update_preimage"
CDC_TYPE_UPDATE_POSTIMAGE = "update_postimage"
CDC_TYPE_DELETE = "delete"

# Action codes: the metric each output row counts towards.
MATCHED_UPDATE = "matchedUpdate"
MATCHED_DELETE = "matchedDelete"
NOT_MATCHED_BY_SOURCE_UPDATE = "notMatchedBySourceUpdate"
NOT_MATCHED_BY_SOURCE_DELETE = "notMatchedBySourceDelete"
INSERT = "insert"
COPY = "copy"
DROP_SOURCE = "dropSource"
_ACTION_CODES = {
    name: i
    for i, name in enumerate(
        (
            MATCHED_UPDATE,
            MATCHED_DELETE,
            NOT_MATCHED_BY_SOURCE_UPDATE,
            NOT_MATCHED_BY_SOURCE_DELETE,
            INSERT,
            COPY,
            DROP_SOURCE,
        )
    )
}


def action(name: str) -> Column:
    """The ``ACTION_COL`` value of an action: a small integer, cheap to compare on every row."""
    return F.lit(_ACTION_CODES[name]).cast("byte")


def cdc_not_cdc() -> Column:
    return F.lit(None).cast("string")


@dataclass
class ProcessedClause:
    """A clause after its condition is precomputed: N output values, then ROW_DROPPED_COL, the action and, with
    Change Data Feed, the change type."""

    condition: Column | None
    actions: list[Column]


def generate_precomputed_conditions_and_df(
    df: DataFrame, clauses: Sequence[ResolvedClause]
) -> tuple[DataFrame, dict[int, Column]]:
    """Each clause condition becomes a boolean column computed once per row (``<kind>_condition_<i>``, internal),
    not once per output column inside every CASE WHEN."""
    columns: list[Column] = []
    lookups: dict[int, Column] = {}
    for clause in clauses:
        if clause.condition is None:
            continue
        name = internal_column(f"{clause.kind}_condition_{len(columns)}")
        columns.append(clause.condition.alias(name))
        lookups[id(clause)] = F.col(quote_identifier(name))
    if not columns:
        return df, lookups
    return df.select("*", *columns), lookups


def target_write_cols(
    fields: Sequence[StructField], target_alias: str, existing: set[str], converted: Mapping[str, str] | None = None
) -> list[Column]:
    """The target row as it is (new columns from schema evolution are NULL for existing rows; ``converted``
    holds the SQL of the columns whose struct type gained fields)."""
    cols = []
    for f in fields:
        if converted and f.name.lower() in converted:
            cols.append(F.expr(converted[f.name.lower()]))
        elif f.name.lower() in existing:
            cols.append(F.expr(f"{quote_identifier(target_alias)}.{quote_identifier(f.name)}"))
        else:
            cols.append(F.lit(None).cast(f.dataType))
    return cols


def generate_all_action_exprs(
    target_cols: Sequence[Column],
    clauses: Sequence[ResolvedClause],
    lookups: dict[int, Column],
    *,
    cdc: bool = False,
) -> list[ProcessedClause]:
    processed = []
    for clause in clauses:
        ctype = clause.clause.clause_type
        if clause.is_delete:
            code = MATCHED_DELETE if ctype == "matched" else NOT_MATCHED_BY_SOURCE_DELETE
            actions = [*target_cols, F.lit(True), action(code)]
            change = CDC_TYPE_DELETE
        else:
            assert clause.values is not None
            code = {
                "matched": MATCHED_UPDATE,
                "notMatchedBySource": NOT_MATCHED_BY_SOURCE_UPDATE,
                "notMatched": INSERT,
            }[ctype]
            actions = [*clause.values, F.lit(False), action(code)]
            change = CDC_TYPE_INSERT if ctype == "notMatched" else CDC_TYPE_UPDATE_POSTIMAGE
        if cdc:
            actions.append(F.lit(change))
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
    *,
    cdc: bool = False,
) -> list[Column]:
    """One CASE WHEN per output column, choosing the NOT MATCHED BY SOURCE, NOT MATCHED or MATCHED
    expressions by which side of the outer join is missing."""
    names = [*output_names, ROW_DROPPED_COL, ACTION_COL, *([CDC_TYPE_COL] if cdc else [])]
    n = len(names)
    noop_copy = noop_copy_exprs(target_cols, cdc=cdc)
    delete_source_row = [*target_cols, F.lit(True), action(DROP_SOURCE), *([cdc_not_cdc()] if cdc else [])]
    matched_exprs = generate_clause_output_exprs(
        n, generate_all_action_exprs(target_cols, matched, lookups, cdc=cdc), noop_copy
    )
    not_matched_exprs = generate_clause_output_exprs(
        n, generate_all_action_exprs(target_cols, not_matched, lookups, cdc=cdc), delete_source_row
    )
    nmbs_exprs = generate_clause_output_exprs(
        n, generate_all_action_exprs(target_cols, not_matched_by_source, lookups, cdc=cdc), noop_copy
    )
    if_source_row_null = F.col(SOURCE_ROW_PRESENT_COL).isNull()
    if_target_row_null = F.col(TARGET_ROW_PRESENT_COL).isNull()
    return [
        F.when(if_source_row_null, nmbs_exprs[i])
        .when(if_target_row_null, not_matched_exprs[i])
        .otherwise(matched_exprs[i])
        .alias(name)
        for i, name in enumerate(names)
    ]


def noop_copy_exprs(target_cols: Sequence[Column], *, cdc: bool) -> list[Column]:
    return [*target_cols, F.lit(False), action(COPY), *([cdc_not_cdc()] if cdc else [])]


# The rows each joined row gives with Change Data Feed (generateCdcAndOutputRows): its data row, its change
# row, and an update's preimage.
_DATA_ROW, _CHANGE_ROW, _PREIMAGE_ROW = 0, 1, 2
CDC_ROW_KIND_COL = internal_column("cdc_row_kind")


def preimage_names(count: int) -> list[str]:
    """The columns that carry the target row as it was, for an update's ``update_preimage`` change row."""
    return [internal_column(f"preimage_{i}") for i in range(count)]


def generate_cdc_and_output_rows(
    df: DataFrame,
    output_cols: Sequence[Column],
    output_names: Sequence[str],
    target_cols: Sequence[Column],
    dedup_columns: Sequence[str] = (),
) -> DataFrame:
    """Delta's generateCdcAndOutputRows: an insert gives its data row and an ``insert`` change row, an update
    its data row, an ``update_postimage`` and an ``update_preimage`` (the target row as it was), a delete only
    its ``delete`` change row, any other row its data row. Rows with a NULL ``_change_type`` are the table's
    data; the others are change data. ``output_cols`` end with ROW_DROPPED_COL, ACTION_COL and
    _change_type; the output keeps that layout.

    Delta packs each joined row's output rows into an array of structs and explodes it twice. Here the
    joined row explodes a constant array of row kinds instead, and each output column picks its value by
    kind: no struct is built per row, and the generated code stays whole (measured 2.5x cheaper on top of
    a plain copy of 5M rows)."""
    names = [*output_names, ROW_DROPPED_COL, ACTION_COL, CDC_TYPE_COL]
    preimages = preimage_names(len(output_names))
    dedup = [F.col(c) for c in dedup_columns]
    projected = df.select(
        *[c.alias(n) for c, n in zip(output_cols, names, strict=True)],
        *[c.alias(n) for c, n in zip(target_cols, preimages, strict=True)],
        *dedup,
    )
    cdc_type = F.col(CDC_TYPE_COL)
    kinds = (
        F.when(cdc_type.eqNullSafe(CDC_TYPE_INSERT), F.array(F.lit(_DATA_ROW), F.lit(_CHANGE_ROW)))
        .when(
            cdc_type.eqNullSafe(CDC_TYPE_UPDATE_POSTIMAGE),
            F.array(F.lit(_DATA_ROW), F.lit(_CHANGE_ROW), F.lit(_PREIMAGE_ROW)),
        )
        .when(cdc_type.eqNullSafe(CDC_TYPE_DELETE), F.array(F.lit(_CHANGE_ROW)))
        .otherwise(F.array(F.lit(_DATA_ROW)))
    )
    exploded = projected.select("*", F.explode(kinds).alias(CDC_ROW_KIND_COL))
    kind = F.col(CDC_ROW_KIND_COL)
    preimage = kind == F.lit(_PREIMAGE_ROW)
    dropped = F.col(ROW_DROPPED_COL)
    rows = exploded.select(
        *[
            F.when(preimage, F.col(p)).otherwise(F.col(quote_identifier(n))).alias(n)
            for n, p in zip(output_names, preimages, strict=True)
        ],
        # A delete's change row is kept: the deleted row is dropped from the data only.
        F.when(preimage, F.lit(False))
        .when((kind == F.lit(_CHANGE_ROW)) & cdc_type.eqNullSafe(CDC_TYPE_DELETE), ~dropped)
        .otherwise(dropped)
        .alias(ROW_DROPPED_COL),
        F.when(preimage, action(COPY)).otherwise(F.col(ACTION_COL)).alias(ACTION_COL),
        F.when(kind == F.lit(_DATA_ROW), cdc_not_cdc())
        .when(preimage, F.lit(CDC_TYPE_UPDATE_PREIMAGE))
        .otherwise(cdc_type)
        .alias(CDC_TYPE_COL),
        *dedup,
    )
    if not dedup_columns:
        return rows
    return deduplicate_cdf_deletes(rows, dedup_columns)


def deduplicate_cdf_deletes(df: DataFrame, dedup_columns: Sequence[str]) -> DataFrame:
    """With the delete-only multiple-match exemption, a target row matched twice yields one delete row.
    Inserted rows carry their source row index instead; the two index ranges are disjoint (even / odd)."""
    if SOURCE_ROW_INDEX_COL in dedup_columns:
        df = df.withColumn(TARGET_ROW_INDEX_COL, F.coalesce(F.col(TARGET_ROW_INDEX_COL), F.col(SOURCE_ROW_INDEX_COL)))
    # Only change rows are de-duplicated: data rows are distinct rows by construction.
    key = F.when(F.col(CDC_TYPE_COL).isNull(), F.monotonically_increasing_id()).otherwise(F.lit(None))
    return (
        df.withColumn(DATA_ROW_KEY_COL, key)
        .dropDuplicates([TARGET_ROW_INDEX_COL, CDC_TYPE_COL, DATA_ROW_KEY_COL])
        .drop(TARGET_ROW_INDEX_COL, SOURCE_ROW_INDEX_COL, DATA_ROW_KEY_COL)
    )


def generate_inserts_only_output_cols(
    output_names: Sequence[str],
    output_fields: Sequence[StructField],
    not_matched: Sequence[ResolvedClause],
    lookups: dict[int, Column],
) -> list[Column]:
    """InsertOnlyMergeExecutor's output: the first insert clause that holds, else the row is dropped."""
    nulls = [F.lit(None).cast(f.dataType) for f in output_fields]
    names = [*output_names, ROW_DROPPED_COL, ACTION_COL]
    exprs = generate_clause_output_exprs(
        len(names), generate_all_action_exprs(nulls, not_matched, lookups), [*nulls, F.lit(True), action(DROP_SOURCE)]
    )
    return [e.alias(name) for e, name in zip(exprs, names, strict=True)]


def action_counts(codes: Sequence[str]) -> list[Column]:
    """Aggregates for ``observe``: how many output rows took each action."""
    return [F.count_if(F.col(ACTION_COL) == action(code)).alias(code) for code in codes]
