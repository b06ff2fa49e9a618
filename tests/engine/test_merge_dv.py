"""Copy-on-write merges into tables whose files carry deletion vectors: every plan agrees with a reference model
computed in Python, the rewritten files drop their deleted rows, the removes carry the old vectors, the metrics
count live rows, and delta-rs reads the result back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import SparkSession

from engine import run_merge
from engine.delta import load_snapshot, scan_deleted_rows
from tests.engine.delta.dv_tables import (
    delete_rows,
    enable_deletion_vectors,
    file_paths,
    kill_once_written,
    read_with_deltalake,
)
from tests.engine.harness import FindPlan, clause, find_plan, join_plan, make_spec, stray_files, write_table


def _rows(ids: list[int], tag: str) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"{tag}{i}" for i in ids], "n": pa.array(ids, pa.int64())})


def _target(lake: Path) -> tuple[Path, list[str]]:
    """Three files of 100 rows (ids 0-299); vectors delete ids 0-49 step 7 and 150 of the second file's;
    the third file has none."""
    path = lake / "target"
    for start in (0, 100, 200):
        write_deltalake(str(path), _rows(list(range(start, start + 100)), "t"), mode="append")
    enable_deletion_vectors(path)
    files = _files_by_first_id(path)
    delete_rows(path, {files[0]: range(0, 50, 7)})
    delete_rows(path, {files[0]: [99], files[1]: [50]}, storage="i")
    return path, files


def _files_by_first_id(path: Path) -> list[str]:
    snapshot = load_snapshot(path)
    return [f.path for f in sorted(snapshot.files, key=lambda f: f.stats.min_values["id"])]  # type: ignore[union-attr]


def _live(path: Path) -> dict[int, tuple[Any, ...]]:
    table = read_with_deltalake(path)
    return {
        row["id"]: (row["id"], row["v"], row["n"])
        for row in table.select(["id", "v", "n"]).to_pylist()  # delta-rs's own read, vectors applied
    }


def _merge_commit(path: Path) -> list[dict[str, Any]]:
    version = load_snapshot(path).version
    text = (path / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


UPSERT = [clause("matched", "update_all"), clause("notMatched", "insert_all")]

SOURCE_IDS = [3, 7, 14, 20, 98, 99, 150, 250, 1000]
"""7, 14 and 99 are deleted in the target (they insert), 3, 20, 98, 250 are live (they update), 150 is deleted
too, 1000 is new."""


@pytest.mark.parametrize("plan", ["source_keys", "target_rows", "single_pass"])
@pytest.mark.parametrize("broadcast", [True, False])
def test_upsert_into_dv_table(spark: SparkSession, lake: Path, plan: FindPlan, broadcast: bool) -> None:
    target, files = _target(lake)
    before = load_snapshot(target)
    vectors = {f.path: f.deletion_vector for f in before.files}
    live = _live(target)
    assert len(live) == 300 - 10
    source = write_table(lake / "source", _rows(SOURCE_IDS, "s"))
    spec = make_spec(
        target,
        source,
        "t.id = s.id",
        [clause("matched", "update_all"), clause("notMatched", "insert_all")],
        deletion_vectors="off",
    )
    with find_plan(plan), join_plan(broadcast=broadcast):
        result = run_merge(spark, spec)

    expected = dict(live)
    for i in SOURCE_IDS:
        expected[i] = (i, f"s{i}", i)
    assert _live(target) == expected
    updated = [i for i in SOURCE_IDS if i in live]
    assert result.result["num_updated_rows"] == len(updated) == 4
    assert result.result["num_inserted_rows"] == len(SOURCE_IDS) - len(updated)

    touched = {files[0], files[2]}  # ids 3, 20, 98 and 250; file 1 (ids 100-199) holds only the deleted 150
    removes = [a["remove"] for a in _merge_commit(target) if "remove" in a]
    assert {r["path"] for r in removes} == touched
    for remove in removes:
        old = vectors[remove["path"]]
        assert remove.get("deletionVector") == (old.to_json() if old is not None else None)
    live_in_touched = sum(f.num_live_records or 0 for f in before.files if f.path in touched)
    m = result.metrics
    assert m["numTargetRowsCopied"] == live_in_touched - len(updated)
    assert m["numTargetFilesRemoved"] == 2
    after = load_snapshot(target)
    assert {f.path: f.deletion_vector for f in after.files}[files[1]] == vectors[files[1]]  # untouched, kept
    assert all(f.deletion_vector is None for f in after.files if f.path not in (files[1],))
    assert not stray_files(target)


def test_delete_and_not_matched_by_source_over_dv_table(spark: SparkSession, lake: Path) -> None:
    target, files = _target(lake)
    live = _live(target)
    source = write_table(lake / "source", _rows([1, 2, 7, 120, 121], "s"))
    spec = make_spec(
        target,
        source,
        "t.id = s.id",
        [
            clause("matched", "delete"),
            clause("notMatchedBySource", "update", "t.id >= 290", v="'gone soon'"),
            clause("notMatchedBySource", "delete", "t.id < 10"),
        ],
        deletion_vectors="off",
    )
    result = run_merge(spark, spec)
    expected = {}
    for i, row in live.items():
        if i in (1, 2, 120, 121):
            continue
        if i >= 290:
            expected[i] = (i, "gone soon", row[2])
        elif i < 10:
            continue
        else:
            expected[i] = row
    assert _live(target) == expected
    deleted_by_source = len([i for i in live if i < 10 and i not in (1, 2)])
    assert result.result["num_deleted_rows"] == 4 + deleted_by_source
    assert result.result["num_updated_rows"] == 10
    del files


def test_a_deleted_duplicate_is_no_multiple_match(spark: SparkSession, lake: Path) -> None:
    """A key whose second copy a vector deletes matches once: the merge updates it instead of failing."""
    path = lake / "dup"
    write_deltalake(str(path), _rows([1, 2, 2, 3], "t"))
    enable_deletion_vectors(path)
    (only,) = file_paths(path)
    delete_rows(path, {only: [2]})
    source = write_table(lake / "source", _rows([2], "s"))
    for plan in ("source_keys", "target_rows", "single_pass"):
        spec = make_spec(
            path, source, "t.id = s.id", [clause("matched", "update", n="t.n + 10")], deletion_vectors="off"
        )
        with find_plan(plan):  # type: ignore[arg-type]
            result = run_merge(spark, spec)
        assert result.result["num_updated_rows"] == 1
    assert sorted(_live(path).values()) == [(1, "t1", 1), (2, "t2", 32), (3, "t3", 3)]


def test_source_with_deletion_vectors(spark: SparkSession, lake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The source's deleted rows take no part, whichever way the scan drops them."""
    monkeypatch.setattr(scan_deleted_rows, "INLINE_DELETED_ROWS", 0)
    target = write_table(lake / "target", _rows([1, 2, 3], "t"))
    source = write_table(lake / "source", _rows([2, 3, 4, 5], "s"))
    enable_deletion_vectors(source)
    (only,) = file_paths(source)
    delete_rows(source, {only: [1, 3]})  # ids 3 and 5
    spec = make_spec(
        target, source, "t.id = s.id", [clause("matched", "update_all"), clause("notMatched", "insert_all")]
    )
    result = run_merge(spark, spec)
    assert result.result == {
        "num_affected_rows": 2,
        "num_updated_rows": 1,
        "num_deleted_rows": 0,
        "num_inserted_rows": 1,
    }
    assert sorted(_live(target).values()) == [(1, "t1", 1), (2, "s2", 2), (3, "t3", 3), (4, "s4", 4)]


_KILLED_MERGE = """
import sys, time
from pyspark.sql import SparkSession
from engine import run_merge
from engine.delta import transaction
from tests.engine.harness import clause, make_spec

def hang(self, *args, **kwargs):
    print("written", flush=True)
    time.sleep(600)

transaction.Transaction.commit = hang
spark = SparkSession.builder.remote(sys.argv[1]).create()
spec = make_spec(sys.argv[2], sys.argv[3], "t.id = s.id",
                 [clause("matched", "update_all"), clause("notMatched", "insert_all")])
run_merge(spark, spec)
"""


def test_merge_killed_mid_write_leaves_the_table_as_it_was(spark_remote: str, lake: Path) -> None:
    target, _ = _target(lake)
    before_rows = _live(target)
    before = load_snapshot(target)
    source = write_table(lake / "source", _rows(SOURCE_IDS, "s"))
    kill_once_written(_KILLED_MERGE, spark_remote, str(target), str(source))
    after = load_snapshot(target)
    assert after.version == before.version
    assert {f.path: f.deletion_vector for f in after.files} == {f.path: f.deletion_vector for f in before.files}
    assert _live(target) == before_rows
    assert stray_files(target)  # the killed merge's data files, which no commit names
