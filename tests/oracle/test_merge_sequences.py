"""Random merges in sequence on one table with deletion vectors, against Delta's own MERGE INTO on Delta's Spark
and the reference model. Each merge starts from the table the last one left, written by the engine and by Delta in
turn: the engine merges over vectors Delta wrote and over its own, and Delta over the engine's, so files whose
vectors grow, files removed once every row is deleted, and the log and checkpoints both write are all read back by
the other.
``MERGE_DELTA_SEQUENCE_EXAMPLES`` sets the number of sequences for a long run."""

from __future__ import annotations

import itertools
import os
import shutil
from pathlib import Path
from typing import Any

from hypothesis import given, note
from hypothesis import strategies as st
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from tests.engine.harness import find_plan, join_plan, write_table
from tests.engine.test_merge_random import (
    ModelClause,
    as_sorted,
    merge_sequences,
    model_merge,
    random_merge_settings,
    to_arrow,
)
from tests.oracle.delta_faults import DELTA_UNEXPECTED_ROW, delta_disagrees_with_itself
from tests.oracle.differential import Side, assert_same, delta_rows, run_delta, run_engine
from tests.oracle.tables import latest_version

EXAMPLES = int(os.environ.get("MERGE_DELTA_SEQUENCE_EXAMPLES", "5"))
STEPS = 3
DELETION_VECTORS = {"delta.enableDeletionVectors": "true"}
CDF = {"delta.enableChangeDataFeed": "true"}
CHECKPOINTS = {"delta.checkpointInterval": "2"}
"""A checkpoint every other version (the second commit of a sequence writes one): each side then reads the
deletion-vector descriptors the other's checkpoint carries, not only its commits."""

_counter = itertools.count()


def _table_rows(delta_spark: SparkSession, path: Path, columns: list[str]) -> list[dict[str, Any]]:
    """The table's rows as the reference model takes them."""
    return [dict(zip(columns, r, strict=True)) for r in delta_rows(delta_spark, path, columns)]


@random_merge_settings(EXAMPLES)
@given(case=merge_sequences(steps=STEPS), cdf=st.booleans())
def test_merges_in_sequence_match_delta(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, case: dict[str, Any], cdf: bool
) -> None:
    """Each merge runs on two copies of the table as the last merge left it: rows, the result row, every
    operationMetric Delta reports (its deletion-vector counts among them) and, with Change Data Feed, the change
    rows agree, and the engine's rows are the model's. The next merge starts from the engine's table after an
    even step and from Delta's after an odd one. Where Delta has no trustworthy answer (docs/oracle.md) the
    model alone judges, and the sequence goes on from the engine's table."""
    columns, types = case["columns"], case["types"]
    root = tmp_path / f"sequence{next(_counter)}"
    configuration = {**DELETION_VECTORS, **CHECKPOINTS, **(CDF if cdf else {})}
    table = write_table(
        root / "start",
        to_arrow(case["target"], columns, types),
        partition_by=["p"] if case["partitioned"] else None,
        configuration=configuration,
    )
    for step, merge in enumerate(case["merges"]):
        # Fresh paths for each merge: Delta on Spark caches a path's log, and may take a table copied over it at
        # the same version for the one it cached.
        ours_path, theirs_path = root / f"ours{step}", root / f"theirs{step}"
        shutil.copytree(table, ours_path)
        shutil.copytree(table, theirs_path)
        clauses: list[ModelClause] = merge["clauses"]
        on = merge["on"]
        note(
            f"step {step}: ON {on.sql}; clauses {[(c.kind, c.action, c.cond.sql if c.cond else None) for c in clauses]}"
        )
        start = _table_rows(delta_spark, ours_path, columns)
        expected, counts = model_merge(start, merge["source"], clauses, columns, on=on)
        source = write_table(root / f"source{step}", to_arrow(merge["source"], columns, types))
        ours = Side(ours_path, start_version=latest_version(ours_path))
        theirs = Side(theirs_path, start_version=latest_version(theirs_path))
        engine_clauses = [c.engine_clause() for c in clauses]
        plans = (join_plan(broadcast=merge["broadcast"], key_bitmap=merge["key_bitmap"]), find_plan(merge["find_plan"]))
        run_engine(spark, ours, source, on.sql, engine_clauses, plans)
        assert ours.error is None, ours.error
        assert ours.result is not None and {k: ours.result[k] for k in counts} == counts
        assert delta_rows(delta_spark, ours_path, columns) == as_sorted(expected, columns)
        delta_trusted = True
        try:
            run_delta(delta_spark, theirs, source, on.sql, engine_clauses)
        except PySparkException as exc:
            if DELTA_UNEXPECTED_ROW not in str(exc):
                raise
            delta_trusted = False
        if delta_trusted and delta_disagrees_with_itself(delta_spark, theirs, len(start), columns):
            delta_trusted = False
        if delta_trusted:
            assert_same(delta_spark, ours, theirs, columns, cdf=cdf)
        table = theirs_path if delta_trusted and step % 2 == 1 else ours_path
    shutil.rmtree(root, ignore_errors=True)
