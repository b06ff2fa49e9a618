"""The row groups of a table's files, from their footers: what bounds the tasks Spark reads them in."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import WriterProperties, write_deltalake

from engine import delta
from engine.delta import row_groups


def _append(path: Path, ids: range, rows_per_group: int) -> None:
    data = pa.table({"id": pa.array(list(ids), pa.int64())})
    write_deltalake(
        str(path), data, mode="append", writer_properties=WriterProperties(max_row_group_size=rows_per_group)
    )


def test_the_row_groups_of_every_file_are_summed(tmp_path: Path) -> None:
    """One file of three row groups and one of a single row group: four."""
    _append(tmp_path, range(0, 30), 10)
    assert delta.row_group_count(delta.load_snapshot(str(tmp_path))) == 3
    _append(tmp_path, range(30, 40), 100)
    snapshot = delta.load_snapshot(str(tmp_path))
    assert len(snapshot.files) == 2
    assert delta.row_group_count(snapshot) == 4


def test_many_files_are_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ROW_GROUPS_MAX_FILES files no footer is read: so many files already give Spark that many splits."""
    monkeypatch.setattr(row_groups, "ROW_GROUPS_MAX_FILES", 2)
    for start in (0, 10, 20):
        _append(tmp_path, range(start, start + 10), 100)
    assert delta.row_group_count(delta.load_snapshot(str(tmp_path))) is None


def test_an_unreadable_footer_counts_as_unknown(tmp_path: Path) -> None:
    """A file that is not Parquet (here, truncated) leaves the count unknown; the merge's own read reports it."""
    _append(tmp_path, range(0, 10), 100)
    snapshot = delta.load_snapshot(str(tmp_path))
    Path(snapshot.file_path(snapshot.files[0])).write_bytes(b"PAR1")
    assert delta.row_group_count(snapshot) is None
