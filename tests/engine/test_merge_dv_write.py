"""Merge-on-read: merges into tables with ``delta.enableDeletionVectors`` mark updated and deleted rows in
deletion vectors instead of rewriting the touched files. Every result is checked against a reference model
computed in Python and read back by delta-rs (which applies the vectors); the log must show the vectors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from engine import run_merge
from engine.delta import load_snapshot
from engine.delta.transaction import Transaction
from tests.engine.delta.dv_tables import delete_rows, enable_deletion_vectors, kill_once_written, read_with_deltalake
from tests.engine.harness import clause, join_plan, make_spec, stray_files, write_table
from tests.engine.test_merge_dv import _KILLED_MERGE
from tests.oracle.tables import make_delta_table

Row = tuple[Any, ...]


def _rows(ids: list[int], tag: str) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"{tag}{i}" for i in ids], "n": pa.array(ids, pa.int64())})


def _target(lake: Path, *, cdf: bool = False) -> Path:
    """Three files of 100 rows (ids 0-299), deletion vectors enabled."""
    path = lake / "target"
    config = {"delta.enableChangeDataFeed": "true"} if cdf else None
    for start in (0, 100, 200):
        write_deltalake(str(path), _rows(list(range(start, start + 100)), "t"), mode="append", configuration=config)
    enable_deletion_vectors(path)
    return path


def _live(path: Path) -> dict[int, Row]:
    table = read_with_deltalake(path)
    return {row["id"]: (row["id"], row["v"], row["n"]) for row in table.select(["id", "v", "n"]).to_pylist()}


def _commit(path: Path) -> list[dict[str, Any]]:
    version = load_snapshot(path).version
    text = (path / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _files_by_first_id(path: Path) -> list[str]:
    snapshot = load_snapshot(path)
    return [f.path for f in sorted(snapshot.files, key=lambda f: f.stats.min_values["id"])]  # type: ignore[union-attr]


# The join of writeAllChanges: both sides shuffled, or the source broadcast past the streamed target with its unmatched
# rows found by a semi join, or through the source's key bitmap (held target rows, or the semi join on it).
JOIN_PLANS = {
    "shuffled": {"broadcast": False},
    "broadcast": {"broadcast": True},
    "broadcast-held": {"broadcast": True, "key_bitmap": "held"},
    "broadcast-semi": {"broadcast": True, "key_bitmap": "semi"},
}


@pytest.mark.parametrize("plan", list(JOIN_PLANS))
def test_upsert_writes_deletion_vectors(spark: SparkSession, lake: Path, plan: str) -> None:
    target = _target(lake)
    files = _files_by_first_id(target)
    live = _live(target)
    ids = [3, 20, 250, 1000, 1001]
    source = write_table(lake / "source", _rows(ids, "s"))
    spec = make_spec(
        target, source, "t.id = s.id", [clause("matched", "update_all"), clause("notMatched", "insert_all")]
    )
    with join_plan(**JOIN_PLANS[plan]):  # type: ignore[arg-type]
        result = run_merge(spark, spec)

    expected = dict(live)
    for i in ids:
        expected[i] = (i, f"s{i}", i)
    assert _live(target) == expected
    actions = _commit(target)
    removes = {a["remove"]["path"]: a["remove"] for a in actions if "remove" in a}
    adds = [a["add"] for a in actions if "add" in a]
    readded = {a["path"]: a for a in adds if "deletionVector" in a}
    assert set(removes) == set(readded) == {files[0], files[2]}
    assert all("deletionVector" not in r for r in removes.values())
    for add in readded.values():
        stats = json.loads(add["stats"])
        assert stats["numRecords"] == 100 and stats["tightBounds"] is False
        assert add["dataChange"] is True
        assert add["deletionVector"]["storageType"] == "u"
    assert readded[files[0]]["deletionVector"]["cardinality"] == 2
    assert readded[files[2]]["deletionVector"]["cardinality"] == 1
    # One DV file for the commit, as Delta writes it.
    assert len({a["deletionVector"]["pathOrInlineDv"] for a in readded.values()}) == 1
    assert pa.RecordBatchReader.from_stream(DeltaTable(str(target)).deletion_vectors()).read_all().num_rows == 2
    new_files = [a for a in adds if "deletionVector" not in a]
    assert sum(json.loads(a["stats"])["numRecords"] for a in new_files) == len(ids)  # no copied row written
    # The few changed rows (updates out of two files, and the inserts) make one file, not one per touched file.
    assert len(new_files) == 1
    m = result.metrics
    assert m["numTargetRowsUpdated"] == 3 and m["numTargetRowsInserted"] == 2
    assert m["numTargetRowsCopied"] == 0
    assert m["numTargetDeletionVectorsAdded"] == 2
    assert m["numTargetDeletionVectorsUpdated"] == 0 and m["numTargetDeletionVectorsRemoved"] == 0
    assert m["numTargetFilesRemoved"] == 0 and m["numTargetFilesAdded"] == len(new_files)

    # A second merge over the same file updates its vector: old deletions OR new ones.
    source2 = write_table(lake / "source2", _rows([4, 5], "u"))
    result2 = run_merge(spark, make_spec(target, source2, "t.id = s.id", [clause("matched", "update_all")]))
    expected[4], expected[5] = (4, "u4", 4), (5, "u5", 5)
    assert _live(target) == expected
    readded2 = [a["add"] for a in _commit(target) if "add" in a and "deletionVector" in a["add"]]
    assert [a["deletionVector"]["cardinality"] for a in readded2] == [4]
    assert result2.metrics["numTargetDeletionVectorsUpdated"] == 1
    assert result2.metrics["numTargetDeletionVectorsAdded"] == 1
    assert result2.metrics["numTargetDeletionVectorsRemoved"] == 1
    assert not stray_files(target)


def test_delete_only_writes_no_data_file(spark: SparkSession, lake: Path) -> None:
    target = _target(lake)
    live = _live(target)
    source = write_table(lake / "source", _rows([1, 2, 150], "s"))
    result = run_merge(spark, make_spec(target, source, "t.id = s.id", [clause("matched", "delete")]))
    assert _live(target) == {i: r for i, r in live.items() if i not in (1, 2, 150)}
    actions = _commit(target)
    assert all("deletionVector" in a["add"] for a in actions if "add" in a)
    assert len([a for a in actions if "add" in a]) == 2
    assert result.metrics["numTargetFilesAdded"] == 0
    assert result.metrics["numTargetRowsDeleted"] == 3
    assert result.metrics["numTargetDeletionVectorsAdded"] == 2


def test_partitioned_upsert_writes_one_file_per_partition(spark: SparkSession, lake: Path) -> None:
    """The few changed rows go to one task, which still writes each partition value its own file."""
    target = lake / "partitioned"
    data = _rows(list(range(200)), "t").append_column("p", pa.array(["a", "b"] * 100))
    write_deltalake(str(target), data, partition_by=["p"])
    enable_deletion_vectors(target)
    live = _live(target)
    ids = [2, 3, 150, 151, 500, 501]
    source = write_table(lake / "source", _rows(ids, "s").append_column("p", pa.array(["a", "b"] * 3)))
    spec = make_spec(
        target, source, "t.id = s.id", [clause("matched", "update_all"), clause("notMatched", "insert_all")]
    )
    result = run_merge(spark, spec)
    assert _live(target) == {**live, **{i: (i, f"s{i}", i) for i in ids}}
    new_files = [a["add"] for a in _commit(target) if "add" in a and "deletionVector" not in a["add"]]
    assert sorted(a["partitionValues"]["p"] for a in new_files) == ["a", "b"]
    assert result.metrics["numTargetFilesAdded"] == 2 and result.metrics["numTargetRowsCopied"] == 0


def test_file_whose_rows_are_all_deleted_is_removed(spark: SparkSession, lake: Path) -> None:
    target = _target(lake)
    files = _files_by_first_id(target)
    live = _live(target)
    source = write_table(lake / "source", _rows(list(range(100, 200)), "s"))
    result = run_merge(spark, make_spec(target, source, "t.id = s.id", [clause("matched", "delete")]))
    assert _live(target) == {i: r for i, r in live.items() if not 100 <= i < 200}
    actions = _commit(target)
    assert [a["remove"]["path"] for a in actions if "remove" in a] == [files[1]]
    assert not [a for a in actions if "add" in a]
    assert result.metrics["numTargetFilesRemoved"] == 1


def test_conditional_update_and_not_matched_by_source(spark: SparkSession, lake: Path) -> None:
    target = _target(lake)
    live = _live(target)
    source = write_table(lake / "source", _rows([5, 6, 120, 121, 500], "s"))
    clauses = [
        clause("matched", "update", "s.id % 2 = 0", v="s.v"),
        clause("matched", "delete"),
        clause("notMatched", "insert_all"),
        clause("notMatchedBySource", "update", "t.id >= 290", v="'old'"),
        clause("notMatchedBySource", "delete", "t.id < 3"),
    ]
    result = run_merge(spark, make_spec(target, source, "t.id = s.id", clauses))
    expected: dict[int, Row] = {}
    for i, row in live.items():
        if i in (6, 120):
            expected[i] = (i, f"s{i}", i)
        elif i in (5, 121) or i < 3:
            continue
        elif i >= 290:
            expected[i] = (i, "old", i)
        else:
            expected[i] = row
    expected[500] = (500, "s500", 500)
    assert _live(target) == expected
    m = result.metrics
    assert m["numTargetRowsMatchedUpdated"] == 2 and m["numTargetRowsMatchedDeleted"] == 2
    assert m["numTargetRowsNotMatchedBySourceUpdated"] == 10
    assert m["numTargetRowsNotMatchedBySourceDeleted"] == 3
    assert m["numTargetRowsCopied"] == 0
    # Every file has a changed row: each gets a vector (file 0: 5, 6, 0-2; file 1: 120, 121; file 2: 290-299).
    cardinalities = sorted(
        a["add"]["deletionVector"]["cardinality"]
        for a in _commit(target)
        if "add" in a and "deletionVector" in a["add"]
    )
    assert cardinalities == [2, 5, 10]


def test_off_rewrites_files(spark: SparkSession, lake: Path) -> None:
    target = _target(lake)
    source = write_table(lake / "source", _rows([3], "s"))
    spec = make_spec(target, source, "t.id = s.id", [clause("matched", "update_all")], deletion_vectors="off")
    result = run_merge(spark, spec)
    assert result.metrics["numTargetRowsCopied"] == 99
    assert not any("deletionVector" in a.get("add", {}) for a in _commit(target))


def _cdf(path: Path) -> list[Row]:
    table = DeltaTable(str(path)).load_cdf(starting_version=load_snapshot(path).version).read_all()
    values = [table.column(c).to_pylist() for c in ("id", "v", "_change_type")]
    return sorted(zip(*values, strict=True))


@pytest.mark.parametrize("plan", list(JOIN_PLANS))
@pytest.mark.parametrize("clauses", ["upsert", "upsert_nmbs", "delete_nmbs"])
def test_change_data_feed_equals_copy_on_write(spark: SparkSession, lake: Path, clauses: str, plan: str) -> None:
    chosen = {
        "upsert": [clause("matched", "update_all"), clause("notMatched", "insert_all")],
        "upsert_nmbs": [
            clause("matched", "update_all"),
            clause("notMatched", "insert_all"),
            clause("notMatchedBySource", "delete", "t.id > 290"),
        ],
        "delete_nmbs": [clause("matched", "delete"), clause("notMatchedBySource", "update", "t.id > 295", v="'x'")],
    }[clauses]
    results = []
    for mode in ("auto", "off"):
        root = lake / mode
        target = _target(root, cdf=True)
        source = write_table(root / "source", _rows([1, 2, 150, 400], "s"))
        with join_plan(**JOIN_PLANS[plan]):  # type: ignore[arg-type]
            run_merge(spark, make_spec(target, source, "t.id = s.id", chosen, deletion_vectors=mode))
        results.append((_cdf(target), _live(target)))
    assert results[0] == results[1]
    assert results[0][0]


def test_concurrent_vector_change_conflicts(spark: SparkSession, lake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit that changes a file's vector between the merge's read and its commit removes the same path: the
    merge's commit conflicts and is redone, so neither writer's deletions are lost."""
    target = _target(lake)
    files = _files_by_first_id(target)
    live = _live(target)
    original = Transaction.commit
    calls: list[int] = []

    def commit_after_a_rival(self: Transaction, *args: Any, **kwargs: Any) -> int:
        calls.append(self.read_version)
        if len(calls) == 1:
            delete_rows(target, {files[0]: [50]})  # id 50, same file as the merge's id 3
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Transaction, "commit", commit_after_a_rival)
    source = write_table(lake / "source", _rows([3], "s"))
    run_merge(spark, make_spec(target, source, "t.id = s.id", [clause("matched", "update_all")]))
    assert len(calls) == 2 and calls[1] > calls[0]
    expected = {i: r for i, r in live.items() if i != 50}
    expected[3] = (3, "s3", 3)
    assert _live(target) == expected
    (vector,) = [f.deletion_vector for f in load_snapshot(target).files if f.path == files[0]]
    assert vector is not None and vector.cardinality == 2
    assert not stray_files(target)
    # The rival's vector file and the redone merge's: the first attempt's went with its discarded write.
    assert len(list(target.rglob("deletion_vector_*.bin"))) == 2


DELTA_METRICS = (
    "numTargetRowsUpdated",
    "numTargetRowsInserted",
    "numTargetRowsDeleted",
    "numTargetRowsCopied",
    "numTargetDeletionVectorsAdded",
    "numTargetDeletionVectorsUpdated",
    "numTargetDeletionVectorsRemoved",
    "numTargetFilesRemoved",
)
"""The metrics that do not depend on how the new rows are split into files."""


@pytest.mark.parametrize(
    "merge",
    [
        "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
        "WHEN MATCHED AND s.id % 2 = 0 THEN DELETE WHEN NOT MATCHED BY SOURCE AND t.id < 3 THEN DELETE",
    ],
)
def test_delta_on_spark_reads_the_merge_and_agrees(
    spark: SparkSession,
    delta_spark: SparkSession,
    tmp_path: Path,
    merge: str,
) -> None:
    """Delta on Spark merges a copy of the same table (one with a vector it wrote itself): its full scan of the
    engine's result equals its own result, DESCRIBE DETAIL reads the table, and the metrics agree."""
    ours = make_delta_table(
        delta_spark,
        tmp_path / "ours",
        "id BIGINT, v STRING, n BIGINT",
        [(i, f"t{i}", i) for i in range(40)],
        properties={"delta.enableDeletionVectors": "true"},
        then_sql=["DELETE FROM {table} WHERE id IN (1, 9, 21)"],
    )
    theirs = tmp_path / "theirs"
    shutil.copytree(ours, theirs)
    source_rows = [(i, f"s{i}", -i) for i in (0, 2, 9, 10, 21, 33, 50)]
    source = write_table(
        tmp_path / "source",
        pa.table(
            {
                "id": pa.array([r[0] for r in source_rows], pa.int64()),
                "v": [r[1] for r in source_rows],
                "n": pa.array([r[2] for r in source_rows], pa.int64()),
            }
        ),
    )
    clauses = {
        "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *": [
            clause("matched", "update_all"),
            clause("notMatched", "insert_all"),
        ],
    }.get(merge) or [clause("matched", "delete", "s.id % 2 = 0"), clause("notMatchedBySource", "delete", "t.id < 3")]
    result = run_merge(spark, make_spec(ours, source, "t.id = s.id", clauses))
    delta_spark.sql(f"MERGE INTO delta.`{theirs}` t USING delta.`{source}` s ON t.id = s.id {merge}").collect()

    def scan(path: Path) -> list[Row]:
        return [tuple(r) for r in delta_spark.sql(f"SELECT id, v, n FROM delta.`{path}` ORDER BY id").collect()]

    assert scan(ours) == scan(theirs)
    assert {(r[0], r[1], r[2]) for r in scan(ours)} == set(_live(ours).values())
    detail = delta_spark.sql(f"DESCRIBE DETAIL delta.`{ours}`").collect()[0]
    assert detail.numFiles == len(load_snapshot(ours).files)
    history = delta_spark.sql(f"DESCRIBE HISTORY delta.`{theirs}` LIMIT 1").collect()[0]
    theirs_metrics = {k: int(history.operationMetrics[k]) for k in DELTA_METRICS}
    assert {k: result.metrics[k] for k in DELTA_METRICS} == theirs_metrics
    assert any("deletionVector" in a.get("add", {}) for a in _commit(ours))


def test_add_before_remove_keeps_the_new_vector(spark: SparkSession, lake: Path) -> None:
    """Delta's DELETE writes the file's new ``add`` before the ``remove`` of its old vector; log replay keys
    file actions by path and vector, so the new vector stays live and a merge sees the rows it deletes."""
    target = _target(lake)
    files = _files_by_first_id(target)
    version = delete_rows(target, {files[0]: [3]})
    entry = target / "_delta_log" / f"{version:020d}.json"
    lines = entry.read_text().splitlines()
    entry.write_text("\n".join(sorted(lines, key=lambda line: '"remove"' in line)) + "\n")
    assert lines != sorted(lines, key=lambda line: '"remove"' in line)
    source = write_table(lake / "source", _rows([3, 4], "s"))
    result = run_merge(spark, make_spec(target, source, "t.id = s.id", [clause("matched", "update_all")]))
    assert result.metrics["numTargetRowsUpdated"] == 1
    assert 3 not in _live(target)


def test_killed_merge_leaves_no_visible_vector(spark_remote: str, lake: Path) -> None:
    """A merge killed after writing its data and vector files, before its commit: the log and the live rows are
    as they were, and the vector file is garbage no log entry names."""
    target = _target(lake)
    before = load_snapshot(target)
    live = _live(target)
    source = write_table(lake / "source", _rows([3, 20, 250, 1000], "s"))
    kill_once_written(_KILLED_MERGE, spark_remote, str(target), str(source))
    after = load_snapshot(target)
    assert after.version == before.version
    assert all(f.deletion_vector is None for f in after.files)
    assert _live(target) == live
    assert list(target.rglob("deletion_vector_*.bin"))  # written, named by no live file
