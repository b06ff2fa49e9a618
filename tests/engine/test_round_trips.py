"""A small merge's round trips to the Spark Connect server, counted on the client: a plan analyzed answers a
schema, a plan executed runs Spark jobs. A one-row upsert that matches runs one query (the single pass); ON and
every clause are typed in one analysis, however many clauses the merge has."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from engine import run_merge
from engine.spec import MergeClause, MergeSpec, RowsSource, TableSource
from tests.engine.harness import clause

# Every execution (a command's or a query's) streams its answer through the iterator.
ROUND_TRIPS = {"_analyze": "analyze", "_execute_and_fetch_as_iterator": "execute"}


@contextmanager
def counting_round_trips(spark: SparkSession, monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    counts: Counter[str] = Counter()
    client = spark.client  # type: ignore[attr-defined]
    for name, kind in ROUND_TRIPS.items():
        real = getattr(client, name)

        def counted(*args: Any, _real: Any = real, _kind: str = kind, **kwargs: Any) -> Any:
            counts[_kind] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(client, name, counted)
    try:
        yield counts
    finally:
        monkeypatch.undo()


def _target(path: Path, ids: tuple[int, ...] = (1, 2, 3)) -> Path:
    data = pa.table({"id": pa.array(ids, pa.int64()), "v": [chr(ord("a") + i) for i in range(len(ids))]})
    write_deltalake(str(path), data)
    return path


def _spec(target: Path, key: int, clauses: list[MergeClause]) -> MergeSpec:
    return MergeSpec(
        target=str(target),
        source=RowsSource(rows=[{"id": key, "v": f"x{key}"}], schema="id BIGINT, v STRING"),
        on="t.id = s.id",
        matched=tuple(c for c in clauses if c.clause_type == "matched"),
        not_matched=tuple(c for c in clauses if c.clause_type == "notMatched"),
        not_matched_by_source=tuple(c for c in clauses if c.clause_type == "notMatchedBySource"),
        target_alias="t",
        source_alias="s",
    )


UPSERT = [clause("matched", "update_all"), clause("notMatched", "insert_all")]
FOUR_CLAUSES = [
    clause("matched", "delete", "s.v = 'gone'"),
    clause("matched", "update", "t.v <> s.v", v="concat(t.v, s.v)"),
    clause("notMatched", "insert_all", "s.id > 0"),
    clause("notMatchedBySource", "update", "t.id > 2", v="upper(t.v)"),
]


def test_a_matching_one_row_upsert_runs_one_query(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = _target(tmp_path / "t")
    run_merge(spark, _spec(target, 1, UPSERT))  # the first merge of a plan shape may pay for more
    with counting_round_trips(spark, monkeypatch) as counts:
        result = run_merge(spark, _spec(target, 2, UPSERT))
    assert result.result["num_updated_rows"] == 1
    assert counts == {"analyze": 3, "execute": 1}
    assert sorted(DeltaTable(str(target)).to_pyarrow_table().to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "v": "x1"},
        {"id": 2, "v": "x2"},
        {"id": 3, "v": "c"},
    ]


def test_a_new_key_in_range_writes_the_insert_after_the_guess(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The single pass guessed the one file touched; it was not, so its write is discarded and the insert is
    written alone: one more query, and the table holds the new row once."""
    target = _target(tmp_path / "t", (1, 3))
    with counting_round_trips(spark, monkeypatch) as counts:
        result = run_merge(spark, _spec(target, 2, UPSERT))
    assert result.result["num_inserted_rows"] == 1
    assert result.metrics["numTargetFilesRemoved"] == 0
    assert counts["execute"] == 2
    assert [r["id"] for r in DeltaTable(str(target)).to_pyarrow_table().to_pylist()].count(2) == 1


def test_every_clause_is_typed_in_the_one_analysis(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = _target(tmp_path / "t")
    with counting_round_trips(spark, monkeypatch) as counts:
        result = run_merge(spark, _spec(target, 2, FOUR_CLAUSES))
    assert result.result["num_updated_rows"] == 2  # id 2 matched, id 3 not matched by source
    assert counts["analyze"] == 3
    rows = sorted(DeltaTable(str(target)).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    assert rows == [{"id": 1, "v": "a"}, {"id": 2, "v": "bx2"}, {"id": 3, "v": "C"}]


@pytest.mark.parametrize("files", [1, 2])
def test_a_new_key_past_every_file_runs_only_the_insert(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: int
) -> None:
    """The source's key range skips every file (the inline rows' range costs no Spark job, so a table of one file
    is skipped too), and the inline rows' count is known: the insert is the one query, and numSourceRows is still
    the source's row count."""
    target = _target(tmp_path / "t")
    if files == 2:
        write_deltalake(str(target), pa.table({"id": pa.array([5, 6], pa.int64()), "v": ["e", "f"]}), mode="append")
    with counting_round_trips(spark, monkeypatch) as counts:
        result = run_merge(spark, _spec(target, 100, UPSERT))
    assert result.metrics["numTargetFilesAfterSkipping"] == 0
    assert result.metrics["numSourceRows"] == 1
    assert result.result["num_inserted_rows"] == 1
    assert counts["execute"] == 1


def test_a_single_file_is_not_worth_a_spark_job_for_the_source_key_range(spark: SparkSession, tmp_path: Path) -> None:
    """A JSON source's key range would take a Spark aggregation: for a table of one file it is not computed, so
    the file stays a candidate (with a range it would have been skipped) and the merge is still right."""
    target = _target(tmp_path / "t")
    source = tmp_path / "s.json"
    source.write_text('{"id": 100, "v": "x100"}\n')
    spec = replace(_spec(target, 100, UPSERT), source=TableSource(format="json", path=str(source)))
    result = run_merge(spark, spec)
    assert result.metrics["numTargetFilesAfterSkipping"] == 1
    assert result.result["num_inserted_rows"] == 1
    assert sorted(r["id"] for r in DeltaTable(str(target)).to_pyarrow_table().to_pylist()) == [1, 2, 3, 100]
