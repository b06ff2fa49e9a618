"""How many Parquet row groups a table's files hold: Spark splits a file only between row groups, so this bounds
the tasks that read them."""

from __future__ import annotations

import pyarrow.parquet as pq

from engine.delta.snapshot import Snapshot

ROW_GROUPS_MAX_FILES = 8
"""Footers are read for at most this many files: more files already give Spark that many splits or more."""


def row_group_count(snapshot: Snapshot) -> int | None:
    """The row groups of the snapshot's files, from their footers; None when it has more than
    ``ROW_GROUPS_MAX_FILES`` files or a footer cannot be read."""
    if len(snapshot.files) > ROW_GROUPS_MAX_FILES:
        return None
    try:
        return sum(pq.read_metadata(snapshot.file_path(f)).num_row_groups for f in snapshot.files)
    except (OSError, ValueError):
        return None
