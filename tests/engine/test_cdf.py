"""Change Data Feed: deltalake's load_cdf over the engine's commit returns the same change rows as over
deltalake's own merge of the same data (commit timestamps and row order aside). The random cases: 60 in
``make test``, ``MERGE_RANDOM_CDF_EXAMPLES`` for a long run."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import given, note
from pyspark.sql import SparkSession

from engine import run_merge
from engine.errors import SchemaMismatchError
from tests.engine.harness import (
    clause,
    find_plan,
    join_plan,
    make_spec,
    oracle_merge,
    rows,
    upsert_all_spec,
    write_table,
)
from tests.engine.test_merge import CASES, SOURCE, TARGET
from tests.engine.test_merge_random import (
    ModelMultipleMatch,
    has_multiple_matches,
    merges,
    model_merge,
    random_merge_settings,
    to_arrow,
)

CDF = {"delta.enableChangeDataFeed": "true"}
EXAMPLES = int(os.environ.get("MERGE_RANDOM_CDF_EXAMPLES", "60"))


def changes(path: Path, columns: Sequence[str]) -> list[tuple[Any, ...]]:
    """The change rows of version 1 as sorted tuples of the table's columns and ``_change_type``."""
    table = DeltaTable(str(path)).load_cdf(starting_version=1).read_all()
    names = [*columns, "_change_type"]
    values = [table.column(n).to_pylist() for n in names]
    return sorted(zip(*values, strict=True), key=lambda r: tuple((v is not None, str(v)) for v in r))


def both(
    spark: SparkSession,
    tmp: Path,
    target: pa.Table,
    source: pa.Table,
    clauses: Sequence[Any],
    partition_by: Sequence[str] | None = None,
) -> tuple[Any, Path, Path]:
    ours = write_table(tmp / "ours", target, partition_by=partition_by, configuration=CDF)
    theirs = tmp / "theirs"
    shutil.copytree(ours, theirs)
    src = write_table(tmp / "source", source)
    result = run_merge(spark, make_spec(ours, src, "t.id = s.id", clauses))
    oracle_merge(theirs, source, "t.id = s.id", clauses)
    return result, ours, theirs


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("partitioned", [False, True], ids=["flat", "partitioned"])
def test_change_rows_match_deltalake(spark: SparkSession, tmp_path: Path, name: str, partitioned: bool) -> None:
    target = TARGET.append_column("p", pa.array(["x", "y", "x", "y"])) if partitioned else TARGET
    source = SOURCE.append_column("p", pa.array(["y", "x", "x"])) if partitioned else SOURCE
    result, ours, theirs = both(spark, tmp_path, target, source, CASES[name], ["p"] if partitioned else None)
    assert rows(ours) == rows(theirs)
    if result.table_version is None:
        return
    columns = target.column_names
    assert changes(ours, columns) == changes(theirs, columns)
    log = [line for line in (ours / "_delta_log" / f"{1:020d}.json").read_text().splitlines() if '"cdc"' in line]
    assert len(log) == result.metrics["numTargetChangeFilesAdded"]
    if log:
        assert result.metrics["numTargetChangeFileBytes"] > 0
    if partitioned:
        # Change files carry the partition values of their rows: deltalake reads ``p`` of a change row from its
        # cdc action's partitionValues, so the equality above checks them; here, that each action has them.
        for line in log:
            assert '"partitionValues":{"p":' in line.replace(" ", "")


@pytest.mark.parametrize("name", ["upsert", "everything", "insert_only"])
def test_change_rows_match_deltalake_with_broadcast_source(spark: SparkSession, tmp_path: Path, name: str) -> None:
    with join_plan(broadcast=True):
        result, ours, theirs = both(spark, tmp_path, TARGET, SOURCE, CASES[name])
    assert rows(ours) == rows(theirs)
    assert result.table_version == 1
    assert changes(ours, TARGET.column_names) == changes(theirs, TARGET.column_names)


def test_update_writes_pre_and_post_images(spark: SparkSession, tmp_path: Path) -> None:
    result, ours, _ = both(spark, tmp_path, TARGET, SOURCE, CASES["update_only"])
    got = changes(ours, ["id", "v"])
    assert (2, "b", "update_preimage") in got and (2, "B", "update_postimage") in got
    assert result.metrics["numTargetChangeFilesAdded"] >= 1


def test_delete_only_multiple_matches_yield_one_delete_row(spark: SparkSession, tmp_path: Path) -> None:
    ours = write_table(tmp_path / "t", TARGET, configuration=CDF)
    dup = pa.table(
        {
            "id": pa.array([2, 2, 2, 3, 9], pa.int64()),
            "v": ["x", "y", "z", "w", "q"],
            "n": pa.array([1, 2, 3, 4, 5], pa.int64()),
        }
    )
    src = write_table(tmp_path / "s", dup)
    clauses = [clause("matched", "delete"), clause("notMatched", "insert_all")]
    with join_plan(broadcast=True):
        result = run_merge(spark, make_spec(ours, src, "t.id = s.id", clauses))
    assert result.result["num_deleted_rows"] == 2
    assert result.result["num_inserted_rows"] == 1
    got = changes(ours, ["id", "v"])
    assert got == [(2, "b", "delete"), (3, "c", "delete"), (9, "q", "insert")]
    assert [r[0] for r in rows(ours, ["id"])] == [1, 4, 9]


@pytest.mark.slow
@random_merge_settings(EXAMPLES)
@given(case=merges())
def test_random_change_rows_match_deltalake(spark: SparkSession, tmp_path: Path, case: dict[str, Any]) -> None:
    note(f"case: {case!r}")
    columns, types = case["columns"], case["types"]
    target_rows, source_rows, clauses = case["target"], case["source"], case["clauses"]
    on = case["on"]
    try:
        model_merge(target_rows, source_rows, clauses, columns, on)
    except ModelMultipleMatch:
        return  # the random suite checks the failure; no change data to compare
    if has_multiple_matches(target_rows, source_rows, on):
        return  # deltalake has no multiple-match rule; the hand-written case above covers it
    root = tmp_path / f"cdf{len(list(tmp_path.iterdir()))}"
    partition_by = ["p"] if case["partitioned"] else None
    ours = write_table(
        root / "ours", to_arrow(target_rows, columns, types), partition_by=partition_by, configuration=CDF
    )
    theirs = root / "theirs"
    shutil.copytree(ours, theirs)
    source_arrow = to_arrow(source_rows, columns, types)
    source = write_table(root / "source", source_arrow)
    engine_clauses = [c.engine_clause() for c in clauses]
    with join_plan(broadcast=case["broadcast"], key_bitmap=case["key_bitmap"]), find_plan(case["find_plan"]):
        result = run_merge(spark, make_spec(ours, source, on.sql, engine_clauses))
    oracle_merge(theirs, source_arrow, on.sql, engine_clauses)
    assert rows(ours, columns) == rows(theirs, columns)
    if result.table_version is not None and DeltaTable(str(theirs)).version() == 1:
        mine, oracle = changes(ours, columns), changes(theirs, columns)
        assert mine == oracle
    shutil.rmtree(root, ignore_errors=True)


def test_schema_evolution_with_change_data(spark: SparkSession, tmp_path: Path) -> None:
    ours = write_table(tmp_path / "t", TARGET, configuration=CDF)
    wider = SOURCE.append_column("extra", pa.array(["x", "y", "z"]))
    src = write_table(tmp_path / "s", wider)
    spec = upsert_all_spec(ours, src, schema_evolution=True)
    result = run_merge(spark, spec)
    assert result.table_version == 1
    got = changes(ours, ["id", "v", "extra"])
    assert (2, "b", None, "update_preimage") in got
    assert (2, "B", "x", "update_postimage") in got
    assert (5, "E", "z", "insert") in got
    assert len(got) == 5


def test_reserved_change_data_column_fails_and_leaves_table(spark: SparkSession, tmp_path: Path) -> None:
    """Schema evolution would add ``_change_type``, which CDF readers add themselves: Delta refuses the write."""
    ours = write_table(tmp_path / "t", TARGET, configuration=CDF)
    before = sorted(p.name for p in ours.rglob("*"))
    wider = SOURCE.append_column("_change_type", pa.array(["x", "y", "z"]))
    src = write_table(tmp_path / "s", wider)
    spec = upsert_all_spec(ours, src, schema_evolution=True)
    with pytest.raises(SchemaMismatchError, match=r"reserved columns \['_change_type'\].*Change Data Feed"):
        run_merge(spark, spec)
    assert sorted(p.name for p in ours.rglob("*")) == before
    assert DeltaTable(str(ours)).version() == 0
