"""Is the fast answer right? Every peer's table is read back with deltalake and compared in full with delta-rs's
(row count, then every column sorted by id), and the merge counts with the counts the data was built for. A table
with deletion vectors is read through deltalake's SQL engine, which honours them (its pyarrow reader refuses
such tables)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from bench.merge.workloads import Expected


def read_sorted(path: Path) -> pa.Table:
    from deltalake import DeltaTable, QueryBuilder

    table = DeltaTable(str(path))
    if "deletionVectors" in (table.protocol().reader_features or []):
        rows = pa.table(QueryBuilder().register("t", table).execute("SELECT * FROM t").read_all())
        # Its SQL engine answers strings as string views, which Arrow's sort cannot take yet.
        views = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}
        rows = rows.cast(pa.schema([f.with_type(views.get(f.type, f.type)) for f in rows.schema]))
    else:
        rows = table.to_pyarrow_table()
    return rows.sort_by("id").combine_chunks()


def compare_tables(ours_path: Path, theirs_path: Path, expected_rows: int, *, peer: str = "engine") -> list[str]:
    """What differs between ``ours_path`` (the peer's table) and ``theirs_path`` (delta-rs's)."""
    problems = []
    try:
        ours = read_sorted(ours_path)
    except Exception as exc:
        return [f"deltalake cannot read the {peer}'s table: {type(exc).__name__}: {exc}"]
    theirs = read_sorted(theirs_path)
    if ours.num_rows != theirs.num_rows or ours.num_rows != expected_rows:
        problems.append(
            f"row counts differ: {peer} {ours.num_rows:,}, delta-rs {theirs.num_rows:,}, expected {expected_rows:,}"
        )
        return problems
    if ours.schema.names != theirs.schema.names:
        problems.append(f"columns differ: {peer} {ours.schema.names}, delta-rs {theirs.schema.names}")
        return problems
    for name in theirs.schema.names:
        a, b = ours.column(name), theirs.column(name)
        if a.type != b.type:
            try:
                a = a.cast(b.type)
            except pa.ArrowInvalid as exc:
                problems.append(f"column {name}: {peer} type {a.type}, delta-rs type {b.type}: {exc}")
                continue
        if a.equals(b):
            continue
        same = pc.fill_null(pc.or_kleene(pc.equal(a, b), pc.and_(pc.is_null(a), pc.is_null(b))), False)
        bad = pc.indices_nonzero(pc.invert(same))
        i = bad[0].as_py()
        problems.append(
            f"column {name} differs in {len(bad):,} rows; first at id {theirs.column('id')[i]}: "
            f"{peer} {a[i].as_py()!r}, delta-rs {b[i].as_py()!r}"
        )
    return problems


def change_counts(path: Path, version: int) -> dict[str, int]:
    from deltalake import DeltaTable

    reader = DeltaTable(str(path)).load_cdf(starting_version=version, ending_version=version)
    changes = pa.RecordBatchReader.from_stream(reader).read_all()
    counts = changes.group_by("_change_type").aggregate([([], "count_all")])
    return {str(k): int(v) for k, v in zip(counts.column(0).to_pylist(), counts.column(1).to_pylist(), strict=True)}


def check_result(peer: str, result: dict[str, Any], source_rows: int | None, expected: Expected) -> list[str]:
    """The result row (``num_updated_rows``...) a peer answered, against the counts the data was built for."""
    want = {"updated": expected.updated, "inserted": expected.inserted, "deleted": expected.deleted}
    got = {
        "updated": result.get("num_updated_rows"),
        "inserted": result.get("num_inserted_rows"),
        "deleted": result.get("num_deleted_rows"),
    }
    problems = [f"{peer} result {got}, expected {want}"] if got != want else []
    if source_rows is not None and source_rows != expected.source_rows:
        problems.append(f"{peer} numSourceRows {source_rows}, expected {expected.source_rows}")
    return problems


def check_deltars_metrics(metrics: dict[str, Any], expected: Expected) -> list[str]:
    want = {"updated": expected.updated, "inserted": expected.inserted, "deleted": expected.deleted}
    got = {
        "updated": metrics.get("num_target_rows_updated"),
        "inserted": metrics.get("num_target_rows_inserted"),
        "deleted": metrics.get("num_target_rows_deleted"),
    }
    return [f"delta-rs metrics {got}, expected {want} (the bench's data is wrong)"] if got != want else []


def merged_on_read(path: Path, version: int) -> bool:
    """Whether the commit at ``version`` merged on read: it gave some file a deletion vector, or it removed touched
    files whole (every row of theirs changed) and copied no row, as Delta does when a file's vector would cover
    every row (the newest-5% upsert touches only such files)."""
    import json

    removed, copied, vector = False, None, False
    log = path / "_delta_log" / f"{version:020d}.json"
    for line in log.read_text().splitlines():
        action = json.loads(line) if line.strip() else {}
        vector = vector or bool(action.get("add", {}).get("deletionVector"))
        removed = removed or "remove" in action
        if "commitInfo" in action:
            copied = (action["commitInfo"].get("operationMetrics") or {}).get("numTargetRowsCopied")
    return vector or (removed and copied is not None and int(copied) == 0)
