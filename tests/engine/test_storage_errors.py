"""A write that fails in the storage, not in the data (found by the fault campaign, bench/fault_campaign.py): a
lake whose disk is full fails the merge as a retryable storage error that says so, and the table stays as it
was. The full disk is real: a small tmpfs mounted as the lake (mounting needs root, as CI runs)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from engine import run_merge
from engine.errors import StorageWriteError
from tests.engine.delta.dv_tables import enable_deletion_vectors, read_with_deltalake
from tests.engine.harness import clause, make_spec, rows, write_table
from tests.full_disk import can_mount, fill, mount_tmpfs, unmount


@pytest.fixture
def small_lake(tmp_path: Path) -> Iterator[Path]:
    if not can_mount():
        pytest.skip("mounting a small tmpfs as a full lake needs root")
    lake = tmp_path / "small-lake"
    lake.mkdir()
    mount_tmpfs(lake, 3)
    try:
        yield lake
    finally:
        unmount(lake)


@pytest.fixture
def filler(small_lake: Path) -> Iterator[Path]:
    """The file that fills the small lake (``fill``); a test frees the disk by removing it, and it is removed
    whatever the test does."""
    path = small_lake / "filler"
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def test_a_full_disk_is_a_retryable_storage_error(spark: SparkSession, small_lake: Path, tmp_path: Path) -> None:
    target = write_table(small_lake / "t", pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]}))
    n = 200_000
    # Random text does not compress: some 6 MB of Parquet for a 3 MB disk.
    source = write_table(
        tmp_path / "s",
        pa.table({"id": pa.array(range(10, 10 + n), pa.int64()), "v": [os.urandom(16).hex() for _ in range(n)]}),
    )
    before = DeltaTable(str(target)).version()
    spec = make_spec(target, source, "t.id = s.id", [clause("notMatched", "insert_all")])
    with pytest.raises(StorageWriteError) as caught:
        run_merge(spark, spec)
    assert caught.value.retryable
    assert "could not write the table's files" in str(caught.value)
    assert DeltaTable(str(target)).version() == before
    assert rows(target) == [(1, "a"), (2, "b")]


def test_a_full_disk_at_the_commit_is_a_retryable_storage_error(
    spark: SparkSession, small_lake: Path, filler: Path, tmp_path: Path
) -> None:
    """The data files are written; the disk fills before the log entry is: the merge is retried, not failed, and
    the table is unchanged until a retry commits it."""
    target = write_table(small_lake / "t", pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]}))
    before = DeltaTable(str(target)).version()
    source = write_table(tmp_path / "s", pa.table({"id": pa.array([2, 3], pa.int64()), "v": ["B", "c"]}))
    spec = make_spec(
        target, source, "t.id = s.id", [clause("matched", "update_all"), clause("notMatched", "insert_all")]
    )

    def fill_at_commit(phase: str) -> None:
        if phase == "committing":
            fill(filler)

    with pytest.raises(StorageWriteError) as caught:
        run_merge(spark, spec, on_progress=fill_at_commit)
    filler.unlink()
    assert caught.value.retryable
    assert "No space left on device" in str(caught.value)
    assert DeltaTable(str(target)).version() == before
    assert rows(target) == [(1, "a"), (2, "b")]
    assert sorted(p.name for p in target.iterdir() if p.name != "_delta_log") == sorted(
        Path(f).name for f in DeltaTable(str(target)).file_uris()
    ), "the failed attempt's data files are removed"

    result = run_merge(spark, spec)
    assert result.table_version == before + 1
    assert rows(target) == [(1, "a"), (2, "B"), (3, "c")]


def test_a_full_disk_under_a_deletion_vector_is_a_retryable_storage_error(
    spark: SparkSession, small_lake: Path, filler: Path, tmp_path: Path
) -> None:
    """A delete by key on a deletion-vector table writes no data file, only the vector's file (in the engine, not
    Spark) and the log entry: on a full disk it is retried like any other write, and leaves nothing behind."""
    target = write_table(small_lake / "t", pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]}))
    enable_deletion_vectors(target)
    before = DeltaTable(str(target)).version()
    files_before = sorted(p.relative_to(target) for p in target.rglob("*"))
    source = write_table(tmp_path / "s", pa.table({"id": pa.array([2], pa.int64())}))
    spec = make_spec(target, source, "t.id = s.id", [clause("matched", "delete")])
    fill(filler)
    with pytest.raises(StorageWriteError) as caught:
        run_merge(spark, spec)
    filler.unlink()
    assert caught.value.retryable
    assert "No space left on device" in str(caught.value)
    assert DeltaTable(str(target)).version() == before
    assert sorted(p.relative_to(target) for p in target.rglob("*")) == files_before

    result = run_merge(spark, spec)
    assert result.metrics["numTargetDeletionVectorsAdded"] == 1
    assert read_with_deltalake(target).to_pylist() == [{"id": 1, "v": "a"}, {"id": 3, "v": "c"}]
