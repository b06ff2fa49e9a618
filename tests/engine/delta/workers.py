"""Writer processes for the concurrency and crash tests: ``python -m tests.engine.delta.workers <command> ...``.

Each prints one JSON line per outcome on stdout so the test can check every commit landed exactly once.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid

import pyarrow as pa


def _wait(start_at: float) -> None:
    delay = start_at - time.time()
    if delay > 0:
        time.sleep(delay)


def _report(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def ours_append(table: str, tag: str, count: int, start_at: float) -> None:
    """Appends through our Transaction, each reading its own partition (no conflicts expected: rebases)."""
    from engine.delta import Transaction, load_snapshot

    from .util import parquet_add

    _wait(start_at)
    for n in range(count):
        snapshot = load_snapshot(table)
        data = pa.table({"id": pa.array([n], pa.int64()), "v": [f"{tag}-{n}"]})
        add = parquet_add(snapshot, data, partition={"p": tag}, write_id=f"{tag}-{n}-{uuid.uuid4().hex[:6]}")
        txn = Transaction(snapshot)
        txn.record_read([f for f in snapshot.files if f.partition_values.get("p") == tag], f"p = '{tag}'")
        version = txn.commit(
            [add], operation="WRITE", operation_parameters={"mode": "Append"}, is_blind_append=False, max_attempts=200
        )
        _report(writer="ours", tag=tag, version=version, txn_id=txn.txn_id, path=add.path, attempts=txn.attempts)


def rs_append(table: str, tag: str, count: int, start_at: float) -> None:
    """Appends through deltalake (delta-rs), which retries appends on its own."""
    from deltalake import write_deltalake

    _wait(start_at)
    for n in range(count):
        data = pa.table({"id": pa.array([n], pa.int64()), "v": [f"{tag}-{n}"], "p": [tag]})
        write_deltalake(table, data, mode="append")
        _report(writer="deltalake", tag=tag, n=n)


def rs_delete(table: str, predicate: str, start_at: float) -> None:
    from deltalake import DeltaTable

    _wait(start_at)
    try:
        metrics = DeltaTable(table).delete(predicate)
        _report(writer="deltalake-delete", ok=True, metrics=str(metrics))
    except Exception as exc:
        _report(writer="deltalake-delete", ok=False, error=f"{type(exc).__name__}: {exc}")


def crash_after_write(table: str, write_id: str, remote: str) -> None:
    """Write data files with Spark for a commit, announce it, then wait to be killed before committing."""
    from pyspark.sql import SparkSession

    from engine.delta import load_snapshot, write_data_files
    from engine.spark import configure_session

    spark = SparkSession.builder.remote(remote).create()
    configure_session(spark)
    snapshot = load_snapshot(table)
    df = spark.sql("SELECT id, CONCAT('crash-', id) AS v, 'x' AS p FROM range(100, 110)")
    adds = write_data_files(spark, df, snapshot, write_id=write_id)
    _report(ready=True, paths=[a.path for a in adds])
    time.sleep(600)


def crash_in_commit(table: str, write_id: str) -> None:
    """Stage the commit file, then wait to be killed just before the put-if-absent link."""
    import os

    from engine.delta import Transaction, load_snapshot
    from engine.delta import storage as storage_module

    from .util import parquet_add

    snapshot = load_snapshot(table)
    add = parquet_add(
        snapshot, pa.table({"id": pa.array([999], pa.int64()), "v": ["lost"]}), partition={"p": "x"}, write_id=write_id
    )
    real_link = os.link

    def stalled_link(src: str, dst: str) -> None:
        _report(ready=True, staged=src, path=add.path)
        time.sleep(600)
        real_link(src, dst)

    storage_module.os.link = stalled_link  # type: ignore[attr-defined]
    Transaction(snapshot).commit([add], operation="WRITE", operation_parameters={})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command")
    parser.add_argument("args", nargs="*")
    ns = parser.parse_args(argv)
    a = ns.args
    if ns.command == "ours-append":
        ours_append(a[0], a[1], int(a[2]), float(a[3]))
    elif ns.command == "rs-append":
        rs_append(a[0], a[1], int(a[2]), float(a[3]))
    elif ns.command == "rs-delete":
        rs_delete(a[0], a[1], float(a[2]))
    elif ns.command == "crash-after-write":
        crash_after_write(a[0], a[1], a[2])
    elif ns.command == "crash-in-commit":
        crash_in_commit(a[0], a[1])
    else:
        sys.exit(f"unknown command {ns.command}")


if __name__ == "__main__":
    main()
