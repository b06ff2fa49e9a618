"""Merge-on-read: merges into tables with ``delta.enableDeletionVectors`` mark updated and deleted rows in
deletion vectors instead of rewriting the touched files. Every result is checked against a reference model
computed in Python and read back by delta-rs (which applies the vectors); the log must show the vectors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from engine import run_merge
from engine.delta import load_snapshot
from tests.engine.delta.dv_tables import enable_deletion_vectors, read_with_deltalake
from tests.engine.harness import clause, make_spec, stray_files, write_table

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


def test_upsert_writes_deletion_vectors(spark: SparkSession, lake: Path) -> None:
    target = _target(lake)
    files = _files_by_first_id(target)
    live = _live(target)
    ids = [3, 20, 250, 1000, 1001]
    source = write_table(lake / "source", _rows(ids, "s"))
    spec = make_spec(
        target, source, "t.id = s.id", [clause("matched", "update_all"), clause("notMatched", "insert_all")]
    )
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
    assert result2.metrics["numTargetDeletionVectorsAdded"] == 0
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


@pytest.mark.parametrize("clauses", ["upsert", "delete_nmbs"])
def test_change_data_feed_equals_copy_on_write(spark: SparkSession, lake: Path, clauses: str) -> None:
    chosen = {
        "upsert": [clause("matched", "update_all"), clause("notMatched", "insert_all")],
        "delete_nmbs": [clause("matched", "delete"), clause("notMatchedBySource", "update", "t.id > 295", v="'x'")],
    }[clauses]
    results = []
    for mode in ("auto", "off"):
        root = lake / mode
        target = _target(root, cdf=True)
        source = write_table(root / "source", _rows([1, 2, 150, 400], "s"))
        run_merge(spark, make_spec(target, source, "t.id = s.id", chosen, deletion_vectors=mode))
        results.append((_cdf(target), _live(target)))
    assert results[0] == results[1]
    assert results[0][0]
