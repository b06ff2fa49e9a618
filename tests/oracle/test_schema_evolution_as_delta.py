"""Schema evolution checked against Delta on Spark, on copies of one table Delta created. Which source types an
existing column takes (Delta merges the schemas with Spark's implicit conversions: a string into a number, a date,
a timestamp or binary, the column keeping its type) and which it refuses (a boolean or binary into a number); and
what a column the merge adds keeps of the source column's metadata (its comment, CHAR or VARCHAR type and default,
none of the source table's own Delta keys) and of its type (every field nullable; no NULL type inside an array or
a map)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from engine import parse_merge_sql, run_merge
from engine.errors import SchemaMismatchError
from tests.oracle.differential import copy_sides
from tests.oracle.sql_cases import SqlCopies, sql_copies, sql_rows
from tests.oracle.tables import log_actions, make_delta_table, table_ref

STAR = "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
MAPPING_KEYS = ("delta.columnMapping.id", "delta.columnMapping.physicalName")
"""Column mapping's keys, which each writer assigns a physical name of its own for a new column."""

# (target type, a target value, source type, source values): the column keeps its type, the values cast
TAKEN: dict[str, tuple[str, str, str, str]] = {
    "string into int": ("INT", "1", "STRING", "'5', ' 7 ', NULL"),
    "string into decimal": ("DECIMAL(10, 2)", "1.5", "STRING", "'5.25', '-7', NULL"),
    "string into date": ("DATE", "DATE'2020-01-01'", "STRING", "'2021-02-03', '2022-12-31', NULL"),
    "string into timestamp without time zone": (
        "TIMESTAMP_NTZ",
        "TIMESTAMP_NTZ'2020-01-01 00:00:00'",
        "STRING",
        "'2021-02-03 04:05:06', '2022-12-31', NULL",
    ),
    "string into binary": ("BINARY", "X'01'", "STRING", "'ab', '', NULL"),
    "date into timestamp without time zone": (
        "TIMESTAMP_NTZ",
        "TIMESTAMP_NTZ'2020-01-01 00:00:00'",
        "DATE",
        "DATE'2021-02-03', DATE'2022-12-31', NULL",
    ),
    "double into int": ("INT", "1", "DOUBLE", "5.7, -7.2, NULL"),
    "array of strings into array of ints": (
        "ARRAY<INT>",
        "array(1)",
        "ARRAY<STRING>",
        "array('5', NULL), array(), NULL",
    ),
}

# (target type, source type, source value): Delta refuses to merge the schemas
REFUSED: dict[str, tuple[str, str, str]] = {
    "boolean into int": ("INT", "BOOLEAN", "true"),
    "string into boolean": ("BOOLEAN", "STRING", "'true'"),
    "binary into bigint": ("BIGINT", "BINARY", "X'07'"),
    "float into timestamp": ("TIMESTAMP", "FLOAT", "CAST(1.5 AS FLOAT)"),
}


@pytest.mark.parametrize("case", list(TAKEN))
def test_an_existing_column_takes_what_delta_converts_implicitly(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, case: str
) -> None:
    target_type, target_value, source_type, source_values = TAKEN[case]
    rows = ", ".join(f"({i}, {v})" for i, v in enumerate(_values(source_values), start=1))
    copies = sql_copies(
        delta_spark,
        tmp_path,
        (f"id BIGINT, c {target_type}", f"(1, {target_value}), (9, {target_value})"),
        (f"id BIGINT, c {source_type}", rows),
        STAR,
        schema_evolution=True,
    )
    copies.merged_alike(spark, delta_spark)
    assert _logged_schema(copies.ours) == _logged_schema(copies.theirs)
    assert [f["type"] for f in _logged_schema(copies.ours)["fields"]][1] == _schema_type(delta_spark, target_type)


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_type_delta_does_not_convert_implicitly_is_refused(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, case: str
) -> None:
    target_type, source_type, source_value = REFUSED[case]
    copies = sql_copies(
        delta_spark,
        tmp_path,
        (f"id BIGINT, c {target_type}", "(1, NULL)"),
        (f"id BIGINT, c {source_type}", f"(1, {source_value}), (2, {source_value})"),
        STAR,
        schema_evolution=True,
    )
    copies.refused_alike(
        spark, delta_spark, SchemaMismatchError, "Failed to merge fields 'c' and 'c'", "DELTA_FAILED_TO_MERGE_FIELDS"
    )


# (source DDL, its table properties, its rows (id, v, ...)): the new column n's metadata as Delta keeps it
ADDED: dict[str, tuple[str, dict[str, str] | None, str]] = {
    "comment": ("id BIGINT, v STRING, n INT COMMENT 'the n'", None, "(1, 'x', 10), (3, 'y', 30)"),
    "varchar": ("id BIGINT, v STRING, n VARCHAR(3)", None, "(1, 'x', 'ab'), (3, 'y', 'cde')"),
    "char": ("id BIGINT, v STRING, n CHAR(4)", None, "(1, 'x', 'ab'), (3, 'y', 'cd')"),
    "varchar in a struct": (
        "id BIGINT, v STRING, n STRUCT<a: VARCHAR(2), b: INT>",
        None,
        "(1, 'x', named_struct('a', 'ab', 'b', 1)), (3, 'y', named_struct('a', 'c', 'b', 2))",
    ),
    "default": (
        "id BIGINT, v STRING, n INT DEFAULT 5",
        {"delta.feature.allowColumnDefaults": "supported"},
        "(1, 'x', 10), (3, 'y', 30)",
    ),
    "generated, identity and mapped source": (
        "id BIGINT, v STRING, n BIGINT GENERATED ALWAYS AS (id * 3), "
        "i BIGINT GENERATED ALWAYS AS IDENTITY COMMENT 'kept'",
        {"delta.columnMapping.mode": "name"},
        "(1, 'x'), (3, 'y')",
    ),
}


@pytest.mark.parametrize("case", list(ADDED))
@pytest.mark.parametrize("mapped", [False, True], ids=["target plain", "target column-mapped"])
def test_an_added_column_keeps_the_source_metadata_delta_keeps(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, case: str, mapped: bool
) -> None:
    source_ddl, source_properties, source_rows = ADDED[case]
    properties = {"delta.columnMapping.mode": "name"} if mapped else None
    target = make_delta_table(
        delta_spark,
        tmp_path / "ours",
        "id BIGINT, v STRING",
        properties=properties,
        then_sql=["INSERT INTO {table} VALUES (1, 'a'), (2, 'b')"],
    )
    source = make_delta_table(
        delta_spark,
        tmp_path / "source",
        source_ddl,
        properties=source_properties,
        then_sql=[
            f"INSERT INTO {{table}} (id, v{', n' if 'GENERATED' not in source_ddl else ''}) VALUES {source_rows}"
        ],
    )
    ours, theirs = (side.path for side in copy_sides(target, tmp_path / "theirs"))
    merge = f"MERGE WITH SCHEMA EVOLUTION INTO {{t}} AS t USING {table_ref(source)} AS s ON t.id = s.id {STAR}"
    run_merge(spark, parse_merge_sql(merge.format(t=table_ref(ours))))
    delta_spark.sql(merge.format(t=table_ref(theirs))).collect()
    assert _logged_schema(ours) == _logged_schema(theirs)
    assert sql_rows(delta_spark, ours) == sql_rows(delta_spark, theirs)
    # The kept metadata acts on later writes alike: the default fills an INSERT that names no value for it.
    later = (
        "MERGE INTO {t} AS t USING (SELECT 5 AS id, 'z' AS v) AS s ON t.id = s.id "
        "WHEN NOT MATCHED THEN INSERT (id, v) VALUES (s.id, s.v)"
    )
    run_merge(spark, parse_merge_sql(later.format(t=table_ref(ours))))
    delta_spark.sql(later.format(t=table_ref(theirs))).collect()
    assert sql_rows(delta_spark, ours) == sql_rows(delta_spark, theirs)


def _values(text: str) -> list[str]:
    """The comma-separated SQL values of ``text``, commas inside parentheses kept."""
    values, depth, current = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            values.append(current.strip())
            current = ""
            continue
        depth += {"(": 1, ")": -1}.get(ch, 0)
        current += ch
    return [*values, current.strip()]


def _schema_type(delta_spark: SparkSession, ddl_type: str) -> Any:
    """The schemaString type Delta logs for a DDL type."""
    return json.loads(delta_spark.createDataFrame([], f"c {ddl_type}").schema.json())["fields"][0]["type"]


def _logged_schema(path: Path) -> dict[str, Any]:
    """The table's schema as its last metadata action logs it, column mapping's per-writer keys left out."""
    metadata = [a["metaData"] for a in log_actions(path) if "metaData" in a][-1]
    return dict(_without_mapping_keys(json.loads(metadata["schemaString"])))


def _without_mapping_keys(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_mapping_keys(v) for k, v in node.items() if k not in MAPPING_KEYS}
    if isinstance(node, list):
        return [_without_mapping_keys(v) for v in node]
    return node


# A query as the source: (its SELECT, Delta's error class or None)
QUERIES: dict[str, tuple[str, str | None]] = {
    "a NULL column": ("SELECT 1L AS id, 'x' AS v, NULL AS n UNION ALL SELECT 3L, 'y', NULL", None),
    "a struct of a literal and a NULL": ("SELECT 1L AS id, 'x' AS v, named_struct('a', 1, 'b', NULL) AS n", None),
    "an array of NULLs": (
        "SELECT 3L AS id, 'x' AS v, array(NULL) AS n",
        "DELTA_COMPLEX_TYPE_COLUMN_CONTAINS_NULL_TYPE",
    ),
    "a map to NULLs": (
        "SELECT 3L AS id, 'x' AS v, map('k', NULL) AS n",
        "DELTA_COMPLEX_TYPE_COLUMN_CONTAINS_NULL_TYPE",
    ),
}


@pytest.mark.parametrize("case", list(QUERIES))
def test_a_column_added_from_a_query_has_the_type_delta_gives_it(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, case: str
) -> None:
    """Every field of an added type is nullable, as Delta makes it (a literal's struct field is not, in the query);
    a NULL type is written as a column or a struct field, never inside an array or a map."""
    query, error_class = QUERIES[case]
    target = make_delta_table(
        delta_spark,
        tmp_path / "ours",
        "id BIGINT, v STRING",
        then_sql=["INSERT INTO {table} VALUES (1, 'a'), (2, 'b')"],
    )
    ours, theirs = (side.path for side in copy_sides(target, tmp_path / "theirs"))
    merge = f"MERGE WITH SCHEMA EVOLUTION INTO {{target}} AS t USING ({query}) AS s ON t.id = s.id {STAR}"
    copies = SqlCopies(ours, theirs, merge)
    if error_class is None:
        copies.merged_alike(spark, delta_spark)
        assert _logged_schema(ours) == _logged_schema(theirs)
        return
    copies.refused_alike(spark, delta_spark, SchemaMismatchError, error_class)
