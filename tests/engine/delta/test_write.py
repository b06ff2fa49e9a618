"""Writing data and change files with Spark: the files, their ``add`` actions and statistics, judged by
deltalake reading them back and by what deltalake writes itself for the same data."""

from __future__ import annotations

import datetime as dt
import json
import os
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from engine.delta import (
    AddCDCFile,
    Transaction,
    discard_write,
    load_snapshot,
    write_data_and_cdc_files,
    write_data_files,
)
from engine.delta.errors import InvalidWriteError, InvariantViolationError, WriteSchemaMismatchError
from engine.delta.stats import truncate_max_string, truncate_min_string
from engine.delta.write import CDC_PARTITION_COL, _list_written

from .util import sorted_rows, write_log_entry

UTC = dt.UTC


def _rows(ids: range) -> pa.Table:
    def maybe(i: int, value: object) -> object:
        return None if i % 4 == 1 else value

    return pa.table(
        {
            "id": pa.array(list(ids), pa.int64()),
            "small": pa.array([maybe(i, i % 100 - 50) for i in ids], pa.int16()),
            "amount": pa.array([maybe(i, Decimal(i) / 4) for i in ids], pa.decimal128(10, 2)),
            "big_amount": pa.array([maybe(i, Decimal(i) * 10**15) for i in ids], pa.decimal128(30, 4)),
            "ratio": pa.array([maybe(i, i * 1.5 - 7) for i in ids], pa.float64()),
            "name": pa.array([maybe(i, f"n{i:03d}-é") for i in ids]),
            "day": pa.array([maybe(i, dt.date(2023, 12, 25) + dt.timedelta(days=i)) for i in ids], pa.date32()),
            "at": pa.array(
                [
                    maybe(i, dt.datetime(2024, 1, 1, tzinfo=UTC) + dt.timedelta(hours=i, microseconds=999 * i))
                    for i in ids
                ],
                pa.timestamp("us", tz="UTC"),
            ),
            "local": pa.array(
                [maybe(i, dt.datetime(2024, 3, 1) + dt.timedelta(minutes=i, microseconds=1234 * i)) for i in ids],
                pa.timestamp("us"),
            ),
            "flag": pa.array([maybe(i, i % 3 == 0) for i in ids]),
            "info": pa.array(
                [maybe(i, {"k": i * 2, "tag": f"t{i % 5}"}) for i in ids],
                pa.struct([("k", pa.int32()), ("tag", pa.string())]),
            ),
        }
    )


def _commit_adds(snapshot: Any, adds: list[Any], operation: str = "WRITE") -> int:
    return Transaction(snapshot).commit(
        adds, operation=operation, operation_parameters={"mode": "Append"}, is_blind_append=True
    )


def _stats_by_column(table: Path) -> dict[str, Any]:
    actions = pa.table(DeltaTable(str(table)).get_add_actions(flatten=True)).to_pylist()
    assert len(actions) == 1
    return {k: v for k, v in actions[0].items() if k.startswith(("min.", "max.", "null_count.", "num_records"))}


def test_statistics_match_what_deltalake_writes(spark: SparkSession, lake: Path) -> None:
    data = _rows(range(0, 40))
    reference = lake / "by-deltalake"
    write_deltalake(str(reference), data)
    ours = lake / "by-us"
    DeltaTable.create(str(ours), data.schema)
    snapshot = load_snapshot(str(ours))
    df = spark.createDataFrame(data).withColumn("local", F.col("local").cast("timestamp_ntz"))
    adds = write_data_files(spark, df.coalesce(1), snapshot, write_id="w1")
    assert len(adds) == 1
    _commit_adds(snapshot, adds)

    expected, actual = _stats_by_column(reference), _stats_by_column(ours)
    # Delta (unlike delta-rs) writes no min/max for booleans, and a nullCount for every indexed column.
    for key in ("min.flag", "max.flag"):
        assert actual.get(key) is None and expected.pop(key) is not None
        actual.pop(key, None)
    # delta-rs leaves out some bounds (the max of a 30-digit decimal): those are checked against the data.
    for key, value in list(expected.items()):
        if value is None and actual.get(key) is not None:
            kind, _, column = key.partition(".")
            true_bound = (pc.min if kind == "min" else pc.max)(data.column(column)).as_py()
            assert actual.pop(key) == true_bound
            expected.pop(key)
    assert actual == expected
    assert sorted_rows(DeltaTable(str(ours)).to_pyarrow_table()) == sorted_rows(data)


def test_statistics_of_names_with_dots(spark: SparkSession, lake: Path) -> None:
    """A column ``a.b`` is not the field ``b`` of a column ``a``: its statistics (and those of a struct field
    named with a dot) describe its own values, so readers and data skipping see them."""
    data = pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "a.b": ["x", None, "z"],
            "s": pa.array(
                [{"f.g": 5, "h": 1}, {"f.g": 7, "h": None}, {"f.g": None, "h": 3}],
                pa.struct([("f.g", pa.int64()), ("h", pa.int64())]),
            ),
        }
    )
    table = lake / "dots"
    DeltaTable.create(str(table), data.schema)
    snapshot = load_snapshot(str(table))
    adds = write_data_files(spark, spark.createDataFrame(data).coalesce(1), snapshot, write_id="w1")
    _commit_adds(snapshot, adds)
    stats = adds[0].stats
    assert stats is not None
    assert stats.null_count == {"id": 0, "a.b": 1, "s": {"f.g": 1, "h": 1}}
    assert stats.min_values == {"id": 1, "a.b": "x", "s": {"f.g": 5, "h": 1}}
    assert stats.max_values == {"id": 3, "a.b": "z", "s": {"f.g": 7, "h": 3}}
    assert sorted_rows(DeltaTable(str(table)).to_pyarrow_table()) == sorted_rows(data)


def test_statistics_json_is_deltas_format(spark: SparkSession, lake: Path) -> None:
    data = pa.table(
        {
            "id": pa.array([2, 1], pa.int64()),
            "amount": pa.array([Decimal("10.50"), Decimal("-0.25")], pa.decimal128(6, 2)),
            "at": pa.array([dt.datetime(2024, 1, 1, 0, 0, 0, 123999, tzinfo=UTC), None], pa.timestamp("us", tz="UTC")),
            "day": pa.array([dt.date(2024, 2, 29), dt.date(1999, 12, 31)], pa.date32()),
            "name": ["b" * 40, "a\U0001f600"],
            "raw": [b"\x00", None],
            "tags": pa.array([[1, 2], None], pa.list_(pa.int64())),
        }
    )
    table = lake / "fmt"
    DeltaTable.create(str(table), data.schema)
    snapshot = load_snapshot(str(table))
    (add,) = write_data_files(spark, spark.createDataFrame(data).coalesce(1), snapshot, write_id="fmt-1")
    assert add.stats is not None
    assert json.loads(add.stats.to_json()) == {
        "numRecords": 2,
        "minValues": {
            "id": 1,
            "amount": -0.25,
            "at": "2024-01-01T00:00:00.123Z",
            "day": "1999-12-31",
            "name": "a\U0001f600",
        },
        "maxValues": {
            "id": 2,
            "amount": 10.5,
            "at": "2024-01-01T00:00:00.123Z",
            "day": "2024-02-29",
            "name": "b" * 32 + "\x7f",
        },
        "nullCount": {"id": 0, "amount": 0, "at": 1, "day": 0, "name": 0, "raw": 1},
    }
    assert '"amount":-0.25' in add.stats.to_json()  # decimals are JSON numbers, not strings
    assert add.data_change and add.size == os.path.getsize(add.absolute_path(snapshot.root))
    assert add.path.startswith("fmt-1/") and add.path.endswith(".parquet")


def test_string_truncation_follows_delta() -> None:
    assert truncate_min_string("a" * 40) == "a" * 32
    assert truncate_max_string("a" * 32) == "a" * 32
    assert truncate_max_string("a" * 40) == "a" * 32 + "\x7f"
    assert truncate_max_string("a" * 32 + "é" + "z") == "a" * 32 + "\U0010ffff"
    assert truncate_max_string("a" * 32 + "\U0010ffff" * 2 + "b") == "a" * 32 + "\U0010ffff" * 2 + "\x7f"
    assert truncate_max_string("a" * 31 + "\U0010ffff" * 40) is None
    for value in ["a" * 40, "a" * 32 + "é", "z" * 31 + "\U0010ffff" * 3 + "a"]:
        bound = truncate_max_string(value)
        assert bound is None or bound >= value


def test_partition_values_parsed_back_from_directories(spark: SparkSession, lake: Path) -> None:
    data = pa.table(
        {
            "id": pa.array(range(6), pa.int64()),
            "label": ["a b", "c:d/e", "100%", None, "ü=1", ""],
            "day": pa.array(
                [dt.date(2024, 1, 1), None, dt.date(2024, 1, 2), dt.date(2024, 1, 1), None, None], pa.date32()
            ),
            "at": pa.array(
                [
                    dt.datetime(2024, 1, 1, 1, 2, 3, 456789, tzinfo=UTC),
                    None,
                    dt.datetime(2024, 1, 1, tzinfo=UTC),
                    None,
                    None,
                    None,
                ],
                pa.timestamp("us", tz="UTC"),
            ),
            "n": pa.array([1, 2, None, -4, 5, 6], pa.int32()),
            "amount": pa.array([Decimal("1.50"), None, Decimal("-2.00"), None, None, None], pa.decimal128(5, 2)),
            "flag": pa.array([True, False, None, True, True, True]),
        }
    )
    table = lake / "parts"
    columns = ["label", "day", "at", "n", "amount", "flag"]
    DeltaTable.create(str(table), data.schema, partition_by=columns)
    snapshot = load_snapshot(str(table))
    adds = write_data_files(spark, spark.createDataFrame(data), snapshot, write_id="p1")
    values = sorted((a.partition_values for a in adds), key=lambda v: json.dumps(v, sort_keys=True))
    assert {
        "label": "a b",
        "day": "2024-01-01",
        "at": "2024-01-01 01:02:03.456789",
        "n": "1",
        "amount": "1.50",
        "flag": "true",
    } in values
    assert {"label": None, "day": "2024-01-01", "at": None, "n": "-4", "amount": None, "flag": "true"} in values
    _commit_adds(snapshot, adds)
    assert sorted_rows(DeltaTable(str(table)).to_pyarrow_table()) == sorted_rows(
        data.set_column(1, "label", pa.array(["a b", "c:d/e", "100%", None, "ü=1", None]))
    )


def test_not_null_columns_are_enforced(spark: SparkSession, lake: Path) -> None:
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("v", pa.string()),
            pa.field("s", pa.struct([pa.field("x", pa.int64(), nullable=False)])),
        ]
    )
    table = lake / "strict"
    DeltaTable.create(str(table), schema)
    snapshot = load_snapshot(str(table))
    ok = spark.sql(
        "SELECT 1L AS id, 'a' AS v, named_struct('x', 1L) AS s UNION ALL "
        "SELECT 2L, NULL, CAST(NULL AS STRUCT<x: BIGINT>)"
    )
    assert sum(a.stats.num_records for a in write_data_files(spark, ok, snapshot, write_id="ok") if a.stats) == 2
    bad_top = spark.sql("SELECT CAST(NULL AS BIGINT) AS id, 'a' AS v, named_struct('x', 1L) AS s")
    with pytest.raises(InvariantViolationError, match="id"):
        write_data_files(spark, bad_top, snapshot, write_id="bad1")
    bad_nested = spark.sql("SELECT 3L AS id, 'a' AS v, named_struct('x', CAST(NULL AS BIGINT)) AS s")
    with pytest.raises(InvariantViolationError, match=r"s\.x"):
        write_data_files(spark, bad_nested, snapshot, write_id="bad2")
    assert not (table / "bad1").exists() and not (table / "bad2").exists()


def _hand_made_table(path: Path, fields: list[dict[str, Any]], configuration: dict[str, str]) -> Path:
    """A table as Delta on Spark leaves it (field metadata deltalake cannot write), with no files yet."""
    write_log_entry(
        path,
        0,
        [
            {"protocol": {"minReaderVersion": 1, "minWriterVersion": 3}},
            {
                "metaData": {
                    "id": "c0ffee00-0000-4000-8000-000000000000",
                    "format": {"provider": "parquet", "options": {}},
                    "schemaString": json.dumps({"type": "struct", "fields": fields}),
                    "partitionColumns": [],
                    "configuration": configuration,
                    "createdTime": 0,
                }
            },
        ],
    )
    return path


def test_check_constraints_invariants_and_lengths_are_enforced(spark: SparkSession, lake: Path) -> None:
    fields = [
        {
            "name": "id",
            "type": "long",
            "nullable": True,
            "metadata": {"delta.invariants": json.dumps({"expression": {"expression": "id < 100"}})},
        },
        {"name": "Amount", "type": "long", "nullable": True, "metadata": {}},
        {"name": "code", "type": "string", "nullable": True, "metadata": {"__CHAR_VARCHAR_TYPE_STRING": "varchar(3)"}},
    ]
    table = _hand_made_table(lake / "rules", fields, {"delta.constraints.amount_pos": "amount > 0 AND id > 0"})
    snapshot = load_snapshot(str(table))
    ok = spark.sql("SELECT 1L AS id, 5L AS amount, 'abc' AS code UNION ALL SELECT 2L, 1L, NULL")
    assert sum(a.stats.num_records for a in write_data_files(spark, ok, snapshot, write_id="ok") if a.stats) == 2
    cases = [
        (
            "SELECT 3L AS id, -1L AS amount, 'a' AS code",
            "[DELTA_VIOLATE_CONSTRAINT_WITH_VALUES] CHECK constraint amount_pos (amount > 0 AND id > 0) "
            "violated by row "
            "with values:\n - Amount : -1\n - id : 3",
        ),
        # NULL breaks a CHECK constraint as false does.
        ("SELECT 3L AS id, CAST(NULL AS BIGINT) AS amount, 'a' AS code", "- Amount : null\n - id : 3"),
        (
            "SELECT 300L AS id, 1L AS amount, 'a' AS code",
            "CHECK constraint EXPRESSION(id < 100) (id < 100) violated by row with values:\n - id : 300",
        ),
        (
            "SELECT 4L AS id, 1L AS amount, 'abcd' AS code",
            '[DELTA_EXCEED_CHAR_VARCHAR_LIMIT] Value "abcd" exceeds char/varchar type length limitation. '
            "Failed check: ((code IS NULL) OR (length(code) <= 3)).",
        ),
    ]
    for i, (query, message) in enumerate(cases):
        with pytest.raises(InvariantViolationError) as raised:
            write_data_files(spark, spark.sql(query), snapshot, write_id=f"bad{i}")
        assert message in str(raised.value)
        assert "SQLSTATE" not in str(raised.value) and not (table / f"bad{i}").exists()
    # Change rows are not table rows: only the data rows of a CDF write are checked.
    rows = spark.sql(
        "SELECT 5L AS id, 1L AS amount, 'a' AS code, CAST(NULL AS STRING) AS _change_type UNION ALL "
        "SELECT 6L, -1L, 'long', 'update_preimage'"
    )
    adds, cdcs = write_data_and_cdc_files(spark, rows, snapshot, write_id="cdf")
    assert len(adds) == 1 and len(cdcs) == 1
    bad = spark.sql("SELECT 5L AS id, -1L AS amount, 'a' AS code, CAST(NULL AS STRING) AS _change_type")
    with pytest.raises(InvariantViolationError, match="amount_pos"):
        write_data_and_cdc_files(spark, bad, snapshot, write_id="cdf-bad")


def test_schema_checks_and_write_ids(spark: SparkSession, lake: Path) -> None:
    table = lake / "checked"
    DeltaTable.create(str(table), pa.schema([("id", pa.int64()), ("v", pa.string())]))
    snapshot = load_snapshot(str(table))
    with pytest.raises(WriteSchemaMismatchError, match="'v' is int"):
        write_data_files(spark, spark.sql("SELECT 1L AS id, 2 AS v"), snapshot, write_id="x1")
    with pytest.raises(WriteSchemaMismatchError, match="missing column 'v'"):
        write_data_files(spark, spark.sql("SELECT 1L AS id"), snapshot, write_id="x2")
    with pytest.raises(WriteSchemaMismatchError, match="unexpected column 'extra'"):
        write_data_files(spark, spark.sql("SELECT 1L AS id, 'a' AS v, 1 AS extra"), snapshot, write_id="x3")
    for bad in ["_hidden", ".dot", "a/b", "..", "", "_change_data"]:
        with pytest.raises(InvalidWriteError):
            write_data_files(spark, spark.sql("SELECT 1L AS id, 'a' AS v"), snapshot, write_id=bad)
    # Column order and case do not matter; the schema override adds a column (schema evolution).
    adds = write_data_files(spark, spark.sql("SELECT 'a' AS V, 1L AS ID"), snapshot, write_id="x4")
    assert adds[0].stats is not None and adds[0].stats.min_values == {"id": 1, "v": "a"}
    evolved = snapshot.metadata.with_schema(snapshot.spark_schema.add("added", "date")).schema
    adds = write_data_files(
        spark,
        spark.sql("SELECT 1L AS id, 'a' AS v, DATE'2024-01-01' AS added"),
        snapshot,
        write_id="x5",
        schema=evolved,
    )
    assert adds[0].stats is not None and adds[0].stats.max_values["added"] == dt.date(2024, 1, 1)
    with pytest.raises(InvalidWriteError, match="new write_id"):
        write_data_files(spark, spark.sql("SELECT 1L AS id, 'a' AS v"), snapshot, write_id="x4")
    assert any((table / "x4").rglob("*.parquet"))  # the earlier write's files are untouched
    discard_write(snapshot, "x4")
    discard_write(snapshot, "x5")
    assert not (table / "x4").exists() and not (table / "x5").exists()


def test_indexed_columns_follow_table_properties(spark: SparkSession, lake: Path) -> None:
    schema = pa.schema([("a", pa.int64()), ("s", pa.struct([("x", pa.int64()), ("y", pa.int64())])), ("b", pa.int64())])
    df = spark.sql("SELECT 1L AS a, named_struct('x', 2L, 'y', 3L) AS s, 4L AS b")
    first_two = lake / "two"
    DeltaTable.create(str(first_two), schema, configuration={"delta.dataSkippingNumIndexedCols": "2"})
    (add,) = write_data_files(spark, df, load_snapshot(str(first_two)), write_id="w")
    assert add.stats is not None
    assert add.stats.max_values == {"a": 1, "s": {"x": 2}} and add.stats.null_count == {"a": 0, "s": {"x": 0}}
    named = lake / "named"
    DeltaTable.create(str(named), schema, configuration={"delta.dataSkippingStatsColumns": "b,s.y"})
    (add,) = write_data_files(spark, df, load_snapshot(str(named)), write_id="w")
    assert add.stats is not None and add.stats.max_values == {"s": {"y": 3}, "b": 4}


def test_change_data_files_read_by_deltalake(spark: SparkSession, lake: Path) -> None:
    table = lake / "cdf"
    write_deltalake(
        str(table),
        pa.table({"id": pa.array([1, 2], pa.int64()), "p": ["a", "b"]}),
        partition_by=["p"],
        configuration={"delta.enableChangeDataFeed": "true"},
    )
    snapshot = load_snapshot(str(table))
    assert snapshot.cdf_enabled
    target = next(f for f in snapshot.files if f.partition_values["p"] == "a")
    changes = spark.sql("SELECT 1L AS id, 'a' AS p, 'delete' AS _change_type")
    adds, cdcs = write_data_and_cdc_files(spark, changes, snapshot, write_id="c1")
    assert adds == []  # only change rows: no data file
    assert [type(c) for c in cdcs] == [AddCDCFile]
    assert cdcs[0].path.startswith("_change_data/c1/p=a/") and cdcs[0].partition_values == {"p": "a"}
    assert not cdcs[0].data_change
    version = Transaction(snapshot).commit(
        [target.to_remove(), *cdcs], operation="DELETE", operation_parameters={"predicate": "id = 1"}
    )
    changes_read = DeltaTable(str(table)).load_cdf(starting_version=version, ending_version=version).read_all()
    rows = pa.table(changes_read).select(["id", "p", "_change_type", "_commit_version"]).to_pylist()
    assert rows == [{"id": 1, "p": "a", "_change_type": "delete", "_commit_version": version}]
    assert sorted_rows(DeltaTable(str(table)).to_pyarrow_table()) == [{"id": 2, "p": "b"}]


def test_data_and_change_rows_in_one_write(spark: SparkSession, lake: Path) -> None:
    """Delta's __is_cdc split: one Spark write gives data files under the write's folder and change files under
    _change_data/, each with its partition values, and no folder of its partition column is left."""
    table = lake / "cdf-one-pass"
    write_deltalake(
        str(table),
        pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["x", "y", "z"], "p": ["a", "b", "b"]}),
        partition_by=["p"],
        configuration={"delta.enableChangeDataFeed": "true"},
    )
    snapshot = load_snapshot(str(table))
    rows = spark.sql("""
        SELECT * FROM VALUES
          (1L, 'x', 'a', 'update_preimage'), (1L, 'x2', 'a', 'update_postimage'), (1L, 'x2', 'a', NULL),
          (2L, 'y', 'b', 'delete'), (3L, 'z', 'b', NULL), (4L, 'w', 'c', 'insert'), (4L, 'w', 'c', NULL)
        AS t(id, v, p, _change_type)""")
    adds, cdcs = write_data_and_cdc_files(spark, rows, snapshot, write_id="m1")
    assert sorted((a.partition_values["p"], a.stats.num_records) for a in adds) == [("a", 1), ("b", 1), ("c", 1)]
    assert all(a.path.startswith(f"m1/p={a.partition_values['p']}/") for a in adds)
    assert sorted(c.partition_values["p"] for c in cdcs) == ["a", "b", "c"]
    assert all(c.path.startswith(f"_change_data/m1/p={c.partition_values['p']}/") for c in cdcs)
    assert not [d for d in os.listdir(table / "m1") if d.startswith(CDC_PARTITION_COL)]
    assert not list((table / "_change_data" / "m1").glob(f"**/{CDC_PARTITION_COL}*"))
    version = Transaction(snapshot).commit(
        [*[f.to_remove() for f in snapshot.files], *adds, *cdcs],
        operation="MERGE",
        operation_parameters={"predicate": "id = id"},
    )
    assert sorted_rows(DeltaTable(str(table)).to_pyarrow_table()) == [
        {"id": 1, "v": "x2", "p": "a"},
        {"id": 3, "v": "z", "p": "b"},
        {"id": 4, "v": "w", "p": "c"},
    ]
    read = DeltaTable(str(table)).load_cdf(starting_version=version, ending_version=version).read_all()
    changes = sorted(tuple(r.values()) for r in pa.table(read).select(["id", "v", "p", "_change_type"]).to_pylist())
    assert changes == [
        (1, "x", "a", "update_preimage"),
        (1, "x2", "a", "update_postimage"),
        (2, "y", "b", "delete"),
        (4, "w", "c", "insert"),
    ]
    # A failed write leaves neither folder behind.
    bad = spark.sql("SELECT 'not a number' AS id, 'v' AS v, 'a' AS p, CAST(NULL AS STRING) AS _change_type")
    with pytest.raises(WriteSchemaMismatchError):
        write_data_and_cdc_files(spark, bad, load_snapshot(str(table)), write_id="m2")
    assert not (table / "m2").exists() and not (table / "_change_data" / "m2").exists()


def test_empty_input_writes_no_files(spark: SparkSession, lake: Path) -> None:
    table = lake / "none"
    DeltaTable.create(str(table), pa.schema([("id", pa.int64())]))
    snapshot = load_snapshot(str(table))
    empty = spark.range(0).select(F.col("id").cast("long"))
    assert write_data_files(spark, empty, snapshot, write_id="e") == []


def test_spark_written_merge_commit_round_trip(spark: SparkSession, lake: Path) -> None:
    """A MERGE-shaped commit of Spark-written files plus removes: deltalake reads it exactly (rows, schema,
    history and metrics), writes on top of it, checkpoints it; our scan then agrees with deltalake again."""
    from engine.delta import FILE_NAME_COL, ROW_INDEX_COL, scan_files, target_partitions

    table = lake / "round-trip"
    write_deltalake(
        str(table), _rows(range(0, 30)).append_column("part", pa.array(["a", "b", "c"] * 10)), partition_by=["part"]
    )
    snapshot = load_snapshot(str(table))
    touched = [f for f in snapshot.files if f.partition_values["part"] == "b"]
    scanned = scan_files(spark, snapshot, touched)
    rewritten = (
        scanned.where("id % 2 = 0")
        .withColumn("name", F.upper("name"))
        .drop(FILE_NAME_COL, ROW_INDEX_COL)
        .repartition(target_partitions(10_000))
    )
    inserted = spark.createDataFrame(_rows(range(100, 103)).append_column("part", pa.array(["d"] * 3))).withColumn(
        "local", F.col("local").cast("timestamp_ntz")
    )
    adds = write_data_files(spark, rewritten.unionByName(inserted), snapshot, write_id="merge-rt")
    assert {a.partition_values["part"] for a in adds} == {"b", "d"}
    metrics = {"numTargetRowsDeleted": "5", "numTargetRowsUpdated": "5", "numTargetRowsInserted": "3"}
    txn = Transaction(snapshot)
    txn.record_read(touched, "part = 'b'")
    version = txn.commit(
        [*(f.to_remove() for f in touched), *adds],
        operation="MERGE",
        operation_parameters={"predicate": '["t.id = s.id"]'},
        operation_metrics=metrics,
    )

    reference = DeltaTable(str(table))
    assert reference.version() == version
    assert [f.name for f in reference.schema().fields] == [f.name for f in snapshot.spark_schema.fields]
    history = reference.history(1)[0]
    assert history["operation"] == "MERGE" and history["operationMetrics"] == metrics
    expected = [
        dict(r, name=r["name"].upper() if r["part"] == "b" and r["name"] else r["name"])
        for r in sorted_rows(_rows(range(0, 30)).append_column("part", pa.array(["a", "b", "c"] * 10)))
        if r["part"] != "b" or r["id"] % 2 == 0
    ]
    expected += sorted_rows(_rows(range(100, 103)).append_column("part", pa.array(["d"] * 3)))
    assert sorted_rows(reference.to_pyarrow_table()) == sorted_rows(pa.Table.from_pylist(expected))

    write_deltalake(str(table), _rows(range(200, 202)).append_column("part", pa.array(["b", "e"])), mode="append")
    DeltaTable(str(table)).delete("id = 4")
    DeltaTable(str(table)).create_checkpoint()
    latest = load_snapshot(str(table))
    ours = scan_files(spark, latest, latest.files).drop(FILE_NAME_COL, ROW_INDEX_COL).toArrow()
    assert sorted_rows(ours) == sorted_rows(DeltaTable(str(table)).to_pyarrow_table())


def test_every_parquet_file_written_is_listed_or_the_write_is_refused(tmp_path: Path) -> None:
    """Partition folders of columns named ``_p`` are listed; a data file anywhere else (a hidden folder) would
    be left out of the commit, so the listing refuses rather than lose its rows."""
    written = tmp_path / "w1"
    for folder in ["_p=a", "_p=b+%2521"]:
        (written / folder).mkdir(parents=True)
        pq.write_table(pa.table({"x": [1]}), written / folder / "part-00000.parquet")
    (written / "_SUCCESS").write_text("")
    listed = _list_written(str(tmp_path), "w1", {"_p": T.StringType()}, "UTC")
    assert sorted((rel, values) for rel, _, values, _ in listed) == [
        ("w1/_p=a/part-00000.parquet", {"_p": "a"}),
        ("w1/_p=b+%2521/part-00000.parquet", {"_p": "b+%21"}),
    ]
    (written / "_temporary").mkdir()
    pq.write_table(pa.table({"x": [1]}), written / "_temporary" / "part-00001.parquet")
    with pytest.raises(InvalidWriteError, match=r"3 Parquet files .* 2 of them"):
        _list_written(str(tmp_path), "w1", {"_p": T.StringType()}, "UTC")
