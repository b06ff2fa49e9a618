"""A column's rules on tables Delta on Spark created (generated columns, CHECK constraints, NOT NULL, CHAR and
VARCHAR lengths, inside nested types too, defaults): the engine's merges against Delta's own MERGE INTO on copies.
Merges that keep every rule commit the same rows, generated values (a generated partition column among them),
defaults and metrics; merges that break one fail on both sides and leave both tables as they were."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from engine import InsertAction, MergeClause, UpdateAction
from engine.errors import InvariantViolationError, MergeResolutionError, MergeServiceEngineError
from tests.engine.harness import clause
from tests.oracle.differential import Side, assert_same, delta_made_copies, run_delta, run_engine
from tests.oracle.sql_cases import sql_copies
from tests.oracle.tables import latest_version, table_ref

DDL = (
    "id BIGINT NOT NULL, v STRING NOT NULL, amount INT, ts TIMESTAMP, "
    "d DATE GENERATED ALWAYS AS (CAST(ts AS DATE)), doubled INT GENERATED ALWAYS AS (amount * 2), "
    "code VARCHAR(3), tag CHAR(4), note STRING DEFAULT 'none'"
)
COLUMNS = ["id", "v", "amount", "ts", "d", "doubled", "code", "tag", "note"]
ROWS = ", ".join(f"({i}, 'v{i}', {i * 10}, TIMESTAMP'2026-01-0{1 + i % 3} 10:00:00')" for i in range(1, 9))
SOURCE_DDL = "id BIGINT, v STRING, amount INT, ts TIMESTAMP"
SOURCE_ROWS = ", ".join(
    [
        "(2, 's2', 25, TIMESTAMP'2026-02-01 00:30:00')",
        "(3, 's3', NULL, TIMESTAMP'2026-01-02 08:00:00')",
        "(5, 's5', 55, NULL)",
        "(20, 's20', 200, TIMESTAMP'2026-03-03 23:59:59')",
        "(21, 's21', 210, NULL)",
    ]
)


def _tables(delta_spark: SparkSession, tmp: Path, properties: dict[str, str]) -> tuple[Side, Side, Path]:
    return delta_made_copies(
        delta_spark,
        tmp,
        DDL,
        (SOURCE_DDL, SOURCE_ROWS),
        properties={"delta.feature.allowColumnDefaults": "supported", **properties},
        partitioned_by=["d"],
        then_sql=[
            f"INSERT INTO {{table}} (id, v, amount, ts) VALUES {ROWS}",
            "ALTER TABLE {table} ADD CONSTRAINT positive CHECK (amount > 0 OR amount IS NULL)",
        ],
    )


PROPERTIES = {
    "copy-on-write": {},
    "deletion-vectors": {"delta.enableDeletionVectors": "true"},
    "change-data-feed": {"delta.enableChangeDataFeed": "true"},
}

KEEPING = [
    clause("matched", "delete", "s.amount IS NULL"),
    clause("matched", "update", None, amount="s.amount", ts="s.ts", v="concat(t.v, s.v)", tag="'ab'"),
    MergeClause(
        "notMatched", InsertAction(values={"id": "s.id", "v": "s.v", "amount": "s.amount", "ts": "s.ts"}), None
    ),
    clause("notMatchedBySource", "update", "t.id = 1", amount="t.amount + 1"),
]


@pytest.mark.parametrize("properties", list(PROPERTIES))
def test_merges_that_keep_the_rules_match_delta(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, properties: str
) -> None:
    """Updates move rows between partitions of the generated column; inserts and updates get their generated
    values computed; the change feed and deletion vectors as each table asks."""
    ours, theirs, source = _tables(delta_spark, tmp_path, PROPERTIES[properties])
    run_engine(spark, ours, source, "t.id = s.id", KEEPING)
    run_delta(delta_spark, theirs, source, "t.id = s.id", KEEPING)
    assert ours.error is None and theirs.error is None
    assert ours.result == {"num_affected_rows": 6, "num_updated_rows": 3, "num_deleted_rows": 1, "num_inserted_rows": 2}
    assert_same(delta_spark, ours, theirs, COLUMNS, cdf=properties == "change-data-feed")


STAR = [clause("matched", "update_all"), clause("notMatched", "insert_all")]


def test_star_actions_with_a_source_lacking_the_generated_columns_are_refused_as_in_delta(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path
) -> None:
    """UPDATE SET * needs every target column in the source, generated ones too (Delta: unresolved ``d``)."""
    ours, theirs, source = _tables(delta_spark, tmp_path, {})
    engine_error, delta_error = _both(spark, delta_spark, ours, theirs, source, STAR)
    assert isinstance(engine_error, MergeResolutionError) and "`t`.`d`" in str(engine_error)
    assert "DELTA_MERGE_UNRESOLVED_EXPRESSION" in str(delta_error)


def _both(
    spark: SparkSession, delta_spark: SparkSession, ours: Side, theirs: Side, source: Path, clauses: list[MergeClause]
) -> tuple[MergeServiceEngineError | None, PySparkException | None]:
    """Both sides fail and leave their tables as they were, or both commit the same; each side's error."""
    engine_error: MergeServiceEngineError | None = None
    delta_error: PySparkException | None = None
    try:
        run_engine(spark, ours, source, "t.id = s.id", clauses)
    except MergeServiceEngineError as exc:
        engine_error = exc
    try:
        run_delta(delta_spark, theirs, source, "t.id = s.id", clauses)
    except PySparkException as exc:
        delta_error = exc
    assert (engine_error is None) == (delta_error is None), (engine_error, delta_error)
    if engine_error is not None:
        assert latest_version(ours.path) == ours.start_version
        assert latest_version(theirs.path) == theirs.start_version
    else:
        assert_same(delta_spark, ours, theirs, COLUMNS)
    return engine_error, delta_error


NOT_NULL = "DELTA_NOT_NULL_CONSTRAINT_VIOLATED"
CHECK = "DELTA_VIOLATE_CONSTRAINT_WITH_VALUES"
LENGTH = "DELTA_EXCEED_CHAR_VARCHAR_LIMIT"
BREAKING: dict[str, tuple[list[MergeClause], str, str]] = {
    "check constraint": ([clause("matched", "update", "s.id = 2", amount="-1")], CHECK, "CHECK constraint positive"),
    "varchar length": ([clause("matched", "update", "s.id = 2", code="'abcd'")], LENGTH, "length(code) <= 3"),
    "char length": ([clause("matched", "update", "s.id = 2", tag="s.v || 'xyz'")], LENGTH, "length(tag) <= 4"),
    "not null": ([clause("matched", "update", "s.id = 2", v="CAST(NULL AS STRING)")], NOT_NULL, "column: v."),
    "generated value set": (
        [clause("matched", "update", "s.id = 2", doubled="7")],
        CHECK,
        "Generated Column (doubled <=> (amount * 2))",
    ),
    "generated partition set": (
        [clause("matched", "update", "s.id = 2", d="DATE'2001-01-01'")],
        CHECK,
        "Generated Column (d <=> ",
    ),
    "inserted generated value": (
        [
            MergeClause(
                "notMatched",
                InsertAction(values={"id": "s.id", "v": "s.v", "amount": "s.amount", "ts": "s.ts", "doubled": "1"}),
                None,
            )
        ],
        CHECK,
        "Generated Column (doubled <=> (amount * 2))",
    ),
    "inserted null key": (
        [MergeClause("notMatched", InsertAction(values={"id": "CAST(NULL AS BIGINT)", "v": "s.v"}), "s.id = 20")],
        NOT_NULL,
        "column: id.",
    ),
}


@pytest.mark.parametrize("name", list(BREAKING))
def test_merges_that_break_a_rule_fail_as_in_delta(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, name: str
) -> None:
    """The engine's failure names Delta's error class and the rule, as Delta's does."""
    ours, theirs, source = _tables(delta_spark, tmp_path, {"delta.enableDeletionVectors": "true"})
    clauses, error_class, rule = BREAKING[name]
    engine_error, delta_error = _both(spark, delta_spark, ours, theirs, source, clauses)
    assert isinstance(engine_error, InvariantViolationError)
    assert str(engine_error).startswith(f"[{error_class}]") and rule in str(engine_error)
    assert error_class in str(delta_error) and rule in str(delta_error)


def test_an_update_that_sets_a_generated_column_to_its_own_value_commits_as_in_delta(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path
) -> None:
    ours, theirs, source = _tables(delta_spark, tmp_path, {"delta.enableDeletionVectors": "true"})
    clauses = [MergeClause("matched", UpdateAction(set={"amount": "s.amount", "doubled": "s.amount * 2"}), "s.id = 2")]
    assert _both(spark, delta_spark, ours, theirs, source, clauses) == (None, None)
    assert ours.result is not None and ours.result["num_updated_rows"] == 1


def test_the_default_keyword_takes_the_columns_default_where_delta_refuses_it(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path
) -> None:
    """An intended difference (docs/oracle.md): Delta 4.4's MERGE cannot resolve ``DEFAULT`` as a value; the engine
    gives the column its default, as Databricks documents MERGE doing."""
    ours, theirs, source = _tables(delta_spark, tmp_path, {})
    delta_spark.sql(f"UPDATE {table_ref(ours.path)} SET note = 'set', code = 'c'").collect()
    clauses = [
        MergeClause("matched", UpdateAction(set={"note": "DEFAULT", "code": "DEFAULT"}), "s.id = 2"),
        MergeClause("notMatched", InsertAction(values={"id": "s.id", "v": "s.v", "note": "DEFAULT"}), None),
    ]
    run_engine(spark, ours, source, "t.id = s.id", clauses)
    with pytest.raises(PySparkException, match="DELTA_MERGE_UNRESOLVED_EXPRESSION"):
        run_delta(delta_spark, theirs, source, "t.id = s.id", clauses)
    got = delta_spark.read.format("delta").load(str(ours.path)).where("id IN (1, 2, 20, 21)").orderBy("id").collect()
    expected = [(1, "set", "c"), (2, "none", None), (20, "none", None), (21, "none", None)]
    assert [(r.id, r.note, r.code) for r in got] == expected


NESTED_DDL = (
    "id BIGINT, s STRUCT<a: VARCHAR(2), b: INT>, arr ARRAY<VARCHAR(2)>, m MAP<STRING, VARCHAR(2)>, "
    "c STRUCT<x: CHAR(3)>, ac ARRAY<CHAR(3)>"
)
NESTED_SOURCE_DDL = (
    "id BIGINT, s STRUCT<a: STRING, b: INT>, arr ARRAY<STRING>, m MAP<STRING, STRING>, c STRUCT<x: STRING>, "
    "ac ARRAY<STRING>"
)
NESTED_ROW = (
    "({id}, named_struct('a', {a}, 'b', 1), array('x', {e}), map('k', {v}), named_struct('x', {x}), array({ae}))"
)
NESTED_FITTING = {"a": "'ab'", "e": "NULL", "v": "'yz'", "x": "'q'", "ae": "'r'"}
NESTED_BREAKING = {
    "struct field": ({"a": "'abc'"}, "((s.`a` IS NULL) OR (length(s.`a`) <= 2))"),
    "array element": (
        {"e": "'abc'"},
        "((arr IS NULL) OR forall(arr, lambdafunction(((namedlambdavariable() IS NULL) OR "
        "(length(namedlambdavariable()) <= 2)), namedlambdavariable())))",
    ),
    "map value": ({"v": "'abc'"}, "((map_values(m) IS NULL) OR forall(map_values(m), lambdafunction("),
    "char in a struct": ({"x": "'abcd'"}, "((c.`x` IS NULL) OR (length(c.`x`) <= 3))"),
    "char in an array": ({"ae": "'abcd'"}, "((ac IS NULL) OR forall(ac, lambdafunction("),
}


@pytest.mark.parametrize("name", [None, *NESTED_BREAKING], ids=["fitting", *NESTED_BREAKING])
def test_char_and_varchar_lengths_inside_nested_types_hold_as_in_delta(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, name: str | None
) -> None:
    """Delta checks every CHAR/VARCHAR inside structs, arrays and maps: a fitting merge commits the same rows on
    both sides; a value too long fails both with Delta's error class and the same failed check."""
    values, check = NESTED_BREAKING[name] if name is not None else ({}, None)
    rows = ", ".join(NESTED_ROW.format(id=i, **{**NESTED_FITTING, **(values if i == 3 else {})}) for i in (1, 2, 3))
    copies = sql_copies(
        delta_spark,
        tmp_path,
        (NESTED_DDL, NESTED_ROW.format(id=1, **NESTED_FITTING)),
        (NESTED_SOURCE_DDL, rows),
        "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
    )
    if check is None:
        copies.merged_alike(spark, delta_spark)
        return
    messages = copies.refused_alike(spark, delta_spark, InvariantViolationError, LENGTH)
    assert all(f"Failed check: {check}" in message for message in messages)
