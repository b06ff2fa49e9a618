"""A large Delta source held in one row group (one Spark task) is hash-partitioned by ON's keys before the
merge-on-read write's join streams it, so its rows spread over the cores. The table, result and metrics are
those of the merge without it; a source of several row groups, a small one, one broadcast to the join, and an
ON without key equalities stay as they are."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import WriterProperties, write_deltalake
from pyspark.sql import DataFrame, SparkSession

from engine import merge_on_read, run_merge, streamed_source
from engine.context import MergeContext
from engine.result import MergeResult
from tests.engine.delta.dv_tables import enable_deletion_vectors, read_with_deltalake
from tests.engine.harness import clause, make_spec, stray_files
from tests.engine.test_single_pass import PLAN_DEPENDENT

UPSERT = [clause("matched", "update_all"), clause("notMatched", "insert_all")]


def _target(path: Path) -> Path:
    """Two files of 50 rows (the even ids 0-198), deletion vectors enabled."""
    for start in (0, 100):
        ids = list(range(start, start + 100, 2))
        write_deltalake(
            str(path), pa.table({"id": pa.array(ids, pa.int64()), "v": [f"t{i}" for i in ids]}), mode="append"
        )
    enable_deletion_vectors(path)
    return path


def _source(path: Path, rows_per_group: int) -> Path:
    """40 rows in one file: ids 150-228 step 2 (half of them in the target), in row groups of ``rows_per_group``."""
    ids = list(range(150, 230, 2))
    data = pa.table({"id": pa.array(ids, pa.int64()), "v": [f"s{i}" for i in ids]})
    write_deltalake(str(path), data, writer_properties=WriterProperties(max_row_group_size=rows_per_group))
    return path


Spread = list[tuple[int | None, str | None]]
"""Each call's source splits, and the physical plan of what it returned when that differs from the source."""


def _merge(
    spark: SparkSession,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    name: str,
    source: Path,
    *,
    spread: bool,
    on: str = "t.id = s.id",
) -> tuple[MergeResult, Path, Spread]:
    seen: Spread = []
    real = streamed_source.spread_streamed_source

    def recorded(ctx: MergeContext, frame: DataFrame) -> DataFrame:
        out = real(ctx, frame) if spread else frame
        plan = None
        if out is not frame:
            plan = out._explain_string(extended=False)  # type: ignore[attr-defined]
        seen.append((ctx.source_splits, plan))
        return out

    target = _target(tmp_path / name)
    spec = make_spec(target, source, on, UPSERT)
    with monkeypatch.context() as patched:
        patched.setattr(merge_on_read, "spread_streamed_source", recorded)
        result = run_merge(spark, spec)
    return result, target, seen


def _same_as_unspread(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, source: Path, **kwargs: str
) -> tuple[MergeResult, Spread]:
    spread, spread_target, seen = _merge(spark, monkeypatch, tmp_path, "spread", source, spread=True, **kwargs)
    plain, plain_target, _ = _merge(spark, monkeypatch, tmp_path, "plain", source, spread=False, **kwargs)
    assert spread.result == plain.result
    assert {k: v for k, v in spread.metrics.items() if k not in PLAN_DEPENDENT} == {
        k: v for k, v in plain.metrics.items() if k not in PLAN_DEPENDENT
    }
    assert read_with_deltalake(spread_target).to_pylist() == read_with_deltalake(plain_target).to_pylist()
    assert stray_files(spread_target) == set()
    assert spread.result["num_updated_rows"] == 25 and spread.result["num_inserted_rows"] == 15
    assert spread.metrics["numTargetDeletionVectorsAdded"] == 1
    return spread, seen


@pytest.fixture
def large_from_ten(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sources of 10 rows or more count as large."""
    monkeypatch.setattr(streamed_source, "STREAMED_SPREAD_MIN_ROWS", 10)


@pytest.mark.usefixtures("large_from_ten")
def test_a_large_source_of_one_row_group_is_spread_by_its_keys(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _, seen = _same_as_unspread(spark, monkeypatch, tmp_path, _source(tmp_path / "source", 1_000))
    assert len(seen) == 1
    splits, plan = seen[0]
    assert splits == 1
    assert plan is not None and "hashpartitioning(id#" in plan.replace(" ", "")


@pytest.mark.usefixtures("large_from_ten")
def test_the_spread_joins_a_shuffled_join_as_well(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without the source's keys filtering the scan (and no broadcast of the source), the join shuffles the source
    by the same keys: the spread gives the same answer there too."""
    monkeypatch.setattr(merge_on_read, "source_key_filter", lambda ctx: None)
    monkeypatch.setattr(merge_on_read, "source_fits_broadcast", lambda *args: False)
    _, seen = _same_as_unspread(spark, monkeypatch, tmp_path, _source(tmp_path / "source", 1_000))
    assert [(s, p is not None) for s, p in seen] == [(1, True)]


@pytest.mark.usefixtures("large_from_ten")
def test_a_source_of_several_row_groups_stays_as_it_is(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _, seen = _same_as_unspread(spark, monkeypatch, tmp_path, _source(tmp_path / "source", 16))
    assert seen == [(3, None)]


def test_a_small_source_reads_no_footer(spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Below STREAMED_SPREAD_MIN_ROWS source rows (here the default, 200,000) the splits are not even asked."""
    _, seen = _same_as_unspread(spark, monkeypatch, tmp_path, _source(tmp_path / "source", 1_000))
    assert seen == [(None, None)]


@pytest.mark.usefixtures("large_from_ten")
def test_a_broadcast_source_is_not_spread(spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A source broadcast to the join is not streamed: no shuffle is put below its broadcast."""
    monkeypatch.setattr(merge_on_read, "source_key_filter", lambda ctx: None)
    monkeypatch.setattr(merge_on_read, "source_fits_broadcast", lambda *args: True)
    _, seen = _same_as_unspread(spark, monkeypatch, tmp_path, _source(tmp_path / "source", 1_000))
    assert seen == []


@pytest.mark.usefixtures("large_from_ten")
def test_an_on_without_key_equalities_is_not_spread(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without key equalities there is no key to spread by (and no key filter): the source joins as it is read."""
    monkeypatch.setattr(merge_on_read, "source_fits_broadcast", lambda *args: False)
    _, seen = _same_as_unspread(
        spark, monkeypatch, tmp_path, _source(tmp_path / "source", 1_000), on="t.id <=> s.id + 0"
    )
    assert seen == [(1, None)]
