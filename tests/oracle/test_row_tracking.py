"""Row tracking, liquid clustering and in-commit timestamps: tables Delta on Spark writes, merged by the engine,
read back by Delta (rows, ``_metadata.row_id`` / ``row_commit_version``), then merged, deleted from and optimized
by Delta; the engine's commit checked against PROTOCOL.md's writer requirements, the rows read by delta-rs."""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable, QueryBuilder
from pyspark.sql import SparkSession

from engine import MergeSpec, run_merge
from engine.spec import RowsSource
from tests.engine.harness import clause
from tests.oracle.tables import commit_info, latest_version, log_actions, make_delta_table, table_ref

ROW_TRACKING = {"delta.enableRowTracking": "true"}
DDL = "id BIGINT, v STRING"


def _ids(delta_spark: SparkSession, path: Path) -> dict[int, tuple[int, int, str]]:
    """id -> (stable row id, stable row commit version, v), as Delta reads them."""
    got = delta_spark.sql(
        f"SELECT id, v, _metadata.row_id AS row_id, _metadata.row_commit_version AS rcv FROM {table_ref(path)}"
    ).collect()
    return {r.id: (r.row_id, r.rcv, r.v) for r in got}


def _high_water_mark(path: Path) -> int:
    marks = [
        json.loads(a["domainMetadata"]["configuration"])["rowIdHighWaterMark"]
        for a in log_actions(path)
        if "domainMetadata" in a and a["domainMetadata"]["domain"] == "delta.rowTracking"
    ]
    return max(marks, default=-1)


def _upsert(
    spark: SparkSession, path: Path, source: Sequence[Mapping[str, Any]], *, deletion_vectors: str = "auto"
) -> int:
    """UPDATE matched rows (DELETE those with v = 'gone'), INSERT the others, through the engine."""
    spec = MergeSpec(
        target=str(path),
        source=RowsSource(rows=list(source), schema=DDL),
        on="t.id = s.id",
        matched=(clause("matched", "delete", "s.v = 'gone'"), clause("matched", "update_all")),
        not_matched=(clause("notMatched", "insert_all"),),
        target_alias="t",
        source_alias="s",
        deletion_vectors=deletion_vectors,  # type: ignore[arg-type]
    )
    return _merge(spark, spec)


def _merge(spark: SparkSession, spec: MergeSpec) -> int:
    """The engine's merge (on the product's Spark), which must commit."""
    result = run_merge(spark, spec)
    assert result.table_version is not None
    return result.table_version


def _writer_features(path: Path, version: int) -> set[str]:
    """The writer features of the newest protocol at or before ``version``."""
    features: set[str] = set()
    for v in range(version + 1):
        for action in log_actions(path, v):
            if "protocol" in action:
                features = set(action["protocol"].get("writerFeatures") or ())
    return features


def check_writer_requirements(path: Path, version: int) -> None:
    """PROTOCOL.md's writer requirements on the commit at ``version``: commitInfo first (with a monotonic
    ``inCommitTimestamp`` where enabled); every new add's ``baseRowId`` above the previous high-water mark and
    its ``defaultRowCommitVersion`` the commit's version; the mark raised in the same commit to cover them; a
    re-added or removed file keeps its add's fields; no two live files share a row id."""
    actions = log_actions(path, version)
    assert "commitInfo" in actions[0], actions[0]
    before = {a["add"]["path"]: a["add"] for a in _live_adds(path, version - 1)}
    previous_mark = max(
        (
            json.loads(a["domainMetadata"]["configuration"])["rowIdHighWaterMark"]
            for v in range(version)
            for a in log_actions(path, v)
            if "domainMetadata" in a and a["domainMetadata"]["domain"] == "delta.rowTracking"
        ),
        default=-1,
    )
    config = _configuration(path, version)
    if config.get("delta.enableInCommitTimestamps") == "true":
        ict = actions[0]["commitInfo"]["inCommitTimestamp"]
        assert ict > commit_info(path, version - 1)["inCommitTimestamp"]
    if "rowTracking" not in _writer_features(path, version):
        return  # the row id requirements apply to tables that support row tracking
    marks = [
        json.loads(a["domainMetadata"]["configuration"])["rowIdHighWaterMark"]
        for a in actions
        if "domainMetadata" in a and a["domainMetadata"]["domain"] == "delta.rowTracking"
    ]
    mark = marks[0] if marks else previous_mark
    for action in actions:
        if "remove" in action and action["remove"]["path"] in before:
            old = before[action["remove"]["path"]]
            assert action["remove"].get("baseRowId") == old.get("baseRowId")
            assert action["remove"].get("defaultRowCommitVersion") == old.get("defaultRowCommitVersion")
        if "add" not in action:
            continue
        add = action["add"]
        if add["path"] in before:
            assert add["baseRowId"] == before[add["path"]]["baseRowId"]
            assert add["defaultRowCommitVersion"] == before[add["path"]]["defaultRowCommitVersion"]
            continue
        records = json.loads(add["stats"])["numRecords"]
        assert add["baseRowId"] > previous_mark
        assert add["baseRowId"] + records - 1 <= mark
        assert add["defaultRowCommitVersion"] == version
    ranges = sorted(
        (a["add"]["baseRowId"], a["add"]["baseRowId"] + json.loads(a["add"]["stats"])["numRecords"])
        for a in _live_adds(path, version)
    )
    for (_, end), (start, _) in itertools.pairwise(ranges):
        assert end <= start, ranges


def _live_adds(path: Path, version: int) -> list[dict[str, Any]]:
    live: dict[str, dict[str, Any]] = {}
    for v in range(version + 1):
        for action in log_actions(path, v):
            if "add" in action:
                live[action["add"]["path"]] = action
            elif "remove" in action:
                dv = action["remove"].get("deletionVector")
                current = live.get(action["remove"]["path"])
                if current is not None and (current["add"].get("deletionVector") or {}).get("pathOrInlineDv") == (
                    dv or {}
                ).get("pathOrInlineDv"):
                    del live[action["remove"]["path"]]
    return list(live.values())


def _configuration(path: Path, version: int) -> dict[str, str]:
    config: dict[str, str] = {}
    for v in range(version + 1):
        for action in log_actions(path, v):
            if "metaData" in action:
                config = action["metaData"]["configuration"]
    return config


def _delta_follows(delta_spark: SparkSession, path: Path, *, row_ids: bool = True) -> None:
    """Delta's own MERGE, DELETE and OPTIMIZE on the engine's result, without error, keeping the rows (and the
    row ids and commit versions with ``row_ids``)."""
    ref = table_ref(path)
    delta_spark.sql(
        f"MERGE INTO {ref} t USING (SELECT 1000 AS id, 'delta' AS v) s ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
    ).collect()
    delta_spark.sql(f"DELETE FROM {ref} WHERE id = 1000").collect()
    read = _ids if row_ids else _values
    before = read(delta_spark, path)
    delta_spark.sql(f"OPTIMIZE {ref}").collect()
    assert read(delta_spark, path) == before


def _values(delta_spark: SparkSession, path: Path) -> dict[int, str]:
    return {r.id: r.v for r in delta_spark.sql(f"SELECT id, v FROM {table_ref(path)}").collect()}


def _assert_rows_by_delta_rs(path: Path, expected: Mapping[int, str]) -> None:
    """delta-rs reads the table through its SQL engine, which honours deletion vectors."""
    table = QueryBuilder().register("t", DeltaTable(str(path))).execute("SELECT id, v FROM t").read_all()
    assert dict(zip(table.column("id").to_pylist(), table.column("v").to_pylist(), strict=True)) == dict(expected)


def _row_tracked_table(delta_spark: SparkSession, path: Path, properties: Mapping[str, str]) -> Path:
    """Thirty rows, then five more in another commit, then Delta's UPDATE of two of them: their row ids are
    materialized. Enough rows per file that a merge touching a few leaves each touched file with live rows."""
    make_delta_table(
        delta_spark,
        path,
        DDL,
        [(i, f"v{i}") for i in range(30)],
        properties={**ROW_TRACKING, **properties},
        then_sql=[
            "INSERT INTO {table} VALUES " + ", ".join(f"({i}, 'v{i}')" for i in range(30, 35)),
            "UPDATE {table} SET v = 'u' || v WHERE id IN (3, 33)",
        ],
    )
    return path


@pytest.mark.parametrize(
    ("properties", "deletion_vectors"),
    [
        ({}, "off"),
        ({"delta.enableDeletionVectors": "true"}, "auto"),
        ({"delta.enableChangeDataFeed": "true"}, "off"),
        ({"delta.enableDeletionVectors": "true", "delta.enableChangeDataFeed": "true"}, "auto"),
        ({"delta.columnMapping.mode": "name"}, "off"),
        ({"delta.columnMapping.mode": "id", "delta.enableDeletionVectors": "true"}, "auto"),
        ({"delta.columnMapping.mode": "name", "delta.enableChangeDataFeed": "true"}, "off"),
    ],
    ids=[
        "copy-on-write",
        "deletion-vectors",
        "cdf",
        "deletion-vectors-cdf",
        "column-mapping",
        "column-mapping-id-dv",
        "column-mapping-cdf",
    ],
)
def test_merge_preserves_row_ids(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, properties: dict[str, str], deletion_vectors: str
) -> None:
    path = _row_tracked_table(delta_spark, tmp_path / "rt", properties)
    before = _ids(delta_spark, path)
    mark = _high_water_mark(path)
    source = [{"id": 3, "v": "new3"}, {"id": 5, "v": "new5"}, {"id": 6, "v": "gone"}]
    source += [{"id": 100, "v": "v100"}, {"id": 101, "v": "v101"}]
    version = _upsert(spark, path, source, deletion_vectors=deletion_vectors)

    after = _ids(delta_spark, path)
    assert {i: v for i, (_, _, v) in after.items()} == {
        **{i: v for i, (_, _, v) in before.items() if i != 6},
        3: "new3",
        5: "new5",
        100: "v100",
        101: "v101",
    }
    for i in (3, 5):  # updated: same row id, the merge's version
        assert after[i][:2] == (before[i][0], version)
    for i in set(before) - {3, 5, 6}:  # copied (or left in place): both kept
        assert after[i][:2] == before[i][:2]
    fresh = [after[i][0] for i in (100, 101)]
    assert min(fresh) > mark and all(after[i][1] == version for i in (100, 101))
    assert len({row_id for row_id, _, _ in after.values()}) == len(after)
    assert commit_info(path, version)["tags"]["delta.rowTracking.preserved"] == "true"
    check_writer_requirements(path, version)
    if deletion_vectors == "auto":
        adds = [a["add"] for a in log_actions(path, version) if "add" in a]
        assert any(a.get("deletionVector") for a in adds), [a["path"] for a in adds]
        assert commit_info(path, version)["operationMetrics"]["numTargetRowsCopied"] == "0"
    _assert_rows_by_delta_rs(path, {i: v for i, (_, _, v) in after.items()})
    _delta_follows(delta_spark, path)


def test_insert_only_merge_assigns_fresh_row_ids(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path
) -> None:
    """On a table whose log Delta checkpointed: the high-water mark and the files' row ids come from the
    checkpoint."""
    path = _row_tracked_table(delta_spark, tmp_path / "rt", {"delta.checkpointInterval": "2"})
    assert list((path / "_delta_log").glob("*.checkpoint.parquet"))
    before = _ids(delta_spark, path)
    mark = _high_water_mark(path)
    spec = MergeSpec(
        target=str(path),
        source=RowsSource(rows=[{"id": 3, "v": "x"}, {"id": 130, "v": "v130"}, {"id": 131, "v": "v131"}], schema=DDL),
        on="t.id = s.id",
        not_matched=(clause("notMatched", "insert_all"),),
        target_alias="t",
        source_alias="s",
    )
    version = _merge(spark, spec)
    after = _ids(delta_spark, path)
    assert {i: after[i] for i in before} == before
    assert sorted(after[i][0] for i in (130, 131)) == [mark + 1, mark + 2]
    assert _high_water_mark(path) == mark + 2
    check_writer_requirements(path, version)
    _delta_follows(delta_spark, path)


def test_concurrent_high_water_mark_reassigns_row_ids(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path
) -> None:
    """A commit that raised the high-water mark after the merge read the table: the merge's new files get ids
    above the winner's mark when it retries, so no row id is handed out twice."""
    from engine import delta

    path = _row_tracked_table(delta_spark, tmp_path / "rt", {})
    snapshot = delta.load_snapshot(str(path))
    delta_spark.sql(f"INSERT INTO {table_ref(path)} VALUES (50, 'v50'), (51, 'v51')").collect()
    winner_mark = _high_water_mark(path)
    transaction = delta.Transaction(snapshot)
    added = delta.write_data_files(
        spark,
        spark.createDataFrame([(60, "v60")], DDL),
        snapshot,
        write_id="concurrent-append",
    )
    version = transaction.commit(added, operation="WRITE", operation_parameters={"mode": "Append"})
    assert transaction.attempts == 1 and version == snapshot.version + 2
    add = next(a["add"] for a in log_actions(path, version) if "add" in a)
    assert add["baseRowId"] == winner_mark + 1
    assert _high_water_mark(path) == winner_mark + 1
    check_writer_requirements(path, version)
    ids = _ids(delta_spark, path)
    assert len({row_id for row_id, _, _ in ids.values()}) == len(ids)


def test_clustered_table_keeps_its_clustering(spark: SparkSession, delta_spark: SparkSession, tmp_path: Path) -> None:
    """Liquid clustering: the engine's merge keeps the ``delta.clustering`` domain and writes files with
    statistics on the clustering columns and no ``clusteringProvider`` (not clustered: Delta's MERGE does not
    cluster on write either); Delta's OPTIMIZE clusters them afterwards."""
    path = tmp_path / "clustered"
    delta_spark.sql(f"CREATE TABLE {table_ref(path)} ({DDL}) USING delta CLUSTER BY (id)").collect()
    delta_spark.sql(f"INSERT INTO {table_ref(path)} VALUES (1, 'a'), (2, 'b'), (3, 'c')").collect()
    delta_spark.sql(f"OPTIMIZE {table_ref(path)}").collect()
    domains_before = _domains(path)
    assert "delta.clustering" in domains_before
    version = _upsert(spark, path, [{"id": 2, "v": "B"}, {"id": 4, "v": "d"}])
    assert _domains(path) == domains_before
    adds = [a["add"] for a in log_actions(path, version) if "add" in a]
    for add in adds:
        assert "clusteringProvider" not in add
        stats = json.loads(add["stats"])
        assert "id" in stats["minValues"] and "id" in stats["maxValues"]
    detail = delta_spark.sql(f"DESCRIBE DETAIL {table_ref(path)}").collect()[0]
    assert list(detail.clusteringColumns) == ["id"]
    expected = {1: "a", 2: "B", 3: "c", 4: "d"}
    got = delta_spark.sql(f"SELECT id, v FROM {table_ref(path)}").collect()
    assert {r.id: r.v for r in got} == expected
    _assert_rows_by_delta_rs(path, expected)
    _delta_follows(delta_spark, path, row_ids=False)


def _domains(path: Path) -> dict[str, str]:
    domains: dict[str, str] = {}
    for action in log_actions(path):
        if "domainMetadata" in action:
            d = action["domainMetadata"]
            if d.get("removed"):
                domains.pop(d["domain"], None)
            else:
                domains[d["domain"]] = d["configuration"]
    return domains


def test_in_commit_timestamps(spark: SparkSession, delta_spark: SparkSession, tmp_path: Path) -> None:
    """commitInfo first, with an in-commit timestamp after the previous commit's; Delta's history shows it."""
    path = make_delta_table(
        delta_spark,
        tmp_path / "ict",
        DDL,
        [(1, "a"), (2, "b")],
        properties={"delta.enableInCommitTimestamps": "true"},
    )
    version = _upsert(spark, path, [{"id": 2, "v": "B"}, {"id": 3, "v": "c"}])
    info = log_actions(path, version)[0]["commitInfo"]
    assert info["inCommitTimestamp"] > commit_info(path, version - 1)["inCommitTimestamp"]
    check_writer_requirements(path, version)
    history = delta_spark.sql(f"DESCRIBE HISTORY {table_ref(path)} LIMIT 1").collect()[0]
    assert history.version == version
    assert int(history.timestamp.timestamp() * 1000) == info["inCommitTimestamp"]
    _assert_rows_by_delta_rs(path, {1: "a", 2: "B", 3: "c"})
    _delta_follows(delta_spark, path, row_ids=False)
    assert latest_version(path) > version


def test_in_commit_timestamp_follows_a_later_previous_commit(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path
) -> None:
    """A previous commit whose in-commit timestamp lies ahead of this machine's clock: the next one is one
    millisecond after it, never before (monotonic)."""
    path = make_delta_table(
        delta_spark, tmp_path / "ict", DDL, [(1, "a")], properties={"delta.enableInCommitTimestamps": "true"}
    )
    last = latest_version(path)
    commit = path / "_delta_log" / f"{last:020d}.json"
    lines = [json.loads(line) for line in commit.read_text().splitlines() if line.strip()]
    ahead = lines[0]["commitInfo"]["inCommitTimestamp"] + 3_600_000
    lines[0]["commitInfo"]["inCommitTimestamp"] = ahead
    commit.write_text("".join(json.dumps(line) + "\n" for line in lines))
    version = _upsert(spark, path, [{"id": 2, "v": "b"}])
    assert log_actions(path, version)[0]["commitInfo"]["inCommitTimestamp"] == ahead + 1
