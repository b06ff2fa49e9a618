"""How a source value is stored in a target column of another type, checked against Delta on Spark: Delta's MERGE
casts by the ANSI store assignment rules (numbers widened or narrowed with an overflow check, strings parsed,
timestamps to dates and back), pairs struct fields by name at any depth and in any case, ignores source columns
the target lacks unless schema evolution is on, and fails the merge on a value that does not fit. Each case runs
on copies of one table Delta created; both sides commit the same rows and schema, or both fail with the same
error class (an overflow with the same words, naming the column) and leave their table as it was."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from engine.errors import DataCastError
from tests.oracle.sql_cases import sql_copies

STAR = "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
OVERFLOW = "DELTA_CAST_OVERFLOW_IN_TABLE_WRITE"
"""Delta's error class for a value too large for the column it is stored in; both sides name the column."""

# (target DDL, target rows, source DDL, source rows, WITH SCHEMA EVOLUTION, clauses, the engine's error class)
CASES: dict[str, tuple[str, str, str, str, bool, str, str | None]] = {
    "array element struct gains a field": (
        "id BIGINT, a ARRAY<STRUCT<x: INT>>",
        "(1, array(named_struct('x', 1)))",
        "id BIGINT, a ARRAY<STRUCT<x: INT, y: INT>>",
        "(1, array(named_struct('x', 5, 'y', 6))), (2, array(named_struct('x', 7, 'y', 8)))",
        True,
        STAR,
        None,
    ),
    "array element struct by name": (
        "id BIGINT, a ARRAY<STRUCT<x: INT, y: INT>>",
        "(1, array(named_struct('x', 1, 'y', 2)))",
        "id BIGINT, a ARRAY<STRUCT<y: INT, x: INT>>",
        "(1, array(named_struct('y', 5, 'x', 6))), (2, array(named_struct('y', 7, 'x', 8)))",
        False,
        STAR,
        None,
    ),
    "array element struct lacks a field": (
        "id BIGINT, a ARRAY<STRUCT<x: INT, y: INT>>",
        "(1, array(named_struct('x', 1, 'y', 2)))",
        "id BIGINT, a ARRAY<STRUCT<x: INT>>",
        "(1, array(named_struct('x', 5))), (2, array(named_struct('x', 7)))",
        True,
        STAR,
        None,
    ),
    "int into bigint": ("id BIGINT, v BIGINT", "(1, 1)", "id BIGINT, v INT", "(1, 5), (2, 6)", False, STAR, None),
    "bigint into int ok": ("id BIGINT, v INT", "(1, 1)", "id BIGINT, v BIGINT", "(1, 5), (2, 6)", False, STAR, None),
    "bigint into int overflow": (
        "id BIGINT, v INT",
        "(1, 1)",
        "id BIGINT, v BIGINT",
        "(1, 5000000000)",
        False,
        STAR,
        OVERFLOW,
    ),
    "double into int overflow": (
        "id BIGINT, v INT",
        "(1, 1)",
        "id BIGINT, v DOUBLE",
        "(1, 5.0), (2, 1e10)",
        False,
        STAR,
        OVERFLOW,
    ),
    "NaN into int": (
        "id BIGINT, v INT",
        "(1, 1)",
        "id BIGINT, v DOUBLE",
        "(1, CAST('NaN' AS DOUBLE))",
        False,
        STAR,
        OVERFLOW,
    ),
    "inserted value overflows a named column": (
        "id BIGINT, `small-value` SMALLINT",
        "(1, 1)",
        "id BIGINT, v INT",
        "(1, 7), (2, 40000)",
        False,
        "WHEN MATCHED THEN UPDATE SET `small-value` = s.v "
        "WHEN NOT MATCHED THEN INSERT (id, `small-value`) VALUES (s.id, s.v)",
        OVERFLOW,
    ),
    "integer into a decimal too narrow": (
        "id BIGINT, v DECIMAL(4,1)",
        "(1, 1.5)",
        "id BIGINT, v INT",
        "(1, 999), (2, 1000)",
        False,
        STAR,
        OVERFLOW,
    ),
    "decimal rounded into one more integer digit": (
        "id BIGINT, v DECIMAL(3,0)",
        "(1, 1)",
        "id BIGINT, v DECIMAL(5,2)",
        "(1, 998.49), (2, 999.99)",
        False,
        STAR,
        OVERFLOW,
    ),
    "bigint into int, NULL and in range": (
        "id BIGINT, v INT",
        "(1, 1), (2, 2)",
        "id BIGINT, v BIGINT",
        "(1, NULL), (2, -2147483648), (3, 2147483647)",
        False,
        STAR,
        None,
    ),
    "string into int": (
        "id BIGINT, v INT",
        "(1, 1)",
        "id BIGINT, v STRING",
        "(1, '5'), (2, 'x')",
        False,
        STAR,
        "CAST_INVALID_INPUT",
    ),
    "double into int": ("id BIGINT, v INT", "(1, 1)", "id BIGINT, v DOUBLE", "(1, 5.7), (2, -2.5)", False, STAR, None),
    "decimal into double": (
        "id BIGINT, v DOUBLE",
        "(1, 1)",
        "id BIGINT, v DECIMAL(10,2)",
        "(1, 5.75)",
        False,
        STAR,
        None,
    ),
    "double into decimal": (
        "id BIGINT, v DECIMAL(5,2)",
        "(1, 1)",
        "id BIGINT, v DOUBLE",
        "(1, 5.755), (2, 1.005)",
        False,
        STAR,
        None,
    ),
    "decimal overflow": (
        "id BIGINT, v DECIMAL(5,2)",
        "(1, 1)",
        "id BIGINT, v DECIMAL(10,2)",
        "(1, 12345.67)",
        False,
        STAR,
        OVERFLOW,
    ),
    "timestamp into date": (
        "id BIGINT, v DATE",
        "(1, DATE'2020-01-01')",
        "id BIGINT, v TIMESTAMP",
        "(1, TIMESTAMP'2021-05-05 23:30:00')",
        False,
        STAR,
        None,
    ),
    "date into timestamp": (
        "id BIGINT, v TIMESTAMP",
        "(1, TIMESTAMP'2020-01-01 00:00:00')",
        "id BIGINT, v DATE",
        "(1, DATE'2021-05-05')",
        False,
        STAR,
        None,
    ),
    "timestamp_ntz into timestamp": (
        "id BIGINT, v TIMESTAMP",
        "(1, TIMESTAMP'2020-01-01 00:00:00')",
        "id BIGINT, v TIMESTAMP_NTZ",
        "(1, TIMESTAMP_NTZ'2021-05-05 10:00:00')",
        False,
        STAR,
        None,
    ),
    "int into string": ("id BIGINT, v STRING", "(1, 'a')", "id BIGINT, v INT", "(1, 5), (2, 6)", False, STAR, None),
    "bool into int": ("id BIGINT, v INT", "(1, 1)", "id BIGINT, v BOOLEAN", "(1, true)", False, STAR, None),
    "source column the target lacks, no evolution": (
        "id BIGINT, v INT",
        "(1, 1)",
        "id BIGINT, v INT, w INT",
        "(1, 5, 6), (2, 7, 8)",
        False,
        STAR,
        None,
    ),
    "case-insensitive names": (
        "id BIGINT, Val INT",
        "(1, 1)",
        "ID BIGINT, vAL INT",
        "(1, 5), (2, 6)",
        False,
        STAR,
        None,
    ),
    "case-insensitive evolution": (
        "id BIGINT, Val INT",
        "(1, 1)",
        "ID BIGINT, vAL INT, NewC STRING",
        "(1, 5, 'a'), (2, 6, 'b')",
        True,
        STAR,
        None,
    ),
    "struct field case": (
        "id BIGINT, st STRUCT<Ab: INT>",
        "(1, named_struct('Ab', 1))",
        "id BIGINT, st STRUCT<aB: INT>",
        "(1, named_struct('aB', 5)), (2, named_struct('aB', 6))",
        False,
        STAR,
        None,
    ),
    "struct by position SET": (
        "id BIGINT, st STRUCT<a: INT, b: INT>",
        "(1, named_struct('a', 1, 'b', 2))",
        "id BIGINT, st STRUCT<b: INT, a: INT>",
        "(1, named_struct('b', 5, 'a', 6))",
        False,
        "WHEN MATCHED THEN UPDATE SET t.st = s.st",
        None,
    ),
    "struct field set from a narrower type": (
        "id BIGINT, st STRUCT<a: BIGINT, b: INT>",
        "(1, named_struct('a', 1L, 'b', 2))",
        "id BIGINT, x INT",
        "(1, 9)",
        False,
        "WHEN MATCHED THEN UPDATE SET t.st.a = s.x",
        None,
    ),
    "evolution does not widen int without type widening": (
        "id BIGINT, v INT",
        "(1, 1)",
        "id BIGINT, v BIGINT",
        "(1, 5000000000)",
        True,
        STAR,
        OVERFLOW,
    ),
    "NULL literals": (
        "id BIGINT, v INT, w STRING",
        "(1, 1, 'a')",
        "id BIGINT",
        "(1), (2)",
        False,
        "WHEN MATCHED THEN UPDATE SET v = NULL WHEN NOT MATCHED THEN INSERT (id, v, w) VALUES (s.id, NULL, NULL)",
        None,
    ),
    "ON casts the source key": (
        "id BIGINT, v INT",
        "(1, 1), (2, 2)",
        "id STRING, v INT",
        "('1', 5), ('3', 6), ('x', 7)",
        False,
        "WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT (id, v) VALUES (s.id, s.v)",
        "CAST_INVALID_INPUT",
    ),
    "map value int->bigint": (
        "id BIGINT, m MAP<STRING, BIGINT>",
        "(1, map('a', 1L))",
        "id BIGINT, m MAP<STRING, INT>",
        "(1, map('b', 2)), (2, map('c', 3))",
        False,
        STAR,
        None,
    ),
    "array int->bigint": (
        "id BIGINT, a ARRAY<BIGINT>",
        "(1, array(1L))",
        "id BIGINT, a ARRAY<INT>",
        "(1, array(2)), (2, array(3, NULL))",
        False,
        STAR,
        None,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_source_values_are_stored_as_delta_stores_them(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, case: str
) -> None:
    target_ddl, target_rows, source_ddl, source_rows, evolution, clauses, error_class = CASES[case]
    copies = sql_copies(
        delta_spark, tmp_path, (target_ddl, target_rows), (source_ddl, source_rows), clauses, schema_evolution=evolution
    )
    ours, theirs = copies.ours, copies.theirs
    if error_class is None:
        copies.merged_alike(spark, delta_spark)
        schema = delta_spark.read.format("delta").load(str(ours)).schema
        assert schema == delta_spark.read.format("delta").load(str(theirs)).schema
        return
    ours_message, theirs_message = copies.refused_alike(spark, delta_spark, DataCastError, error_class)
    if error_class == OVERFLOW:
        words = re.search(r"Failed to write .* due to an overflow\.", theirs_message)
        assert words is not None and words.group(0) in ours_message
