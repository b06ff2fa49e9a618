"""Hand-written merges, each checked against deltalake's merge of the same data, and Delta's own rules where
deltalake differs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal
from unittest.mock import patch

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from engine import COMMIT_METRICS, joins, run_merge, single_pass
from engine.errors import MergeResolutionError, MultipleMatchError, TableNotFoundError
from engine.key_bitmap import KeyBitmap
from tests.engine.harness import (
    COUNTS,
    FindPlan,
    KeyBitmapPlan,
    clause,
    differential,
    find_plan,
    join_plan,
    make_spec,
    rows,
    write_table,
)

TARGET = pa.table(
    {
        "id": pa.array([1, 2, 3, 4], pa.int64()),
        "v": pa.array(["a", "b", "c", "d"]),
        "n": pa.array([10, 20, 30, None], pa.int64()),
    }
)
SOURCE = pa.table(
    {"id": pa.array([2, 3, 5], pa.int64()), "v": pa.array(["B", "C", "E"]), "n": pa.array([200, None, 500], pa.int64())}
)

CASES = {
    "upsert": [clause("matched", "update_all"), clause("notMatched", "insert_all")],
    "update_only": [clause("matched", "update", v="s.v")],
    "conditional_update_and_delete": [
        clause("matched", "delete", "s.n IS NULL"),
        clause("matched", "update", "t.n < 25", n="t.n + s.n"),
    ],
    "delete_only": [clause("matched", "delete")],
    "insert_only": [clause("notMatched", "insert_all")],
    "conditional_inserts": [
        clause("notMatched", "insert", "s.n > 1000", id="s.id", v="'big'"),
        clause("notMatched", "insert", None, id="s.id", v="concat(s.v, '!')"),
    ],
    "not_matched_by_source_delete": [clause("notMatchedBySource", "delete")],
    "not_matched_by_source_update": [
        clause("matched", "update", v="s.v"),
        clause("notMatchedBySource", "update", "t.n > 15", n="0"),
        clause("notMatchedBySource", "delete"),
    ],
    "everything": [
        clause("matched", "update", "s.id = 2", v="'two'"),
        clause("matched", "delete"),
        clause("notMatched", "insert_all"),
        clause("notMatchedBySource", "update", None, v="'gone'"),
    ],
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("partitioned", [False, True], ids=["flat", "partitioned"])
def test_matches_deltalake(spark: SparkSession, tmp_path: Path, name: str, partitioned: bool) -> None:
    clauses = CASES[name]
    target = TARGET.append_column("p", pa.array(["x", "y", "x", "y"])) if partitioned else TARGET
    source = SOURCE.append_column("p", pa.array(["y", "x", "x"])) if partitioned else SOURCE
    result, expected, ours, theirs = differential(
        spark, tmp_path, target, source, "t.id = s.id", clauses, partition_by=["p"] if partitioned else None
    )
    assert {k: result.result[k] for k in COUNTS} == expected
    assert result.result["num_affected_rows"] == sum(expected.values())
    assert rows(ours) == rows(theirs)
    m = result.metrics
    assert m["numSourceRows"] == 3
    assert m["numTargetRowsUpdated"] == expected["num_updated_rows"]
    assert m["numTargetRowsDeleted"] == expected["num_deleted_rows"]
    assert m["numTargetRowsInserted"] == expected["num_inserted_rows"]
    assert m["numOutputRows"] == m["numTargetRowsInserted"] + m["numTargetRowsUpdated"] + m["numTargetRowsCopied"]
    if sum(expected.values()):
        assert result.table_version == 1
        history = DeltaTable(str(ours)).history(1)[0]
        assert history["operation"] == "MERGE"
        assert history["operationMetrics"]["numTargetRowsInserted"] == str(expected["num_inserted_rows"])
        # The commit records the job's own figures, the execution time included, as Delta's strings.
        assert history["operationMetrics"] == {k: str(m[k]) for k in COMMIT_METRICS}
        assert m["executionTimeMs"] > 0
    elif m["numTargetFilesRemoved"]:
        # A touched file that no clause changes is rewritten all the same, and committed, as Delta does.
        assert result.table_version == 1 and m["numTargetRowsCopied"] > 0
    else:
        assert result.table_version is None
        assert DeltaTable(str(ours)).version() == 0


@pytest.mark.parametrize("name", list(CASES))
def test_broadcast_joins_match_deltalake(spark: SparkSession, tmp_path: Path, name: str) -> None:
    """A source much smaller than the target is broadcast and the target streamed past it: the full outer
    join becomes a left outer join united with the source rows matching no target row (for insert-only
    merges: the anti join). Here both sides are small, so the plan is forced."""
    with join_plan(broadcast=True):
        result, expected, ours, theirs = differential(spark, tmp_path, TARGET, SOURCE, "t.id = s.id", CASES[name])
    assert {k: result.result[k] for k in COUNTS} == expected
    assert rows(ours) == rows(theirs)
    assert result.metrics["numSourceRows"] == 3


def test_upsert_metrics_are_delta_s(spark: SparkSession, tmp_path: Path) -> None:
    target = write_table(tmp_path / "t", TARGET)
    source = write_table(tmp_path / "s", SOURCE)
    result = run_merge(spark, make_spec(target, source, "t.id = s.id", CASES["upsert"]))
    m = result.metrics
    assert result.result == {
        "num_affected_rows": 3,
        "num_updated_rows": 2,
        "num_deleted_rows": 0,
        "num_inserted_rows": 1,
    }
    assert m["numTargetRowsMatchedUpdated"] == 2
    assert m["numTargetRowsCopied"] == 2  # ids 1 and 4 share the one touched file
    assert m["numTargetFilesRemoved"] == 1
    assert m["numTargetFilesAdded"] >= 1
    assert m["numTargetBytesAdded"] > 0
    assert m["numTargetBytesRemoved"] > 0
    assert m["numSourceRowsInSecondScan"] == 3
    log = (target / "_delta_log" / f"{1:020d}.json").read_text()
    assert '"operation":"MERGE"' in log.replace(" ", "")


@pytest.mark.parametrize("plan", ["single_pass", "source_keys", "target_rows"])
@pytest.mark.parametrize("broadcast", [True, False], ids=["broadcast", "shuffle"])
@pytest.mark.parametrize("name", ["update_only", "upsert"])
def test_second_scan_counts_every_source_row(
    spark: SparkSession, tmp_path: Path, plan: FindPlan, broadcast: bool, name: str
) -> None:
    """numSourceRowsInSecondScan is every source row writeAllChanges reads, as Delta counts it on the join's
    source side: a matched-only merge's right outer join drops the source row matching none (id 5), yet it
    was read."""
    target = write_table(tmp_path / "t", TARGET)
    source = write_table(tmp_path / "s", SOURCE)
    with find_plan(plan), join_plan(broadcast=broadcast):
        result = run_merge(spark, make_spec(target, source, "t.id = s.id", CASES[name]))
    assert result.metrics["numSourceRows"] == 3
    assert result.metrics["numSourceRowsInSecondScan"] == 3
    assert result.metrics["numTargetRowsUpdated"] == 2


@pytest.mark.parametrize(
    "clauses",
    [
        [clause("matched", "update", "s.n > 1", v="s.v")],
        [clause("matched", "update", v="s.v"), clause("notMatched", "insert_all")],
    ],
    ids=["conditional_update", "upsert"],
)
@pytest.mark.parametrize("plan", ["source_keys", "target_rows", "single_pass"])
def test_multiple_matches_fail_and_name_the_keys(
    spark: SparkSession, tmp_path: Path, clauses: list, plan: FindPlan
) -> None:
    target = write_table(tmp_path / "t", TARGET)
    dup = pa.table({"id": pa.array([2, 2, 3], pa.int64()), "v": ["x", "y", "z"], "n": pa.array([1, 2, 3], pa.int64())})
    source = write_table(tmp_path / "s", dup)
    before = rows(target)
    spec = make_spec(target, source, "t.id = s.id", clauses)
    with pytest.raises(MultipleMatchError) as info, find_plan(plan):
        run_merge(spark, spec)
    assert "multiple source rows matched" in str(info.value)
    assert "id=2" in str(info.value)
    assert rows(target) == before
    assert DeltaTable(str(target)).version() == 0


@pytest.mark.parametrize("broadcast", [True, False], ids=["broadcast", "shuffle"])
@pytest.mark.parametrize("plan", ["source_keys", "target_rows", "single_pass"])
def test_duplicate_keys_on_excludes_are_no_multiple_match(
    spark: SparkSession, tmp_path: Path, plan: FindPlan, broadcast: bool
) -> None:
    """Source rows that fail a source-only conjunct of ON match nothing: they are inserted, never counted as a
    second match of the target row their key names."""
    dup = pa.table(
        {
            "id": pa.array([2, 2, 3, None], pa.int64()),
            "v": ["x", "y", "z", "w"],
            "n": pa.array([1, 5, 0, 7], pa.int64()),
        }
    )
    clauses = [clause("matched", "update", v="s.v"), clause("notMatched", "insert_all")]
    with find_plan(plan), join_plan(broadcast=broadcast):
        result, expected, ours, theirs = differential(spark, tmp_path, TARGET, dup, "t.id = s.id AND s.n > 1", clauses)
    assert {k: result.result[k] for k in COUNTS} == expected
    assert expected == {"num_updated_rows": 1, "num_deleted_rows": 0, "num_inserted_rows": 3}
    assert rows(ours) == rows(theirs)


def test_unconditional_delete_with_multiple_matches_deletes_once(spark: SparkSession, tmp_path: Path) -> None:
    target = write_table(tmp_path / "t", TARGET)
    dup = pa.table({"id": pa.array([2, 2, 3], pa.int64())})
    source = write_table(tmp_path / "s", dup)
    result = run_merge(spark, make_spec(target, source, "t.id = s.id", [clause("matched", "delete")]))
    assert result.result["num_deleted_rows"] == 2
    assert result.metrics["numTargetRowsMatchedDeleted"] == 2
    assert [r[0] for r in rows(target, ["id"])] == [1, 4]


def test_insert_only_inserts_duplicate_source_rows(spark: SparkSession, tmp_path: Path) -> None:
    target = write_table(tmp_path / "t", TARGET)
    dup = pa.table({"id": pa.array([7, 7, 1], pa.int64()), "v": ["x", "y", "z"], "n": pa.array([1, 2, 3], pa.int64())})
    source = write_table(tmp_path / "s", dup)
    result = run_merge(spark, make_spec(target, source, "t.id = s.id", [clause("notMatched", "insert_all")]))
    assert result.result["num_inserted_rows"] == 2
    assert result.metrics["numTargetFilesRemoved"] == 0
    assert sorted(r[0] for r in rows(target, ["id"])) == [1, 2, 3, 4, 7, 7]


def test_unknown_column_fails_and_leaves_table(spark: SparkSession, tmp_path: Path) -> None:
    target = write_table(tmp_path / "t", TARGET)
    source = write_table(tmp_path / "s", SOURCE)
    spec = make_spec(target, source, "t.id = s.id", [clause("matched", "update", v="s.nope")])
    with pytest.raises(MergeResolutionError, match="when_matched\\[0\\]"):
        run_merge(spark, spec)
    assert DeltaTable(str(target)).version() == 0


def test_insert_clause_cannot_see_the_target(spark: SparkSession, tmp_path: Path) -> None:
    target = write_table(tmp_path / "t", TARGET)
    source = write_table(tmp_path / "s", SOURCE)
    spec = make_spec(target, source, "t.id = s.id", [clause("notMatched", "insert", id="s.id", v="t.v")])
    with pytest.raises(MergeResolutionError, match="WHEN NOT MATCHED clauses can only refer to the source"):
        run_merge(spark, spec)


def test_a_one_sided_clause_reads_a_struct_field_named_without_alias_on_its_side(
    spark: SparkSession, tmp_path: Path
) -> None:
    """``st.b`` in a NOT MATCHED BY SOURCE clause is the target's field, in a NOT MATCHED clause the source's, though
    both tables have a column ``st`` (Delta resolves a one-sided clause against its side alone)."""
    struct = pa.struct([("a", pa.int64()), ("b", pa.string())])

    def table(ids: list[int], tag: str) -> pa.Table:
        return pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "st": pa.array([{"a": i, "b": f"{tag}{i}"} for i in ids], struct),
                "v": pa.array([None] * len(ids), pa.string()),
            }
        )

    target = write_table(tmp_path / "t", table([1, 2], "t"))
    source = write_table(tmp_path / "s", table([2, 3], "s"))
    clauses = [
        clause("notMatched", "insert", id="id", st="st", v="concat(st.b, '+')"),
        clause("notMatchedBySource", "update", "st.a = 1", v="concat(st.b, '-')"),
    ]
    result = run_merge(spark, make_spec(target, source, "t.id = s.id", clauses))
    assert result.metrics["numTargetRowsInserted"] == 1 and result.metrics["numTargetRowsUpdated"] == 1
    assert sorted(rows(target, ["id", "v"])) == [(1, "t1-"), (2, None), (3, "s3+")]


def test_missing_target_is_table_not_found(spark: SparkSession, tmp_path: Path) -> None:
    source = write_table(tmp_path / "s", SOURCE)
    with pytest.raises(TableNotFoundError):
        run_merge(spark, make_spec(tmp_path / "missing", source, "t.id = s.id", CASES["upsert"]))


KEY_BITS = 1 << 16


def tables_sharing_key_bits() -> tuple[pa.Table, pa.Table]:
    """Keys that share a bit with a source key (k and k + 2**16), negative keys and NULL keys; an INT target key
    meets a BIGINT source key."""
    target_ids = [1, 2, 1 + KEY_BITS, 2 + 3 * KEY_BITS, -1, -1 - KEY_BITS, None, 40, 41]
    target = pa.table(
        {
            "id": pa.array(target_ids, pa.int32()),
            "v": [f"v{i}" for i in range(len(target_ids))],
            "n": pa.array(range(len(target_ids)), pa.int64()),
        }
    )
    source = pa.table(
        {
            "id": pa.array([1, 2, -1, None, 7, 40, 3 + KEY_BITS], pa.int64()),
            "v": ["a", "b", "c", "d", "e", "x", "f"],
            "n": pa.array([1, 0, 5, 2, 3, 4, 6], pa.int64()),
        }
    )
    return target, source


@contextmanager
def watching_key_bitmap() -> Iterator[tuple[list[KeyBitmap], list[str]]]:
    """The key bitmaps built, and which way the source rows matching no target row were found through it."""
    built: list[KeyBitmap] = []
    routes: list[str] = []
    real_bitmap, real_held = KeyBitmap.build, joins.unmatched_source_rows_by_held_rows
    real_pairs = single_pass.write_in_one_pass_counting_pairs

    def spy_bitmap(*args: Any, **kwargs: Any) -> KeyBitmap:
        built.append(real_bitmap(*args, **kwargs))
        return built[-1]

    def spy_held(*args: Any, **kwargs: Any) -> Any:
        routes.append("held")
        return real_held(*args, **kwargs)

    def spy_pairs(*args: Any, **kwargs: Any) -> Any:
        routes.append("pairs")
        return real_pairs(*args, **kwargs)

    with (
        patch.object(KeyBitmap, "build", spy_bitmap),
        patch.object(joins, "unmatched_source_rows_by_held_rows", spy_held),
        patch.object(single_pass, "write_in_one_pass_counting_pairs", spy_pairs),
    ):
        yield built, routes


@pytest.mark.parametrize(
    "on",
    ["t.id = s.id", "t.id = s.id AND s.n > 0", "s.id = t.id AND t.v <> 'x'"],
    ids=["key", "source_conjunct", "target_conjunct"],
)
@pytest.mark.parametrize(
    ("plan", "unmatched"),
    [
        ("single_pass", "held"),
        ("single_pass", "semi"),
        ("source_keys", "held"),
        ("insert_only", "held"),
        ("insert_only", "semi"),
    ],
)
def test_key_bitmap_answers_as_the_plain_probe(
    spark: SparkSession, tmp_path: Path, on: str, plan: FindPlan | Literal["insert_only"], unmatched: KeyBitmapPlan
) -> None:
    """Target rows whose bit is clear skip the probe into the broadcast source, and the source rows matching
    no target row are found through the bitmap too. The keys (see tables_sharing_key_bits) must come out as the
    plain join has them."""
    target, source = tables_sharing_key_bits()
    insert = clause("notMatched", "insert", "s.id IS NOT NULL", id="s.id", v="s.v", n="s.n")
    clauses = (
        [insert]
        if plan == "insert_only"
        else [clause("matched", "delete", "s.v = 'b'"), clause("matched", "update", v="s.v", n="t.n + s.n"), insert]
    )
    with (
        find_plan("source_keys" if plan == "insert_only" else plan),
        join_plan(broadcast=True, key_bitmap=unmatched),
        watching_key_bitmap() as (built, routes),
    ):
        result, expected, ours, theirs = differential(spark, tmp_path, target, source, on, clauses)
    assert [b.bits for b in built] == [KEY_BITS]
    assert built[0].keys == 6 and built[0].held_fraction == 6 / KEY_BITS
    # findTouchedFiles by source keys keeps the matched keys: it does not ask the target for the unmatched
    # source rows. The single pass (taken on these few candidate rows whatever the conjuncts) meets the held
    # target rows with the source rows to count its actions; an insert-only merge anti-joins them.
    held = {"insert_only": ["held"], "single_pass": ["pairs"]}.get(plan, [])
    assert routes == (held if unmatched == "held" else [])
    assert {k: result.result[k] for k in COUNTS} == expected
    assert rows(ours) == rows(theirs)
