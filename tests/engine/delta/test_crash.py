"""Crash safety: a writer killed (SIGKILL) before its log entry exists leaves the table as it was."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from engine.delta import Transaction, discard_write, load_snapshot

from .util import parquet_add, sorted_rows

REPO = Path(__file__).resolve().parents[3]


def _table(lake: Path) -> str:
    path = str(lake / "t")
    write_deltalake(
        path, pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"], "p": ["x", "y"]}), partition_by=["p"]
    )
    return path


def _start_and_wait_ready(*args: str) -> tuple[subprocess.Popen[str], dict[str, object]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.engine.delta.workers", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(30)
        raise AssertionError(proc.stderr.read()[-3000:] if proc.stderr else "worker died")
    return proc, json.loads(line)


def _kill(proc: subprocess.Popen[str]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    assert proc.returncode == -signal.SIGKILL


def test_killed_after_writing_data_files(spark_remote: str, lake: Path) -> None:
    path = _table(lake)
    before = sorted_rows(DeltaTable(path).to_pyarrow_table())
    proc, report = _start_and_wait_ready("crash-after-write", path, "crashed-write", spark_remote)
    _kill(proc)
    assert report["paths"]
    written = Path(path) / "crashed-write"
    assert any(written.rglob("*.parquet"))

    snapshot = load_snapshot(path)
    assert snapshot.version == 0
    assert sorted_rows(DeltaTable(path).to_pyarrow_table()) == before
    assert not any(f.path.startswith("crashed-write/") for f in snapshot.files)

    discard_write(snapshot, "crashed-write")
    assert not written.exists()
    add = parquet_add(snapshot, pa.table({"id": pa.array([3], pa.int64()), "v": ["c"]}), partition={"p": "x"})
    assert Transaction(snapshot).commit([add], operation="WRITE", operation_parameters={}) == 1
    assert len(DeltaTable(path).to_pyarrow_table()) == 3


def test_killed_while_committing(lake: Path) -> None:
    path = _table(lake)
    before = sorted_rows(DeltaTable(path).to_pyarrow_table())
    proc, report = _start_and_wait_ready("crash-in-commit", path, "half-commit")
    assert Path(str(report["staged"])).exists()  # the commit body was fully staged...
    _kill(proc)
    log_dir = Path(path) / "_delta_log"
    assert not (log_dir / f"{1:020d}.json").exists()  # ...but never linked into place
    assert load_snapshot(path).version == 0
    assert sorted_rows(DeltaTable(path).to_pyarrow_table()) == before

    # Readers and writers ignore the stray staging file; both deltalake and we commit on top.
    write_deltalake(path, pa.table({"id": pa.array([4], pa.int64()), "v": ["d"], "p": ["y"]}), mode="append")
    snapshot = load_snapshot(path)
    add = parquet_add(snapshot, pa.table({"id": pa.array([5], pa.int64()), "v": ["e"]}), partition={"p": "x"})
    assert Transaction(snapshot).commit([add], operation="WRITE", operation_parameters={}) == 2
    assert sorted(DeltaTable(path).to_pyarrow_table().column("id").to_pylist()) == [1, 2, 4, 5]
    discard_write(snapshot, "half-commit")
    assert not (Path(path) / "half-commit").exists()
