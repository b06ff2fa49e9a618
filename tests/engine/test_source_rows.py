"""Inline rows converted to typed Arrow data, with errors that name the row and column."""

from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from engine import rows_to_arrow
from engine.errors import SourceError, SourceRowError


def test_values_convert_to_declared_types() -> None:
    table = rows_to_arrow(
        [
            {
                "id": "9007199254740993",
                "amount": "12.50",
                "ts": "2024-01-01T00:00:00Z",
                "d": "2024-01-02",
                "name": "a",
                "ok": True,
                "tags": ["x", None],
            },
            {"id": 2, "amount": 3, "ts": None, "d": None, "name": None, "ok": None},
        ],
        "id BIGINT, amount DECIMAL(10,2), ts TIMESTAMP, d DATE, name STRING, ok BOOLEAN, tags ARRAY<STRING>",
    )
    assert table.schema.field("amount").type == pa.decimal128(10, 2)
    assert table.column("id").to_pylist() == [9007199254740993, 2]
    assert table.column("amount").to_pylist() == [decimal.Decimal("12.50"), decimal.Decimal("3.00")]
    assert table.column("ts").to_pylist()[0] == dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    assert table.column("d").to_pylist() == [dt.date(2024, 1, 2), None]
    assert table.column("tags").to_pylist() == [["x", None], None]


@pytest.mark.parametrize(
    ("value", "column", "schema"),
    [
        ("abc", "id", "id BIGINT"),
        (2**63, "id", "id BIGINT"),
        ("123456789.123", "amount", "amount DECIMAL(5,2)"),
        ("yesterday", "ts", "ts TIMESTAMP"),
        (1.5, "n", "n INT"),
    ],
)
def test_a_value_that_does_not_convert_names_row_and_column(value: object, column: str, schema: str) -> None:
    with pytest.raises(SourceRowError) as info:
        rows_to_arrow([{column: None}, {column: value}], schema)
    assert info.value.row == 1
    assert info.value.column == column
    assert f"rows[1].{column}" in str(info.value)


def test_unknown_column_is_refused() -> None:
    with pytest.raises(SourceRowError) as info:
        rows_to_arrow([{"id": 1, "nope": 2}], "id BIGINT")
    assert info.value.column == "nope"


def test_bad_schema_is_a_source_error() -> None:
    with pytest.raises(SourceError, match="schema"):
        rows_to_arrow([{"id": 1}], "id BIGINT,,")


def test_types_are_inferred_without_a_schema() -> None:
    table = rows_to_arrow([{"id": 1, "name": "a", "nothing": None}], None)
    assert table.schema.field("id").type == pa.int64()
    assert table.schema.field("nothing").type == pa.string()


def test_not_null_in_the_schema_is_kept_and_enforced() -> None:
    table = rows_to_arrow([{"id": 1}], "id BIGINT NOT NULL, name STRING")
    assert not table.schema.field("id").nullable and table.schema.field("name").nullable
    for row in ({"id": None, "name": "z"}, {"name": "z"}):
        with pytest.raises(SourceRowError, match=r"rows\[1\]\.id: NULL in a NOT NULL column") as info:
            rows_to_arrow([{"id": 1}, row], "id BIGINT NOT NULL, name STRING")
        assert (info.value.row, info.value.column) == (1, "id")


@pytest.mark.parametrize(
    "text", ["2024-01-01 00:00:00+02:00", "2024-01-01T23:30:00-05:00", "2024-01-01T00:00:00Z", "2024-03-04 05:06:07"]
)
def test_a_timestamp_ntz_keeps_its_wall_clock_time_as_spark_casts_it(spark: SparkSession, text: str) -> None:
    """The same text as an inline row and in a SQL source's CAST lands as the same value."""
    (row,) = rows_to_arrow([{"ts": text}], "ts TIMESTAMP_NTZ").to_pylist()
    (cast,) = spark.sql(f"SELECT CAST('{text}' AS TIMESTAMP_NTZ) AS ts").collect()
    assert row["ts"] == cast["ts"]
