"""Assignments checked against Delta on Spark on copies of one table Delta created: struct fields paired by name
inside maps (keys and values), schema evolution of structs inside maps, UPDATE SET * under schema evolution of a
struct the source lacks fields of (Delta keeps the target's value of those fields), and schema evolution from
explicit assignments (a source column an UPDATE SET or INSERT names is added, a struct assigned whole evolves)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from engine import parse_merge_sql, run_merge
from tests.oracle.sql_cases import sql_copies, sql_rows
from tests.oracle.tables import commit_info, latest_version

UPSERT_STAR = "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
MAP_OF_STRUCTS = "id BIGINT, m MAP<STRING, STRUCT<a: INT, b: INT>>"
REORDERED_MAP = "id BIGINT, m MAP<STRING, STRUCT<b: INT, a: INT>>"
REORDERED_ROWS = "(1, map('k', named_struct('b', 20, 'a', 10))), (2, map('q', named_struct('b', 200, 'a', 100)))"

# (target DDL, target rows, source DDL, source rows, WITH SCHEMA EVOLUTION, clauses)
CASES: dict[str, tuple[str, str, str, str, bool, str]] = {
    "map value struct by name, SET": (
        MAP_OF_STRUCTS,
        "(1, map('k', named_struct('a', 1, 'b', 2)))",
        REORDERED_MAP,
        REORDERED_ROWS,
        False,
        "WHEN MATCHED THEN UPDATE SET m = s.m WHEN NOT MATCHED THEN INSERT (id, m) VALUES (s.id, s.m)",
    ),
    "map value struct by name, star": (
        MAP_OF_STRUCTS,
        "(1, map('k', named_struct('a', 1, 'b', 2)))",
        REORDERED_MAP,
        REORDERED_ROWS,
        False,
        UPSERT_STAR,
    ),
    "map key struct by name": (
        "id BIGINT, m MAP<STRUCT<x: INT, y: INT>, STRING>",
        "(1, map(named_struct('x', 1, 'y', 2), 'a'))",
        "id BIGINT, m MAP<STRUCT<y: INT, x: INT>, STRING>",
        "(1, map(named_struct('y', 20, 'x', 10), 'b')), (2, map(named_struct('y', 4, 'x', 3), 'c'))",
        False,
        UPSERT_STAR,
    ),
    "map value gains a field": (
        "id BIGINT, m MAP<STRING, STRUCT<a: INT>>",
        "(1, map('k', named_struct('a', 1))), (3, map('z', named_struct('a', 9)))",
        "id BIGINT, m MAP<STRING, STRUCT<a: INT, b: INT>>",
        "(1, map('k', named_struct('a', 2, 'b', 3))), (2, map('q', named_struct('a', 4, 'b', 5)))",
        True,
        UPSERT_STAR,
    ),
    "map value lacks a field": (
        MAP_OF_STRUCTS,
        "(1, map('k', named_struct('a', 1, 'b', 2)))",
        "id BIGINT, m MAP<STRING, STRUCT<a: INT>>",
        "(1, map('k', named_struct('a', 5))), (2, map('q', named_struct('a', 6)))",
        True,
        UPSERT_STAR,
    ),
    "map key gains a field": (
        "id BIGINT, m MAP<STRUCT<x: INT>, INT>",
        "(1, map(named_struct('x', 1), 1))",
        "id BIGINT, m MAP<STRUCT<x: INT, y: INT>, INT>",
        "(1, map(named_struct('x', 5, 'y', 6), 2))",
        True,
        UPSERT_STAR,
    ),
    "update star keeps fields the source lacks": (
        "id BIGINT, st STRUCT<a: INT, b: STRING>",
        "(1, named_struct('a', 1, 'b', 'x')), (2, named_struct('a', 2, 'b', 'y')), "
        "(3, CAST(NULL AS STRUCT<a: INT, b: STRING>))",
        "id BIGINT, st STRUCT<a: INT>",
        "(1, named_struct('a', 9)), (2, CAST(NULL AS STRUCT<a: INT>)), (3, named_struct('a', 7)), "
        "(4, named_struct('a', 8))",
        True,
        UPSERT_STAR,
    ),
    "update star keeps nested fields the source lacks": (
        "id BIGINT, st STRUCT<a: INT, inner: STRUCT<x: INT, y: STRING>, p: STRUCT<u: INT>>",
        "(1, named_struct('a', 1, 'inner', named_struct('x', 1, 'y', 'keep'), 'p', named_struct('u', 1)))",
        "id BIGINT, st STRUCT<inner: STRUCT<x: INT, z: INT>, p: STRUCT<u: INT>>",
        "(1, named_struct('inner', named_struct('x', 7, 'z', 8), 'p', CAST(NULL AS STRUCT<u: INT>)))",
        True,
        UPSERT_STAR,
    ),
    "update star with added and lacking fields": (
        "id BIGINT, st STRUCT<a: INT, b: STRING>",
        "(1, named_struct('a', 1, 'b', 'x')), (2, CAST(NULL AS STRUCT<a: INT, b: STRING>))",
        "id BIGINT, st STRUCT<a: INT, c: INT>",
        "(1, named_struct('a', 5, 'c', 6)), (2, named_struct('a', 7, 'c', 8))",
        True,
        "WHEN MATCHED THEN UPDATE SET *",
    ),
    "update star of a struct the source only widens stays whole": (
        "id BIGINT, st STRUCT<a: INT>",
        "(1, named_struct('a', 1)), (2, named_struct('a', 2))",
        "id BIGINT, st STRUCT<a: INT, c: INT>",
        "(1, CAST(NULL AS STRUCT<a: INT, c: INT>)), (2, named_struct('a', 3, 'c', 4))",
        True,
        "WHEN MATCHED THEN UPDATE SET *",
    ),
    "explicit UPDATE SET adds a source column": (
        "id BIGINT, v INT",
        "(1, 1), (2, 2)",
        "id BIGINT, v INT, w INT",
        "(1, 2, 3), (3, 4, 5)",
        True,
        "WHEN MATCHED THEN UPDATE SET w = s.w WHEN NOT MATCHED THEN INSERT (id, v) VALUES (s.id, s.v)",
    ),
    "explicit INSERT adds a source column": (
        "id BIGINT, v INT",
        "(1, 1)",
        "id BIGINT, v INT, w INT",
        "(1, 9, 9), (2, 4, 5)",
        True,
        "WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT (id, w) VALUES (s.id, s.w)",
    ),
    "explicit assignment of an expression adds the source's column": (
        "id BIGINT, v INT",
        "(1, 1)",
        "id BIGINT, v INT, w INT",
        "(1, 2, 3)",
        True,
        "WHEN MATCHED THEN UPDATE SET w = s.w * 10 + s.v",
    ),
    "explicit struct assignment gains the source's fields": (
        "id BIGINT, st STRUCT<a: INT>",
        "(1, named_struct('a', 1)), (2, named_struct('a', 2))",
        "id BIGINT, st STRUCT<a: INT, b: INT>",
        "(1, named_struct('a', 2, 'b', 3)), (3, named_struct('a', 4, 'b', 5))",
        True,
        "WHEN MATCHED THEN UPDATE SET st = s.st WHEN NOT MATCHED THEN INSERT (id, st) VALUES (s.id, s.st)",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_nested_structs_are_assigned_as_delta_assigns_them(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, case: str
) -> None:
    target_ddl, target_rows, source_ddl, source_rows, evolution, clauses = CASES[case]
    copies = sql_copies(
        delta_spark, tmp_path, (target_ddl, target_rows), (source_ddl, source_rows), clauses, schema_evolution=evolution
    )
    ours, theirs = copies.ours, copies.theirs
    run_merge(spark, parse_merge_sql(copies.merge_sql(ours)))
    delta_spark.sql(copies.merge_sql(theirs)).collect()
    assert sql_rows(delta_spark, ours) == sql_rows(delta_spark, theirs)
    ours_schema = delta_spark.read.format("delta").load(str(ours)).schema
    assert ours_schema == delta_spark.read.format("delta").load(str(theirs)).schema
    # Each clause's actionType in the commit is Delta's: a star clause's is update or insert.
    assert _action_types(theirs, "matchedPredicates") == ["update"]  # every case updates its matches
    for key in ("matchedPredicates", "notMatchedPredicates"):
        assert _action_types(ours, key) == _action_types(theirs, key), key


def _action_types(path: Path, key: str) -> list[str]:
    parameters = commit_info(path, latest_version(path))["operationParameters"]
    return [p["actionType"] for p in json.loads(parameters.get(key, "[]"))]
