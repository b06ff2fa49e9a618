"""Column mapping against Delta on Spark: tables Delta wrote in ``name`` and ``id`` mode, with renamed, dropped
and re-added columns, a mapped partition column and nested struct fields, merged by the engine and by Delta's
own MERGE INTO on copies; rows compared as Delta and delta-rs read them, the engine's commit checked against
PROTOCOL.md's writer rules, and Delta's MERGE, DELETE and OPTIMIZE run on the engine's result."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder
from pyspark.sql import SparkSession

from engine import MergeClause, UpdateAction, run_merge
from tests.engine.harness import clause, upsert_all_spec, write_table
from tests.oracle.differential import (
    Side,
    assert_same,
    copy_sides,
    merge_sql,
    metric_differences,
    run_delta,
    run_engine,
)
from tests.oracle.tables import latest_version, log_actions, make_delta_table, table_ref

DDL = "id BIGINT, v STRING, gone STRING, s STRUCT<a: INT, b: STRING>, p STRING"
ROWS = [(i, f"v{i}", f"gone{i}", (i * 10, f"b{i}"), "x" if i % 2 else "y") for i in range(1, 9)]
RENAMES = [
    "ALTER TABLE {table} RENAME COLUMN v TO value",
    "ALTER TABLE {table} RENAME COLUMN s.a TO alpha",
    "ALTER TABLE {table} RENAME COLUMN p TO part",
    "ALTER TABLE {table} DROP COLUMN gone",
    # A new column under the dropped one's name: its physical name is new, the old data must stay unread.
    "ALTER TABLE {table} ADD COLUMNS (gone STRING)",
]
COLUMNS = ["id", "value", "gone", "s", "part"]
SOURCE = pa.table(
    {
        "id": pa.array([2, 3, 10, 11], pa.int64()),
        "value": pa.array(["V2", "V3", "v10", "v11"]),
        "gone": pa.array(["new2", None, "new10", None]),
        "s": pa.array(
            [{"alpha": 200, "b": "B2"}, {"alpha": 300, "b": "B3"}, {"alpha": 1000, "b": "b10"}, None],
            pa.struct([("alpha", pa.int32()), ("b", pa.string())]),
        ),
        "part": pa.array(["y", "y", "y", "x"]),
    }
)
CLAUSES = [
    clause("matched", "delete", "s.id = 3"),
    clause("matched", "update_all"),
    clause("notMatched", "insert_all"),
    clause("notMatchedBySource", "update", "t.id = 8", value="'untouched'"),
]


def _mapped_table(delta_spark: SparkSession, path: Path, mode: str, properties: dict[str, str] | None = None) -> Path:
    return make_delta_table(
        delta_spark,
        path,
        DDL,
        ROWS,
        properties={"delta.columnMapping.mode": mode, **(properties or {})},
        partitioned_by=["p"],
        then_sql=RENAMES,
    )


def _delta_rows(delta_spark: SparkSession, path: Path, columns: Sequence[str] = COLUMNS) -> list[tuple[Any, ...]]:
    """The table's rows as Delta on Spark reads them, structs as dicts, sorted by id."""
    names = ", ".join(f"`{c}`" for c in columns)
    got = delta_spark.sql(f"SELECT {names} FROM {table_ref(path)}").collect()
    return sorted(
        (tuple(v.asDict() if hasattr(v, "asDict") else v for v in r) for r in got), key=lambda r: str(r[0]).zfill(9)
    )


def _rs_rows(path: Path, columns: Sequence[str] = COLUMNS) -> list[tuple[Any, ...]]:
    """The table's rows as delta-rs reads them (its SQL reader honours column mapping)."""
    reader = QueryBuilder().register("t", DeltaTable(str(path))).execute("SELECT * FROM t")
    table = pa.RecordBatchReader.from_stream(reader).read_all()
    values = [table.column(c).to_pylist() for c in columns]
    return sorted(zip(*values, strict=True), key=lambda r: str(r[0]).zfill(9))


def _copies(tmp: Path, original: Path) -> tuple[Side, Side, Path]:
    return (*copy_sides(original, tmp / "theirs"), write_table(tmp / "source", SOURCE))


def _schema(path: Path) -> dict[str, Any]:
    metadata = [a["metaData"] for a in log_actions(path) if "metaData" in a]
    return json.loads(metadata[-1]["schemaString"])


def _physical_names(dtype: Any) -> set[str]:
    """Every physical name of a schema's fields, nested ones included."""
    names: set[str] = set()
    if isinstance(dtype, dict) and dtype.get("type") == "struct":
        for f in dtype["fields"]:
            names.add(f["metadata"]["delta.columnMapping.physicalName"])
            names |= _physical_names(f["type"])
    return names


def _stat_keys(stats: dict[str, Any]) -> set[str]:
    keys: set[str] = set()
    for kind in ("minValues", "maxValues", "nullCount"):
        stack = [stats.get(kind) or {}]
        while stack:
            node = stack.pop()
            for k, v in node.items():
                keys.add(k)
                if isinstance(v, dict):
                    stack.append(v)
    return keys


def _check_engine_commit(path: Path, version: int, mode: str) -> None:
    """PROTOCOL.md "Writer Requirements for Column Mapping" on the engine's commit."""
    schema = _schema(path)
    physical = _physical_names(schema)
    part = next(f for f in schema["fields"] if f["name"] == "part")["metadata"]
    actions = log_actions(path, version)
    adds = [a["add"] for a in actions if "add" in a]
    removes = [a["remove"] for a in actions if "remove" in a]
    assert adds and removes
    for action in adds + removes:
        assert list(action["partitionValues"]) == [part["delta.columnMapping.physicalName"]]
    ids = {
        f["metadata"]["delta.columnMapping.physicalName"]: f["metadata"]["delta.columnMapping.id"]
        for f in schema["fields"]
    }
    for add in adds:
        assert _stat_keys(json.loads(add["stats"])) <= physical
        footer = pq.read_schema(path / add["path"])
        assert set(footer.names) <= physical, footer.names
        assert {n: int(footer.field(n).metadata[b"PARQUET:field_id"]) for n in footer.names} == {
            n: ids[n] for n in footer.names
        }
    assert mode in ("name", "id")


def _interop(delta_spark: SparkSession, ours: Path, theirs: Path) -> None:
    """Delta's MERGE, DELETE and OPTIMIZE on the engine's result, and the same on Delta's: same rows after."""
    follow_up = [
        clause("matched", "update", None, value="concat(t.value, '!')"),
        clause("notMatched", "insert_all"),
    ]
    extra = write_table(
        ours.parent / "extra",
        pa.table(
            {
                "id": pa.array([1, 20], pa.int64()),
                "value": pa.array(["x1", "v20"]),
                "gone": pa.array([None, "g20"]),
                "s": pa.array([None, {"alpha": 7, "b": "b20"}], pa.struct([("alpha", pa.int32()), ("b", pa.string())])),
                "part": pa.array(["x", "y"]),
            }
        ),
    )
    for path in (ours, theirs):
        delta_spark.sql(merge_sql(path, extra, "t.id = s.id", follow_up)).collect()
        delta_spark.sql(f"DELETE FROM {table_ref(path)} WHERE id = 4").collect()
        delta_spark.sql(f"OPTIMIZE {table_ref(path)}").collect()
    assert _delta_rows(delta_spark, ours) == _delta_rows(delta_spark, theirs)


def _merge_both(
    spark: SparkSession, delta_spark: SparkSession, ours: Side, theirs: Side, source: Path, clauses: list[MergeClause]
) -> None:
    run_engine(spark, ours, source, "t.id = s.id", clauses, ())
    run_delta(delta_spark, theirs, source, "t.id = s.id", clauses)
    assert ours.error is None and theirs.error is None, (ours.error, theirs.error)
    assert ours.result == theirs.result
    assert ours.version == theirs.version
    assert ours.metrics is not None and theirs.metrics is not None
    assert not metric_differences(ours.metrics, theirs.metrics)


@pytest.mark.parametrize("mode", ["name", "id"])
def test_renamed_and_dropped_columns_merge_as_delta_does(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, mode: str
) -> None:
    original = _mapped_table(delta_spark, tmp_path / "ours", mode)
    before = _delta_rows(delta_spark, original)
    assert all(r[2] is None for r in before)  # the dropped column's data stays in the files, unread
    ours, theirs, source = _copies(tmp_path, original)

    _merge_both(spark, delta_spark, ours, theirs, source, CLAUSES)

    expected = _delta_rows(delta_spark, theirs.path)
    assert _delta_rows(delta_spark, ours.path) == expected
    assert ("new2" in {r[2] for r in expected}) and {r[0] for r in expected} >= {10, 11}
    if mode == "name":
        # delta-rs reads name-mode tables; its id-mode reads disagree with Delta (deltalake 1.6 matches by name).
        assert _rs_rows(ours.path) == _rs_rows(theirs.path)
    assert ours.version is not None
    _check_engine_commit(ours.path, ours.version, mode)
    _interop(delta_spark, ours.path, theirs.path)


def test_change_data_feed_and_deletion_vectors_on_a_mapped_table(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path
) -> None:
    """Delta's own deletion vectors on a mapped table with Change Data Feed: the engine's row-index reads go
    through physical names, and its change files hold physical names as Delta's do, so Delta's table_changes
    reads both sides alike."""
    original = make_delta_table(
        delta_spark,
        tmp_path / "ours",
        DDL,
        ROWS,
        properties={
            "delta.columnMapping.mode": "name",
            "delta.enableDeletionVectors": "true",
            "delta.enableChangeDataFeed": "true",
        },
        partitioned_by=["p"],
        then_sql=[*RENAMES, "DELETE FROM {table} WHERE id IN (5, 6)"],
    )
    assert any(a["add"].get("deletionVector") for a in log_actions(original) if "add" in a)
    ours, theirs, source = _copies(tmp_path, original)
    _merge_both(spark, delta_spark, ours, theirs, source, CLAUSES)
    assert _delta_rows(delta_spark, ours.path) == _delta_rows(delta_spark, theirs.path)

    def changes(side: Side) -> list[tuple[Any, ...]]:
        got = delta_spark.sql(
            f"SELECT id, value, gone, s, part, _change_type FROM table_changes_by_path('{side.path}', {side.version})"
        ).collect()
        return sorted((tuple(v.asDict() if hasattr(v, "asDict") else v for v in r) for r in got), key=str)

    assert changes(ours) == changes(theirs)
    assert ours.version is not None
    cdc = [a["cdc"] for a in log_actions(ours.path, ours.version) if "cdc" in a]
    assert cdc
    physical = _physical_names(_schema(ours.path))
    for action in cdc:
        names = set(pq.read_schema(ours.path / action["path"]).names)
        assert names - {"_change_type"} <= physical, names
    _interop(delta_spark, ours.path, theirs.path)


def test_schema_evolution_on_an_id_mode_table(spark: SparkSession, delta_spark: SparkSession, tmp_path: Path) -> None:
    """New columns get new physical names and ids and raise maxColumnId; Delta, which reads id-mode files by
    field id, reads the new column and deletes and optimizes the result. (name mode: test_column_mapping in
    tests/engine/delta, read back by delta-rs.)"""
    original = _mapped_table(delta_spark, tmp_path / "t", "id")
    max_before = int(_last_configuration(original)["delta.columnMapping.maxColumnId"])
    source = write_table(tmp_path / "source", SOURCE.append_column("added", pa.array([1.5, 2.5, 3.5, 4.5])))
    spec = upsert_all_spec(original, source, schema_evolution=True)
    version = run_merge(spark, spec).table_version
    assert version == latest_version(original)
    schema = _schema(original)
    added = next(f for f in schema["fields"] if f["name"] == "added")["metadata"]
    assert added["delta.columnMapping.id"] == max_before + 1
    assert added["delta.columnMapping.physicalName"].startswith("col-")
    assert int(_last_configuration(original)["delta.columnMapping.maxColumnId"]) == max_before + 1
    got = {r[0]: r[1] for r in _delta_rows(delta_spark, original, ["id", "added"])}
    assert got[10] == 3.5 and got[2] == 1.5 and got[1] is None
    delta_spark.sql(f"DELETE FROM {table_ref(original)} WHERE added > 3").collect()
    delta_spark.sql(f"OPTIMIZE {table_ref(original)}").collect()
    assert {r[0] for r in _delta_rows(delta_spark, original, ["id", "added"])} == {1, 2, 3, 4, 5, 6, 7, 8}


def _last_configuration(path: Path) -> dict[str, str]:
    metadata = [a["metaData"] for a in log_actions(path) if "metaData" in a]
    return dict(metadata[-1]["configuration"])


ODD_NAMES_DDL = "`my id` BIGINT, `p q` STRING, `c.d` INT, `e,f` STRING, `g=h` DOUBLE, `(x);{y}` INT, `_z` INT"
ODD_NAMES = ["my id", "p q", "c.d", "e,f", "g=h", "(x);{y}", "_z"]
"""Names Delta accepts only under column mapping (a space, a dot, a comma, ``=``, brackets and ``;``), one of
them the partition column, and one with a leading underscore."""


@pytest.mark.parametrize("deletion_vectors", [False, True])
def test_names_only_column_mapping_allows_merge_as_delta_does(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, deletion_vectors: bool
) -> None:
    properties = {"delta.columnMapping.mode": "name"}
    if deletion_vectors:
        properties["delta.enableDeletionVectors"] = "true"
    rows = [(i, ["a b", "c=d", None][i % 3], i, f"v{i}", i / 2, i, i) for i in range(12)]
    ours, theirs = copy_sides(
        make_delta_table(
            delta_spark, tmp_path / "ours", ODD_NAMES_DDL, rows, properties=properties, partitioned_by=["`p q`"]
        ),
        tmp_path / "theirs",
    )
    source_rows = [(i, ["a b", "new p", None][i % 3], i * 10, f"s{i}", 1.5, -i, 7) for i in range(6, 18)]
    source = make_delta_table(
        delta_spark, tmp_path / "source", ODD_NAMES_DDL, source_rows, properties={"delta.columnMapping.mode": "name"}
    )
    clauses = [
        clause("matched", "delete", "s.`c.d` = 80"),
        MergeClause("matched", UpdateAction(set={"`e,f`": "s.`e,f`", "`g=h`": "t.`g=h` + s.`g=h`"}), "t.`(x);{y}` > 7"),
        clause("matched", "update_all"),
        clause("notMatched", "insert_all"),
        MergeClause("notMatchedBySource", UpdateAction(set={"`_z`": "t.`_z` + 100"}), "t.`my id` < 3"),
    ]
    on = "t.`my id` = s.`my id`"
    run_engine(spark, ours, source, on, clauses)
    run_delta(delta_spark, theirs, source, on, clauses)
    assert_same(delta_spark, ours, theirs, ODD_NAMES)
    assert ours.result == {
        "num_affected_rows": 15,
        "num_updated_rows": 8,
        "num_deleted_rows": 1,
        "num_inserted_rows": 6,
    }
