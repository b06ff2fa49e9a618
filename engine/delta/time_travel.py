"""Which version of a table a time travel names, as Delta's DeltaHistoryManager answers: a version the log can
still recreate, or the latest commit at or before a timestamp. A commit's time is its in-commit timestamp where
the table keeps them, else its commit file's modification time, made strictly increasing (a clock that stepped
back must not reorder history)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime

from engine.delta.log_replay import commit_versions, complete_checkpoints
from engine.delta.paths import normalize_table
from engine.delta.row_tracking import ICT_ENABLEMENT_VERSION_KEY, in_commit_timestamps_enabled
from engine.delta.snapshot import Snapshot
from engine.errors import DeltaError, TableNotFoundError


class TimeTravelError(DeltaError):
    """The version or timestamp names no version the table can be read at."""


@dataclass(frozen=True)
class _History:
    log_dir: str
    commits: list[int]
    earliest: int
    latest: int


def _history(table: str) -> _History:
    root = normalize_table(table)[1]
    log_dir = os.path.join(root, "_delta_log")
    if not os.path.isdir(log_dir):
        raise TableNotFoundError(f"No Delta table at {root} (no _delta_log folder)")
    names = os.listdir(log_dir)
    commits = commit_versions(names)
    if not commits:
        raise TimeTravelError(f"No commits in the log of {root}")
    latest = commits[-1]
    present = set(commits)
    checkpoints = complete_checkpoints(names)
    earliest = commits[0]
    # Walking back from the latest commit: a version with a complete state (version 0's commit, or a
    # checkpoint) can be recreated while every commit after it is still there.
    for version in range(latest, -1, -1):
        if version in checkpoints or (version == 0 and 0 in present):
            earliest = version
        if version not in present:
            break
    return _History(log_dir, commits, earliest, latest)


def check_version(table: str, version: int) -> None:
    """Delta's DELTA_VERSION_NOT_FOUND where ``version`` is not one the log of ``table`` can recreate."""
    history = _history(table)
    if not history.earliest <= version <= history.latest:
        raise TimeTravelError(
            f"[DELTA_VERSION_NOT_FOUND] Cannot time travel Delta table to version {version}. "
            f"Available versions: [{history.earliest}, {history.latest}]."
        )


def version_at(latest: Snapshot, timestamp_us: int) -> int:
    """The latest version committed at or before ``timestamp_us`` (microseconds since the epoch; Delta compares
    milliseconds), as Delta's time travel resolves it from the table's ``latest`` snapshot: earlier than every
    recreatable commit, or later than the last one, is an error."""
    times = _commit_times(_history(latest.root), _ict_since(latest))
    timestamp_ms = timestamp_us // 1000
    chosen = None
    for version, commit_ms in times:
        if commit_ms <= timestamp_ms:
            chosen = version
    first_ms = times[0][1]
    if chosen is None:
        raise TimeTravelError(
            f"[DELTA_TIMESTAMP_EARLIER_THAN_COMMIT_RETENTION] The provided timestamp ({java_timestamp(timestamp_us)}) "
            f"is before the earliest version available to this table ({java_timestamp(first_ms * 1000)}). Please use "
            f"a timestamp after {java_timestamp(first_ms * 1000, seconds=True)}."
        )
    _check_not_after_last(times, timestamp_us)
    return chosen


def version_from(latest: Snapshot, timestamp_us: int) -> int:
    """The first version committed at or after ``timestamp_us``, as Delta's Change Data Feed starts from a
    timestamp: a timestamp before every commit starts at the earliest, one after the last is an error."""
    times = _commit_times(_history(latest.root), _ict_since(latest))
    _check_not_after_last(times, timestamp_us)
    timestamp_ms = timestamp_us // 1000
    return next(version for version, commit_ms in times if commit_ms >= timestamp_ms)


def commit_timestamps(latest: Snapshot) -> dict[int, int]:
    """Each recreatable commit's time in milliseconds since the epoch, by version, as Delta's history reports
    it: what Delta's Change Data Feed gives as ``_commit_timestamp``."""
    return dict(_commit_times(_history(latest.root), _ict_since(latest)))


def _check_not_after_last(times: list[tuple[int, int]], timestamp_us: int) -> None:
    last_ms = times[-1][1]
    if last_ms < timestamp_us // 1000:
        raise TimeTravelError(
            f"[DELTA_TIMESTAMP_GREATER_THAN_COMMIT] Timestamp {java_timestamp(timestamp_us)} is after the table's "
            f"latest version ({java_timestamp(last_ms * 1000)}). Use a timestamp at or before "
            f"{java_timestamp(last_ms * 1000, seconds=True)}."
        )


def _commit_times(history: _History, enabled_ict_since: int | None) -> list[tuple[int, int]]:
    """(version, commit time in ms) of every recreatable commit with a commit file, in version order."""
    times: list[tuple[int, int]] = []
    for version in history.commits:
        if version < history.earliest:
            continue
        path = os.path.join(history.log_dir, f"{version:020d}.json")
        if enabled_ict_since is not None and version >= enabled_ict_since:
            times.append((version, _in_commit_timestamp(path)))
            continue
        modified = int(os.stat(path).st_mtime_ns // 1_000_000)
        if times and modified <= times[-1][1]:
            modified = times[-1][1] + 1
        times.append((version, modified))
    return times


def _in_commit_timestamp(path: str) -> int:
    with open(path, encoding="utf-8") as handle:
        first = handle.readline()
    try:
        return int(json.loads(first)["commitInfo"]["inCommitTimestamp"])
    except (ValueError, KeyError, TypeError) as exc:
        raise TimeTravelError(
            f"The commit {os.path.basename(path)} lacks the inCommitTimestamp its table keeps in every commit"
        ) from exc


def _ict_since(latest: Snapshot) -> int | None:
    """The version from which the table's commits carry in-commit timestamps: the enablement version where they
    were turned on after the table was created, else 0; None where they are off."""
    if not in_commit_timestamps_enabled(latest.metadata):
        return None
    return int(latest.metadata.configuration.get(ICT_ENABLEMENT_VERSION_KEY, "0"))


def java_timestamp(us: int, *, seconds: bool = False) -> str:
    """A UTC time as Delta's messages print it (java.sql.Timestamp: ``2024-01-01 00:00:00.0``); ``seconds``: to
    the second, as its advice does."""
    moment = datetime.fromtimestamp(us // 1_000_000, tz=UTC)
    text = moment.strftime("%Y-%m-%d %H:%M:%S")
    if seconds:
        return text
    return f"{text}.{f'{us % 1_000_000:06d}'.rstrip('0') or '0'}"


__all__ = ["TimeTravelError", "check_version", "commit_timestamps", "java_timestamp", "version_at", "version_from"]
