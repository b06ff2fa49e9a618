"""The engine against Delta's own MERGE INTO on Delta's Spark: the hand cases on plain, partitioned and Change
Data Feed tables, and a bounded number of random merges (``MERGE_DELTA_RANDOM_EXAMPLES`` for a long run)."""

from __future__ import annotations

import itertools
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, note
from pyspark.sql import SparkSession

from tests.engine.harness import find_plan, join_plan
from tests.engine.test_merge import CASES, SOURCE, TARGET
from tests.engine.test_merge_random import ModelClause, merges, random_merge_settings, skippable_rows, to_arrow
from tests.oracle.differential import assert_same, prepare_copies, run_delta, run_engine

EXAMPLES = int(os.environ.get("MERGE_DELTA_RANDOM_EXAMPLES", "10"))
CDF = {"delta.enableChangeDataFeed": "true"}

LAYOUTS = {
    "plain": (None, None),
    "cdf": (["p"], CDF),
}
"""A table without partitions, and a partitioned one with Change Data Feed (which also covers partitioning)."""


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", list(CASES))
def test_hand_cases_match_delta(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, name: str, layout: str
) -> None:
    partition_by, configuration = LAYOUTS[layout]
    target, source = TARGET, SOURCE
    if partition_by:
        target = target.append_column("p", pa.array(["x", "y", "x", "y"]))
        source = source.append_column("p", pa.array(["y", "x", "x"]))
    ours, theirs, src = prepare_copies(tmp_path, target, source, partition_by=partition_by, configuration=configuration)
    run_engine(spark, ours, src, "t.id = s.id", CASES[name], ())
    run_delta(delta_spark, theirs, src, "t.id = s.id", CASES[name])
    assert_same(delta_spark, ours, theirs, target.column_names, cdf=configuration is not None)


_counter = itertools.count()


@random_merge_settings(EXAMPLES)
@given(case=merges())
def test_random_merges_match_delta(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, case: dict[str, Any]
) -> None:
    """Random merges (the engine's own generator, with its forced join and findTouchedFiles plans), half of them
    on Change Data Feed tables. Where several source rows match one target row both must fail, unless those rows
    lie in files data skipping may leave unread (then whether a merge sees them is each engine's own)."""
    clauses: list[ModelClause] = case["clauses"]
    note(f"clauses: {[(c.kind, c.action, c.cond.sql if c.cond else None, c.assign_sql) for c in clauses]}")
    columns, types = case["columns"], case["types"]
    cdf = len(case["target"]) % 2 == 0
    root = tmp_path / f"case{next(_counter)}"
    ours, theirs, src = prepare_copies(
        root,
        to_arrow(case["target"], columns, types),
        to_arrow(case["source"], columns, types),
        partition_by=["p"] if case["partitioned"] else None,
        configuration=CDF if cdf else None,
    )
    engine_clauses = [c.engine_clause() for c in clauses]
    plans = (join_plan(broadcast=case["broadcast"], key_bitmap=case["key_bitmap"]), find_plan(case["find_plan"]))
    run_engine(spark, ours, src, case["on"].sql, engine_clauses, plans)
    run_delta(delta_spark, theirs, src, case["on"].sql, engine_clauses)
    if ours.multiple_match != theirs.multiple_match and skippable_rows(case["target"], clauses, case["partitioned"]):
        return
    assert_same(delta_spark, ours, theirs, columns, cdf=cdf)
    shutil.rmtree(root, ignore_errors=True)
