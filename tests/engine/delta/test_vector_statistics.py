"""The statistics a file carries once a merge gives it a deletion vector (PROTOCOL.md, "Deletion Vectors" and
"Per-file Statistics"), and the empty inline vector Delta may write. No Spark: real tables on disk, written with
deltalake."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyroaring import BitMap64

from engine.delta.deletion_vectors import DeletionVectorDescriptor, read_deletion_vector
from engine.delta.dml_with_deletion_vectors import mark_rows_deleted
from engine.delta.errors import DeltaError
from engine.delta.snapshot import load_snapshot
from engine.delta.transaction import Transaction

from .dv_tables import enable_deletion_vectors


def _table(path: Path, columns: dict[str, list[object]], *, stats: bool = True) -> None:
    write_deltalake(str(path), pa.table(columns))
    if not stats:  # as a writer that collects none leaves it: legal while the file has no vector
        first = path / "_delta_log" / "00000000000000000000.json"
        actions = [json.loads(line) for line in first.read_text().splitlines() if line.strip()]
        for action in actions:
            action.get("add", {}).pop("stats", None)
        first.write_text("".join(json.dumps(a) + "\n" for a in actions))
    enable_deletion_vectors(path)


def _mark(path: Path, rows: list[int]) -> dict[str, object]:
    """Give the table's one file a vector deleting ``rows``, commit it, and answer the committed ``add``."""
    snapshot = load_snapshot(str(path))
    [file] = snapshot.files
    removed, updated = mark_rows_deleted(snapshot, [file], {file.path: BitMap64(rows)}, prefix="merge-test")
    assert not removed
    [(old, new)] = updated
    transaction = Transaction(snapshot)
    transaction.record_read([file], None)
    version = transaction.commit([old.to_remove(), new], operation="MERGE", operation_parameters={})
    commit = path / "_delta_log" / f"{version:020d}.json"
    [add] = [json.loads(line)["add"] for line in commit.read_text().splitlines() if '"add"' in line]
    return dict(add)


def test_a_file_added_without_statistics_gets_num_records_with_its_vector(tmp_path: Path) -> None:
    """PROTOCOL.md: a file with a deletion vector must have an accurate numRecords."""
    _table(tmp_path, {"id": list(range(10))}, stats=False)
    add = _mark(tmp_path, [1, 3])
    assert json.loads(str(add["stats"])) == {"numRecords": 10, "tightBounds": False}
    assert load_snapshot(str(tmp_path)).files[0].stats is not None


def test_tight_null_counts_become_what_wide_bounds_can_say(tmp_path: Path) -> None:
    """Delta's updateStatsToWideBounds: a column null in every live row reads as numRecords; any other count stays
    (wide bounds read it as "some or none")."""
    _table(tmp_path, {"id": list(range(4)), "none": pa.array([None] * 4, pa.string()), "some": ["a", None, "c", None]})
    stats = json.loads(str(_mark(tmp_path, [0])["stats"]))
    assert stats["numRecords"] == 4 and stats["tightBounds"] is False
    assert stats["nullCount"] == {"id": 0, "none": 4, "some": 2}
    assert stats["minValues"]["id"] == 0  # bounds of the physical rows stay valid bounds of the live ones
    again = json.loads(str(_mark(tmp_path, [0, 2])["stats"]))
    assert again == stats  # already wide: nothing to change


def test_tight_statistics_of_a_file_with_a_vector_count_its_live_rows(tmp_path: Path) -> None:
    """Beside a vector, numRecords counts the physical rows and tight bounds describe the live ones: a column null
    in all of them (3 of 4 rows live here) reads as numRecords once the bounds are wide."""
    _table(tmp_path, {"id": list(range(4)), "none": pa.array([None] * 4, pa.string())})
    _mark(tmp_path, [0])
    commit = sorted((tmp_path / "_delta_log").glob("*.json"))[-1]
    actions = [json.loads(line) for line in commit.read_text().splitlines() if line.strip()]
    for action in actions:
        if "add" in action:
            action["add"]["stats"] = json.dumps(
                {"numRecords": 4, "nullCount": {"id": 0, "none": 3}, "tightBounds": True}
            )
    commit.write_text("".join(json.dumps(a) + "\n" for a in actions))
    stats = json.loads(str(_mark(tmp_path, [0, 1])["stats"]))
    assert stats == {"numRecords": 4, "nullCount": {"id": 0, "none": 4}, "tightBounds": False}


def test_the_empty_inline_vector_reads_as_no_deleted_rows(tmp_path: Path) -> None:
    """Delta's DeletionVectorDescriptor.EMPTY: inline, no bytes, cardinality 0."""
    empty = DeletionVectorDescriptor.from_json(
        {"storageType": "i", "pathOrInlineDv": "", "sizeInBytes": 0, "cardinality": 0}
    )
    assert len(read_deletion_vector(empty, str(tmp_path))) == 0


def test_a_commit_refuses_a_vector_without_num_records(tmp_path: Path) -> None:
    """Delta's DELTA_DELETION_VECTOR_MISSING_NUM_RECORDS, checked before anything is written."""
    _table(tmp_path, {"id": list(range(10))})
    snapshot = load_snapshot(str(tmp_path))
    [file] = snapshot.files
    _, [(old, new)] = mark_rows_deleted(snapshot, [file], {file.path: BitMap64([1])}, prefix="merge-test")
    transaction = Transaction(snapshot)
    transaction.record_read([file], None)
    with pytest.raises(DeltaError, match="needs numRecords"):
        transaction.commit([old.to_remove(), replace(new, stats=None)], operation="MERGE", operation_parameters={})
    assert load_snapshot(str(tmp_path)).version == snapshot.version


def test_a_remove_carries_the_statistics_of_the_file_it_removes(tmp_path: Path) -> None:
    """As Delta's removes carry them (AddFile.removeWithTimestamp)."""
    _table(tmp_path, {"id": list(range(10))})
    first = (tmp_path / "_delta_log" / "00000000000000000000.json").read_text().splitlines()
    added = next(json.loads(line)["add"] for line in first if '"add"' in line)
    _mark(tmp_path, [2])
    commit = sorted((tmp_path / "_delta_log").glob("*.json"))[-1]
    [removed] = [json.loads(line)["remove"] for line in commit.read_text().splitlines() if '"remove"' in line]
    assert json.loads(removed["stats"]) == json.loads(added["stats"])
