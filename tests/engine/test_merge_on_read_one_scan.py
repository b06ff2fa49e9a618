"""Merge-on-read finds the touched files in its write's own join where every match touches its file: one scan of
the candidate files instead of findTouchedFiles' and writeAllChanges'. The same merge through both passes gives
the same table, result row, metrics and change rows, reading the target's files twice."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake
from pyspark.sql import DataFrame, SparkSession

from engine import deletion_vector_output, merge_on_read, run_merge, source_key_filter
from engine.context import MergeContext
from engine.delta import AddFile, load_snapshot
from engine.errors import MultipleMatchError
from engine.merge_condition import KeyedOn
from engine.merge_on_read import MergeOnReadExecutor
from engine.result import MergeResult
from engine.spec import MergeClause
from tests.engine.delta.dv_tables import enable_deletion_vectors, read_with_deltalake
from tests.engine.harness import clause, join_plan, make_spec, stray_files, write_table
from tests.engine.test_round_trips import counting_round_trips
from tests.engine.test_single_pass import PLAN_DEPENDENT

SIZES = {*PLAN_DEPENDENT, "numTargetChangeFileBytes"}
"""What the plan may change: how the written rows are split into files (so their sizes), and where the time went."""

UPSERT = [clause("matched", "update_all"), clause("notMatched", "insert_all")]

KEYS_ON = "t.id = s.id"
MIXED_ON = "t.id = s.id AND t.n <= s.n"
"""An ON that is not key equalities alone: a broadcast plan would find the unmatched source rows by reading the
candidate files again, so such a merge takes the two passes."""

CASES: dict[str, list[MergeClause]] = {
    "upsert": UPSERT,
    "update_only": [clause("matched", "update", v="concat(t.v, s.v)")],
    "conditional": [
        clause("matched", "delete", "s.n % 3 = 0"),
        clause("matched", "update", "t.n % 2 = 0", v="concat(t.v, s.v)"),
        clause("notMatched", "insert", "s.n % 5 <> 0", id="s.id", v="'new'", n="s.n"),
    ],
    "delete_and_insert": [clause("matched", "delete", "s.n % 4 = 0"), clause("notMatched", "insert_all")],
}
"""Merges every match of which touches its file (an unconditional WHEN MATCHED clause, or WHEN NOT MATCHED ones)."""


def _rows(ids: list[int], tag: str) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"{tag}{i}" for i in ids], "n": pa.array(ids, pa.int64())})


def _target(path: Path, *, cdf: bool) -> Path:
    """Four files of 100 rows (the even ids 0-798), deletion vectors enabled."""
    config = {"delta.enableChangeDataFeed": "true"} if cdf else None
    for start in range(0, 800, 200):
        write_deltalake(str(path), _rows(list(range(start, start + 200, 2)), "t"), mode="append", configuration=config)
    enable_deletion_vectors(path)
    return path


def _merge(
    monkeypatch: pytest.MonkeyPatch,
    spark: SparkSession,
    target: Path,
    source: Path,
    clauses: list[MergeClause],
    *,
    one_scan: bool,
    on: str = KEYS_ON,
) -> tuple[MergeResult, list[int]]:
    """The merge, and the number of target files each of its scans of the target read; without ``one_scan``
    through findTouchedFiles first."""
    scans: list[int] = []
    real = MergeContext.target_df

    def counted(self: MergeContext, files: Sequence[AddFile], **kwargs: Any) -> DataFrame:
        scans.append(len(files))
        return real(self, files, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(MergeContext, "target_df", counted)
        if not one_scan:
            patched.setattr(MergeOnReadExecutor, "takes_one_scan", lambda self: False)
        result = run_merge(spark, make_spec(target, source, on, clauses))
    return result, scans


@pytest.mark.parametrize(
    ("name", "join", "cdf", "on"),
    [
        *[
            (name, join, cdf, KEYS_ON)
            for name in CASES
            for join in ("key-values", "broadcast", "shuffle")
            for cdf in (False, True)
        ],
        *[(name, "broadcast", False, MIXED_ON) for name in ("upsert", "conditional")],
    ],
    ids=lambda v: {False: "plain", True: "cdf", MIXED_ON: "mixed-on", KEYS_ON: "keys"}.get(v, v),
)
def test_one_scan_equals_two_passes(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, join: str, cdf: bool, on: str
) -> None:
    """``key-values``: the source's keys keep the target rows they may match before the join (a source this small
    always takes that plan); ``broadcast`` and ``shuffle``: the join plans of a larger source (one that would be
    broadcast whole sends only its keys where ON is key equalities, and is broadcast whole otherwise)."""
    clauses = CASES[name]
    # Keys in two of the four files (matching where even), and new ones.
    source = write_table(tmp_path / "source", _rows([*range(10, 60, 3), *range(410, 430), 1000, 1001, 1002], "s"))
    filtered: list[KeyedOn] = []
    real_filter = merge_on_read.keep_rows_of_source_keys

    def recorded(ctx: MergeContext, target: DataFrame, keyed: KeyedOn) -> DataFrame:
        filtered.append(keyed)
        return real_filter(ctx, target, keyed)

    monkeypatch.setattr(merge_on_read, "keep_rows_of_source_keys", recorded)
    if join != "key-values":
        monkeypatch.setattr(source_key_filter, "SOURCE_KEY_FILTER_MAX_ROWS", -1)
    results = {}
    for one_scan in (True, False):
        target = _target(tmp_path / f"target-{one_scan}", cdf=cdf)
        with join_plan(broadcast=join != "shuffle"):  # type: ignore[arg-type]
            results[one_scan] = _merge(monkeypatch, spark, target, source, clauses, one_scan=one_scan, on=on)
    # Only the one scan holds no unmatched target row, and only ON's key equalities filter by the source's keys.
    assert len(filtered) == (1 if join != "shuffle" and on == KEYS_ON else 0)
    (one, one_scans), (two, two_scans) = results[True], results[False]
    assert one.result == two.result
    assert {k: v for k, v in one.metrics.items() if k not in SIZES} == {
        k: v for k, v in two.metrics.items() if k not in SIZES
    }
    assert one.metrics["numTargetDeletionVectorsAdded"] == 2
    if on == KEYS_ON:
        assert one_scans == [4]  # the candidate files, once
        assert two_scans == [4, 2]  # findTouchedFiles' scan of the candidates, writeAllChanges' of the touched files
    else:  # the two passes, the touched files read again for the unmatched source rows
        assert one_scans == two_scans == [4, 2, 2]
    once, twice = tmp_path / "target-True", tmp_path / "target-False"
    assert read_with_deltalake(once).to_pylist() == read_with_deltalake(twice).to_pylist()
    vectors = _files_with_vectors(once)
    assert vectors == _files_with_vectors(twice) == [0, 400]
    if cdf:
        version = load_snapshot(once).version
        assert _change_rows(once, version) == _change_rows(twice, version)
    assert stray_files(once) == set()


def _files_with_vectors(path: Path) -> list[int]:
    """The target files given a deletion vector, by their first id (file names differ between copies)."""
    snapshot = load_snapshot(path)
    return sorted(f.stats.min_values["id"] for f in snapshot.files if f.deletion_vector is not None and f.stats)


def _change_rows(path: Path, version: int) -> list[tuple[Any, ...]]:
    """The change rows of the commit at ``version``: its ``cdc`` files, as the log names them."""
    log = (path / "_delta_log" / f"{version:020d}.json").read_text()
    names = [json.loads(line)["cdc"]["path"] for line in log.splitlines() if '"cdc"' in line]
    assert names, "a Change Data Feed merge that changes rows writes change files"
    rows = [tuple(r.values()) for name in names for r in pq.read_table(path / name).to_pylist()]
    return sorted(rows, key=str)


def test_several_matches_fail_in_one_scan_and_leave_the_table(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    target = _target(tmp_path / "target", cdf=False)
    before = read_with_deltalake(target).to_pylist()
    version = load_snapshot(target).version
    source = write_table(tmp_path / "source", _rows([6, 6, 250, 1000], "s"))
    with pytest.raises(MultipleMatchError, match=r"id=6"):
        _merge(monkeypatch, spark, target, source, UPSERT, one_scan=True)
    assert load_snapshot(target).version == version
    assert read_with_deltalake(target).to_pylist() == before
    assert stray_files(target) == set()


def test_no_touched_file_writes_only_the_inserts(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    target = _target(tmp_path / "target", cdf=False)
    source = write_table(tmp_path / "source", _rows([151, 153], "s"))  # in the first file's range, not in it
    result, _ = _merge(monkeypatch, spark, target, source, UPSERT, one_scan=True)
    assert result.result == {
        "num_affected_rows": 2,
        "num_updated_rows": 0,
        "num_deleted_rows": 0,
        "num_inserted_rows": 2,
    }
    assert result.metrics["numTargetFilesRemoved"] == 0 and result.metrics["numTargetDeletionVectorsAdded"] == 0
    assert result.metrics["numSourceRows"] == 2 and result.metrics["numTargetFilesAfterSkipping"] == 1
    assert len(read_with_deltalake(target)) == 402
    assert stray_files(target) == set()  # the write that found no touched file is gone


def test_an_unconditional_delete_keeps_two_passes(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Several matches are allowed when the only WHEN MATCHED clause is an unconditional delete, and with Change
    Data Feed its deletes are deduplicated by row: findTouchedFiles must know them before the write's join."""
    target = _target(tmp_path / "target", cdf=False)
    source = write_table(tmp_path / "source", _rows([6, 6, 250, 1000], "s"))
    clauses = [clause("matched", "delete"), clause("notMatched", "insert_all")]
    result, scans = _merge(monkeypatch, spark, target, source, clauses, one_scan=True)
    assert scans == [4, 2]
    assert result.result == {
        "num_affected_rows": 3,
        "num_updated_rows": 0,
        "num_deleted_rows": 2,
        "num_inserted_rows": 1,
    }
    assert len(read_with_deltalake(target)) == 399


@pytest.mark.parametrize("cdf", [False, True], ids=["plain", "cdf"])
@pytest.mark.parametrize("name", list(CASES))
def test_the_write_observes_what_an_aggregation_before_it_gathered(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, cdf: bool
) -> None:
    """The one scan's write observes the target rows it replaces as it writes, where an aggregation over its cached
    output rows used to gather them first: the same table, vectors, result, metrics and change rows, with one
    Spark query fewer."""
    source = write_table(tmp_path / "source", _rows([*range(10, 60, 3), *range(410, 430), 1000, 1001, 1002], "s"))
    results = {}
    for observed in (True, False):
        target = _target(tmp_path / f"target-{observed}", cdf=cdf)
        with monkeypatch.context() as patched:
            if not observed:
                patched.setattr(merge_on_read, "OBSERVED_FILES_MAX", 0)
            with counting_round_trips(spark, patched) as trips:
                result, scans = _merge(monkeypatch, spark, target, source, CASES[name], one_scan=True)
        assert scans == [4]
        results[observed] = result, trips["execute"]
    (observing, observing_queries), (aggregating, aggregating_queries) = results[True], results[False]
    assert observing.result == aggregating.result
    assert {k: v for k, v in observing.metrics.items() if k not in SIZES} == {
        k: v for k, v in aggregating.metrics.items() if k not in SIZES
    }
    assert observing_queries == aggregating_queries - 1
    observed_table, aggregated_table = tmp_path / "target-True", tmp_path / "target-False"
    assert read_with_deltalake(observed_table).to_pylist() == read_with_deltalake(aggregated_table).to_pylist()
    assert _files_with_vectors(observed_table) == _files_with_vectors(aggregated_table) == [0, 400]
    if cdf:
        version = load_snapshot(observed_table).version
        assert _change_rows(observed_table, version) == _change_rows(aggregated_table, version)
    assert stray_files(observed_table) == set()


def test_a_write_that_saw_too_many_target_rows_is_discarded_for_the_aggregation(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A few source rows can match many target rows: past a bound the observed rows are not brought back, what the
    write wrote goes, and the aggregation answers before a second write. The table ends as the direct path's."""
    source = write_table(tmp_path / "source", _rows([*range(10, 60, 3), *range(410, 430), 1000], "s"))
    tables = {}
    for bounded in (True, False):
        target = _target(tmp_path / f"target-{bounded}", cdf=False)
        with monkeypatch.context() as patched:
            if bounded:
                patched.setattr(deletion_vector_output, "OBSERVED_TARGET_ROWS_MAX", 1)
            with counting_round_trips(spark, patched) as trips:
                result, _ = _merge(monkeypatch, spark, target, source, UPSERT, one_scan=True)
        tables[bounded] = target, result, trips["execute"]
    (bounded_table, bounded_result, bounded_queries), (table, direct, queries) = tables[True], tables[False]
    assert bounded_queries == queries + 2  # the discarded write; the aggregation
    assert bounded_result.result == direct.result
    assert read_with_deltalake(bounded_table).to_pylist() == read_with_deltalake(table).to_pylist()
    assert _files_with_vectors(bounded_table) == [0, 400]
    assert stray_files(bounded_table) == set()


def test_the_join_is_planned_on_the_source_rows_known_before_the_count(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Before any Spark job counts the source, the one scan chooses its join on the source's estimated rows
    (here from the source table's statistics): never on the metric's starting 0, which would broadcast a
    source of any size. 300 source rows against 200 candidate rows are shuffled, not broadcast."""
    from engine import joins

    seen: list[tuple[int | None, bool]] = []
    real = joins.source_fits_broadcast

    def recorded(ctx: MergeContext, rows: int | None, files: Sequence[AddFile]) -> bool:
        fits = real(ctx, rows, files)
        seen.append((rows, fits))
        return fits

    monkeypatch.setattr(merge_on_read, "source_fits_broadcast", recorded)
    ids = [*range(0, 400, 2), *range(1, 200, 2)]  # 300 keys: the 200 rows of the first two files, 100 new
    source = write_table(tmp_path / "source", _rows(ids, "s"))
    target = _target(tmp_path / "target", cdf=False)
    result, scans = _merge(monkeypatch, spark, target, source, UPSERT, one_scan=True)
    assert seen and seen == [(300, False)] * len(seen)
    assert scans == [2]
    assert (result.metrics["numTargetRowsUpdated"], result.metrics["numTargetRowsInserted"]) == (200, 100)
    assert read_with_deltalake(target).num_rows == 500
