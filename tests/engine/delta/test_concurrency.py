"""Optimistic concurrency with real writers: conflicts are typed, rebases are clean, nothing is lost or doubled.

Deterministic cases put a real deltalake (or second Transaction) commit between our snapshot and our commit;
racing cases start writers in threads and processes at the same instant and check the log afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from engine.delta import Transaction, load_snapshot
from engine.delta.commits import parse_commit
from engine.errors import (
    ConcurrentAppendError,
    ConcurrentDeleteDeleteError,
    ConcurrentDeleteReadError,
    ConcurrentModificationError,
    ConcurrentTransactionError,
    MetadataChangedError,
    ProtocolChangedError,
)

from .util import log_entries, parquet_add, sorted_rows, write_log_entry

REPO = Path(__file__).resolve().parents[3]


def _table(lake: Path, name: str = "t", *, partitioned: bool = True) -> str:
    path = str(lake / name)
    data = pa.table({"id": pa.array([1, 2, 3, 4], pa.int64()), "v": ["a", "b", "c", "d"], "p": ["x", "y", "x", "y"]})
    write_deltalake(
        path, data if partitioned else data.drop_columns(["p"]), partition_by=["p"] if partitioned else None
    )
    return path


def _rs_rows(p: str, ids: list[int]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"rs{i}" for i in ids], "p": [p] * len(ids)})


def _ours(snapshot: Any, ids: list[int], p: str = "x") -> Any:
    return parquet_add(
        snapshot, pa.table({"id": pa.array(ids, pa.int64()), "v": [f"o{i}" for i in ids]}), partition={"p": p}
    )


def _commit(txn: Transaction, actions: list[Any]) -> int:
    return txn.commit(actions, operation="MERGE", operation_parameters={}, operation_metrics={})


def test_concurrent_delete_of_a_file_we_read(lake: Path) -> None:
    path = _table(lake)
    snapshot = load_snapshot(path)
    read = [f for f in snapshot.files if f.partition_values["p"] == "x"]
    txn = Transaction(snapshot)
    txn.record_read(read, "p = 'x'")
    DeltaTable(path).delete("id = 1")  # rewrites the x file we read
    with pytest.raises(ConcurrentDeleteReadError) as failure:
        _commit(txn, [_ours(snapshot, [10])])  # removing it too would be a delete-delete conflict
    assert failure.value.retryable and "DELETE" in str(failure.value)
    assert DeltaTable(path).version() == 1


def test_concurrent_delete_of_a_file_we_remove(lake: Path) -> None:
    path = _table(lake)
    snapshot = load_snapshot(path)
    victim = next(f for f in snapshot.files if f.partition_values["p"] == "y")
    first, second = Transaction(snapshot), Transaction(snapshot)
    first.record_read([victim], "p = 'y'")
    second.record_read([victim], "p = 'y'")
    assert _commit(first, [victim.to_remove()]) == 1
    with pytest.raises(ConcurrentDeleteDeleteError):
        _commit(second, [victim.to_remove()])


def test_concurrent_append_into_our_read_scope(lake: Path) -> None:
    path = _table(lake)
    snapshot = load_snapshot(path)
    txn = Transaction(snapshot)
    txn.record_read([f for f in snapshot.files if f.partition_values["p"] == "x"], "p = 'x' AND id > 0")
    write_deltalake(path, _rs_rows("x", [50]), mode="append")
    with pytest.raises(ConcurrentAppendError, match="p = 'x'"):
        _commit(txn, [_ours(snapshot, [60])])


def test_blind_append_outside_our_read_scope_rebases(lake: Path) -> None:
    path = _table(lake)
    snapshot = load_snapshot(path)
    read = [f for f in snapshot.files if f.partition_values["p"] == "x"]
    txn = Transaction(snapshot)
    txn.record_read(read, "p = 'x'")
    write_deltalake(path, _rs_rows("y", [50]), mode="append")
    write_deltalake(path, _rs_rows("z", [51]), mode="append")
    assert _commit(txn, [read[0].to_remove(), _ours(snapshot, [1, 3, 70])]) == 3
    assert txn.attempts == 1  # the winners were found by listing the log, not by losing races
    assert log_entries(path, 3)[0]["commitInfo"]["readVersion"] == 0
    ids = sorted(DeltaTable(path).to_pyarrow_table().column("id").to_pylist())
    assert ids == [1, 2, 3, 4, 50, 51, 70]


def test_a_long_transaction_catches_up_without_spending_attempts(lake: Path) -> None:
    path = _table(lake)
    snapshot = load_snapshot(path)
    txn = Transaction(snapshot)
    txn.record_read([f for f in snapshot.files if f.partition_values["p"] == "x"], "p = 'x'")
    for n in range(12):
        write_deltalake(path, _rs_rows("y", [100 + n]), mode="append")
    assert _commit_with(txn, [_ours(snapshot, [7])], max_attempts=2) == 13

    late = Transaction(snapshot)
    late.record_read([], "p = 'x' AND id > 200")  # our id-7 file at version 13 cannot match
    write_deltalake(path, _rs_rows("y", [300]), mode="append")
    write_deltalake(path, _rs_rows("x", [301]), mode="append")
    with pytest.raises(ConcurrentAppendError, match="version 15"):
        _commit(late, [])


def _commit_with(txn: Transaction, actions: list[Any], *, max_attempts: int) -> int:
    return txn.commit(actions, operation="WRITE", operation_parameters={}, max_attempts=max_attempts)


def test_statistics_decide_append_conflicts(lake: Path) -> None:
    path = _table(lake, partitioned=False)
    snapshot = load_snapshot(path)
    outside = Transaction(snapshot)
    outside.record_read(snapshot.files, "id < 10")
    write_deltalake(path, pa.table({"id": pa.array([100, 200], pa.int64()), "v": ["e", "f"]}), mode="append")
    assert _commit(outside, []) == 2  # the added file's min id is 100: cannot match id < 10

    snapshot = load_snapshot(path)
    inside = Transaction(snapshot)
    inside.record_read(snapshot.files, "id < 10")
    write_deltalake(path, pa.table({"id": pa.array([5, 500], pa.int64()), "v": ["g", "h"]}), mode="append")
    with pytest.raises(ConcurrentAppendError):
        _commit(inside, [])

    snapshot = load_snapshot(path)
    whole = Transaction(snapshot)
    whole.record_read(snapshot.files, None)
    write_deltalake(path, pa.table({"id": pa.array([1000], pa.int64()), "v": ["i"]}), mode="append")
    with pytest.raises(ConcurrentAppendError, match="in full"):
        _commit(whole, [])


def test_concurrent_schema_protocol_and_app_transaction_changes(lake: Path) -> None:
    path = _table(lake)
    snapshot = load_snapshot(path)
    txn = Transaction(snapshot)
    txn.record_read([], "p = 'nothing'")
    write_deltalake(
        path,
        pa.table({"id": pa.array([9], pa.int64()), "v": ["n"], "p": ["q"], "extra": [1]}),
        mode="append",
        schema_mode="merge",
    )
    with pytest.raises(MetadataChangedError):
        _commit(txn, [_ours(snapshot, [10])])

    snapshot = load_snapshot(path)
    txn = Transaction(snapshot)
    write_log_entry(
        path,
        snapshot.version + 1,
        [
            {"commitInfo": {"operation": "UPGRADE PROTOCOL"}},
            {"protocol": {"minReaderVersion": 1, "minWriterVersion": 4}},
        ],
    )
    with pytest.raises(ProtocolChangedError):
        _commit(txn, [])

    snapshot = load_snapshot(path)
    first, second = Transaction(snapshot), Transaction(snapshot)
    first.set_app_transaction("job-7", 1)
    second.set_app_transaction("job-7", 1)
    _commit(first, [])
    with pytest.raises(ConcurrentTransactionError):
        _commit(second, [])


def test_threads_race_our_commits(lake: Path) -> None:
    """Threads committing at once into their own partitions: all land, at contiguous versions."""
    path = _table(lake)
    results: list[int] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def worker(tag: str) -> None:
        try:
            barrier.wait()
            for n in range(5):
                snapshot = load_snapshot(path)
                txn = Transaction(snapshot)
                txn.record_read([f for f in snapshot.files if f.partition_values["p"] == tag], f"p = '{tag}'")
                results.append(_commit(txn, [_ours(snapshot, [n], p=tag)]))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(f"t{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(results) == list(range(1, 21))
    assert DeltaTable(path).to_pyarrow_table().num_rows == 24


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.engine.delta.workers", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _outputs(proc: subprocess.Popen[str], timeout: float = 180) -> list[dict[str, Any]]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_processes_race_with_deltalake_writers(lake: Path) -> None:
    """Several processes of ours and of deltalake append at once: every commit lands exactly once, the
    versions are contiguous, and every log entry is whole."""
    path = _table(lake)
    start_at = time.time() + 4
    ours = [_spawn("ours-append", path, f"o{i}", "6", str(start_at)) for i in range(3)]
    theirs = [_spawn("rs-append", path, f"r{i}", "4", str(start_at)) for i in range(2)]
    reports = [r for p in ours for r in _outputs(p)]
    rs_reports = [r for p in theirs for r in _outputs(p)]
    assert len(reports) == 18 and len(rs_reports) == 8

    log_dir = Path(path) / "_delta_log"
    versions = sorted(int(name[:20]) for name in os.listdir(log_dir) if name.endswith(".json") and name[:20].isdigit())
    assert versions == list(range(27))
    assert not [n for n in os.listdir(log_dir) if n.endswith(".tmp")]
    schema = load_snapshot(path, version=0).spark_schema
    entries = [parse_commit(v, (log_dir / f"{v:020d}.json").read_text(), schema) for v in versions]
    txn_ids = [e.commit_info.get("txnId") for e in entries if e.commit_info and e.commit_info.get("txnId")]
    assert sorted(txn_ids) == sorted(r["txn_id"] for r in reports)  # each of our commits exactly once
    added = [a.path for e in entries for a in e.adds]
    assert len(added) == len(set(added))
    assert {r["path"] for r in reports} <= set(added)
    assert {e.version for e in entries if e.commit_info and e.commit_info.get("txnId") in txn_ids} == {
        r["version"] for r in reports
    }

    table = DeltaTable(path).to_pyarrow_table()
    assert table.num_rows == 4 + 18 + 8
    values = sorted(table.column("v").to_pylist())
    assert values == sorted(
        [
            "a",
            "b",
            "c",
            "d",
            *[f"o{i}-{n}" for n in range(6) for i in range(3)],
            *[f"r{i}-{n}" for n in range(4) for i in range(2)],
        ]
    )


def test_racing_delete_never_lands_under_our_commit(lake: Path) -> None:
    """A deltalake DELETE races our rewrite of the same partition: whichever wins, our commit never lands on
    top of a delete of a file it read (it fails with a typed conflict instead)."""
    outcomes = set()
    for round_, our_delay in enumerate([0.0, 0.1, 0.3, 1.5]):
        path = _table(lake, f"race{round_}")
        snapshot = load_snapshot(path)
        read = [f for f in snapshot.files if f.partition_values["p"] == "x"]
        replacement = _ours(snapshot, [1, 3, 100 + round_])
        start_at = time.time() + 2.5 + round_ * 0.01
        deleter = _spawn("rs-delete", path, "p = 'x' AND id = 3", str(start_at))
        txn = Transaction(snapshot)
        txn.record_read(read, "p = 'x'")
        time.sleep(max(0.0, start_at + our_delay - time.time()))
        try:
            version: int | None = _commit(txn, [f.to_remove() for f in read] + [replacement])
        except ConcurrentModificationError as exc:
            assert isinstance(exc, (ConcurrentDeleteReadError, ConcurrentDeleteDeleteError)), exc
            version = None
        (report,) = _outputs(deleter)
        final = load_snapshot(path)
        schema = final.spark_schema
        log = {
            v: parse_commit(v, (Path(path) / "_delta_log" / f"{v:020d}.json").read_text(), schema)
            for v in range(1, final.version + 1)
        }
        if version is not None:
            removed_before = {r.path for v, e in log.items() if v < version for r in e.removes}
            assert not removed_before & {f.path for f in read}
            outcomes.add("ours first")
        else:
            assert report["ok"]
            outcomes.add("delete first")
        rows = sorted_rows(DeltaTable(path).to_pyarrow_table())
        assert [r["id"] for r in rows if r["p"] == "y"] == [2, 4]
    assert outcomes
