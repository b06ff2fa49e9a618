"""Commits written by Transaction, read back by deltalake (the oracle), and deltalake writing on top of them."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from engine.delta import Transaction, check_can_modify, load_snapshot
from engine.errors import AppendOnlyTableError, CommitFailedError, DeltaError, UnsupportedTableFeatureError

from .util import log_entries, parquet_add, sorted_rows

MERGE_METRICS = {"numTargetRowsInserted": 2, "numTargetRowsDeleted": 1, "numOutputRows": 3}


def _base(lake: Path, **config: str) -> Path:
    path = lake / "t"
    write_deltalake(
        str(path),
        pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"], "p": ["x", "y", "x"]}),
        partition_by=["p"],
        configuration=config or None,
    )
    return path


def _data(ids: list[int], v: str = "n") -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"{v}{i}" for i in ids]})


def test_merge_commit_reads_back_in_deltalake(lake: Path) -> None:
    path = _base(lake)
    snapshot = load_snapshot(str(path))
    touched = next(f for f in snapshot.files if f.partition_values["p"] == "y")
    added = [
        parquet_add(snapshot, _data([2, 20], "u"), partition={"p": "y"}, write_id="merge-1"),
        parquet_add(snapshot, _data([30]), partition={"p": "z"}, write_id="merge-1"),
    ]
    txn = Transaction(snapshot)
    txn.record_read([touched], "p = 'y'")
    txn.set_app_transaction("job-1", 5)
    version = txn.commit(
        [touched.to_remove(), *added],
        operation="MERGE",
        operation_parameters={"predicate": '["t.id = s.id"]', "matchedPredicates": "[]"},
        operation_metrics=MERGE_METRICS,
    )
    assert version == 1 == txn.committed_version

    entries = log_entries(path, 1)
    assert [next(iter(e)) for e in entries] == ["commitInfo", "txn", "remove", "add", "add"]
    info = entries[0]["commitInfo"]
    assert info["operation"] == "MERGE" and info["readVersion"] == 0
    assert info["isolationLevel"] == "WriteSerializable" and info["isBlindAppend"] is False
    assert info["operationMetrics"] == {k: str(v) for k, v in MERGE_METRICS.items()}
    assert info["engineInfo"] == "merge-service/0.1.0" and uuid.UUID(info["txnId"])
    remove = entries[2]["remove"]
    assert remove["path"] == touched.path and remove["extendedFileMetadata"] is True
    assert remove["size"] == touched.size and remove["partitionValues"] == {"p": "y"} and remove["dataChange"]
    assert entries[1]["txn"]["appId"] == "job-1" and entries[1]["txn"]["version"] == 5

    table = DeltaTable(str(path))
    assert table.version() == 1
    assert sorted_rows(table.to_pyarrow_table()) == [
        {"id": 1, "v": "a", "p": "x"},
        {"id": 2, "v": "u2", "p": "y"},
        {"id": 3, "v": "c", "p": "x"},
        {"id": 20, "v": "u20", "p": "y"},
        {"id": 30, "v": "n30", "p": "z"},
    ]
    history = table.history(1)[0]
    assert history["operation"] == "MERGE"
    assert history["operationMetrics"] == {k: str(v) for k, v in MERGE_METRICS.items()}
    assert table.transaction_version("job-1") == 5
    assert load_snapshot(str(path)).app_transaction_version("job-1") == 5
    stats = {a["path"]: a for a in pa.table(table.get_add_actions(flatten=True)).to_pylist()}
    assert stats[added[0].path]["min.id"] == 2 and stats[added[0].path]["max.v"] == "u20"


def test_deltalake_appends_merges_and_checkpoints_on_top(lake: Path) -> None:
    path = _base(lake)
    snapshot = load_snapshot(str(path))
    add = parquet_add(snapshot, _data([4]), partition={"p": "x"})
    Transaction(snapshot).commit(
        [add], operation="WRITE", operation_parameters={"mode": "Append"}, is_blind_append=True
    )
    write_deltalake(str(path), pa.table({"id": pa.array([5], pa.int64()), "v": ["e"], "p": ["y"]}), mode="append")
    table = DeltaTable(str(path))
    source = pa.table({"id": pa.array([4, 6], pa.int64()), "v": ["merged", "new"], "p": ["x", "w"]})
    table.merge(
        source, "t.id = s.id", source_alias="s", target_alias="t"
    ).when_matched_update_all().when_not_matched_insert_all().execute()
    table = DeltaTable(str(path))
    table.create_checkpoint()
    assert (path / "_delta_log" / f"{table.version():020d}.checkpoint.parquet").exists()
    rows = sorted_rows(DeltaTable(str(path)).to_pyarrow_table())
    assert [(r["id"], r["v"]) for r in rows] == [(1, "a"), (2, "b"), (3, "c"), (4, "merged"), (5, "e"), (6, "new")]
    # and we read the checkpointed table again, then commit after it
    snapshot = load_snapshot(str(path))
    assert snapshot.version == table.version()
    victim = next(f for f in snapshot.files if f.partition_values["p"] == "w")
    Transaction(snapshot).commit([victim.to_remove()], operation="DELETE", operation_parameters={})
    assert 6 not in DeltaTable(str(path)).to_pyarrow_table().column("id").to_pylist()


def test_checkpoint_every_interval(lake: Path) -> None:
    path = _base(lake, **{"delta.checkpointInterval": "2"})
    for i in range(3):
        snapshot = load_snapshot(str(path))
        add = parquet_add(snapshot, _data([100 + i]), partition={"p": "x"})
        version = Transaction(snapshot).commit([add], operation="WRITE", operation_parameters={}, is_blind_append=True)
        assert (path / "_delta_log" / f"{version:020d}.checkpoint.parquet").exists() == (version % 2 == 0)
    assert json.loads((path / "_delta_log" / "_last_checkpoint").read_text())["version"] == 2
    assert DeltaTable(str(path)).to_pyarrow_table().num_rows == 6


def test_schema_evolution_metadata(lake: Path) -> None:
    path = _base(lake)
    snapshot = load_snapshot(str(path))
    evolved = snapshot.metadata.with_schema(snapshot.spark_schema.add("added_on", "date"))
    schema = evolved.schema
    data = pa.table({"id": pa.array([9], pa.int64()), "v": ["z"], "added_on": [dt.date(2024, 1, 2)]})
    add = parquet_add(snapshot, data, partition={"p": "x"})
    Transaction(snapshot).commit([evolved, add], operation="MERGE", operation_parameters={})
    entries = log_entries(path, 1)
    assert [next(iter(e)) for e in entries] == ["commitInfo", "metaData", "add"]
    assert entries[1]["metaData"]["id"] == snapshot.metadata.id
    table = DeltaTable(str(path))
    assert [f.name for f in table.schema().fields] == [f.name for f in schema.fields]
    rows = sorted_rows(table.to_pyarrow_table())
    assert rows[0]["added_on"] is None and rows[-1]["added_on"] == dt.date(2024, 1, 2)
    with pytest.raises(ValueError, match="partition column"):
        snapshot.metadata.with_schema('{"type":"struct","fields":[]}')


@pytest.mark.parametrize(("column_type", "feature"), [("timestamp_ntz", "timestampNtz"), ("variant", "variantType")])
def test_schema_evolution_needs_the_feature_a_new_column_type_requires(
    lake: Path, column_type: str, feature: str
) -> None:
    """PROTOCOL.md: TIMESTAMP_NTZ and VARIANT columns need their table features; a commit that would add one to a
    table without the feature is refused and writes nothing."""
    path = _base(lake)
    snapshot = load_snapshot(str(path))
    evolved = snapshot.metadata.with_schema(snapshot.spark_schema.add("added", column_type))
    with pytest.raises(UnsupportedTableFeatureError, match=f"needs the {feature} table feature"):
        Transaction(snapshot).commit([evolved], operation="MERGE", operation_parameters={})
    assert DeltaTable(str(path)).version() == 0


def test_append_only_tables_refuse_removes(lake: Path) -> None:
    path = _base(lake, **{"delta.appendOnly": "true"})
    snapshot = load_snapshot(str(path))
    with pytest.raises(AppendOnlyTableError):
        check_can_modify(snapshot)
    with pytest.raises(AppendOnlyTableError):
        Transaction(snapshot).commit([snapshot.files[0].to_remove()], operation="DELETE", operation_parameters={})
    add = parquet_add(snapshot, _data([7]), partition={"p": "x"})
    assert Transaction(snapshot).commit([add], operation="WRITE", operation_parameters={}, is_blind_append=True) == 1


def test_invalid_commits_write_nothing(lake: Path) -> None:
    path = _base(lake)
    snapshot = load_snapshot(str(path))
    stranger = parquet_add(snapshot, _data([1]), partition={"p": "x"})
    with pytest.raises(DeltaError, match="not in version 0"):
        Transaction(snapshot).commit([stranger.to_remove()], operation="DELETE", operation_parameters={})
    with pytest.raises(DeltaError, match="twice"):
        Transaction(snapshot).commit([stranger, stranger], operation="WRITE", operation_parameters={})
    txn = Transaction(snapshot)
    txn.commit([stranger], operation="WRITE", operation_parameters={})
    with pytest.raises(DeltaError, match="already committed"):
        txn.commit([stranger], operation="WRITE", operation_parameters={})
    assert DeltaTable(str(path)).version() == 1


def test_unwritable_log_is_commit_failed(lake: Path) -> None:
    path = _base(lake)
    snapshot = load_snapshot(str(path))
    add = parquet_add(snapshot, _data([8]), partition={"p": "x"})
    log_dir = path / "_delta_log"
    moved = path / "_delta_log.saved"
    log_dir.rename(moved)
    log_dir.write_text("not a folder")
    try:
        with pytest.raises(CommitFailedError) as failure:
            Transaction(snapshot).commit([add], operation="WRITE", operation_parameters={})
        assert not failure.value.retryable
    finally:
        log_dir.unlink()
        moved.rename(log_dir)
    assert DeltaTable(str(path)).version() == 0
