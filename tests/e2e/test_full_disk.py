"""A disk that stays full past every retry, through `merge-service serve` as an operator runs it: each merge is
tried ``MERGE_SERVICE_MAX_ATTEMPTS`` times, then fails with the storage-write problem that says why, and its table
(plain or with deletion vectors) is exactly as it was, no file added; once the disk has room the same merge
succeeds. The full disk is real: a small tmpfs mounted as the lake and filled (mounting needs root, as CI runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from service.problems import TYPE_BASE
from tests.e2e.harness import finished_job, serving, upsert_body
from tests.engine.delta.dv_tables import enable_deletion_vectors, read_with_deltalake
from tests.full_disk import can_mount, fill, mount_tmpfs, unmount

pytestmark = pytest.mark.timeout(600)

ATTEMPTS = 3
SCHEMA = "id BIGINT, v STRING"


def table_state(table: Path) -> tuple[int, list[dict[str, Any]], list[Path]]:
    """The table's version, its live rows (deletion vectors applied) and every file under it."""
    rows = sorted(read_with_deltalake(table).to_pylist(), key=lambda r: r["id"])
    return DeltaTable(str(table)).version(), rows, sorted(p.relative_to(table) for p in table.rglob("*"))


def submit(base: str, table: Path, rows: list[dict[str, Any]]) -> str:
    response = httpx.post(f"{base}/merges", json=upsert_body(table, rows, SCHEMA), timeout=10)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def test_a_disk_full_past_the_retries_fails_the_merge_and_leaves_the_table(tmp_path: Path, spark_remote: str) -> None:
    if not can_mount():
        pytest.skip("mounting a small tmpfs as a full lake needs root")
    settings = {
        "MERGE_SERVICE_MAX_ATTEMPTS": str(ATTEMPTS),
        "MERGE_SERVICE_BACKOFF_BASE_SECONDS": "0.2",
        "MERGE_SERVICE_BACKOFF_MAX_SECONDS": "0.5",
    }
    with serving(tmp_path, spark_remote, **settings) as service:
        base, lake = service["base"], service["lake"]
        mount_tmpfs(lake, 8)
        try:
            tables = {"plain": lake / "plain", "dv": lake / "dv"}
            for table in tables.values():
                write_deltalake(str(table), pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]}))
            enable_deletion_vectors(tables["dv"])
            before = {name: table_state(table) for name, table in tables.items()}
            upsert = [{"id": 2, "v": "B"}, {"id": 4, "v": "d"}]

            filler = lake / "filler"
            fill(filler)
            try:
                failed = {name: finished_job(base, submit(base, table, upsert), 180) for name, table in tables.items()}
            finally:
                filler.unlink()
            for name, job in failed.items():
                assert job["status"] == "failed", (name, job)
                assert job["attempts"] == ATTEMPTS, (name, job)
                assert job["error"]["type"] == TYPE_BASE + "storage-write", (name, job)
                assert job["error"]["status"] == 503, (name, job)
                assert "No space left on device" in job["error"]["detail"], (name, job)
                assert f"gave up after {ATTEMPTS} attempts" in job["error"]["detail"], (name, job)
                assert job["table_version"] is None, (name, job)
                assert table_state(tables[name]) == before[name], f"{name}: the failed merge changed the table"

            for name, table in tables.items():
                job = finished_job(base, submit(base, table, upsert), 180)
                assert job["status"] == "succeeded", (name, job)
                assert job["table_version"] == before[name][0] + 1, (name, job)
                assert table_state(table)[1] == [
                    {"id": 1, "v": "a"},
                    {"id": 2, "v": "B"},
                    {"id": 3, "v": "c"},
                    {"id": 4, "v": "d"},
                ], name
            vectors = pa.RecordBatchReader.from_stream(DeltaTable(str(tables["dv"])).deletion_vectors()).read_all()
            assert vectors.num_rows == 1, "the table with deletion vectors is merged on read"
        finally:
            unmount(lake)
