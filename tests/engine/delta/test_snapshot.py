"""Reading tables written by deltalake: snapshot fields, and scan_files rows against deltalake's own read."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake import Transaction as RsTransaction
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from engine.delta import (
    FILE_NAME_COL,
    FILE_PATH_COL,
    ROW_INDEX_COL,
    files_at_paths,
    load_snapshot,
    scan_files,
    scan_files_with_path,
)
from engine.delta.scan_columns import UNMAPPED_MARKER
from engine.errors import DeltaError, TableNotFoundError

from .conftest import typed_rows
from .util import sorted_rows


def test_snapshot_fields_match_deltalake(typed_table: Path) -> None:
    snapshot = load_snapshot(str(typed_table))
    reference = DeltaTable(str(typed_table))
    assert snapshot.version == reference.version()
    assert snapshot.table_uri == typed_table.resolve().as_uri()
    assert snapshot.root == str(typed_table.resolve())
    assert snapshot.metadata.id == reference.metadata().id
    assert snapshot.partition_columns == ("region",)
    assert snapshot.protocol.min_reader_version == reference.protocol().min_reader_version
    assert snapshot.protocol.min_writer_version == reference.protocol().min_writer_version
    assert [f.name for f in snapshot.spark_schema.fields] == [f.name for f in reference.schema().fields]
    assert isinstance(snapshot.spark_schema["at"].dataType, T.TimestampType)
    assert snapshot.arrow_schema.field("amount").type == pa.decimal128(12, 2)
    assert not snapshot.cdf_enabled

    actions = pa.table(reference.get_add_actions(flatten=True)).to_pylist()
    assert {f.path for f in snapshot.files} == {a["path"] for a in actions}
    by_path = {a["path"]: a for a in actions}
    for add in snapshot.files:
        expected = by_path[add.path]
        assert add.size == expected["size_bytes"]
        assert add.partition_values["region"] == expected["partition.region"]
        assert add.stats is not None and add.stats.num_records == expected["num_records"]
        assert add.stats.value("min_values", ["id"]) == expected["min.id"]
        assert add.stats.value("null_count", ["info", "k"]) == expected["null_count.info.k"]
    assert sum(f.stats.num_records for f in snapshot.files if f.stats) == reference.to_pyarrow_table().num_rows


def test_time_travel_and_missing_tables(typed_table: Path, lake: Path) -> None:
    first = load_snapshot(typed_table.as_uri(), version=0)
    assert first.version == 0
    assert sum(f.stats.num_records for f in first.files if f.stats) == 40
    with pytest.raises(TableNotFoundError, match="nothing-here"):
        load_snapshot(str(lake / "nothing-here"))
    (lake / "empty-dir").mkdir()
    with pytest.raises(TableNotFoundError, match="empty-dir"):
        load_snapshot(str(lake / "empty-dir"))


def test_app_transaction_versions_from_deltalake(lake: Path) -> None:
    path = str(lake / "apps")
    write_deltalake(path, typed_rows(0, 3))
    write_deltalake(
        path,
        typed_rows(3, 3),
        mode="append",
        commit_properties=CommitProperties(app_transactions=[RsTransaction("job-a", 7)]),
    )
    snapshot = load_snapshot(path)
    assert snapshot.app_transaction_version("job-a") == 7
    assert snapshot.app_transaction_version("job-b") is None


def _arrow_rows(table: pa.Table) -> list[dict[str, object]]:
    return sorted_rows(table.drop_columns([c for c in (FILE_NAME_COL, ROW_INDEX_COL) if c in table.column_names]))


def test_scan_files_equals_deltalake_read(spark: SparkSession, typed_table: Path) -> None:
    snapshot = load_snapshot(str(typed_table))
    result = scan_files(spark, snapshot, snapshot.files).toArrow()
    assert result.column_names == [*[f.name for f in snapshot.spark_schema.fields], FILE_NAME_COL, ROW_INDEX_COL]
    expected = DeltaTable(str(typed_table)).to_pyarrow_table()
    assert result.select(expected.column_names).schema.equals(
        pa.schema([pa.field(f.name, f.type) for f in snapshot.arrow_schema]), check_metadata=False
    )
    assert _arrow_rows(result) == _arrow_rows(expected)

    # FILE_NAME_COL is the log path and ROW_INDEX_COL the position in that file: reading the file alone agrees.
    paths = {f.path: f for f in snapshot.files}
    assert set(result.column(FILE_NAME_COL).to_pylist()) == set(paths)
    some = next(f for f in snapshot.files if f.stats and f.stats.num_records and f.stats.num_records > 1)
    rows = [r for r in result.to_pylist() if r[FILE_NAME_COL] == some.path]

    on_disk = pq.read_table(some.absolute_path(snapshot.root)).column("id").to_pylist()
    assert sorted(r[ROW_INDEX_COL] for r in rows) == list(range(len(on_disk)))
    assert all(on_disk[r[ROW_INDEX_COL]] == r["id"] for r in rows)


def test_scan_subset_and_empty(spark: SparkSession, typed_table: Path) -> None:
    snapshot = load_snapshot(str(typed_table))
    chosen = [f for f in snapshot.files if f.partition_values["region"] == "eu"]
    rows = scan_files(spark, snapshot, chosen).select("region", FILE_NAME_COL).collect()
    assert {r.region for r in rows} == {"eu"}
    assert {r[FILE_NAME_COL] for r in rows} == {f.path for f in chosen}

    empty = scan_files(spark, snapshot, [])
    assert empty.count() == 0
    assert empty.schema.fieldNames() == scan_files(spark, snapshot, chosen).schema.fieldNames()
    assert empty.schema["at"].dataType == T.TimestampType()


def test_scan_after_schema_evolution_reads_null_for_missing_columns(spark: SparkSession, lake: Path) -> None:
    path = str(lake / "evolving")
    write_deltalake(path, pa.table({"id": [1, 2], "a": ["x", "y"]}))
    write_deltalake(
        path, pa.table({"id": [3], "a": ["z"], "added": [dt.date(2024, 5, 1)]}), mode="append", schema_mode="merge"
    )
    snapshot = load_snapshot(path)
    rows = sorted(scan_files(spark, snapshot, snapshot.files).collect(), key=lambda r: r.id)
    assert [(r.id, r.a, r.added) for r in rows] == [(1, "x", None), (2, "y", None), (3, "z", dt.date(2024, 5, 1))]


def test_scan_odd_paths_and_partition_values(spark: SparkSession, lake: Path) -> None:
    """Partition values with characters that paths escape, under a table root with spaces, glob characters
    and non-ASCII (deltalake itself cannot open roots with ``[``, ``]`` or ``%``: refused with a clear error)."""
    root = lake / "odd root {x} é+#?"
    values = ["a b", "c:d", "e%f", "g/h", "i=j", "k+l", "m#n", "ü✓", "p?q*r", ""]
    data = pa.table(
        {
            "id": list(range(len(values))),
            "part": values,
            "ts": pa.array(
                [dt.datetime(2024, 1, 1, 12, 30, tzinfo=dt.UTC)] * len(values), pa.timestamp("us", tz="UTC")
            ),
        }
    )
    write_deltalake(str(root), data, partition_by=["part", "ts"])
    snapshot = load_snapshot(str(root))
    result = scan_files(spark, snapshot, snapshot.files).toArrow()
    expected = DeltaTable(str(root)).to_pyarrow_table()
    assert _arrow_rows(result) == _arrow_rows(expected)
    assert set(result.column(FILE_NAME_COL).to_pylist()) == {f.path for f in snapshot.files}

    with pytest.raises(DeltaError, match="cannot open"):
        load_snapshot(str(lake / "bracket [1]"))


def test_spark_does_not_add_partition_columns_itself(spark: SparkSession, lake: Path) -> None:
    """Spark infers ``k=v`` directories as columns when reading folders; the scan reads files, so the only
    partition column is the one put back from the log (typed as the table says, here a date)."""
    path = str(lake / "bydate")
    write_deltalake(
        path, pa.table({"id": [1, 2], "day": pa.array([dt.date(2024, 1, 1), None], pa.date32())}), partition_by=["day"]
    )
    snapshot = load_snapshot(path)
    df = scan_files(spark, snapshot, snapshot.files)
    assert df.schema.fieldNames() == ["id", "day", FILE_NAME_COL, ROW_INDEX_COL]
    assert df.schema["day"].dataType == T.DateType()
    assert sorted((r.id, r.day) for r in df.collect()) == [(1, dt.date(2024, 1, 1)), (2, None)]


def test_partitioned_files_meet_their_log_entries_by_size(spark: SparkSession, lake: Path) -> None:
    """A partitioned table's files meet their log paths and partition values by their size; two files of one size
    (the same rows in two partitions) by a hash of their path, in the same join. A file whose size is not the one
    its log entry gives fails the scan rather than take another file's partition values."""
    path = str(lake / "parted_sizes")
    rows = pa.table({"id": list(range(20)), "v": [f"v{i}" for i in range(20)]})
    write_deltalake(path, rows.append_column("part", pa.array(["a"] * 20)), partition_by=["part"])
    write_deltalake(path, rows.append_column("part", pa.array(["b"] * 20)), mode="append", partition_by=["part"])
    more = pa.table({"id": [100, 101, 102], "v": ["x", "y", "z"], "part": ["c", "c", "c"]})
    write_deltalake(path, more, mode="append", partition_by=["part"])
    snapshot = load_snapshot(path)
    assert len({f.size for f in snapshot.files}) == 2
    for file_columns in (True, False):
        result = scan_files(spark, snapshot, snapshot.files, file_columns=file_columns).toArrow()
        assert _arrow_rows(result) == _arrow_rows(DeltaTable(path).to_pyarrow_table())
    part_of = {f.path: f.partition_values["part"] for f in snapshot.files}
    named = scan_files(spark, snapshot, snapshot.files).toArrow().to_pylist()
    assert {r[FILE_NAME_COL] for r in named} == set(part_of)
    for r in named:
        assert part_of[r[FILE_NAME_COL]] == r["part"]
        stored = pq.read_table(Path(path) / unquote(r[FILE_NAME_COL]), columns=["id"])
        assert stored.column("id")[r[ROW_INDEX_COL]].as_py() == r["id"]
    grown = [replace(f, size=f.size + 1) if f.partition_values["part"] == "c" else f for f in snapshot.files]
    for file_columns in (True, False):
        with pytest.raises(Exception, match=UNMAPPED_MARKER):
            scan_files(spark, snapshot, grown, file_columns=file_columns).collect()


@pytest.mark.parametrize("partitioned", [False, True])
def test_file_paths_map_back_to_files(spark: SparkSession, lake: Path, partitioned: bool) -> None:
    """``FILE_PATH_COL`` is the reader's own name of a row's file (a ``file:`` URI with escapes for a plain
    table, the log path for a partitioned one): ``files_at_paths`` maps every value back, under a root with
    characters URIs escape, and refuses a path outside the files asked for."""
    root = lake / f"paths {partitioned} é+#?{{x}}"
    data = pa.table({"id": list(range(6)), "part": ["a b", "c+d", "e%f", "a b", "c+d", "e%f"]})
    for i in range(3):
        write_deltalake(str(root), data.slice(2 * i, 2), mode="append", partition_by=["part"] if partitioned else None)
    snapshot = load_snapshot(str(root))
    files = list(snapshot.files)
    chosen = files[:2]
    result = scan_files_with_path(spark, snapshot, chosen).toArrow()
    assert result.column_names == [*[f.name for f in snapshot.spark_schema.fields], FILE_PATH_COL]
    paths = result.column(FILE_PATH_COL).to_pylist()
    assert [f.path for f in files_at_paths(snapshot, chosen, set(paths))] == [f.path for f in chosen]

    for path in set(paths):
        (add,) = files_at_paths(snapshot, chosen, [path])
        ids = sorted(r["id"] for r in result.to_pylist() if r[FILE_PATH_COL] == path)
        assert ids == sorted(pq.read_table(add.absolute_path(snapshot.root)).column("id").to_pylist())
    others = scan_files_with_path(spark, snapshot, files[2:]).toArrow().column(FILE_PATH_COL).to_pylist()
    with pytest.raises(DeltaError, match="not in the request"):
        files_at_paths(snapshot, chosen, others)
    assert files_at_paths(snapshot, chosen, []) == []
