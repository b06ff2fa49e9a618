"""A merge-on-read merge of a small source keeps the target rows its keys may match in the scan: the source's
values of ON's one integer key, from inline rows as they are or from one Spark job over a table. The table, result
and metrics are those of the join without them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import DataFrame, SparkSession

from engine import merge_on_read, run_merge, source_key_values
from engine.result import MergeResult
from engine.source_key_values import SourceKeyValues
from engine.spec import MergeSpec, RowsSource, TableSource
from tests.engine.delta.dv_tables import enable_deletion_vectors, read_with_deltalake
from tests.engine.harness import clause, stray_files
from tests.engine.test_round_trips import counting_round_trips
from tests.engine.test_single_pass import PLAN_DEPENDENT

UPSERT = (clause("matched", "update_all"),)
INSERT = (clause("notMatched", "insert_all"),)


def _target(path: Path) -> Path:
    """Two files: the even ids 0-398 and a row whose id is NULL; deletion vectors enabled."""
    for ids in (list(range(0, 200, 2)), [*range(200, 400, 2), None]):
        data = pa.table({"id": pa.array(ids, pa.int64()), "v": [f"t{i}" for i in ids]})
        write_deltalake(str(path), data, mode="append")
    enable_deletion_vectors(path)
    return path


def _merge(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, target: Path, source: Any, on: str, *, key_values: bool
) -> tuple[MergeResult, list[SourceKeyValues], int]:
    """The merge; the key values the scan was given; the Spark queries it ran."""
    given: list[SourceKeyValues] = []
    real = merge_on_read.keep_matchable_rows

    def recorded(frame: DataFrame, keys: SourceKeyValues) -> DataFrame:
        given.append(keys)
        return real(frame, keys)

    spec = MergeSpec(
        target=str(target),
        source=source,
        on=on,
        matched=UPSERT,
        not_matched=INSERT,
        target_alias="t",
        source_alias="s",
    )
    with monkeypatch.context() as patched:
        patched.setattr(merge_on_read, "keep_matchable_rows", recorded)
        if not key_values:
            patched.setattr(source_key_values, "KEY_VALUES_MAX", -1)
        with counting_round_trips(spark, patched) as trips:
            result = run_merge(spark, spec)
    return result, given, trips["execute"]


def _same_merge(tmp_path: Path, with_values: MergeResult, without: MergeResult) -> None:
    assert with_values.result == without.result
    assert {k: v for k, v in with_values.metrics.items() if k not in PLAN_DEPENDENT} == {
        k: v for k, v in without.metrics.items() if k not in PLAN_DEPENDENT
    }
    kept, joined = tmp_path / "target-True", tmp_path / "target-False"
    assert read_with_deltalake(kept).to_pylist() == read_with_deltalake(joined).to_pylist()
    assert stray_files(kept) == set()


def test_inline_rows_give_their_keys_without_a_spark_job(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rows: list[dict[str, Any]] = [
        {"id": 4, "v": "s4"},
        {"id": 250, "v": "s250"},
        {"id": 7, "v": "s7"},
        {"id": None, "v": "snull"},
    ]
    inline = RowsSource(rows=rows, schema="id BIGINT, v STRING")
    runs = {}
    for key_values in (True, False):
        target = _target(tmp_path / f"target-{key_values}")
        runs[key_values] = _merge(spark, monkeypatch, target, inline, "t.id = s.id", key_values=key_values)
    (with_values, given, queries), (without, _, _) = runs[True], runs[False]
    assert [(k.values, k.matches_null) for k in given] == [((4, 7, 250), False)]  # `=`: a NULL key matches nothing
    assert with_values.result == {
        "num_affected_rows": 4,
        "num_updated_rows": 2,
        "num_deleted_rows": 0,
        "num_inserted_rows": 2,
    }
    assert queries == 1  # the write alone
    assert with_values.metrics["numTargetDeletionVectorsAdded"] == 2
    _same_merge(tmp_path, with_values, without)


def test_a_table_source_gives_its_keys_in_one_job(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    source = tmp_path / "source"
    write_deltalake(str(source), pa.table({"id": pa.array([4, 250, 7, 4001], pa.int64()), "v": ["a", "b", "c", "d"]}))
    runs = {}
    for key_values in (True, False):
        target = _target(tmp_path / f"target-{key_values}")
        table = TableSource(format="delta", path=str(source))
        runs[key_values] = _merge(spark, monkeypatch, target, table, "t.id = s.id", key_values=key_values)
    (with_values, given, queries), (without, _, _) = runs[True], runs[False]
    assert [k.values for k in given] == [(4, 7, 250, 4001)]
    assert queries == 2  # the keys, the write
    _same_merge(tmp_path, with_values, without)


def test_a_null_key_matches_under_null_safe_equality(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With ``<=>`` a source row with a NULL key matches the target's NULL-key row: the scan keeps that row too."""
    rows: list[dict[str, Any]] = [{"id": None, "v": "snull"}, {"id": 6, "v": "s6"}, {"id": 9, "v": "s9"}]
    inline = RowsSource(rows=rows, schema="id BIGINT, v STRING")
    runs = {}
    for key_values in (True, False):
        target = _target(tmp_path / f"target-{key_values}")
        runs[key_values] = _merge(spark, monkeypatch, target, inline, "t.id <=> s.id", key_values=key_values)
    (with_values, given, _), (without, _, _) = runs[True], runs[False]
    assert [(k.values, k.matches_null) for k in given] == [((6, 9), True)]
    assert with_values.result["num_updated_rows"] == 2  # the NULL-key row and id 6
    assert with_values.result["num_inserted_rows"] == 1
    live = read_with_deltalake(tmp_path / "target-True").to_pylist()
    assert {"id": None, "v": "snull"} in live and {"id": 6, "v": "s6"} in live
    _same_merge(tmp_path, with_values, without)


def test_a_larger_source_keeps_the_join(spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Past KEY_VALUES_MAX source rows (known before any job) no value is taken: the plan would carry them all."""
    rows = [{"id": i, "v": f"s{i}"} for i in (2, 4, 5)]
    monkeypatch.setattr(source_key_values, "KEY_VALUES_MAX", 2)
    target = _target(tmp_path / "target")
    result, given, _ = _merge(
        spark, monkeypatch, target, RowsSource(rows=rows, schema="id BIGINT, v STRING"), "t.id = s.id", key_values=True
    )
    assert given == []
    assert result.result["num_updated_rows"] == 2 and result.result["num_inserted_rows"] == 1
