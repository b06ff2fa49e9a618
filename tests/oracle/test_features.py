"""Tables Delta on Spark writes with a table feature, merged by the engine: the rows Delta reads afterwards are the
rows Delta's own MERGE gives on a copy of the same table, and Delta then runs MERGE, DELETE and OPTIMIZE on the
engine's result. The committed actions are checked against PROTOCOL.md's writer requirements for the feature."""

from __future__ import annotations

import datetime
import json
import shutil
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder
from pyspark.sql import SparkSession

from engine import MergeClause, MergeResult, run_merge
from engine.delta import load_snapshot
from tests.engine.harness import clause, make_spec, write_table
from tests.oracle.differential import merge_sql
from tests.oracle.tables import latest_version, log_actions, make_delta_table, table_ref


def delta_rows(delta_spark: SparkSession, path: Path, columns: str = "*") -> list[tuple[Any, ...]]:
    got = delta_spark.sql(f"SELECT {columns} FROM {table_ref(path)}").collect()
    return sorted((tuple(r) for r in got), key=lambda r: tuple((v is not None, str(v)) for v in r))


def merge_both(
    spark: SparkSession,
    delta_spark: SparkSession,
    tmp: Path,
    target: Path,
    source: pa.Table,
    on: str,
    clauses: Sequence[MergeClause],
    columns: str = "*",
    **spec: Any,
) -> MergeResult:
    """The engine's merge into ``target`` and Delta's into a copy; both tables read by Delta must agree (on
    ``columns``: VARIANT values compare by their JSON)."""
    theirs = tmp / f"{target.name}-delta"
    shutil.copytree(target, theirs)
    source_path = write_table(tmp / f"{target.name}-source", source)
    result = run_merge(spark, make_spec(target, source_path, on, clauses, **spec))
    delta_spark.sql(merge_sql(theirs, source_path, on, clauses)).collect()
    assert delta_rows(delta_spark, target, columns) == delta_rows(delta_spark, theirs, columns)
    return result


def delta_writes_on(delta_spark: SparkSession, path: Path, key: str = "id", update: str = "*") -> None:
    """Delta's own MERGE, DELETE and OPTIMIZE succeed on a table the engine wrote."""
    ref = table_ref(path)
    first = delta_spark.sql(f"SELECT * FROM {ref} LIMIT 1").collect()
    assert first, "the table is empty"
    delta_spark.sql(
        f"MERGE INTO {ref} t USING (SELECT * FROM {ref} LIMIT 1) s ON t.{key} = s.{key} "
        f"WHEN MATCHED THEN UPDATE SET {update}"
    ).collect()
    delta_spark.sql(f"DELETE FROM {ref} WHERE {key} = {first[0][key]!r}").collect()
    delta_spark.sql(f"OPTIMIZE {ref}").collect()
    delta_spark.sql(f"SELECT count(*) FROM {ref}").collect()


# --- v2Checkpoint -------------------------------------------------------------------------------------------------


def _drop_commits_before(path: Path, version: int) -> None:
    """Delta's metadata cleanup: commits older than a checkpoint go, so readers must start from the checkpoint."""
    for commit in (path / "_delta_log").glob("*.json"):
        if commit.stem.isdigit() and int(commit.stem) < version:
            commit.unlink()
    for crc in (path / "_delta_log").glob("*.crc"):
        crc.unlink()


def test_v2_checkpoint_with_sidecars_and_deletion_vectors(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path
) -> None:
    """A table whose newest checkpoint is UUID-named, its file actions in sidecars, and whose older commits are
    gone: the deletion vectors the snapshot needs are only in the sidecars."""
    path = make_delta_table(
        delta_spark,
        tmp_path / "v2",
        "id BIGINT, v STRING",
        properties={
            "delta.checkpointPolicy": "v2",
            "delta.checkpointInterval": "3",
            "delta.enableDeletionVectors": "true",
        },
        then_sql=[
            "INSERT INTO {table} SELECT id, concat('v', id) FROM range(0, 20, 1, 1)",
            "DELETE FROM {table} WHERE id IN (3, 4)",
            "INSERT INTO {table} SELECT id, concat('w', id) FROM range(20, 25, 1, 1)",
        ],
    )
    log = path / "_delta_log"
    checkpoints = sorted(p.name for p in log.iterdir() if ".checkpoint." in p.name and not p.name.startswith("."))
    assert checkpoints and all(len(n.split(".")) == 4 for n in checkpoints), checkpoints  # n.checkpoint.<uuid>.json
    assert list((log / "_sidecars").glob("*.parquet"))
    newest = int(checkpoints[-1][:20])
    _drop_commits_before(path, newest)

    snapshot = load_snapshot(path)
    assert sum(1 for f in snapshot.files if f.deletion_vector is not None) == 1
    source = pa.table({"id": pa.array([2, 3, 5, 30], pa.int64()), "v": ["x2", "x3", "x5", "x30"]})
    result = merge_both(
        spark,
        delta_spark,
        tmp_path,
        path,
        source,
        "t.id = s.id",
        [clause("matched", "update_all"), clause("notMatched", "insert_all")],
    )
    assert result.result["num_updated_rows"] == 2
    assert result.result["num_inserted_rows"] == 2  # 3 was deleted by the vector: it is inserted again
    delta_writes_on(delta_spark, path)


def test_checkpoints_the_engine_writes_on_a_v2_table_follow_the_v2_spec(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path
) -> None:
    """PROTOCOL.md "Checkpoints": with v2Checkpoint, no multi-part checkpoints; a V2-spec checkpoint holds a
    ``checkpointMetadata`` action. Delta reads the table from the engine's checkpoint alone."""
    path = make_delta_table(
        delta_spark,
        tmp_path / "v2w",
        "id BIGINT, v STRING",
        [(1, "a"), (2, "b")],
        properties={"delta.checkpointPolicy": "v2", "delta.checkpointInterval": "2"},
    )
    assert latest_version(path) == 1
    source = write_table(tmp_path / "src", pa.table({"id": pa.array([2, 3], pa.int64()), "v": ["B", "c"]}))
    result = run_merge(
        spark,
        make_spec(path, source, "t.id = s.id", [clause("matched", "update_all"), clause("notMatched", "insert_all")]),
    )
    assert result.table_version == 2
    written = [p for p in (path / "_delta_log").iterdir() if p.name.startswith(f"{2:020d}.checkpoint")]
    assert len(written) == 1, written
    (checkpoint,) = written
    table = pq.read_table(checkpoint)
    assert [m["version"] for m in table.column("checkpointMetadata").to_pylist() if m] == [2]
    _drop_commits_before(path, 2)
    assert delta_rows(delta_spark, path) == [(1, "a"), (2, "B"), (3, "c")]
    delta_writes_on(delta_spark, path)


# --- typeWidening -------------------------------------------------------------------------------------------------


def _schema(path: Path) -> dict[str, Any]:
    """The table schema of the newest metaData in the log."""
    meta = [a["metaData"] for a in log_actions(path) if "metaData" in a][-1]
    return {
        f["name"]: (f["type"], f["metadata"].get("delta.typeChanges"))
        for f in json.loads(meta["schemaString"])["fields"]
    }


def test_widened_columns_are_read_and_merged(spark: SparkSession, delta_spark: SparkSession, tmp_path: Path) -> None:
    """Files written before ALTER COLUMN ... TYPE keep the narrow types; the engine reads them as the wide ones,
    and data skipping does not trust their old-typed statistics."""
    path = make_delta_table(
        delta_spark,
        tmp_path / "widened",
        "id INT, n SMALLINT, f FLOAT, d DATE, p DECIMAL(5, 2)",
        properties={"delta.enableTypeWidening": "true", "delta.feature.timestampNtz": "supported"},
        then_sql=[
            "INSERT INTO {table} SELECT CAST(id AS INT), CAST(id AS SMALLINT), CAST(id AS FLOAT) / 4, "
            "date_add(DATE'2020-01-01', CAST(id AS INT)), CAST(id AS DECIMAL(5, 2)) / 8 FROM range(0, 10, 1, 1)",
            "ALTER TABLE {table} ALTER COLUMN id TYPE BIGINT",
            "ALTER TABLE {table} ALTER COLUMN n TYPE INT",
            "ALTER TABLE {table} ALTER COLUMN f TYPE DOUBLE",
            "ALTER TABLE {table} ALTER COLUMN d TYPE TIMESTAMP_NTZ",
            "ALTER TABLE {table} ALTER COLUMN p TYPE DECIMAL(10, 4)",
            "INSERT INTO {table} VALUES (3000000000, 100000, 0.1, TIMESTAMP_NTZ'2021-01-01 10:00:00', 123456.1234)",
        ],
    )
    assert _schema(path)["id"] == ("long", [{"fromType": "integer", "toType": "long"}])
    source = pa.table(
        {
            "id": pa.array([2, 5, 3000000000, 11], pa.int64()),
            "n": pa.array([70000, 7, 8, 9], pa.int32()),
            "f": pa.array([1e300, 0.5, 0.25, 0.125], pa.float64()),
            "d": pa.array([datetime.datetime(2020, 1, 3, 6), None, None, datetime.datetime(2022, 1, 1)]),
            "p": pa.array([Decimal("99999.5"), None, Decimal("1.0001"), None], pa.decimal128(10, 4)),
        }
    )
    # Matched only, its condition on the widened date: data skipping would use the old-typed statistics.
    merge_both(
        spark,
        delta_spark,
        tmp_path,
        path,
        source,
        "t.id = s.id",
        [clause("matched", "update_all", "t.d >= TIMESTAMP_NTZ'2020-01-03 00:00:00'")],
    )
    result = merge_both(
        spark,
        delta_spark,
        tmp_path / "second",
        path,
        source,
        "t.id = s.id",
        [clause("matched", "update_all"), clause("notMatched", "insert_all")],
    )
    assert result.result["num_inserted_rows"] == 1
    delta_writes_on(delta_spark, path)


def test_schema_evolution_widens_types_as_delta_does(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path
) -> None:
    """With ``delta.enableTypeWidening``, MERGE WITH SCHEMA EVOLUTION widens a column to the source's wider type
    (int -> bigint, float -> double, date -> timestamp_ntz, decimal precision) and records delta.typeChanges."""
    path = make_delta_table(
        delta_spark,
        tmp_path / "evolve",
        "id INT, n INT, f FLOAT, d DATE, p DECIMAL(5, 2), s STRING",
        [(1, 1, 1.5, datetime.date(2020, 1, 1), Decimal("1.25"), "a"), (2, 2, 2.5, None, None, "b")],
        properties={"delta.enableTypeWidening": "true", "delta.feature.timestampNtz": "supported"},
    )
    theirs = tmp_path / "evolve-delta"
    shutil.copytree(path, theirs)
    source = write_table(
        tmp_path / "evolve-source",
        pa.table(
            {
                "id": pa.array([2, 3], pa.int64()),
                "n": pa.array([5_000_000_000, 3], pa.int64()),
                "f": pa.array([1e300, 3.5], pa.float64()),
                "d": pa.array([datetime.datetime(2020, 1, 2, 3, 4), None]),
                "p": pa.array([Decimal("123456.7891"), Decimal("3")], pa.decimal128(12, 4)),
                "s": pa.array(["B", "c"]),
            }
        ),
    )
    clauses = [clause("matched", "update_all"), clause("notMatched", "insert_all")]
    run_merge(spark, make_spec(path, source, "t.id = s.id", clauses, schema_evolution=True))
    delta_spark.sql(
        merge_sql(theirs, source, "t.id = s.id", clauses).replace("MERGE INTO", "MERGE WITH SCHEMA EVOLUTION INTO", 1)
    ).collect()
    assert _schema(path) == _schema(theirs)
    assert _schema(path)["n"] == ("long", [{"fromType": "integer", "toType": "long"}])
    assert delta_rows(delta_spark, path) == delta_rows(delta_spark, theirs)
    assert (5_000_000_000,) in delta_rows(delta_spark, path, "n")
    delta_writes_on(delta_spark, path)


# --- identityColumns ----------------------------------------------------------------------------------------------


def test_identity_columns_generated_for_inserts(spark: SparkSession, delta_spark: SparkSession, tmp_path: Path) -> None:
    """Delta's GENERATED ALWAYS AS IDENTITY table with Change Data Feed: the engine's inserts get new values in the
    column's sequence above the high-water mark, the same value in the data and in the change rows, and Delta's own
    inserts afterwards continue above the mark the engine's commit set."""
    path = make_delta_table(
        delta_spark,
        tmp_path / "identity",
        "id BIGINT GENERATED ALWAYS AS IDENTITY (START WITH 100 INCREMENT BY 10), k INT, v STRING",
        properties={"delta.enableChangeDataFeed": "true"},
        then_sql=["INSERT INTO {table} (k, v) VALUES (1, 'a'), (2, 'b'), (3, 'c')"],
    )
    before = {k: i for i, k, _ in delta_rows(delta_spark, path)}
    theirs = tmp_path / "identity-delta"
    shutil.copytree(path, theirs)
    source_path = write_table(
        tmp_path / "identity-source",
        pa.table({"k": pa.array(range(2, 40), pa.int32())}).append_column(
            "v", pa.array([f"n{k}" for k in range(2, 40)])
        ),
    )
    clauses = [clause("matched", "update", v="s.v"), clause("notMatched", "insert", k="s.k", v="s.v")]
    result = run_merge(spark, make_spec(path, source_path, "t.k = s.k", clauses))
    assert result.result["num_inserted_rows"] == 36
    delta_spark.sql(merge_sql(theirs, source_path, "t.k = s.k", clauses)).collect()
    assert delta_rows(delta_spark, path, "k, v") == delta_rows(delta_spark, theirs, "k, v")

    rows = delta_rows(delta_spark, path, "k, id")
    ids = [i for _, i in rows]
    assert len(set(ids)) == len(ids)
    assert all((i - 100) % 10 == 0 and i >= 100 for i in ids)
    assert all(i == before[k] for k, i in rows if k in before)  # updated rows keep theirs
    mark = _schema_metadata(path)["id"]["delta.identity.highWaterMark"]
    assert mark == max(ids)
    changes = delta_spark.sql(
        f"SELECT k, id FROM table_changes_by_path('{path}', {result.table_version}) WHERE _change_type = 'insert'"
    ).collect()
    assert sorted(tuple(r) for r in changes) == sorted((k, i) for k, i in rows if k not in before)

    delta_spark.sql(f"INSERT INTO {table_ref(path)} (k, v) VALUES (100, 'x'), (101, 'y')").collect()
    after = [i for _, i in delta_rows(delta_spark, path, "k, id")]
    assert len(set(after)) == len(after) and max(after) > mark
    delta_writes_on(delta_spark, path, key="k", update="t.v = s.v")


def _schema_metadata(path: Path) -> dict[str, dict[str, Any]]:
    meta = [a["metaData"] for a in log_actions(path) if "metaData" in a][-1]
    return {f["name"]: f["metadata"] for f in json.loads(meta["schemaString"])["fields"]}


# --- variantType --------------------------------------------------------------------------------------------------


def _variant_fields(parquet: Path) -> list[str]:
    """The Parquet leaves of the VARIANT column ``v`` in one data file."""
    schema = pq.ParquetFile(parquet).schema
    return [schema.column(i).path for i in range(len(schema)) if schema.column(i).path.startswith("v.")]


@pytest.mark.parametrize("deletion_vectors", [False, True], ids=["copy-on-write", "deletion-vectors"])
def test_variant_columns_are_merged_unshredded(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, deletion_vectors: bool
) -> None:
    """PROTOCOL.md "Variant Data Type": a VARIANT is stored as a struct of ``metadata`` and ``value`` binaries;
    shredded values (``typed_value``) belong to variantShredding, which the table does not have. Copied rows keep
    their values, updated and inserted rows get Spark's own encoding of the new ones, and Delta reads them all."""
    path = make_delta_table(
        delta_spark,
        tmp_path / "variant",
        "id BIGINT, v VARIANT",
        properties={"delta.enableDeletionVectors": str(deletion_vectors).lower()},
        then_sql=[
            "INSERT INTO {table} SELECT id, parse_json(to_json(named_struct('n', id, 'tags', array('a', string(id))))) "
            "FROM range(0, 20, 1, 1)",
            "INSERT INTO {table} VALUES (100, NULL)",
        ],
    )
    assert "variantType" in _protocol(path)["writerFeatures"]
    source = pa.table(
        {
            "id": pa.array([3, 7, 100, 21, 22], pa.int64()),
            "js": pa.array(['{"n": -3}', '[1, 2.5, "x", null]', '"text"', '{"nested": {"deep": [true]}}', None]),
        }
    )
    clauses = [
        clause("matched", "update", v="parse_json(s.js)"),
        clause("notMatched", "insert", id="s.id", v="parse_json(s.js)"),
    ]
    version = latest_version(path)
    merge_both(spark, delta_spark, tmp_path, path, source, "t.id = s.id", clauses, columns="id, to_json(v)")
    got = dict(delta_rows(delta_spark, path, "id, to_json(v)"))
    assert got[3] == '{"n":-3}' and got[7] == '[1,2.5,"x",null]' and got[100] == '"text"' and got[22] is None
    assert got[4] == '{"n":4,"tags":["a","4"]}'
    assert variant_get_works(delta_spark, path)
    added = [a["add"]["path"] for a in log_actions(path, version + 1) if "add" in a]
    assert added
    for name in added:
        assert sorted(_variant_fields(path / name)) == ["v.metadata", "v.value"]
    assert "variantShredding" not in _protocol(path).get("writerFeatures", [])
    if deletion_vectors:
        assert any(a["add"].get("deletionVector") for a in log_actions(path, version + 1) if "add" in a)
    # delta-rs reads the table too: each VARIANT as its metadata and value binaries.
    table = QueryBuilder().register("t", DeltaTable(str(path))).execute("SELECT id, v FROM t").read_all()
    by_id = dict(zip(table.column("id").to_pylist(), table.column("v").to_pylist(), strict=True))
    assert len(by_id) == 23 and by_id[22] is None and by_id[3] is not None
    assert sorted(by_id[3]) == ["metadata", "value"]
    delta_writes_on(delta_spark, path, update="t.v = s.v")


def variant_get_works(delta_spark: SparkSession, path: Path) -> bool:
    row = delta_spark.sql(f"SELECT variant_get(v, '$.n', 'int') AS n FROM {table_ref(path)} WHERE id = 3").collect()
    return [r["n"] for r in row] == [-3]


def _protocol(path: Path) -> dict[str, Any]:
    return [a["protocol"] for a in log_actions(path) if "protocol" in a][-1]
