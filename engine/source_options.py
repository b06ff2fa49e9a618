"""What a Delta source's reader options ask for: the table's rows at its latest version, at an earlier one (time
travel: ``versionAsOf``, ``timestampAsOf``), or its Change Data Feed between two versions (``readChangeFeed``
with ``startingVersion`` or ``startingTimestamp``, and optionally ``endingVersion`` or ``endingTimestamp``).
Option names ignore case, as Spark's do. Any other option is refused rather than ignored: a reader that
quietly read the table's rows where its caller meant its changes would merge the wrong rows."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from engine.errors import MergeSpecError

TIME_TRAVEL_OPTIONS = ("versionAsOf", "timestampAsOf")
CHANGE_FEED_FLAGS = ("readChangeFeed", "readChangeData")
"""Delta takes either name (``readChangeData`` is the older one)."""
CHANGE_FEED_BOUNDS = ("startingVersion", "startingTimestamp", "endingVersion", "endingTimestamp")
DELTA_SOURCE_OPTIONS = {name.lower(): name for name in (*TIME_TRAVEL_OPTIONS, *CHANGE_FEED_FLAGS, *CHANGE_FEED_BOUNDS)}
"""The reader options a Delta source takes, by their lower-case name."""

_VERSION = re.compile(r"[+-]?\d{1,19}")


@dataclass(frozen=True)
class ChangeFeedRange:
    """The versions whose changes a Change Data Feed read gives: from a version or the first commit at or after a
    timestamp, to a version or the last commit at or before a timestamp (neither: the latest version). Where both
    a version and a timestamp bound one end, the version wins, as in Delta."""

    starting_version: int | None = None
    starting_timestamp: str | None = None
    ending_version: int | None = None
    ending_timestamp: str | None = None


@dataclass(frozen=True)
class DeltaRead:
    """A Delta source's read: its latest rows, its rows at ``version`` or ``timestamp``, or its ``change_feed``."""

    version: int | None = None
    timestamp: str | None = None
    change_feed: ChangeFeedRange | None = None


def delta_read(options: Mapping[str, str], where: str = "source.options") -> DeltaRead:
    """The read ``options`` ask of a Delta source, or a ``MergeSpecError`` with Delta's message where Delta refuses
    them and a plain one where an option would be ignored."""
    chosen: dict[str, str] = {}
    for key, value in options.items():
        name = DELTA_SOURCE_OPTIONS.get(key.lower())
        if name is None:
            raise MergeSpecError(
                f"{where}: a Delta source takes only versionAsOf or timestampAsOf (time travel), or readChangeFeed "
                f"with startingVersion/startingTimestamp and endingVersion/endingTimestamp; {key!r} is not supported.",
                field=where,
            )
        if name in chosen:
            raise MergeSpecError(f"{where}: {name} is given twice (option names ignore case).", field=where)
        chosen[name] = value
    if _reads_change_feed(chosen, where):
        return DeltaRead(change_feed=_change_feed_range(chosen, where))
    bounds = [name for name in CHANGE_FEED_BOUNDS if name in chosen]
    if bounds:
        raise MergeSpecError(
            f"{where}: {bounds[0]} bounds a Change Data Feed read; set readChangeFeed to 'true' to read the table's "
            "changes (without it Delta would ignore the option and read every row of the table).",
            field=where,
        )
    travel = [name for name in TIME_TRAVEL_OPTIONS if name in chosen]
    if len(travel) > 1:
        raise MergeSpecError(
            f"{where}: [DELTA_ONEOF_IN_TIMETRAVEL] Please either provide 'timestampAsOf' or 'versionAsOf' for "
            "time travel.",
            field=where,
        )
    if "versionAsOf" in chosen:
        text = chosen["versionAsOf"].strip()
        if not _VERSION.fullmatch(text):
            raise MergeSpecError(
                f"{where}: [DELTA_TIME_TRAVEL_INVALID_BEGIN_VALUE] versionAsOf needs to be a valid begin value; "
                f"got {chosen['versionAsOf']!r}.",
                field=where,
            )
        return DeltaRead(version=int(text))
    return DeltaRead(timestamp=chosen.get("timestampAsOf"))


def _reads_change_feed(chosen: Mapping[str, str], where: str) -> bool:
    flags = []
    for name in CHANGE_FEED_FLAGS:
        if name not in chosen:
            continue
        value = chosen[name].strip().lower()
        if value not in ("true", "false"):
            raise MergeSpecError(
                f"{where}: [DELTA_ILLEGAL_OPTION] Invalid value {chosen[name]!r} for option {name!r}, must be 'true' "
                "or 'false'.",
                field=where,
            )
        flags.append(value == "true")
    return any(flags)


def _change_feed_range(chosen: Mapping[str, str], where: str) -> ChangeFeedRange:
    if any(name in chosen for name in TIME_TRAVEL_OPTIONS):
        raise MergeSpecError(
            f"{where}: [DELTA_UNSUPPORTED_TIME_TRAVEL_VIEWS] Cannot time travel views, subqueries, streams or change "
            "data feed queries.",
            field=where,
        )
    if "startingVersion" not in chosen and "startingTimestamp" not in chosen:
        raise MergeSpecError(
            f"{where}: [DELTA_NO_START_FOR_CDC_READ] No startingVersion or startingTimestamp provided for CDC read.",
            field=where,
        )
    start = _version(chosen, "startingVersion", where)
    end = _version(chosen, "endingVersion", where)
    if start is not None and end is not None and end < start:
        raise MergeSpecError(
            f"{where}: [DELTA_INVALID_CDC_RANGE] CDC range from start {start} to end {end} was invalid. End cannot "
            "be before start.",
            field=where,
        )
    return ChangeFeedRange(
        starting_version=start,
        starting_timestamp=None if start is not None else chosen.get("startingTimestamp"),
        ending_version=end,
        ending_timestamp=None if end is not None else chosen.get("endingTimestamp"),
    )


def _version(chosen: Mapping[str, str], name: str, where: str) -> int | None:
    if name not in chosen:
        return None
    text = chosen[name].strip()
    if not _VERSION.fullmatch(text) or int(text) < 0:
        raise MergeSpecError(
            f"{where}: [DELTA_VERSION_INVALID] The provided version ({chosen[name]}) is not a valid version ({name}).",
            field=where,
        )
    return int(text)
