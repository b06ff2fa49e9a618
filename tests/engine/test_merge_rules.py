"""Delta's rules beyond the clause cases: casts, schema evolution, dry runs, idempotent commits, SQL text,
and every error path leaving the table as it was."""

from __future__ import annotations

import json
import os
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from engine import (
    ALL_METRICS,
    COMMIT_METRICS,
    AppTransaction,
    MergeSpec,
    RowsSource,
    find_applied,
    parse_merge_sql,
    run_merge,
)
from engine.delta import load_snapshot
from engine.delta.errors import InvariantViolationError
from engine.errors import (
    DataCastError,
    MergeResolutionError,
    MergeSpecError,
    SchemaMismatchError,
)
from tests.engine.harness import FindPlan, clause, find_plan, make_spec, oracle_merge, rows, write_table
from tests.engine.test_merge import SOURCE, TARGET

UPSERT = [clause("matched", "update_all"), clause("notMatched", "insert_all")]


def files_under(path: Path) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), path) for d, _, fs in os.walk(path) for f in fs}


def unchanged(path: Path, before: set[str]) -> None:
    assert DeltaTable(str(path)).version() == 0
    assert files_under(path) == before


def test_cast_overflow_fails_and_leaves_the_table(spark: SparkSession, tmp_path: Path) -> None:
    ids = pa.array([1], pa.int64())
    target = write_table(tmp_path / "t", pa.table({"id": ids, "small": pa.array([1], pa.int8())}))
    source = write_table(tmp_path / "s", pa.table({"id": ids, "small": pa.array([300], pa.int64())}))
    before = files_under(target)
    with pytest.raises(DataCastError, match='"BIGINT" type into the "TINYINT" type column `small` due to an overflow'):
        run_merge(spark, make_spec(target, source, "t.id = s.id", [clause("matched", "update_all")]))
    unchanged(target, before)


def test_a_random_value_too_large_fails_with_sparks_own_check(spark: SparkSession, tmp_path: Path) -> None:
    """The check that names the column evaluates the value more than once: a value that differs between
    evaluations keeps Spark's overflow check alone."""
    ids = pa.array([1], pa.int64())
    target = write_table(tmp_path / "t", pa.table({"id": ids, "small": pa.array([1], pa.int8())}))
    source = write_table(tmp_path / "s", pa.table({"id": ids, "big": pa.array([300], pa.int64())}))
    before = files_under(target)
    random_value = clause("matched", "update", None, small="s.big * rand() + 1000")
    with pytest.raises(DataCastError, match=r"\[CAST_OVERFLOW\].* to \"TINYINT\""):
        run_merge(spark, make_spec(target, source, "t.id = s.id", [random_value]))
    unchanged(target, before)


def test_assigned_values_take_ansi_casts_as_in_delta(spark: SparkSession, tmp_path: Path) -> None:
    """Delta's MERGE casts an assigned value with an ANSI ``Cast`` (UpdateExpressionsSupport.castIfNeeded):
    strings go into numbers and dates, and deltalake agrees; a value that does not parse fails the merge when
    it is written, leaving the table as it was; a cast ANSI has no rule for fails before any work."""
    data = pa.table(
        {
            "id": pa.array([1, 2], pa.int64()),
            "n": pa.array([10, 20], pa.int32()),
            "d": pa.array([None, None], pa.date32()),
        }
    )
    source_data = pa.table(
        {"id": pa.array([1, 3], pa.int64()), "txt": ["42", "7"], "day": ["2024-01-05", "2024-02-29"]}
    )
    ours, theirs = write_table(tmp_path / "ours", data), write_table(tmp_path / "theirs", data)
    source = write_table(tmp_path / "s", source_data)
    clauses = [
        clause("matched", "update", n="s.txt", d="s.day"),
        clause("notMatched", "insert", id="s.id", n="s.txt", d="s.day"),
    ]
    result = run_merge(spark, make_spec(ours, source, "t.id = s.id", clauses))
    assert oracle_merge(theirs, source_data, "t.id = s.id", clauses) == {
        k: result.result[k] for k in ("num_updated_rows", "num_deleted_rows", "num_inserted_rows")
    }
    assert rows(ours) == rows(theirs)

    bad = write_table(
        tmp_path / "bad", pa.table({"id": pa.array([2], pa.int64()), "txt": ["twenty"], "day": ["2024-01-05"]})
    )
    before = files_under(ours)
    with pytest.raises(DataCastError, match="CAST_INVALID_INPUT"):
        run_merge(spark, make_spec(ours, bad, "t.id = s.id", [clause("matched", "update", n="s.txt")]))
    assert DeltaTable(str(ours)).version() == 1 and files_under(ours) == before

    with pytest.raises(MergeResolutionError, match="cannot cast date to int"):
        run_merge(spark, make_spec(ours, bad, "t.id = s.id", [clause("matched", "update", n="to_date(s.day)")]))
    assert DeltaTable(str(ours)).version() == 1 and files_under(ours) == before


def test_update_all_without_evolution_needs_every_target_column(spark: SparkSession, tmp_path: Path) -> None:
    target = write_table(tmp_path / "t", TARGET)
    source = write_table(tmp_path / "s", SOURCE.drop_columns(["n"]))
    before = files_under(target)
    with pytest.raises(MergeResolutionError, match="UPDATE SET \\*"):
        run_merge(spark, make_spec(target, source, "t.id = s.id", UPSERT))
    unchanged(target, before)


def test_schema_evolution_adds_source_columns(spark: SparkSession, tmp_path: Path) -> None:
    target = write_table(tmp_path / "t", TARGET)
    wider = SOURCE.drop_columns(["n"]).append_column("extra", pa.array([True, False, None]))
    source = write_table(tmp_path / "s", wider)
    result = run_merge(spark, make_spec(target, source, "t.id = s.id", UPSERT, schema_evolution=True))
    assert result.table_version == 1
    table = DeltaTable(str(target))
    assert [f.name for f in table.schema().fields] == ["id", "v", "n", "extra"]
    assert rows(target) == [
        (1, "a", 10, None),
        (2, "B", 20, True),  # target-only columns keep their value on UPDATE *
        (3, "C", 30, False),
        (4, "d", None, None),
        (5, "E", None, None),  # ... and are NULL on INSERT *
    ]


def test_incompatible_schema_evolution_fails(spark: SparkSession, tmp_path: Path) -> None:
    target = write_table(tmp_path / "t", TARGET)
    source = write_table(tmp_path / "s", SOURCE.set_column(2, "n", pa.array([True, False, None])))
    before = files_under(target)
    with pytest.raises(SchemaMismatchError, match="Failed to merge incompatible data types bigint and boolean"):
        run_merge(spark, make_spec(target, source, "t.id = s.id", UPSERT, schema_evolution=True))
    unchanged(target, before)


def test_schema_evolution_keeps_a_number_column_for_strings_and_fails_on_one_that_is_no_number(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Delta merges the schemas with implicit conversions: the column stays INT and each string is cast as an
    assignment casts it, so a string that is no number fails the merge."""
    target = write_table(tmp_path / "t", TARGET)
    source = write_table(tmp_path / "s", SOURCE.set_column(2, "n", pa.array(["7", "x", None])))
    before = files_under(target)
    with pytest.raises(DataCastError, match="CAST_INVALID_INPUT"):
        run_merge(spark, make_spec(target, source, "t.id = s.id", UPSERT, schema_evolution=True))
    unchanged(target, before)


def test_dry_run_commits_nothing_and_leaves_nothing(spark: SparkSession, tmp_path: Path) -> None:
    target = write_table(tmp_path / "t", TARGET)
    source = write_table(tmp_path / "s", SOURCE)
    before = files_under(target)
    result = run_merge(spark, make_spec(target, source, "t.id = s.id", UPSERT), dry_run=True)
    assert result.table_version is None
    assert result.result["num_affected_rows"] == 3
    assert result.metrics["numTargetFilesAdded"] >= 1
    unchanged(target, before)


def test_an_applied_txn_is_not_applied_again(spark: SparkSession, tmp_path: Path) -> None:
    target = write_table(tmp_path / "t", TARGET)
    source = write_table(tmp_path / "s", SOURCE)
    txn = AppTransaction("merge-service-test", 7)
    first = run_merge(spark, make_spec(target, source, "t.id = s.id", UPSERT), txn=txn)
    assert first.table_version == 1 and not first.already_applied
    again = run_merge(spark, make_spec(target, source, "t.id = s.id", UPSERT), txn=txn)
    assert again.already_applied
    assert again.table_version == 1
    # The result is the committed merge's own, read back from its commit.
    assert again.result == first.result
    assert set(again.metrics) == set(ALL_METRICS)
    assert {k: again.metrics[k] for k in COMMIT_METRICS} == {k: first.metrics[k] for k in COMMIT_METRICS}
    assert DeltaTable(str(target)).version() == 1
    assert DeltaTable(str(target)).transaction_version("merge-service-test") == 7


def test_an_applied_txn_is_found_from_the_log_alone(spark: SparkSession, tmp_path: Path) -> None:
    """``find_applied`` answers what a retry's ``run_merge`` would, without Spark; a log cleaned past the commit
    still holds the txn (in its checkpoint) but no longer the version, which is then not guessed."""
    target = write_table(tmp_path / "t", TARGET)
    source = write_table(tmp_path / "s", SOURCE)
    spec = make_spec(target, source, "t.id = s.id", UPSERT)
    txn = AppTransaction("merge-service-test", 7)
    assert find_applied(spec, txn) is None
    first = run_merge(spark, spec, txn=txn)
    found = find_applied(spec, txn)
    assert found is not None and found.already_applied
    assert (found.table_version, found.result) == (first.table_version, first.result)
    assert found == run_merge(spark, spec, txn=txn)
    assert find_applied(spec, AppTransaction("merge-service-test", 8)) is None
    assert find_applied(spec, AppTransaction("another-app", 1)) is None
    recorded = find_applied(spec, txn, all_metrics=False)
    assert recorded is not None and set(recorded.metrics) < set(ALL_METRICS)
    assert {k: recorded.metrics[k] for k in COMMIT_METRICS} == {k: first.metrics[k] for k in COMMIT_METRICS}

    run_merge(spark, spec, txn=AppTransaction("merge-service-test", 8))
    DeltaTable(str(target)).create_checkpoint()
    for version in (0, 1):
        os.remove(os.path.join(target, "_delta_log", f"{version:020d}.json"))
    cleaned = find_applied(spec, txn)
    assert cleaned is not None and cleaned.already_applied and cleaned.table_version is None


def test_nothing_to_change_commits_nothing(spark: SparkSession, tmp_path: Path) -> None:
    target = write_table(tmp_path / "t", TARGET)
    source = write_table(
        tmp_path / "s", pa.table({"id": pa.array([42], pa.int64()), "v": ["x"], "n": pa.array([1], pa.int64())})
    )
    result = run_merge(spark, make_spec(target, source, "t.id = s.id", [clause("matched", "delete")]))
    assert result.table_version is None
    assert result.result["num_affected_rows"] == 0
    assert DeltaTable(str(target)).version() == 0


def test_sql_text_with_a_query_source(spark: SparkSession, tmp_path: Path) -> None:
    target = write_table(tmp_path / "t", TARGET)
    source = write_table(tmp_path / "s", SOURCE)
    spec = parse_merge_sql(
        f"MERGE INTO delta.`{target}` AS t USING (SELECT id, upper(v) AS v, n FROM delta.`{source}` WHERE id > 2) AS s "
        "ON t.id = s.id WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT *"
    )
    result = run_merge(spark, spec)
    assert result.result == {
        "num_affected_rows": 2,
        "num_updated_rows": 1,
        "num_deleted_rows": 0,
        "num_inserted_rows": 1,
    }
    assert rows(target, ["id", "v"]) == [(1, "a"), (2, "b"), (3, "C"), (4, "d"), (5, "E")]
    assert spark.catalog.listTables() == [] or all(
        not t.name.startswith("__merge_source") for t in spark.catalog.listTables()
    )


def test_inline_rows_source(spark: SparkSession, tmp_path: Path) -> None:
    target = write_table(tmp_path / "t", TARGET)
    rows_source = RowsSource([{"id": "3", "v": "q", "n": "7"}], "id BIGINT, v STRING, n BIGINT")
    spec = MergeSpec(
        target=str(target),
        source=rows_source,
        on="t.id = s.id",
        target_alias="t",
        source_alias="s",
        matched=(clause("matched", "update_all"),),
    )
    assert run_merge(spark, spec).result["num_updated_rows"] == 1
    assert (3, "q", 7) in rows(target)


@pytest.mark.parametrize(
    ("clauses", "error"),
    [
        ([clause("matched", "update", v="s.missing")], MergeResolutionError),
        ([clause("notMatchedBySource", "update", v="s.v")], MergeResolutionError),
        ([clause("matched", "delete"), clause("matched", "delete", "s.n > 1")], MergeSpecError),
        ([clause("matched", "update", "s.v", v="s.v")], MergeResolutionError),  # a condition must be boolean
    ],
)
def test_error_paths_leave_the_table(spark: SparkSession, tmp_path: Path, clauses: list, error: type) -> None:
    target = write_table(tmp_path / "t", TARGET)
    source = write_table(tmp_path / "s", SOURCE)
    before = files_under(target)
    with pytest.raises(error):
        run_merge(spark, make_spec(target, source, "t.id = s.id", clauses))
    unchanged(target, before)


def two_file_table(path: Path, partition_by: list[str] | None = None) -> Path:
    from deltalake import write_deltalake

    write_deltalake(
        str(path), pa.table({"id": pa.array([1, 2, 3], pa.int64()), "p": ["a", "a", "a"]}), partition_by=partition_by
    )
    write_deltalake(
        str(path),
        pa.table({"id": pa.array([10, 11, 12], pa.int64()), "p": ["b", "b", "b"]}),
        mode="append",
        partition_by=partition_by,
    )
    return path


@pytest.mark.parametrize("source_kind", ["delta", "rows"])
def test_source_key_range_skips_files(spark: SparkSession, tmp_path: Path, source_kind: str) -> None:
    target = two_file_table(tmp_path / "t")
    data = [{"id": 11, "p": "z"}, {"id": 13, "p": "z"}]
    if source_kind == "delta":
        source_path = write_table(tmp_path / "s", pa.table({"id": pa.array([11, 13], pa.int64()), "p": ["z", "z"]}))
        spec = make_spec(target, source_path, "t.id = s.id", UPSERT)
    else:
        spec = MergeSpec(
            target=str(target),
            source=RowsSource(data, "id BIGINT, p STRING"),
            on="t.id = s.id",
            target_alias="t",
            source_alias="s",
            matched=(clause("matched", "update_all"),),
            not_matched=(clause("notMatched", "insert_all"),),
        )
    result = run_merge(spark, spec)
    assert result.metrics["numTargetFilesBeforeSkipping"] == 2
    assert result.metrics["numTargetFilesAfterSkipping"] == 1
    assert result.result["num_updated_rows"] == 1 and result.result["num_inserted_rows"] == 1
    assert sorted(rows(target)) == [(1, "a"), (2, "a"), (3, "a"), (10, "b"), (11, "z"), (12, "b"), (13, "z")]


def test_partition_key_values_skip_partitions(spark: SparkSession, tmp_path: Path) -> None:
    target = two_file_table(tmp_path / "t", partition_by=["p"])
    spec = MergeSpec(
        target=str(target),
        source=RowsSource([{"id": 2, "p": "a"}], "id BIGINT, p STRING"),
        on="t.p = s.p AND t.id = s.id",
        target_alias="t",
        source_alias="s",
        matched=(clause("matched", "delete"),),
    )
    result = run_merge(spark, spec)
    assert result.metrics["numTargetFilesAfterSkipping"] == 1
    assert result.metrics["numTargetPartitionsAfterSkipping"] == 1
    assert sorted(r[0] for r in rows(target, ["id"])) == [1, 3, 10, 11, 12]


def test_keys_of_another_type_do_not_skip_wrongly(spark: SparkSession, tmp_path: Path) -> None:
    from deltalake import write_deltalake

    target = tmp_path / "t"
    write_deltalake(str(target), pa.table({"k": ["10", "2"]}))
    write_deltalake(str(target), pa.table({"k": ["9"]}), mode="append")
    spec = MergeSpec(
        target=str(target),
        source=RowsSource([{"k": 9}, {"k": 10}], "k BIGINT"),
        on="t.k = s.k",
        target_alias="t",
        source_alias="s",
        matched=(clause("matched", "delete"),),
    )
    assert run_merge(spark, spec).result["num_deleted_rows"] == 2
    assert rows(target) == [("2",)]


def test_partitioned_delta_source(spark: SparkSession, tmp_path: Path) -> None:
    target = write_table(tmp_path / "t", TARGET)
    source = write_table(tmp_path / "s", SOURCE.append_column("p", pa.array(["x", "y", None])), partition_by=["p"])
    clauses = [
        clause("matched", "update", v="concat(s.v, s.p)"),
        clause("notMatched", "insert", id="s.id", v="coalesce(s.p, '-')"),
    ]
    spec = make_spec(target, source, "t.id = s.id", clauses)
    result = run_merge(spark, spec)
    assert result.result["num_updated_rows"] == 2 and result.result["num_inserted_rows"] == 1
    assert rows(target, ["id", "v"]) == [(1, "a"), (2, "Bx"), (3, "Cy"), (4, "d"), (5, "-")]


CONSTRAINED = pa.table({"id": pa.array([1, 2, 3, 4], pa.int64()), "amount": pa.array([10, 20, 30, 40], pa.int64())})


def _constrained(path: Path, configuration: dict[str, str] | None = None) -> Path:
    write_table(path, CONSTRAINED, configuration=configuration)
    DeltaTable(str(path)).alter.add_constraint({"amount_pos": "amount > 0"})
    return path


@pytest.mark.parametrize("plan", ["source_keys", "single_pass"])
def test_check_constraints_hold_as_in_deltalake(spark: SparkSession, tmp_path: Path, plan: FindPlan) -> None:
    ours = _constrained(tmp_path / "ours")
    theirs = _constrained(tmp_path / "theirs")
    source_data = pa.table({"id": pa.array([2, 5], pa.int64()), "amount": pa.array([7, 8], pa.int64())})
    source = write_table(tmp_path / "s", source_data)
    with find_plan(plan):
        result = run_merge(spark, make_spec(ours, source, "t.id = s.id", UPSERT))
    assert result.result == {**oracle_merge(theirs, source_data, "t.id = s.id", UPSERT), "num_affected_rows": 2}
    assert rows(ours) == rows(theirs)


@pytest.mark.parametrize(
    ("clauses", "values"),
    [
        ([clause("matched", "update", amount="t.amount - 25")], " - amount : -5"),
        ([clause("notMatched", "insert", id="s.id", amount="CAST(NULL AS BIGINT)")], " - amount : null"),
        ([clause("notMatchedBySource", "update", "t.id = 4", amount="0")], " - amount : 0"),
    ],
)
@pytest.mark.parametrize("cdf", [False, True])
def test_a_broken_check_constraint_fails_the_merge(
    spark: SparkSession, tmp_path: Path, clauses: list, values: str, cdf: bool
) -> None:
    configuration = {"delta.enableChangeDataFeed": "true"} if cdf else None
    target = _constrained(tmp_path / "t", configuration)
    source = write_table(
        tmp_path / "s", pa.table({"id": pa.array([2, 5], pa.int64()), "amount": pa.array([7, 8], pa.int64())})
    )
    before = files_under(target)
    version = DeltaTable(str(target)).version()
    with pytest.raises(InvariantViolationError) as raised:
        run_merge(spark, make_spec(target, source, "t.id = s.id", clauses))
    assert str(raised.value).startswith(
        "[DELTA_VIOLATE_CONSTRAINT_WITH_VALUES] CHECK constraint amount_pos (amount > 0) violated by row with values:"
    )
    assert values in str(raised.value)
    assert DeltaTable(str(target)).version() == version and files_under(target) == before
    assert rows(target) == [(1, 10), (2, 20), (3, 30), (4, 40)]


def test_a_table_that_allows_deletion_vectors_is_merged_by_rewriting_files(spark: SparkSession, tmp_path: Path) -> None:
    """delta.enableDeletionVectors lets writers mark rows deleted; rewriting files instead (``deletion_vectors``
    off) is what Delta's protocol allows any writer, and deltalake does the same."""
    dv = {"delta.enableDeletionVectors": "true"}
    ours = write_table(tmp_path / "ours", TARGET, configuration=dv)
    theirs = write_table(tmp_path / "theirs", TARGET, configuration=dv)
    source = write_table(tmp_path / "s", SOURCE)
    clauses = [clause("matched", "delete", "s.n IS NULL"), *UPSERT]
    result = run_merge(spark, make_spec(ours, source, "t.id = s.id", clauses, deletion_vectors="off"))
    expected = oracle_merge(theirs, SOURCE, "t.id = s.id", clauses)
    assert {k: result.result[k] for k in expected} == expected

    def live_rows(path: Path) -> list[tuple]:
        # deltalake's readers refuse the deletionVectors reader feature; its log replay does not.
        table = pa.concat_tables([pq.read_table(uri) for uri in DeltaTable(str(path)).file_uris()])
        return sorted(zip(*[table.column(n).to_pylist() for n in ("id", "v", "n")], strict=True))

    assert live_rows(ours) == live_rows(theirs) == [(1, "a", 10), (2, "B", 200), (4, "d", None), (5, "E", 500)]
    log = (ours / "_delta_log" / "00000000000000000001.json").read_text()
    assert '"remove"' in log and "deletionVector" not in log


INNER = pa.struct([("x", pa.int32()), ("y", pa.string())])
NESTED = pa.struct([("a", pa.int64()), ("b", pa.int64()), ("inner", INNER)])


def _nested_target(path: Path, configuration: dict[str, str] | None = None) -> Path:
    return write_table(
        path,
        pa.table(
            {
                "id": pa.array([1, 2], pa.int64()),
                "s": pa.array(
                    [{"a": 1, "b": 10, "inner": {"x": 1, "y": "p"}}, {"a": 2, "b": 20, "inner": None}], NESTED
                ),
                "arr": pa.array(
                    [[{"p": 1, "q": 2}], None], pa.list_(pa.struct([("p", pa.int64()), ("q", pa.int64())]))
                ),
            }
        ),
        configuration=configuration,
    )


def test_structs_are_assigned_by_field_name_as_delta_does(spark: SparkSession, tmp_path: Path) -> None:
    """A positional cast would swap a and b (same types): Delta pairs struct fields by name, at any depth."""
    reordered = pa.struct(
        [("inner", pa.struct([("y", pa.string()), ("x", pa.int32())])), ("b", pa.int64()), ("a", pa.int64())]
    )
    source_data = pa.table(
        {
            "arr": pa.array(
                [[{"q": 20, "p": 10}], [{"q": 30, "p": 3}, None]],
                pa.list_(pa.struct([("q", pa.int64()), ("p", pa.int64())])),
            ),
            "s": pa.array(
                [{"inner": {"y": "new", "x": 7}, "b": 200, "a": 2}, {"inner": None, "b": 300, "a": 3}], reordered
            ),
            "id": pa.array([2, 3], pa.int64()),
        }
    )
    source = write_table(tmp_path / "s", source_data)
    ours = _nested_target(tmp_path / "ours")
    result = run_merge(spark, make_spec(ours, source, "t.id = s.id", UPSERT))
    assert result.result["num_updated_rows"] == 1 and result.result["num_inserted_rows"] == 1
    assert DeltaTable(str(ours)).to_pyarrow_table().sort_by("id").to_pylist() == [
        {"id": 1, "s": {"a": 1, "b": 10, "inner": {"x": 1, "y": "p"}}, "arr": [{"p": 1, "q": 2}]},
        {"id": 2, "s": {"a": 2, "b": 200, "inner": {"x": 7, "y": "new"}}, "arr": [{"p": 10, "q": 20}]},
        {"id": 3, "s": {"a": 3, "b": 300, "inner": None}, "arr": [{"p": 3, "q": 30}, None]},
    ]
    # deltalake pairs them by name as well.
    theirs = _nested_target(tmp_path / "theirs")
    oracle_merge(theirs, source_data.select(["id", "s"]), "t.id = s.id", [clause("matched", "update", s="s.s")])
    explicit = _nested_target(tmp_path / "explicit")
    run_merge(spark, make_spec(explicit, source, "t.id = s.id", [clause("matched", "update", s="s.s")]))
    assert rows(explicit, ["id", "s"]) == rows(theirs, ["id", "s"])


@pytest.mark.parametrize("evolution", [False, True])
def test_struct_fields_must_match_by_name(spark: SparkSession, tmp_path: Path, evolution: bool) -> None:
    target = _nested_target(tmp_path / "t")
    before = files_under(target)
    lacking = pa.struct([("b", pa.int64()), ("a", pa.int64())])
    source = write_table(
        tmp_path / "lacking", pa.table({"id": pa.array([2], pa.int64()), "s": pa.array([{"b": 5, "a": 6}], lacking)})
    )
    update = [clause("matched", "update", s="s.s")]
    if evolution:
        # A field the source lacks is NULL under schema evolution.
        run_merge(spark, make_spec(target, source, "t.id = s.id", update, schema_evolution=True))
        assert DeltaTable(str(target)).to_pyarrow_table().sort_by("id").column("s").to_pylist()[1] == {
            "a": 6,
            "b": 5,
            "inner": None,
        }
    else:
        with pytest.raises(MergeResolutionError, match="All nested columns must match"):
            run_merge(spark, make_spec(target, source, "t.id = s.id", update))
        unchanged(target, before)
    extra = pa.struct([("a", pa.int64()), ("b", pa.int64()), ("inner", INNER), ("c", pa.int64())])
    source = write_table(
        tmp_path / "extra",
        pa.table({"id": pa.array([2], pa.int64()), "s": pa.array([{"a": 1, "b": 2, "inner": None, "c": 3}], extra)}),
    )
    version = DeltaTable(str(target)).version()
    # Without schema evolution a field the table lacks fails the merge; it is never dropped. (With it, the field
    # is added: test_schema_evolution_adds_nested_fields.)
    with pytest.raises(MergeResolutionError, match="All nested columns must match"):
        run_merge(spark, make_spec(target, source, "t.id = s.id", update))
    assert DeltaTable(str(target)).version() == version


@pytest.mark.parametrize("cdf", [False, True])
def test_schema_evolution_adds_nested_fields(spark: SparkSession, tmp_path: Path, cdf: bool) -> None:
    """Delta's schema evolution appends the source's new struct fields, at any depth and inside arrays; rows
    that keep their value get NULL there."""
    target = _nested_target(tmp_path / "t", configuration={"delta.enableChangeDataFeed": "true"} if cdf else None)
    wider = pa.struct(
        [
            ("b", pa.int64()),
            ("inner", pa.struct([("z", pa.bool_()), ("x", pa.int32())])),
            ("a", pa.int64()),
            ("c", pa.string()),
        ]
    )
    source = write_table(
        tmp_path / "s",
        pa.table(
            {
                "id": pa.array([2, 3], pa.int64()),
                "s": pa.array([{"b": 200, "inner": {"z": True, "x": 7}, "a": 2, "c": "new"}, None], wider),
                "arr": pa.array(
                    [[{"q": 20, "p": 10, "r": "x"}], []],
                    pa.list_(pa.struct([("q", pa.int64()), ("p", pa.int64()), ("r", pa.string())])),
                ),
            }
        ),
    )
    result = run_merge(spark, make_spec(target, source, "t.id = s.id", UPSERT, schema_evolution=True))
    assert (result.result["num_updated_rows"], result.result["num_inserted_rows"]) == (1, 1)
    table = DeltaTable(str(target))
    assert load_snapshot(str(target)).spark_schema.simpleString() == (
        "struct<id:bigint,s:struct<a:bigint,b:bigint,inner:struct<x:int,y:string,z:boolean>,c:string>,"
        "arr:array<struct<p:bigint,q:bigint,r:string>>>"
    )
    assert table.to_pyarrow_table().sort_by("id").to_pylist() == [
        {
            "id": 1,
            "s": {"a": 1, "b": 10, "inner": {"x": 1, "y": "p", "z": None}, "c": None},
            "arr": [{"p": 1, "q": 2, "r": None}],
        },
        {
            "id": 2,
            "s": {"a": 2, "b": 200, "inner": {"x": 7, "y": None, "z": True}, "c": "new"},
            "arr": [{"p": 10, "q": 20, "r": "x"}],
        },
        {"id": 3, "s": None, "arr": []},
    ]


def test_update_set_assigns_fields_inside_structs(spark: SparkSession, tmp_path: Path) -> None:
    """Delta's nested assignment: the struct is rebuilt with the named fields set and the others kept, also for a
    NULL struct; values are cast to the field's type under ANSI store assignment."""
    target = _nested_target(tmp_path / "t")
    source = write_table(
        tmp_path / "s", pa.table({"id": pa.array([1, 2], pa.int64()), "v": pa.array([5, 6], pa.int32())})
    )
    run_merge(
        spark,
        make_spec(
            target,
            source,
            "t.id = s.id",
            [
                clause("matched", "update", "s.id = 1", **{"t.s.b": "s.v", "s.inner.y": "'q'"}),
                clause("matched", "update", **{"s.inner.x": "s.v * 10"}),
            ],
        ),
    )
    assert DeltaTable(str(target)).to_pyarrow_table().sort_by("id").column("s").to_pylist() == [
        {"a": 1, "b": 5, "inner": {"x": 1, "y": "q"}},
        {"a": 2, "b": 20, "inner": {"x": 60, "y": None}},
    ]


@pytest.mark.parametrize(
    ("assign", "error", "message"),
    [
        ({"s.zz": "1"}, MergeResolutionError, "has no field `zz`"),
        ({"id.x": "1"}, MergeResolutionError, "has no field `x`"),
        ({"s.a": "'text'"}, DataCastError, "CAST_INVALID_INPUT"),
        ({"s.a": "current_date()"}, MergeResolutionError, "cannot cast date to bigint"),
        ({"s": "t.s", "s.a": "1"}, MergeSpecError, "conflict from these SET columns"),
    ],
)
def test_nested_assignments_that_cannot_hold(
    spark: SparkSession, tmp_path: Path, assign: dict, error: type, message: str
) -> None:
    target = _nested_target(tmp_path / "t")
    source = write_table(tmp_path / "s", pa.table({"id": pa.array([1], pa.int64())}))
    before = files_under(target)
    with pytest.raises(error, match=message):
        run_merge(spark, make_spec(target, source, "t.id = s.id", [clause("matched", "update", **assign)]))
    unchanged(target, before)
    with pytest.raises(MergeSpecError, match="Nested field is not supported in the INSERT clause"):
        run_merge(
            spark, make_spec(target, source, "t.id = s.id", [clause("notMatched", "insert", id="s.id", **{"s.a": "1"})])
        )


def _generated_table(path: Path) -> Path:
    """deltalake's table with a generated column: v2 is always v * 2."""
    from deltalake.schema import Field, PrimitiveType, Schema

    DeltaTable.create(
        str(path),
        Schema(
            [
                Field("id", PrimitiveType("long")),
                Field("v", PrimitiveType("long")),
                Field("v2", PrimitiveType("long"), metadata={"delta.generationExpression": "v * 2"}),
            ]
        ),
    )
    write_deltalake(
        str(path), pa.table({"id": pa.array([1, 2], pa.int64()), "v": pa.array([10, 20], pa.int64())}), mode="append"
    )
    return path


def test_generated_columns_are_computed_and_checked(spark: SparkSession, tmp_path: Path) -> None:
    """A clause that gives a generated column no value computes it from the row's new values (UPDATE SET * and
    INSERT * too, the source lacking it, under schema evolution: without it Delta refuses a star clause whose
    source lacks a column, a generated one included); a value given must equal the expression."""
    target = _generated_table(tmp_path / "t")
    source = write_table(
        tmp_path / "s", pa.table({"id": pa.array([2, 3], pa.int64()), "v": pa.array([7, 8], pa.int64())})
    )
    for star in UPSERT:
        with pytest.raises(MergeResolutionError, match=r"cannot resolve `t`.`v2` in (UPDATE|INSERT) clause"):
            run_merge(spark, make_spec(target, source, "t.id = s.id", [star]))
    assert DeltaTable(str(target)).version() == 1
    run_merge(spark, make_spec(target, source, "t.id = s.id", UPSERT, schema_evolution=True))
    assert rows(target) == [(1, 10, 20), (2, 7, 14), (3, 8, 16)]
    run_merge(spark, make_spec(target, source, "t.id = s.id", [clause("matched", "update", v="s.v + t.v")]))
    assert rows(target) == [(1, 10, 20), (2, 14, 28), (3, 16, 32)]
    # deltalake checks the expression on its own writes to the table: it reads and appends as before.
    write_deltalake(
        str(target), pa.table({"id": pa.array([4], pa.int64()), "v": pa.array([1], pa.int64())}), mode="append"
    )
    assert (4, 1, 2) in rows(target)

    new_key = write_table(tmp_path / "n", pa.table({"id": pa.array([5], pa.int64()), "v": pa.array([3], pa.int64())}))
    version = DeltaTable(str(target)).version()
    with pytest.raises(InvariantViolationError, match=r"CHECK constraint Generated Column \(v2 <=> \(v \* 2\)\)"):
        run_merge(
            spark,
            make_spec(target, new_key, "t.id = s.id", [clause("notMatched", "insert", id="s.id", v="s.v", v2="s.v")]),
        )
    assert DeltaTable(str(target)).version() == version
    run_merge(
        spark,
        make_spec(target, new_key, "t.id = s.id", [clause("notMatched", "insert", id="s.id", v="s.v", v2="s.v * 2")]),
    )
    assert (5, 3, 6) in rows(target)


def test_struct_fields_with_any_name_are_paired(spark: SparkSession, tmp_path: Path) -> None:
    person = pa.struct([("first name", pa.string()), ("age", pa.int32())])
    target = write_table(
        tmp_path / "t",
        pa.table({"id": pa.array([1], pa.int64()), "p": pa.array([{"first name": "Ann", "age": 30}], person)}),
    )
    source = write_table(
        tmp_path / "s",
        pa.table(
            {
                "id": pa.array([1], pa.int64()),
                "p": pa.array(
                    [{"age": 31, "first name": "Ann B"}], pa.struct([("age", pa.int64()), ("first name", pa.string())])
                ),
            }
        ),
    )
    run_merge(spark, make_spec(target, source, "t.id = s.id", [clause("matched", "update_all")]))
    assert rows(target) == [(1, {"first name": "Ann B", "age": 31})]


def test_insert_fills_in_column_defaults(spark: SparkSession, tmp_path: Path) -> None:
    """allowColumnDefaults (a table Delta on Spark makes with DEFAULT): an INSERT that names no value for a column
    gives it the column's default; an UPDATE keeps the row's value; a value given wins."""
    from tests.engine.delta.util import write_log_entry

    target = tmp_path / "t"
    fields = [
        {"name": "id", "type": "long", "nullable": True, "metadata": {}},
        {
            "name": "status",
            "type": "string",
            "nullable": True,
            "metadata": {"CURRENT_DEFAULT": "'new'", "EXISTS_DEFAULT": "'new'"},
        },
        {"name": "n", "type": "integer", "nullable": True, "metadata": {"CURRENT_DEFAULT": "1 + 1"}},
    ]
    write_log_entry(
        target,
        0,
        [
            {"protocol": {"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": ["allowColumnDefaults"]}},
            {
                "metaData": {
                    "id": "d0d0d0d0-0000-4000-8000-000000000000",
                    "format": {"provider": "parquet", "options": {}},
                    "schemaString": json.dumps({"type": "struct", "fields": fields}),
                    "partitionColumns": [],
                    "configuration": {},
                    "createdTime": 0,
                }
            },
        ],
    )
    source = write_table(tmp_path / "s", pa.table({"id": pa.array([1, 2], pa.int64()), "n": pa.array([5, 6])}))
    run_merge(
        spark,
        make_spec(
            target,
            source,
            "t.id = s.id",
            [
                clause("notMatched", "insert", "s.id = 1", id="s.id"),
                clause("notMatched", "insert", id="s.id", status="'given'"),
            ],
        ),
    )
    assert rows(target) == [(1, "new", 2), (2, "given", 2)]
    run_merge(spark, make_spec(target, source, "t.id = s.id", [clause("matched", "update", n="s.n")]))
    assert rows(target) == [(1, "new", 5), (2, "given", 6)]
    # The DEFAULT keyword in an assignment is the column's default (NULL for a column without one).
    more = write_table(tmp_path / "more", pa.table({"id": pa.array([2, 3], pa.int64())}))
    run_merge(
        spark,
        parse_merge_sql(
            f"MERGE INTO delta.`{target}` t USING delta.`{more}` s ON t.id = s.id "
            "WHEN MATCHED THEN UPDATE SET status = DEFAULT, n = default "
            "WHEN NOT MATCHED THEN INSERT (id, status, n) VALUES (s.id, 'x', DEFAULT)"
        ),
    )
    assert rows(target) == [(1, "new", 5), (2, "new", 2), (3, "x", 2)]


def test_decimal_keys_whose_bounds_were_logged_through_doubles(spark: SparkSession, tmp_path: Path) -> None:
    """delta-rs logs decimal bounds as doubles (below the true maximum here): neither the target's file
    skipping nor the source's key range may trust them, or the matching row is missed and a duplicate key
    inserted."""
    key = Decimal("123456789012.3456789012")
    decimal_type = pa.decimal128(38, 10)
    target = tmp_path / "t"
    for keys in ([Decimal("1"), key], [Decimal("-3")]):
        write_deltalake(
            str(target), pa.table({"k": pa.array(keys, decimal_type), "v": pa.array([0] * len(keys))}), mode="append"
        )
    inline = MergeSpec(
        target=str(target),
        source=RowsSource([{"k": str(key), "v": 2}], "k DECIMAL(38,10), v BIGINT"),
        on="t.k = s.k",
        matched=(clause("matched", "update_all"),),
        not_matched=(clause("notMatched", "insert_all"),),
        target_alias="t",
        source_alias="s",
    )
    result = run_merge(spark, inline)
    assert (result.result["num_updated_rows"], result.result["num_inserted_rows"]) == (1, 0)
    source = tmp_path / "s"
    write_deltalake(str(source), pa.table({"k": pa.array([key], decimal_type), "v": pa.array([3])}))
    result = run_merge(spark, make_spec(target, source, "t.k = s.k", UPSERT))
    assert (result.result["num_updated_rows"], result.result["num_inserted_rows"]) == (1, 0)
    assert sorted(rows(target)) == [(Decimal("-3.0000000000"), 0), (Decimal("1.0000000000"), 0), (key, 3)]


@pytest.mark.parametrize("partitioned", [False, True], ids=["flat", "partitioned"])
def test_timestamp_keys_do_not_depend_on_the_host_time_zone(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, partitioned: bool
) -> None:
    """Spark Connect hands TIMESTAMP values to Python as naive local times: the source's key range must not
    shift with the time zone of the process that runs the merge."""
    import datetime as dt
    import time

    stamps = [dt.datetime(2024, 1, 1, h, tzinfo=dt.UTC) for h in (0, 12)]
    target = tmp_path / "t"
    for stamp in stamps:
        write_deltalake(
            str(target),
            pa.table({"ts": pa.array([stamp], pa.timestamp("us", tz="UTC")), "v": pa.array([0])}),
            mode="append",
            partition_by=["ts"] if partitioned else None,
        )
    source = write_table(
        tmp_path / "s", pa.table({"ts": pa.array(stamps, pa.timestamp("us", tz="UTC")), "v": pa.array([1, 2])})
    )
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        result = run_merge(spark, make_spec(target, source, "t.ts = s.ts", UPSERT))
    finally:
        monkeypatch.undo()
        time.tzset()
    assert (result.result["num_updated_rows"], result.result["num_inserted_rows"]) == (2, 0)
    assert result.metrics["numTargetFilesAfterSkipping"] == 2


def test_empty_inline_rows_with_a_schema(spark: SparkSession, tmp_path: Path) -> None:
    """No rows is a source like any other: an upsert changes nothing and commits nothing, and NOT MATCHED BY
    SOURCE clauses still apply to every target row."""
    target = write_table(tmp_path / "t", TARGET)
    empty = RowsSource([], "id BIGINT, v STRING, n BIGINT")

    def spec(*clauses: Any) -> MergeSpec:
        return MergeSpec(
            target=str(target),
            source=empty,
            on="t.id = s.id",
            target_alias="t",
            source_alias="s",
            matched=tuple(c for c in clauses if c.clause_type == "matched"),
            not_matched=tuple(c for c in clauses if c.clause_type == "notMatched"),
            not_matched_by_source=tuple(c for c in clauses if c.clause_type == "notMatchedBySource"),
        )

    result = run_merge(spark, spec(*UPSERT))
    assert result.table_version is None and result.result["num_affected_rows"] == 0
    assert result.metrics["numSourceRows"] == 0
    result = run_merge(
        spark,
        spec(clause("notMatchedBySource", "delete", "t.id > 2"), clause("notMatchedBySource", "update", v="'gone'")),
    )
    assert result.table_version == 1
    assert (result.result["num_deleted_rows"], result.result["num_updated_rows"]) == (
        sum(1 for i in TARGET.column("id").to_pylist() if i > 2),
        sum(1 for i in TARGET.column("id").to_pylist() if i <= 2),
    )
    assert {r[1] for r in rows(target)} == {"gone"}
