"""A warm start: a throwaway merge that warms a Spark Connect session before a worker takes its first job.

The first merge of a process pays for everything that is loaded once: the engine's and Spark Connect's Python
modules, the server's classes for each plan shape, and the JIT that has not yet compiled them. A merge on a table
of a few rows of its own, with the shapes a real upsert takes (a matched update, an insert, a deletion-vector
write and a copy-on-write one), moves that cost to start-up, where no caller waits for it.
"""

from __future__ import annotations

import contextlib
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from engine.command import run_merge
from engine.delta.feature_upgrade import add_features
from engine.errors import MergeExecutionError
from engine.spec import InsertAction, MergeClause, MergeSpec, RowsSource, UpdateAction

_SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])
_ROWS = [{"id": 1, "v": "warm"}, {"id": 4, "v": "warm"}]


def _upsert(target: Path, deletion_vectors: bool, rows: list[dict[str, object]]) -> MergeSpec:
    return MergeSpec(
        target=str(target),
        source=RowsSource(rows=rows, schema="id BIGINT, v STRING"),
        on="t.id = s.id",
        matched=(MergeClause("matched", UpdateAction(star=True)),),
        not_matched=(MergeClause("notMatched", InsertAction(star=True)),),
        target_alias="t",
        source_alias="s",
        deletion_vectors="auto" if deletion_vectors else "off",
    )


WARM_UP_PATIENCE = 16
"""The JIT's warm-up goes on while one of the last this many rounds was the best so far: on a fresh server a round's
time falls slowly and unevenly for hundreds of merges (a patience of eight ended warm-ups whose rounds were still
falling by a fifth), and a server already warm, whose rounds only vary, sets a new best ever more rarely."""

WARM_UP_GAIN = 0.98
"""A new best round must take at most this share of the best before it: a round a hair faster is noise."""

DV_ROUND_EVERY = 4
"""Every this many rounds also runs a deletion-vector upsert, which costs as much as a few small merges."""


@dataclass(frozen=True)
class WarmUp:
    seconds: float
    rounds: tuple[float, ...]
    """The seconds each round of the JIT's warm-up took, in order."""


def warm_up(spark: SparkSession, scratch: Path, *, max_seconds: float = 0.0) -> WarmUp:
    """Upserts into two tables of three rows made under ``scratch`` (one with deletion vectors enabled), checks
    that each updated one row and inserted one, then, for up to ``max_seconds``, runs rounds of small merges (an
    update and an insert past every file, with a deletion-vector upsert every few rounds) while they still get
    faster (``still_warming``): the server's JIT compiles Spark's hot paths only after many merges, and a server
    already warm stops after some twenty rounds. The tables are removed at the end. ``scratch`` must be a directory
    Spark can write to."""
    start = time.monotonic()
    rounds: list[float] = []
    base = scratch / f"warm-up-{uuid.uuid4().hex}"
    try:
        for deletion_vectors in (False, True):
            target = _small_table(base / ("dv" if deletion_vectors else "cow"), deletion_vectors)
            result = run_merge(spark, _upsert(target, deletion_vectors, _ROWS)).result
            if (result["num_updated_rows"], result["num_inserted_rows"]) != (1, 1):
                raise MergeExecutionError(f"The warm-up merge answered {result}, not one update and one insert.")
        _warm_the_jit(spark, base, start + max_seconds, rounds)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        with contextlib.suppress(OSError):
            scratch.rmdir()  # only when no other worker's warm-up is using it
    return WarmUp(seconds=time.monotonic() - start, rounds=tuple(rounds))


def _small_table(path: Path, deletion_vectors: bool) -> Path:
    """A fresh table of three rows at ``path``, with deletion vectors enabled when asked."""
    shutil.rmtree(path, ignore_errors=True)
    write_deltalake(str(path), pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"]}, schema=_SCHEMA))
    if deletion_vectors:
        add_features(path, ["deletionVectors"])
        DeltaTable(str(path)).alter.set_table_properties({"delta.enableDeletionVectors": "true"})
    return path


def still_warming(rounds: list[float]) -> bool:
    """Whether one of the last ``WARM_UP_PATIENCE`` rounds was clearly faster than every round before it (the first
    rounds always are)."""
    if len(rounds) <= WARM_UP_PATIENCE:
        return True
    return min(rounds[-WARM_UP_PATIENCE:]) <= min(rounds[:-WARM_UP_PATIENCE]) * WARM_UP_GAIN


def _warm_the_jit(spark: SparkSession, base: Path, deadline: float, rounds: list[float]) -> None:
    """Rounds of the two shapes of a small upsert, appended to ``rounds``, while ``still_warming`` and before the
    deadline. The JIT compiles by how often a path runs, so the rounds are cheap and many: each round merges into
    tables of three rows made for it (a table that kept every round's commits and files would make each round
    slower than the last, and its rounds would not compare). A round's time counts its two copy-on-write merges
    only."""
    key = 100
    while time.monotonic() < deadline and still_warming(rounds):
        key += 1
        cow = _small_table(base / "cow", False)
        began = time.monotonic()
        run_merge(spark, _upsert(cow, False, [{"id": 2, "v": f"w{key}"}]))  # a match: the single pass
        run_merge(spark, _upsert(cow, False, [{"id": key, "v": "w"}]))  # a new key past every file
        rounds.append(time.monotonic() - began)
        if len(rounds) % DV_ROUND_EVERY == 0:
            dv = _small_table(base / "dv", True)
            run_merge(spark, _upsert(dv, True, [{"id": 2, "v": f"w{key}"}, {"id": -key, "v": "w"}]))  # on read
