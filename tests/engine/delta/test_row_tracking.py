"""The commit's rules for row tracking, metadata domains and in-commit timestamps (PROTOCOL.md), on a table whose
log is written here by hand as Delta writes it: deltalake's table, then the commit that enables the features."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import SparkSession

from engine import delta
from engine.delta import AddFile, FileStats
from engine.delta.actions import DomainMetadata
from engine.delta.errors import ConcurrentDomainMetadataError
from engine.delta.features import check_protocol_and_metadata
from engine.delta.scan_columns import UNMAPPED_MARKER
from engine.errors import DeltaError

ROWS = 4
ROW_ID_COLUMN = "_row-id-col-0001"
VERSION_COLUMN = "_row-commit-version-col-0001"


def _log(path: Path, version: int) -> list[dict[str, Any]]:
    text = (path / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _write_commit(path: Path, version: int, actions: list[dict[str, Any]]) -> None:
    (path / "_delta_log" / f"{version:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))


def _table(lake: Path, *, ict_ahead_ms: int = 0, configuration: dict[str, str] | None = None) -> Path:
    """A deltalake table of ROWS rows, then version 1: rowTracking, domainMetadata and inCommitTimestamp in the
    protocol, row tracking and in-commit timestamps enabled, its file re-added with ``baseRowId`` 0, the
    high-water mark at ROWS - 1, a user domain."""
    path = lake / "tracked"
    write_deltalake(str(path), pa.table({"id": pa.array(range(ROWS), pa.int64())}))
    version0 = _log(path, 0)
    metadata = next(a["metaData"] for a in version0 if "metaData" in a)
    add = next(a["add"] for a in version0 if "add" in a)
    ict = int(time.time() * 1000) + ict_ahead_ms
    config = {
        "delta.enableRowTracking": "true",
        "delta.rowTracking.materializedRowIdColumnName": ROW_ID_COLUMN,
        "delta.rowTracking.materializedRowCommitVersionColumnName": VERSION_COLUMN,
        "delta.enableInCommitTimestamps": "true",
        "delta.inCommitTimestampEnablementVersion": "1",
        "delta.inCommitTimestampEnablementTimestamp": str(ict),
        **(configuration or {}),
    }
    _write_commit(
        path,
        1,
        [
            {"commitInfo": {"inCommitTimestamp": ict, "timestamp": ict, "operation": "SET TBLPROPERTIES"}},
            {
                "protocol": {
                    "minReaderVersion": 1,
                    "minWriterVersion": 7,
                    "writerFeatures": ["domainMetadata", "rowTracking", "inCommitTimestamp"],
                }
            },
            {"metaData": {**metadata, "configuration": config}},
            {"domainMetadata": {"domain": "delta.rowTracking", "configuration": '{"rowIdHighWaterMark":3}'}},
            {"domainMetadata": {"domain": "app.owner", "configuration": "team-a", "removed": False}},
            {"add": {**add, "dataChange": False, "baseRowId": 0, "defaultRowCommitVersion": 0}},
        ],
    )
    return path


def _new_file(name: str, records: int) -> AddFile:
    return AddFile(
        path=name,
        size=100,
        partition_values={},
        modification_time=int(time.time() * 1000),
        stats=FileStats(num_records=records, min_values={"id": 0}, max_values={"id": 9}, null_count={"id": 0}),
    )


def _commit(path: Path, actions: list[Any], **kwargs: Any) -> tuple[delta.Transaction, int]:
    transaction = delta.Transaction(delta.load_snapshot(str(path)))
    version = transaction.commit(actions, operation="WRITE", operation_parameters={}, **kwargs)
    return transaction, version


def _marks(actions: list[dict[str, Any]]) -> list[int]:
    return [
        json.loads(a["domainMetadata"]["configuration"])["rowIdHighWaterMark"]
        for a in actions
        if "domainMetadata" in a and a["domainMetadata"]["domain"] == "delta.rowTracking"
    ]


@pytest.mark.parametrize("feature", ["rowTracking", "domainMetadata", "clustering", "inCommitTimestamp"])
def test_the_protocol_gate_accepts_the_features(lake: Path, feature: str) -> None:
    snapshot = delta.load_snapshot(str(_table(lake)))
    # The table's metadata enables row tracking and in-commit timestamps, which its protocol must list (Delta
    # refuses it otherwise).
    protocol = delta.Protocol(3, 7, (), ("appendOnly", "domainMetadata", "rowTracking", "inCommitTimestamp", feature))
    check_protocol_and_metadata(protocol, snapshot.metadata)


def test_snapshot_knows_domains_and_row_ids(lake: Path) -> None:
    path = _table(lake)
    (path / "_delta_log" / "00000000000000000002.json").write_text(
        json.dumps({"domainMetadata": {"domain": "app.gone", "configuration": "x", "removed": False}})
        + "\n"
        + json.dumps({"domainMetadata": {"domain": "app.gone", "configuration": "x", "removed": True}})
        + "\n"
    )
    snapshot = delta.load_snapshot(str(path))
    assert set(snapshot.domains) == {"delta.rowTracking", "app.owner"}
    assert snapshot.domains["app.owner"].configuration == "team-a"
    (only,) = snapshot.files
    assert (only.base_row_id, only.default_row_commit_version) == (0, 0)


def test_new_files_get_row_ids_above_the_high_water_mark(lake: Path) -> None:
    path = _table(lake)
    _, version = _commit(path, [_new_file("a.parquet", 5), _new_file("b.parquet", 2)])
    actions = _log(path, version)
    adds = {a["add"]["path"]: a["add"] for a in actions if "add" in a}
    assert (adds["a.parquet"]["baseRowId"], adds["b.parquet"]["baseRowId"]) == (ROWS, ROWS + 5)
    assert {a["defaultRowCommitVersion"] for a in adds.values()} == {version}
    assert _marks(actions) == [ROWS + 5 + 2 - 1]
    assert delta.load_snapshot(str(path)).domains["app.owner"].configuration == "team-a"


def test_a_readded_file_keeps_its_row_ids_and_no_mark_is_written(lake: Path) -> None:
    """A file given a new deletion vector is re-added with its own baseRowId and defaultRowCommitVersion."""
    path = _table(lake)
    snapshot = delta.load_snapshot(str(path))
    (old,) = snapshot.files
    _, version = _commit(path, [old.to_remove(), old])
    actions = _log(path, version)
    add = next(a["add"] for a in actions if "add" in a)
    remove = next(a["remove"] for a in actions if "remove" in a)
    assert (add["baseRowId"], add["defaultRowCommitVersion"]) == (0, 0)
    assert (remove["baseRowId"], remove["defaultRowCommitVersion"]) == (0, 0)
    assert _marks(actions) == []


def test_a_winner_that_raised_the_mark_moves_our_row_ids(lake: Path) -> None:
    path = _table(lake)
    transaction = delta.Transaction(delta.load_snapshot(str(path)))
    _write_commit(
        path,
        2,
        [
            {"commitInfo": {"inCommitTimestamp": int(time.time() * 1000) + 5, "operation": "WRITE"}},
            {"domainMetadata": {"domain": "delta.rowTracking", "configuration": '{"rowIdHighWaterMark":99}'}},
            {"add": {**_new_file("w.parquet", 96).to_action()["add"], "baseRowId": 4, "defaultRowCommitVersion": 2}},
        ],
    )
    version = transaction.commit([_new_file("ours.parquet", 3)], operation="WRITE", operation_parameters={})
    assert version == 3
    actions = _log(path, version)
    add = next(a["add"] for a in actions if "add" in a)
    assert (add["baseRowId"], add["defaultRowCommitVersion"]) == (100, 3)
    assert _marks(actions) == [102]


def test_same_domain_from_a_winner_conflicts(lake: Path) -> None:
    path = _table(lake)
    transaction = delta.Transaction(delta.load_snapshot(str(path)))
    _write_commit(
        path,
        2,
        [
            {"commitInfo": {"inCommitTimestamp": int(time.time() * 1000), "operation": "X"}},
            {"domainMetadata": {"domain": "app.owner", "configuration": "team-b", "removed": False}},
        ],
    )
    with pytest.raises(ConcurrentDomainMetadataError, match=r"app\.owner"):
        transaction.commit([DomainMetadata("app.owner", "team-c")], operation="X", operation_parameters={})
    other = delta.Transaction(delta.load_snapshot(str(path), version=1))
    assert other.commit([DomainMetadata("app.other", "y")], operation="X", operation_parameters={}) == 3


def test_system_domains_and_domains_without_the_feature_are_refused(lake: Path) -> None:
    path = _table(lake)
    transaction = delta.Transaction(delta.load_snapshot(str(path)))
    with pytest.raises(DeltaError, match="System-controlled"):
        transaction.commit([DomainMetadata("delta.clustering", "{}")], operation="X", operation_parameters={})
    plain = lake / "plain"
    write_deltalake(str(plain), pa.table({"id": pa.array([1], pa.int64())}))
    with pytest.raises(DeltaError, match="domainMetadata table feature"):
        _commit(plain, [DomainMetadata("app.owner", "x")])
    assert not (path / "_delta_log" / "00000000000000000002.json").exists()


def test_in_commit_timestamp_is_first_and_monotonic(lake: Path) -> None:
    """The previous commit's timestamp is an hour ahead of this clock: ours is one millisecond after it."""
    path = _table(lake, ict_ahead_ms=3_600_000)
    previous = _log(path, 1)[0]["commitInfo"]["inCommitTimestamp"]
    _, version = _commit(path, [_new_file("a.parquet", 1)])
    first = _log(path, version)[0]
    assert first["commitInfo"]["inCommitTimestamp"] == previous + 1


def test_in_commit_timestamp_follows_a_winner(lake: Path) -> None:
    path = _table(lake)
    transaction = delta.Transaction(delta.load_snapshot(str(path)))
    ahead = int(time.time() * 1000) + 7_200_000
    _write_commit(path, 2, [{"commitInfo": {"inCommitTimestamp": ahead, "operation": "WRITE"}}])
    version = transaction.commit([_new_file("a.parquet", 1)], operation="WRITE", operation_parameters={})
    assert _log(path, version)[0]["commitInfo"]["inCommitTimestamp"] == ahead + 1


def test_suspended_row_tracking_assigns_nothing(lake: Path) -> None:
    path = _table(lake, configuration={"delta.enableRowTracking": "false", "delta.rowTrackingSuspended": "true"})
    _, version = _commit(path, [_new_file("a.parquet", 2)])
    add = next(a["add"] for a in _log(path, version) if "add" in a)
    assert "baseRowId" not in add and "defaultRowCommitVersion" not in add


def test_a_file_without_a_row_count_gets_no_row_ids(lake: Path) -> None:
    path = _table(lake)
    unknown = AddFile(path="a.parquet", size=1, partition_values={}, modification_time=0)
    with pytest.raises(DeltaError, match="numRecords"):
        _commit(path, [unknown])


@pytest.mark.parametrize("part", [None, "a b%"], ids=["plain-paths", "encoded-paths"])
def test_a_scan_gives_each_row_its_files_row_id(spark: SparkSession, lake: Path, part: str | None) -> None:
    """Two files of one size (met by a hash of their path) and a third of another (by its size), or paths Spark
    encodes (by the decoded path): each row gets its own file's ``baseRowId`` plus its row index."""
    path = lake / "tracked"
    parts = {"partition_by": ["part"]} if part else {}
    for i, ids in enumerate([[1, 2, 3, 4], [5, 6, 7, 8], list(range(20, 30))]):
        data = pa.table({"id": pa.array(ids, pa.int64())})
        if part:
            data = data.append_column("part", pa.array([part] * len(ids)))
        write_deltalake(str(path), data, mode="append" if i else "error", **parts)
    adds = [a["add"] for version in range(3) for a in _log(path, version) if "add" in a]
    assert adds[0]["size"] == adds[1]["size"] != adds[2]["size"]
    metadata = next(a["metaData"] for a in _log(path, 0) if "metaData" in a)
    config = {
        "delta.enableRowTracking": "true",
        "delta.rowTracking.materializedRowIdColumnName": ROW_ID_COLUMN,
        "delta.rowTracking.materializedRowCommitVersionColumnName": VERSION_COLUMN,
    }
    protocol = {"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": ["domainMetadata", "rowTracking"]}
    bases = [100, 200, 300]
    _write_commit(
        path,
        3,
        [
            {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": "SET TBLPROPERTIES"}},
            {"protocol": protocol},
            {"metaData": {**metadata, "configuration": config}},
            {"domainMetadata": {"domain": "delta.rowTracking", "configuration": '{"rowIdHighWaterMark":309}'}},
            *[
                {"add": {**add, "dataChange": False, "baseRowId": base, "defaultRowCommitVersion": version}}
                for version, (add, base) in enumerate(zip(adds, bases, strict=True))
            ],
        ],
    )
    snapshot = delta.load_snapshot(str(path))
    rows = delta.scan_files(spark, snapshot, snapshot.files, row_tracking=True).collect()
    base_of = {add["path"]: base for add, base in zip(adds, bases, strict=True)}
    version_of = {add["path"]: version for version, add in enumerate(adds)}
    assert sorted(r["id"] for r in rows) == [1, 2, 3, 4, 5, 6, 7, 8, *range(20, 30)]
    if part:
        assert all(r["part"] == part for r in rows)
    for r in rows:
        name = r[delta.FILE_NAME_COL]
        assert r[delta.ROW_ID_COL] == base_of[name] + r[delta.ROW_INDEX_COL]
        assert r[delta.ROW_COMMIT_VERSION_COL] == version_of[name]
    assert {r[delta.FILE_NAME_COL] for r in rows} == set(base_of)
    if not part:
        # A file of another size than its log entry gives meets no file's row: the scan fails.
        wrong = {
            **adds[2],
            "size": adds[0]["size"],
            "dataChange": False,
            "baseRowId": 300,
            "defaultRowCommitVersion": 2,
        }
        _write_commit(path, 4, [{"commitInfo": {"timestamp": int(time.time() * 1000)}}, {"add": wrong}])
        snapshot = delta.load_snapshot(str(path))
        with pytest.raises(Exception, match=UNMAPPED_MARKER):
            delta.scan_files(spark, snapshot, snapshot.files, row_tracking=True).collect()
