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
from deltalake import DeltaTable
from deltalake.table import TableFeatures
from hypothesis import given, note
from hypothesis import strategies as st
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from engine import run_merge
from engine.errors import UnsupportedTableFeatureError
from tests.engine.harness import clause, find_plan, join_plan, make_spec
from tests.engine.test_merge import CASES, SOURCE, TARGET
from tests.engine.test_merge_random import (
    ModelClause,
    merges,
    random_merge_settings,
    skippable_rows,
    to_arrow,
    unacted_multiple_matches,
)
from tests.oracle.delta_faults import DELTA_UNEXPECTED_ROW, assert_as_modelled, delta_disagrees_with_itself
from tests.oracle.differential import (
    assert_same,
    merge_sql,
    prepare_copies,
    run_delta,
    run_engine,
)
from tests.oracle.tables import latest_version

EXAMPLES = int(os.environ.get("MERGE_DELTA_RANDOM_EXAMPLES", "10"))
CDF = {"delta.enableChangeDataFeed": "true"}

RANDOM_FEATURES: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {
    "changeDataFeed": (CDF, ()),
    "deletionVectors": ({"delta.enableDeletionVectors": "true"}, ()),
    "v2Checkpoint": ({"delta.checkpointInterval": "2"}, ("v2Checkpoint",)),
}
"""Table features the engine merges into that deltalake can give a table: the properties and protocol features
each adds. v2Checkpoint comes with a checkpoint every other version, so the engine's merge writes one."""

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


JOIN_CONDITIONS = {
    "never": "1 = 0",
    "range": "t.id < s.id AND t.id >= s.id - 1",
    "or": "t.id = s.id OR t.v = lower(s.v)",
    "target-only conjunct": "t.id = s.id AND t.n > 15",
    "source-only conjunct": "t.id = s.id AND s.n > 250",
    "null-safe": "t.n <=> s.n",
    "expression key": "t.id + 1 = s.id",
    "coalesced key": "coalesce(t.n, 0) = coalesce(s.n, 0)",
}
JOIN_CLAUSES = {
    "upsert": [clause("matched", "update", None, v="s.v"), clause("notMatched", "insert_all")],
    "delete, insert, not matched by source": [
        clause("matched", "delete"),
        clause("notMatched", "insert_all"),
        clause("notMatchedBySource", "update", None, v="'gone'"),
    ],
}


@pytest.mark.parametrize("clauses", list(JOIN_CLAUSES))
@pytest.mark.parametrize("on", list(JOIN_CONDITIONS))
def test_join_conditions_beyond_key_equality_match_delta(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, on: str, clauses: str
) -> None:
    """ON clauses no key join serves (a range, OR, expressions of keys) or that skipping and the key plans must
    read right (one-sided conjuncts, ``<=>``, a condition that never holds), on a table with deletion vectors and
    Change Data Feed."""
    configuration = {"delta.enableDeletionVectors": "true", **CDF}
    ours, theirs, src = prepare_copies(tmp_path, TARGET, SOURCE, configuration=configuration)
    run_engine(spark, ours, src, JOIN_CONDITIONS[on], JOIN_CLAUSES[clauses], ())
    run_delta(delta_spark, theirs, src, JOIN_CONDITIONS[on], JOIN_CLAUSES[clauses])
    assert_same(delta_spark, ours, theirs, TARGET.column_names, cdf=True)


_counter = itertools.count()


@random_merge_settings(EXAMPLES)
@given(case=merges(), features=st.sets(st.sampled_from(sorted(RANDOM_FEATURES)), max_size=2))
def test_random_merges_match_delta(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, case: dict[str, Any], features: set[str]
) -> None:
    """Random merges (the engine's own generator, with its forced join and findTouchedFiles plans) on tables with
    table features drawn at random (``RANDOM_FEATURES``). Where several source rows match one target row both
    must fail, unless those rows lie in files data skipping may leave unread (then whether a merge sees them is
    each engine's own), or no WHEN MATCHED condition holds for any of their matches (``unacted_multiple_matches``:
    the engine refuses such a merge, Delta does not see it)."""
    clauses: list[ModelClause] = case["clauses"]
    note(f"clauses: {[(c.kind, c.action, c.cond.sql if c.cond else None, c.assign_sql) for c in clauses]}")
    note(f"table features: {sorted(features)}")
    columns, types = case["columns"], case["types"]
    cdf = "changeDataFeed" in features
    configuration = {k: v for name in sorted(features) for k, v in RANDOM_FEATURES[name][0].items()}
    root = tmp_path / f"case{next(_counter)}"
    ours, theirs, src = prepare_copies(
        root,
        to_arrow(case["target"], columns, types),
        to_arrow(case["source"], columns, types),
        partition_by=["p"] if case["partitioned"] else None,
        configuration=configuration or None,
        features=[f for name in sorted(features) for f in RANDOM_FEATURES[name][1]],
    )
    engine_clauses = [c.engine_clause() for c in clauses]
    plans = (join_plan(broadcast=case["broadcast"], key_bitmap=case["key_bitmap"]), find_plan(case["find_plan"]))
    run_engine(spark, ours, src, case["on"].sql, engine_clauses, plans)
    unacted = unacted_multiple_matches(case["target"], case["source"], clauses, case["on"])
    try:
        run_delta(delta_spark, theirs, src, case["on"].sql, engine_clauses)
    except PySparkException as exc:
        if DELTA_UNEXPECTED_ROW in str(exc):
            assert_as_modelled(delta_spark, ours, case, clauses)
            return
        if not (unacted and "DELTA_NUM_RECORDS_MISMATCH" in str(exc)):
            raise
    if unacted and ours.multiple_match and not theirs.multiple_match:
        assert latest_version(ours.path) == ours.start_version
        return
    if ours.multiple_match != theirs.multiple_match and skippable_rows(case["target"], clauses, case["partitioned"]):
        return
    if delta_disagrees_with_itself(delta_spark, theirs, len(case["target"]), columns):
        assert_as_modelled(delta_spark, ours, case, clauses)
        return
    assert_same(delta_spark, ours, theirs, columns, cdf=cdf)
    shutil.rmtree(root, ignore_errors=True)


def test_a_touched_file_no_clause_changes_is_committed_as_delta_does(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path
) -> None:
    """With more than MATCHED clauses every match touches its file, even one no clause acts on: Delta rewrites the
    file, copying its rows, and commits that (its commitIfNeeded), so the version moves though no row changed."""
    clauses = [clause("matched", "delete", "s.v = 'never'"), clause("notMatched", "insert_all", "s.id > 100")]
    ours, theirs, src = prepare_copies(tmp_path, TARGET, SOURCE)
    run_engine(spark, ours, src, "t.id = s.id", clauses, ())
    run_delta(delta_spark, theirs, src, "t.id = s.id", clauses)
    assert ours.result is not None and ours.result["num_affected_rows"] == 0
    assert ours.version == ours.start_version + 1
    assert ours.metrics is not None and int(ours.metrics["numTargetRowsCopied"]) > 0
    assert_same(delta_spark, ours, theirs, TARGET.column_names)


def test_several_matches_no_clause_acts_on_are_refused_where_delta_does_not_see_them(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path
) -> None:
    """An intended difference (docs/oracle.md): two source rows match one target row, alone in its file, and the
    only clause's condition holds for neither. Delta's findTouchedFiles keeps only matches a clause may act on, so
    it commits without reading that file; the engine refuses the merge as several matches and leaves the table."""
    target = pa.table({"k": pa.array([None, 1, 2], pa.int64()), "v": ["t0", "t1", "t2"], "p": ["y", "x", "x"]})
    source = pa.table({"k": pa.array([None, None, 2, 3], pa.int64()), "v": ["s0", "s1", "s2", "s3"], "p": ["y"] * 4})
    clauses = [clause("matched", "update", "s.k > 1", v="s.v")]
    ours, theirs, src = prepare_copies(tmp_path, target, source, partition_by=["p"])
    run_engine(spark, ours, src, "t.k <=> s.k", clauses, ())
    run_delta(delta_spark, theirs, src, "t.k <=> s.k", clauses)
    assert ours.multiple_match and latest_version(ours.path) == ours.start_version
    assert theirs.error is None and theirs.result is not None and theirs.result["num_updated_rows"] == 1


DELETE_ONLY = {
    "unconditional": [clause("matched", "delete")],
    "conditional": [clause("matched", "delete", "s.v = 's4'"), clause("matched", "delete", "t.n > 150")],
}


@pytest.mark.parametrize("duplicates", [False, True], ids=["unique", "duplicate-keys"])
@pytest.mark.parametrize("name", list(DELETE_ONLY))
def test_delete_only_merges_with_deletion_vectors_match_delta(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, name: str, duplicates: bool
) -> None:
    """A merge that only deletes writes no data: the engine gathers the touched files and the deleted rows in one
    Spark job, Delta in three. Four files (one per partition), three of them with vectors Delta wrote: one file
    has every row deleted (removed outright), one vector is updated, one added. Rows, the result and every metric
    agree, and so does the multiple-match rule (allowed for one unconditional delete only)."""
    ids = list(range(200))
    target = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "v": [f"t{i}" for i in ids],
            "n": pa.array(ids, pa.int64()),
            "p": [str(i // 50) for i in ids],
        }
    )
    keys = [*range(50), 60, 61, 120, 199, 250] + ([60, 199] if duplicates else [])
    source = pa.table(
        {
            "id": pa.array(keys, pa.int64()),
            "v": [f"s{i}" for i in keys],
            "n": pa.array(keys, pa.int64()),
            "p": [str(i // 50) for i in keys],
        }
    )
    dv = {"delta.enableDeletionVectors": "true"}
    ours, theirs, src = prepare_copies(tmp_path, target, source, partition_by=["p"], configuration=dv)
    for side in (ours, theirs):
        delta_spark.sql(f"DELETE FROM delta.`{side.path}` WHERE id IN (3, 61, 130, 170)").collect()
        side.start_version = latest_version(side.path)
    run_engine(spark, ours, src, "t.id = s.id", DELETE_ONLY[name], ())
    run_delta(delta_spark, theirs, src, "t.id = s.id", DELETE_ONLY[name])
    assert ours.multiple_match == (duplicates and name == "conditional")
    assert_same(delta_spark, ours, theirs, target.column_names)
    if ours.error is None:
        assert ours.metrics is not None
        metrics = ("numTargetFilesAdded", "numTargetFilesRemoved", "numTargetDeletionVectorsAdded")
        # Unconditional: the first file goes; the others each get a vector that replaces Delta's.
        expected = {"unconditional": (0, 1, 3), "conditional": (0, 0, 2)}[name]
        assert tuple(int(ours.metrics[m]) for m in metrics) == expected
        assert ours.metrics["numTargetDeletionVectorsUpdated"] == ours.metrics["numTargetDeletionVectorsAdded"]


@pytest.mark.parametrize("pair", list(itertools.combinations(sorted(RANDOM_FEATURES), 2)), ids="+".join)
def test_every_pair_of_random_features_makes_a_table_delta_merges(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path, pair: tuple[str, str]
) -> None:
    """The random merges draw up to two features: each pair gives a table both engines take, and agree on."""
    configuration = {k: v for name in pair for k, v in RANDOM_FEATURES[name][0].items()}
    features = [f for name in pair for f in RANDOM_FEATURES[name][1]]
    ours, theirs, src = prepare_copies(tmp_path, TARGET, SOURCE, configuration=configuration, features=features)
    run_engine(spark, ours, src, "t.id = s.id", CASES["upsert"], ())
    run_delta(delta_spark, theirs, src, "t.id = s.id", CASES["upsert"])
    assert_same(delta_spark, ours, theirs, TARGET.column_names, cdf="changeDataFeed" in pair)


def test_a_table_whose_protocol_lacks_a_feature_its_metadata_enables_is_refused_by_both(
    spark: SparkSession, delta_spark: SparkSession, tmp_path: Path
) -> None:
    """deltalake's add_feature alone leaves a Change Data Feed table's protocol without changeDataFeed: Delta
    refuses to merge into it (DELTA_FEATURES_PROTOCOL_METADATA_MISMATCH) and so does the engine, naming the
    feature; neither commits."""
    ours, theirs, src = prepare_copies(tmp_path, TARGET, SOURCE, configuration=CDF)
    for side in (ours, theirs):
        DeltaTable(str(side.path)).alter.add_feature(
            [TableFeatures.DeletionVectors], allow_protocol_versions_increase=True
        )
    start = latest_version(ours.path)
    with pytest.raises(PySparkException, match="DELTA_FEATURES_PROTOCOL_METADATA_MISMATCH"):
        delta_spark.sql(merge_sql(theirs.path, src, "t.id = s.id", CASES["upsert"])).collect()
    with pytest.raises(UnsupportedTableFeatureError, match=r"'changeDataFeed'.*DELTA_FEATURES_PROTOCOL_METADATA"):
        run_merge(spark, make_spec(ours.path, src, "t.id = s.id", CASES["upsert"]))
    assert latest_version(ours.path) == latest_version(theirs.path) == start
