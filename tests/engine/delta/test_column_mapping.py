"""Column mapping (modes ``name`` and ``id``): files hold physical names and field ids, the log keys partition
values and statistics by physical name, and the engine reads and writes logical names over them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder, write_deltalake
from pyspark.sql import SparkSession

from engine import run_merge
from engine.delta import Transaction, load_snapshot, scan_files
from engine.delta.column_mapping import assign_column_mapping, physical_name
from engine.errors import UnsupportedTableFeatureError
from tests.engine.delta.util import log_entries
from tests.engine.harness import clause, make_spec, upsert_all_spec, write_table

PHYSICAL = "delta.columnMapping.physicalName"
STRUCT = pa.struct([("a", pa.int64()), ("b", pa.string())])


def _target(path: Path, mode: str = "name") -> Path:
    data = pa.table(
        {
            "id": pa.array([1, 2, 3, 4], pa.int64()),
            "v": pa.array(["a", "b", "c", "d"]),
            "s": pa.array([{"a": i, "b": f"s{i}"} for i in range(1, 5)], STRUCT),
            "p": pa.array(["x", "y", "x", "y"]),
        }
    )
    write_deltalake(str(path), data, partition_by=["p"], configuration={"delta.columnMapping.mode": mode})
    return path


def _schema(path: Path) -> dict[str, Any]:
    metadata = [e["metaData"] for v in _versions(path) for e in log_entries(path, v) if "metaData" in e]
    return json.loads(metadata[-1]["schemaString"])


def _versions(path: Path) -> list[int]:
    return sorted(int(p.stem) for p in (path / "_delta_log").glob("*.json"))


def _physical(schema: dict[str, Any], name: str) -> str:
    field = next(f for f in schema["fields"] if f["name"] == name)
    return str(field["metadata"]["delta.columnMapping.physicalName"])


def _rows(path: Path) -> list[dict[str, Any]]:
    """The table's rows as delta-rs reads them: its SQL reader honours column mapping (its pyarrow dataset
    does not, and reads every mapped column as NULL)."""
    reader = QueryBuilder().register("t", DeltaTable(str(path))).execute("SELECT * FROM t")
    return sorted(pa.RecordBatchReader.from_stream(reader).read_all().to_pylist(), key=lambda r: r["id"])


def test_scan_presents_logical_names_over_physical_files(spark: SparkSession, lake: Path) -> None:
    path = _target(lake / "t")
    snapshot = load_snapshot(path)
    assert all(physical_name(f).startswith("col-") for f in snapshot.spark_schema.fields)
    scanned = scan_files(spark, snapshot, snapshot.files).collect()
    got = sorted((r.asDict(recursive=True) for r in scanned), key=lambda r: r["id"])
    assert [(r["id"], r["v"], r["s"], r["p"]) for r in got] == [(r["id"], r["v"], r["s"], r["p"]) for r in _rows(path)]
    # deltalake keys statistics by physical name; the snapshot by logical name, as data skipping asks.
    stats = [f.stats for f in snapshot.files]
    assert all(s is not None and s.value("min_values", ["s", "a"]) is not None for s in stats)
    assert {f.partition_values["p"] for f in snapshot.files} == {"x", "y"}


def test_merge_writes_physical_names_field_ids_and_keys(spark: SparkSession, lake: Path) -> None:
    path = _target(lake / "t")
    source_data = pa.table(
        {
            "id": pa.array([2, 5], pa.int64()),
            "v": pa.array(["B", "e"]),
            "s": pa.array([{"a": 20, "b": "u"}, {"a": 50, "b": "n"}], STRUCT),
            "p": pa.array(["y", "x"]),
        }
    )
    source = write_table(lake / "source", source_data)
    result = run_merge(
        spark,
        make_spec(path, source, "t.id = s.id", [clause("matched", "update_all"), clause("notMatched", "insert_all")]),
    )
    assert (result.result["num_updated_rows"], result.result["num_inserted_rows"]) == (1, 1)
    assert [(r["id"], r["v"], r["s"]["a"], r["p"]) for r in _rows(path)] == [
        (1, "a", 1, "x"),
        (2, "B", 20, "y"),
        (3, "c", 3, "x"),
        (4, "d", 4, "y"),
        (5, "e", 50, "x"),
    ]
    schema = _schema(path)
    p_physical, s_physical = _physical(schema, "p"), _physical(schema, "s")
    entries = log_entries(path, result.table_version)
    adds = [e["add"] for e in entries if "add" in e]
    removes = [e["remove"] for e in entries if "remove" in e]
    assert adds and removes
    for action in adds + removes:
        assert list(action["partitionValues"]) == [p_physical]
    struct_field = next(f for f in schema["fields"] if f["name"] == "s")
    a_physical = struct_field["type"]["fields"][0]["metadata"]["delta.columnMapping.physicalName"]
    for add in adds:
        stats = json.loads(add["stats"])
        assert set(stats["minValues"]) == {_physical(schema, "id"), _physical(schema, "v"), s_physical}
        assert a_physical in stats["minValues"][s_physical]
        footer = pq.ParquetFile(path / add["path"]).schema_arrow
        assert footer.names == [_physical(schema, n) for n in ("id", "v", "s")]
        ids = [int(footer.field(n).metadata[b"PARQUET:field_id"]) for n in footer.names]
        assert ids == [
            next(f for f in schema["fields"] if f["name"] == n)["metadata"]["delta.columnMapping.id"]
            for n in ("id", "v", "s")
        ]
        nested = footer.field(s_physical).type.field(0)
        assert nested.name == a_physical
        assert (
            int(nested.metadata[b"PARQUET:field_id"])
            == struct_field["type"]["fields"][0]["metadata"]["delta.columnMapping.id"]
        )


def test_schema_evolution_assigns_physical_names_and_ids(spark: SparkSession, lake: Path) -> None:
    path = _target(lake / "t")
    before = _schema(path)
    max_before = int(load_snapshot(path).configuration["delta.columnMapping.maxColumnId"])
    source_data = pa.table(
        {
            "id": pa.array([1, 9], pa.int64()),
            "extra": pa.array([10.5, 90.5]),
            "s": pa.array(
                [{"a": 7, "b": "q", "c": True}, {"a": 9, "b": "r", "c": False}],
                pa.struct([("a", pa.int64()), ("b", pa.string()), ("c", pa.bool_())]),
            ),
            "p": pa.array(["x", "y"]),
            "v": pa.array(["A", "i"]),
        }
    )
    source = write_table(lake / "source", source_data)
    spec = upsert_all_spec(path, source, schema_evolution=True)
    result = run_merge(spark, spec)
    after = _schema(path)
    metadata = next(e["metaData"] for e in log_entries(path, result.table_version) if "metaData" in e)
    configuration = metadata["configuration"]
    extra = next(f for f in after["fields"] if f["name"] == "extra")
    s_type = next(f for f in after["fields"] if f["name"] == "s")["type"]
    c = next(f for f in s_type["fields"] if f["name"] == "c")
    new_ids = {extra["metadata"]["delta.columnMapping.id"], c["metadata"]["delta.columnMapping.id"]}
    assert new_ids == {max_before + 1, max_before + 2}
    assert int(configuration["delta.columnMapping.maxColumnId"]) == max_before + 2
    assert extra["metadata"]["delta.columnMapping.physicalName"].startswith("col-")
    assert c["metadata"]["delta.columnMapping.physicalName"].startswith("col-")
    # Existing columns keep theirs.
    assert [_physical(after, n) for n in ("id", "v", "s", "p")] == [_physical(before, n) for n in ("id", "v", "s", "p")]
    rows = _rows(path)
    assert [(r["id"], r["v"], r["extra"], r["s"]["c"]) for r in rows] == [
        (1, "A", 10.5, True),
        (2, "b", None, None),
        (3, "c", None, None),
        (4, "d", None, None),
        (9, "i", 90.5, False),
    ]


def test_assignment_continues_from_max_column_id() -> None:
    from pyspark.sql import types as T

    schema = T.StructType(
        [
            T.StructField("a", T.LongType(), True, {"delta.columnMapping.id": 3, PHYSICAL: "x"}),
            T.StructField("n", T.ArrayType(T.StructType([T.StructField("e", T.LongType())]))),
        ]
    )
    assigned, max_id = assign_column_mapping(
        schema, {"delta.columnMapping.mode": "name", "delta.columnMapping.maxColumnId": "7"}
    )
    assert max_id == 9
    n = assigned["n"]
    assert n.metadata["delta.columnMapping.id"] == 8
    element = n.dataType.elementType  # type: ignore[attr-defined]
    assert element["e"].metadata["delta.columnMapping.id"] == 9
    assert assigned["a"].metadata == schema["a"].metadata
    assert assign_column_mapping(schema, {}) == (schema, None)


def test_unknown_mode_is_refused(lake: Path) -> None:
    path = _target(lake / "t")
    snapshot = load_snapshot(path)
    configuration = {**snapshot.configuration, "delta.columnMapping.mode": "position"}
    bad = dataclasses.replace(snapshot.metadata, configuration=configuration)
    with pytest.raises(UnsupportedTableFeatureError, match="column mapping mode"):
        Transaction(snapshot).commit([bad], operation="SET TBLPROPERTIES", operation_parameters={})
    assert _versions(path) == [0]


def test_id_mode_resolves_columns_by_field_id(spark: SparkSession, lake: Path) -> None:
    """In ``id`` mode a file's columns are found by Parquet field id, whatever they are named in the file."""
    path = lake / "t"
    write_deltalake(
        str(path),
        pa.table({"id": pa.array([1, 2], pa.int64()), "v": pa.array(["a", "b"])}),
        configuration={"delta.columnMapping.mode": "id"},
    )
    snapshot = load_snapshot(path)
    (add,) = snapshot.files
    stored = pq.read_table(snapshot.file_path(add))
    renamed = pa.schema(
        [f.with_name(f"written-by-another-engine-{i}") for i, f in enumerate(stored.schema)]
    )  # field ids kept in each field's metadata
    pq.write_table(pa.Table.from_arrays(stored.columns, schema=renamed), snapshot.file_path(add))
    assert all(b"PARQUET:field_id" in (f.metadata or {}) for f in pq.read_schema(snapshot.file_path(add)))
    got = sorted(tuple(r) for r in scan_files(spark, snapshot, snapshot.files, file_columns=False).collect())
    assert got == [(1, "a"), (2, "b")]
