"""delta-rs (``deltalake``) as a peer: its merge in a process of its own. The timing includes reading the source
Delta table into a pyarrow table and loading the target's snapshot, as the engine's does."""

from __future__ import annotations

import time
from typing import Any

from bench.merge.measure import merge_error, peak_rss_bytes


def warm_deltalake(job: dict[str, Any]) -> None:
    """The first table deltalake reads in a process costs ~0.5 s of one-time set-up; every peer pays it untimed."""
    from deltalake import DeltaTable

    DeltaTable(job["warm_table"]).to_pyarrow_table()


def merge(job: dict[str, Any]) -> dict[str, Any]:
    from deltalake import DeltaTable

    warm_deltalake(job)
    rss_before = peak_rss_bytes()
    cpu0 = time.process_time()
    start = time.perf_counter()
    try:
        source = DeltaTable(job["source"]).to_pyarrow_table()
        source_s = time.perf_counter() - start
        merger = DeltaTable(job["target"]).merge(
            source=source,
            predicate="t.id = s.id",
            source_alias="s",
            target_alias="t",
            streamed_exec=job["streamed_exec"],
        )
        if job["kind"] == "upsert":
            merger = merger.when_matched_update_all().when_not_matched_insert_all()
        elif job["kind"] == "insert":
            merger = merger.when_not_matched_insert_all()
        else:
            merger = merger.when_matched_delete()
        metrics = merger.execute()
    except Exception as exc:
        return merge_error(exc)
    wall = time.perf_counter() - start
    return {
        "status": "ok",
        "wall_s": wall,
        "cpu_s": time.process_time() - cpu0,
        "source_read_s": source_s,
        "metrics": metrics,
        "peak_rss": peak_rss_bytes(),
        "peak_rss_before_merge": rss_before,
    }
