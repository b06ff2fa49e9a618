"""A merge-on-read merge of a small source keeps, before its join, only the target rows the source's ON keys may
match: a semi join with the broadcast keys in the write's own query. The table, result and metrics are those of
the join without it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import DataFrame, SparkSession

from engine import deletion_vector_output, joins, merge_on_read, run_merge, source_key_filter
from engine.context import MergeContext
from engine.merge_condition import KeyedOn
from engine.result import MergeResult
from engine.spark import STATIC_PLAN_CONF
from engine.spec import MergeSpec, RowsSource, Source, TableSource
from tests.engine.delta.dv_tables import enable_deletion_vectors, read_with_deltalake
from tests.engine.harness import clause, stray_files
from tests.engine.test_round_trips import counting_round_trips
from tests.engine.test_single_pass import PLAN_DEPENDENT


def _target(path: Path) -> Path:
    """Two files: the even ids 0-398 (``v`` = ``t<id>``) and a row whose id is NULL; deletion vectors enabled."""
    for ids in (list(range(0, 200, 2)), [*range(200, 400, 2), None]):
        data = pa.table({"id": pa.array(ids, pa.int64()), "v": [f"t{i}" for i in ids]})
        write_deltalake(str(path), data, mode="append")
    enable_deletion_vectors(path)
    return path


def _merge(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, target: Path, source: Source, on: str, *, filtered: bool
) -> tuple[MergeResult, list[KeyedOn], int]:
    """The upsert; the keys the target's rows were kept by; the Spark queries it ran."""
    given: list[KeyedOn] = []
    real = merge_on_read.keep_rows_of_source_keys

    def recorded(ctx: MergeContext, frame: DataFrame, keyed: KeyedOn) -> DataFrame:
        given.append(keyed)
        return real(ctx, frame, keyed)

    spec = MergeSpec(
        target=str(target),
        source=source,
        on=on,
        matched=(clause("matched", "update_all"),),
        not_matched=(clause("notMatched", "insert_all"),),
        target_alias="t",
        source_alias="s",
    )
    with monkeypatch.context() as patched:
        patched.setattr(merge_on_read, "keep_rows_of_source_keys", recorded)
        if not filtered:
            patched.setattr(merge_on_read, "source_key_filter", lambda ctx: None)
        with counting_round_trips(spark, patched) as trips:
            result = run_merge(spark, spec)
    return result, given, trips["execute"]


def _both(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, source: Source, on: str
) -> tuple[MergeResult, list[KeyedOn], int]:
    """The merge with the filter, checked against the same merge without it: same result, metrics and rows."""
    runs = {}
    for filtered in (True, False):
        target = _target(tmp_path / f"target-{filtered}")
        runs[filtered] = _merge(spark, monkeypatch, target, source, on, filtered=filtered)
    (with_filter, given, queries), (without, _, _) = runs[True], runs[False]
    assert with_filter.result == without.result
    assert {k: v for k, v in with_filter.metrics.items() if k not in PLAN_DEPENDENT} == {
        k: v for k, v in without.metrics.items() if k not in PLAN_DEPENDENT
    }
    kept, joined = tmp_path / "target-True", tmp_path / "target-False"
    assert read_with_deltalake(kept).to_pylist() == read_with_deltalake(joined).to_pylist()
    assert stray_files(kept) == set()
    return with_filter, given, queries


def _rows(*rows: tuple[Any, str]) -> RowsSource:
    return RowsSource(rows=[{"id": i, "v": v} for i, v in rows], schema="id BIGINT, v STRING")


def test_inline_rows_are_filtered_in_the_write_query(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    source = _rows((4, "s4"), (250, "s250"), (7, "s7"), (None, "snull"))
    result, given, queries = _both(spark, monkeypatch, tmp_path, source, "t.id = s.id")
    assert len(given) == 1
    assert queries == 1  # the keys are broadcast inside the write's query
    assert result.result == {
        "num_affected_rows": 4,
        "num_updated_rows": 2,
        "num_deleted_rows": 0,
        "num_inserted_rows": 2,  # 7, and the NULL key, which `=` matches to nothing
    }
    assert result.metrics["numTargetDeletionVectorsAdded"] == 2


def test_a_table_source(spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    source = tmp_path / "source"
    write_deltalake(str(source), pa.table({"id": pa.array([4, 250, 7, 4001], pa.int64()), "v": ["a", "b", "c", "d"]}))
    result, given, queries = _both(
        spark, monkeypatch, tmp_path, TableSource(format="delta", path=str(source)), "t.id = s.id"
    )
    assert len(given) == 1 and queries == 1
    assert result.result["num_updated_rows"] == 2 and result.result["num_inserted_rows"] == 2


def test_a_null_key_matches_under_null_safe_equality(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With ``<=>`` a source row with a NULL key matches the target's NULL-key row: the filter keeps that row."""
    source = _rows((None, "snull"), (6, "s6"), (9, "s9"))
    result, given, _ = _both(spark, monkeypatch, tmp_path, source, "t.id <=> s.id")
    assert [k.keys[0].null_safe for k in given] == [True]
    assert result.result["num_updated_rows"] == 2  # the NULL-key row and id 6
    assert result.result["num_inserted_rows"] == 1
    live = read_with_deltalake(tmp_path / "target-True").to_pylist()
    assert {"id": None, "v": "snull"} in live and {"id": 6, "v": "s6"} in live


def test_two_keys_one_of_them_a_string(spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A target row is kept only when both its keys equal one source row's: (4, t4) matches, (6, x) does not."""
    source = _rows((4, "t4"), (6, "x"), (300, "t300"))
    result, given, _ = _both(spark, monkeypatch, tmp_path, source, "t.id = s.id AND t.v = s.v")
    assert [len(k.keys) for k in given] == [2]
    assert result.result["num_updated_rows"] == 2 and result.result["num_inserted_rows"] == 1


def test_a_larger_source_is_filtered_where_it_would_be_broadcast(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Past SOURCE_KEY_FILTER_MAX_ROWS source rows (known before any job) the source's keys keep the target's rows
    only where the whole source would be broadcast (much smaller than the target rows it meets); else the target's
    rows meet the source whole."""
    monkeypatch.setattr(source_key_filter, "SOURCE_KEY_FILTER_MAX_ROWS", 2)
    source = _rows((2, "s2"), (4, "s4"), (5, "s5"))
    result, given, _ = _both(spark, monkeypatch, tmp_path, source, "t.id = s.id")  # 3 rows against 201
    assert len(given) == 1
    assert result.result["num_updated_rows"] == 2 and result.result["num_inserted_rows"] == 1
    monkeypatch.setattr(joins, "BROADCAST_SIZE_RATIO", 1_000)
    target = _target(tmp_path / "target")
    result, given, _ = _merge(spark, monkeypatch, target, source, "t.id = s.id", filtered=True)
    assert given == []
    assert result.result["num_updated_rows"] == 2 and result.result["num_inserted_rows"] == 1


STATIC_PLAN_KEYS = ("spark.sql.adaptive.enabled", "spark.sql.shuffle.partitions")


@pytest.mark.parametrize("filtered", [True, False], ids=["filtered", "joined-whole"])
def test_a_small_filtered_write_is_planned_at_once(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, filtered: bool
) -> None:
    """The write of a merge whose source's keys filtered the scan runs under a static plan (STATIC_PLAN_CONF): the
    session's settings are those while it writes, and the earlier ones after, whatever the merge did."""
    before = {key: spark.conf.get(key) for key in STATIC_PLAN_KEYS}
    seen: list[dict[str, str | None]] = []
    real = deletion_vector_output.write_output

    def recorded(ctx: MergeContext, *args: Any, **kwargs: Any) -> Any:
        seen.append({key: spark.conf.get(key) for key in STATIC_PLAN_KEYS})
        return real(ctx, *args, **kwargs)

    monkeypatch.setattr(deletion_vector_output, "write_output", recorded)
    source = _rows((4, "s4"), (250, "s250"), (7, "s7"))
    result, given, _ = _merge(spark, monkeypatch, _target(tmp_path / "t"), source, "t.id = s.id", filtered=filtered)
    assert result.result["num_updated_rows"] == 2 and result.result["num_inserted_rows"] == 1
    assert len(given) == (1 if filtered else 0)
    assert seen == [STATIC_PLAN_CONF if filtered else before]
    assert {key: spark.conf.get(key) for key in STATIC_PLAN_KEYS} == before


def test_files_past_the_inline_limit_are_numbered_by_a_join(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The observed write numbers the candidate files by a map literal up to FILE_NUMBERS_INLINE_MAX files, by a
    broadcast join past it: the two files here take the join, with the same result as the literal."""
    monkeypatch.setattr(deletion_vector_output, "FILE_NUMBERS_INLINE_MAX", 1)
    source = _rows((4, "s4"), (250, "s250"), (7, "s7"))
    result, given, _ = _both(spark, monkeypatch, tmp_path, source, "t.id = s.id")
    assert len(given) == 1
    assert result.result["num_updated_rows"] == 2 and result.result["num_inserted_rows"] == 1
    assert result.metrics["numTargetDeletionVectorsAdded"] == 2
