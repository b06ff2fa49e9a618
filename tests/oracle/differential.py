"""One merge run two ways on copies of one table: by the engine, and by Delta's own MERGE INTO on Delta's Spark.

What is compared, and what is not (with the reason), is written down in docs/oracle.md; INTENDED_DIFFERENCES
holds the operationMetrics left out.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from engine import DeleteAction, InsertAction, MergeClause, MergeResult, run_merge
from engine.delta.feature_upgrade import add_features
from engine.errors import MultipleMatchError
from tests.engine.harness import make_spec, write_table
from tests.oracle.tables import commit_info, latest_version, make_delta_table, table_ref

INTENDED_DIFFERENCES = frozenset(
    {
        # Wall-clock times of two different programs.
        "executionTimeMs",
        "scanTimeMs",
        "rewriteTimeMs",
        "materializeSourceTimeMs",
        # How many files a write splits its rows into, and so their bytes, follow each writer's partitioning of
        # the output (Delta: one file per non-empty task of its shuffle; the engine: its own plan).
        "numTargetFilesAdded",
        "numTargetBytesAdded",
        "numTargetChangeFilesAdded",
    }
)


def merge_sql(target: Path, source: Path, on: str, clauses: Sequence[MergeClause]) -> str:
    """Delta's MERGE INTO text for the same spec the engine runs (aliases t and s)."""
    parts = [f"MERGE INTO {table_ref(target)} AS t USING {table_ref(source)} AS s ON {on}"]
    # Spark's grammar takes the MATCHED clauses first, then NOT MATCHED, then NOT MATCHED BY SOURCE; only the order
    # within each kind has a meaning.
    order = {"matched": 0, "notMatched": 1, "notMatchedBySource": 2}
    for c in sorted(clauses, key=lambda c: order[c.clause_type]):
        when = {
            "matched": "WHEN MATCHED",
            "notMatched": "WHEN NOT MATCHED",
            "notMatchedBySource": "WHEN NOT MATCHED BY SOURCE",
        }[c.clause_type]
        if c.condition:
            when += f" AND {c.condition}"
        a = c.action
        if isinstance(a, DeleteAction):
            then = "DELETE"
        elif isinstance(a, InsertAction):
            then = "INSERT *" if a.star else f"INSERT ({', '.join(a.values)}) VALUES ({', '.join(a.values.values())})"
        else:
            then = "UPDATE SET *" if a.star else "UPDATE SET " + ", ".join(f"t.{k} = {v}" for k, v in a.set.items())
        parts.append(f"{when} THEN {then}")
    return " ".join(parts)


@dataclass
class Side:
    """What one side's merge left: the result row, the commit's version and operationMetrics, or its error."""

    path: Path
    result: dict[str, int] | None = None
    version: int | None = None
    metrics: dict[str, str] | None = None
    error: Exception | None = None
    start_version: int = 0
    """The table's version before the merge."""

    @property
    def multiple_match(self) -> bool:
        if isinstance(self.error, MultipleMatchError):
            return True
        return isinstance(self.error, PySparkException) and "MULTIPLE_SOURCE_ROW_MATCHING_TARGET_ROW" in str(self.error)


def _committed(side: Side, before: int) -> None:
    after = latest_version(side.path)
    if after > before:
        side.version = after
        side.metrics = commit_info(side.path, after).get("operationMetrics", {})


def run_engine(
    spark: SparkSession,
    side: Side,
    source: Path,
    on: str,
    clauses: Sequence[MergeClause],
    plans: Any = (),
    **spec_options: Any,
) -> None:
    """The engine's merge (the join and findTouchedFiles ``plans`` forced, ``spec_options`` on its MergeSpec)."""
    before = latest_version(side.path)
    try:
        with ExitStack() as stack:
            for plan in plans:
                stack.enter_context(plan)
            result: MergeResult = run_merge(spark, make_spec(side.path, source, on, clauses, **spec_options))
    except MultipleMatchError as exc:
        side.error = exc
        return
    side.result = dict(result.result)
    _committed(side, before)


def run_delta(delta_spark: SparkSession, side: Side, source: Path, on: str, clauses: Sequence[MergeClause]) -> None:
    before = latest_version(side.path)
    try:
        row = delta_spark.sql(merge_sql(side.path, source, on, clauses)).collect()[0]
    except PySparkException as exc:
        side.error = exc
        if not side.multiple_match:
            raise
        return
    side.result = {k: int(v) for k, v in row.asDict().items()}
    _committed(side, before)


def prepare_copies(
    tmp: Path,
    target: pa.Table,
    source: pa.Table,
    *,
    partition_by: Sequence[str] | None = None,
    configuration: dict[str, str] | None = None,
    features: Sequence[str] = (),
) -> tuple[Side, Side, Path]:
    """The target written once (by deltalake, Delta's ``features`` then added to its protocol with those its
    configuration enables) and copied, so both merges start from the same files."""
    ours = write_table(tmp / "ours", target, partition_by=partition_by, configuration=configuration)
    if features:
        add_features(ours, features)
    return (*copy_sides(ours, tmp / "theirs"), write_table(tmp / "source", source))


def copy_sides(original: Path, theirs: Path) -> tuple[Side, Side]:
    """The table and a copy of its files at ``theirs``, both merges starting from its latest version."""
    shutil.copytree(original, theirs)
    start = latest_version(original)
    return Side(original, start_version=start), Side(theirs, start_version=start)


def delta_made_copies(
    delta_spark: SparkSession,
    tmp: Path,
    ddl: str,
    source: tuple[str, str],
    *,
    properties: dict[str, str] | None = None,
    partitioned_by: Sequence[str] = (),
    then_sql: Sequence[str] = (),
) -> tuple[Side, Side, Path]:
    """The target as Delta on Spark creates it (``ddl``, its properties and partition columns, then ``then_sql``
    with ``{table}`` for it), copied; the source Delta creates beside them from ``(DDL, VALUES rows)``."""
    ours = make_delta_table(
        delta_spark, tmp / "ours", ddl, properties=properties, partitioned_by=partitioned_by, then_sql=then_sql
    )
    source_path = make_delta_table(
        delta_spark, tmp / "source", source[0], then_sql=[f"INSERT INTO {{table}} VALUES {source[1]}"]
    )
    return (*copy_sides(ours, tmp / "theirs"), source_path)


def delta_rows(delta_spark: SparkSession, path: Path, columns: Sequence[str]) -> list[tuple[Any, ...]]:
    """The table's rows as Delta on Spark reads them, sorted as ``rows`` sorts them."""
    got = delta_spark.read.format("delta").load(str(path)).select(*(f"`{c}`" for c in columns)).collect()
    return sorted((tuple(r) for r in got), key=lambda r: tuple((v is not None, str(v)) for v in r))


def changes(delta_spark: SparkSession, side: Side, columns: Sequence[str]) -> list[tuple[Any, ...]]:
    """The commit's Change Data Feed rows as Delta on Spark reads them (``table_changes``), sorted."""
    assert side.version is not None
    names = ", ".join([*(f"`{c}`" for c in columns), "_change_type", "_commit_version"])
    got = delta_spark.sql(
        f"SELECT {names} FROM table_changes_by_path('{side.path}', {side.version}, {side.version})"
    ).collect()
    return sorted((tuple(r) for r in got), key=lambda r: tuple((v is not None, str(v)) for v in r))


def metric_differences(ours: dict[str, str], theirs: dict[str, str]) -> dict[str, tuple[str | None, str | None]]:
    """Every operationMetric Delta reports (and any the engine adds) whose values differ, intended ones aside."""
    keys = (set(ours) | set(theirs)) - INTENDED_DIFFERENCES
    return {k: (ours.get(k), theirs.get(k)) for k in sorted(keys) if ours.get(k) != theirs.get(k)}


def assert_same(
    delta_spark: SparkSession, ours: Side, theirs: Side, columns: Sequence[str], *, cdf: bool = False
) -> None:
    """Rows, the result row, the commit's operationMetrics and (with ``cdf``) the change rows agree."""
    assert (ours.error is None) == (theirs.error is None), (ours.error, theirs.error)
    if ours.error is not None:
        assert ours.multiple_match and theirs.multiple_match
        assert latest_version(ours.path) == ours.start_version
        assert latest_version(theirs.path) == theirs.start_version
        return
    assert ours.result == theirs.result
    # Delta reads both: deltalake does not read every table feature (v2Checkpoint).
    assert delta_rows(delta_spark, ours.path, columns) == delta_rows(delta_spark, theirs.path, columns)
    assert ours.version == theirs.version
    if theirs.metrics is None:
        return
    assert ours.metrics is not None
    differences = metric_differences(ours.metrics, theirs.metrics)
    assert not differences, f"operationMetrics (engine, Delta): {differences}"
    if cdf:
        assert changes(delta_spark, ours, columns) == changes(delta_spark, theirs, columns)
