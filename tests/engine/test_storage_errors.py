"""A write that fails in the storage, not in the data (found by the fault campaign, bench/fault_campaign.py): a
lake whose disk is full fails the merge as a retryable storage error that says so, and the table stays as it
was. The full disk is real: a small tmpfs mounted as the lake (mounting needs root, as CI runs)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from engine import run_merge
from engine.errors import StorageWriteError
from tests.engine.harness import clause, make_spec, rows, write_table


@pytest.fixture
def small_lake(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs as a full lake needs root")
    lake = tmp_path / "small-lake"
    lake.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(lake)], check=True)
    os.chmod(lake, 0o777)  # the Spark server writes here as whoever runs it
    try:
        yield lake
    finally:
        subprocess.run(["umount", "-l", str(lake)], check=False)


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
