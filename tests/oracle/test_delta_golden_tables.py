"""Delta's own test tables with deletion vectors (``tests/oracle/delta_tables``, copied from delta-io/delta): read by
the engine as Delta reads them, and merged by the engine and by Delta's MERGE INTO on copies, both ways (vectors
written, and files rewritten), with the same rows, result row, version and operationMetrics."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from engine import MergeClause
from engine.delta import scan_files
from engine.delta.snapshot import load_snapshot
from engine.delta_connect import PERSISTENT_DELETION_VECTORS_CONF
from tests.engine.harness import clause, write_table
from tests.oracle.differential import Side, assert_same, delta_rows, run_delta, run_engine
from tests.oracle.tables import latest_version, log_actions

TABLES = Path(__file__).parent / "delta_tables"

ID_TABLES = ["basic-dv-no-checkpoint", "basic-dv-with-checkpoint", "log-replay-dv-key-cases"]
"""One ``id BIGINT`` column, deletion vectors Delta's DELETE wrote (several per file in turn, and a checkpoint)."""
PARTITIONED_TABLES = ["dv-partitioned-with-checkpoint", "dv-with-columnmapping"]
"""``part INT`` (the partition column), ``col1 INT``, ``col2 STRING``; the second with column mapping by name."""


def _copy(name: str, dest: Path) -> Path:
    return _copy_tree(TABLES / name, dest)


def _copy_tree(table: Path, dest: Path) -> Path:
    shutil.copytree(table, dest)
    return dest


def _sort(rows: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in rows), key=lambda r: tuple((v is not None, str(v)) for v in r))


def _engine_rows(spark: SparkSession, path: Path, columns: Sequence[str]) -> list[tuple[Any, ...]]:
    snapshot = load_snapshot(str(path))
    read = scan_files(spark, snapshot, snapshot.files, file_columns=False)
    return _sort([tuple(r) for r in read.select(*(f"`{c}`" for c in columns)).collect()])


def _columns(name: str) -> list[str]:
    return ["id"] if name in ID_TABLES else ["part", "col1", "col2"]


def _source_and_clauses(name: str, existing: list[tuple[Any, ...]]) -> tuple[pa.Table, str, list[MergeClause]]:
    """Some rows each vector left (updated, or deleted by a condition), rows it deleted (inserted again) and new
    keys; a NOT MATCHED BY SOURCE clause deletes some target rows no source row names."""
    if name in ID_TABLES:
        ids = sorted(r[0] for r in existing)
        gone = sorted(set(range(min(ids), max(ids) + 1)) - set(ids))
        keys = ids[::3] + gone[:5] + [max(ids) + 1, max(ids) + 7]
        source = pa.table({"id": pa.array(keys, pa.int64()), "n": pa.array([k % 5 for k in keys], pa.int64())})
        return (
            source,
            "t.id = s.id",
            [
                clause("matched", "delete", "s.n = 0"),
                clause("matched", "update", id="t.id"),
                clause("notMatched", "insert", id="s.id"),
                clause("notMatchedBySource", "delete", f"t.id < {ids[len(ids) // 4]}"),
            ],
        )
    rows = sorted(existing, key=lambda r: r[1])
    keys = [r[1] for r in rows[::2]] + [100, 101]
    source = pa.table(
        {
            "part": pa.array([k % 10 for k in keys], pa.int32()),
            "col1": pa.array(keys, pa.int32()),
            "col2": pa.array([f"new{k}" for k in keys], pa.string()),
        }
    )
    return (
        source,
        "t.part = s.part AND t.col1 = s.col1",
        [
            clause("matched", "delete", "s.col1 % 3 = 0"),
            clause("matched", "update_all"),
            clause("notMatched", "insert_all"),
            clause("notMatchedBySource", "update", "t.part = 8", col2="'untouched'"),
        ],
    )


@pytest.mark.parametrize("deletion_vectors", ["auto", "off"])
@pytest.mark.parametrize("name", ID_TABLES + PARTITIONED_TABLES)
def test_merges_into_deltas_tables_match_delta(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, name: str, deletion_vectors: str
) -> None:
    """Read as Delta reads them, then merged both ways: ``auto`` writes vectors (the tables enable them), ``off``
    rewrites the touched files as Delta does with ``merge.deletionVectors.persistent`` false. Delta then reads the
    engine's table, and the engine reads it as Delta does."""
    columns = _columns(name)
    ours = Side(_copy(name, tmp_path / "ours"))
    theirs = Side(_copy(name, tmp_path / "theirs"))
    ours.start_version = theirs.start_version = latest_version(ours.path)
    before = delta_rows(delta_spark, ours.path, columns)
    # The engine reads Delta's vectors as Delta does (every table has rows its vectors deleted).
    assert _engine_rows(spark, ours.path, columns) == before
    assert sum(f.num_deleted_rows for f in load_snapshot(str(ours.path)).files) > 0
    source_rows, on, clauses = _source_and_clauses(name, before)
    source = write_table(tmp_path / "source", source_rows)

    run_engine(spark, ours, source, on, clauses, deletion_vectors=deletion_vectors)
    persistent = "true" if deletion_vectors == "auto" else "false"
    delta_spark.conf.set(PERSISTENT_DELETION_VECTORS_CONF, persistent)
    try:
        run_delta(delta_spark, theirs, source, on, clauses)
    finally:
        delta_spark.conf.unset(PERSISTENT_DELETION_VECTORS_CONF)

    assert_same(delta_spark, ours, theirs, columns)
    assert ours.result is not None and ours.result["num_affected_rows"] > 0
    adds = [a["add"] for a in log_actions(ours.path, ours.version) if "add" in a]
    with_vectors = [a for a in adds if a.get("deletionVector")]
    assert bool(with_vectors) == (deletion_vectors == "auto")
    # The engine reads its own result as Delta does.
    assert _engine_rows(spark, ours.path, columns) == delta_rows(delta_spark, ours.path, columns)


def test_an_absolute_vector_path_with_special_characters(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path
) -> None:
    """A ``p`` vector whose URI escapes ``%`` and a space (Delta's DeletionVectorsSuite, "absolute DV path with
    encoded special characters"): the rows 0-9 less the even ones. A merge then writes the file's new vector
    beside the table, as Delta's does."""
    table = _copy("table-with-dv-special-char", tmp_path / "spark")
    folder = (table / "folder&with%special char").resolve()
    encoded = f"{folder.parent}/folder&with%25special%20char"
    log = table / "_delta_log" / f"{0:020d}.json"
    log.write_text(log.read_text().replace("{{FOLDER_WITH_SPECIAL_CHAR}}", encoded))
    expected = [(1,), (3,), (5,), (7,), (9,)]
    assert _engine_rows(spark, table, ["id"]) == delta_rows(delta_spark, table, ["id"]) == expected

    ours = Side(table, start_version=0)
    theirs = Side(_copy_tree(table, tmp_path / "theirs"), start_version=0)
    source = write_table(tmp_path / "source", pa.table({"id": pa.array([2, 3, 11], pa.int64())}))
    clauses = [clause("matched", "delete"), clause("notMatched", "insert", id="s.id")]
    run_engine(spark, ours, source, "t.id = s.id", clauses)
    run_delta(delta_spark, theirs, source, "t.id = s.id", clauses)
    assert_same(delta_spark, ours, theirs, ["id"])
    assert _engine_rows(spark, table, ["id"]) == _sort([(1,), (2,), (5,), (7,), (9,), (11,)])
