"""Which version a time travel names, from the log alone: commit times made increasing as Delta makes them, the
earliest version a cleaned-up log can still recreate. (Tables Delta wrote, with and without in-commit timestamps,
are compared with Delta's own time travel in tests/oracle/test_time_travel_as_delta.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from engine.delta import TimeTravelError, check_version, load_snapshot, version_at
from engine.delta.time_travel import java_timestamp
from engine.errors import TableNotFoundError

SECOND_US = 1_000_000


def _table(path: Path, commits: int, seconds: list[int]) -> Path:
    """``commits`` appends, commit ``v``'s file last modified at ``seconds[v]``."""
    for i in range(commits):
        write_deltalake(str(path), pa.table({"id": pa.array([i], pa.int64())}), mode="append")
    for version, at in enumerate(seconds):
        os.utime(path / "_delta_log" / f"{version:020d}.json", (at, at))
    return path


def test_a_commit_time_that_steps_back_is_moved_just_after_the_one_before(tmp_path: Path) -> None:
    """Version 2's file is older than version 1's: Delta takes it as one millisecond after version 1."""
    table = _table(tmp_path / "t", 3, [1_000, 2_000, 1_500])
    latest = load_snapshot(str(table))
    assert version_at(latest, 1_000 * SECOND_US) == 0
    assert version_at(latest, 1_999 * SECOND_US) == 0
    assert version_at(latest, 2_000 * SECOND_US) == 1
    assert version_at(latest, 2_000 * SECOND_US + 999) == 1  # Delta compares whole milliseconds
    assert version_at(latest, 2_000 * SECOND_US + 1_000) == 2
    with pytest.raises(TimeTravelError, match=r"\[DELTA_TIMESTAMP_GREATER_THAN_COMMIT\] Timestamp 1970-01-01 00:33:20"):
        version_at(latest, 2_000 * SECOND_US + 2_000)
    with pytest.raises(
        TimeTravelError,
        match=r"\[DELTA_TIMESTAMP_EARLIER_THAN_COMMIT_RETENTION\] The provided timestamp \(1970-01-01 00:16:39.999999\)"
        r" is before the earliest version available to this table \(1970-01-01 00:16:40.0\)",
    ):
        version_at(latest, 1_000 * SECOND_US - 1)


def test_the_earliest_version_is_the_first_checkpoint_every_later_commit_follows(tmp_path: Path) -> None:
    table = _table(tmp_path / "t", 4, [])
    DeltaTable(str(table), version=2).create_checkpoint()
    check_version(str(table), 0)
    for version in (0, 1):
        (table / "_delta_log" / f"{version:020d}.json").unlink()
    check_version(str(table), 2)
    check_version(str(table), 3)
    for gone in (1, 4, -1):
        with pytest.raises(
            TimeTravelError,
            match=rf"\[DELTA_VERSION_NOT_FOUND\] Cannot time travel Delta table to version {gone}\. "
            r"Available versions: \[2, 3\]\.",
        ):
            check_version(str(table), gone)


def test_a_missing_table_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(TableNotFoundError):
        check_version(str(tmp_path / "nothing"), 0)


@pytest.mark.parametrize(
    ("us", "shown"),
    [(0, "1970-01-01 00:00:00.0"), (1_500_000, "1970-01-01 00:00:01.5"), (-1, "1969-12-31 23:59:59.999999")],
)
def test_times_print_as_java_timestamps(us: int, shown: str) -> None:
    assert java_timestamp(us) == shown
