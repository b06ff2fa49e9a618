"""Queries that shuffle only a few rows are planned statically, as one Spark job (``engine.spark.static_plan``):
findTouchedFiles and the delete with deletion vectors where the source is grouped by key in one task and
broadcast past the target. The static settings hold while such a query runs, the session's own ones otherwise
and after; the results are those of deltalake's merge of the same table."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from engine import executors, merge_on_read, run_merge
from engine.spark import STATIC_PLAN_CONF
from engine.spec import MergeClause
from tests.engine.delta.dv_tables import enable_deletion_vectors, read_with_deltalake
from tests.engine.harness import clause, find_plan, make_spec, oracle_merge, write_table

KEYS = tuple(STATIC_PLAN_CONF)
TARGET = pa.table({"id": pa.array(range(0, 200, 2), pa.int64()), "v": [f"t{i}" for i in range(0, 200, 2)]})
SOURCE = pa.table({"id": pa.array([4, 10, 11, 150], pa.int64()), "v": ["a", "b", "c", "d"]})
UPSERT = (clause("matched", "update_all"), clause("notMatched", "insert_all"))

Settings = dict[str, "str | None"]


def _settings(spark: SparkSession) -> Settings:
    return {key: spark.conf.get(key) for key in KEYS}


def _merge(
    spark: SparkSession,
    monkeypatch: pytest.MonkeyPatch,
    module: ModuleType,
    tmp_path: Path,
    on: str,
    clauses: Sequence[MergeClause],
    *,
    deletion_vectors: bool = False,
) -> list[Settings]:
    """The merge, checked against deltalake's on a copy of the table (without deletion vectors); the settings
    inside each block ``module`` asked ``static_plan`` for, whether or not it planned statically."""
    before = _settings(spark)
    seen: list[Settings] = []
    real = module.static_plan

    class Recorded:
        def __init__(self, session: SparkSession, *, when: bool = True) -> None:
            self.block = real(session, when=when)

        def __enter__(self) -> None:
            self.block.__enter__()
            seen.append(_settings(spark))

        def __exit__(self, *exc: object) -> None:
            self.block.__exit__(*exc)

    ours = write_table(tmp_path / "ours", TARGET)
    theirs = tmp_path / "theirs"
    shutil.copytree(ours, theirs)
    if deletion_vectors:
        enable_deletion_vectors(ours)
    source = write_table(tmp_path / "source", SOURCE)
    with monkeypatch.context() as patched:
        patched.setattr(module, "static_plan", Recorded)
        result = run_merge(spark, make_spec(ours, source, on, clauses))
    expected = oracle_merge(theirs, SOURCE, on, clauses)
    assert {key: result.result[key] for key in expected} == expected
    assert _sorted(read_with_deltalake(ours).to_pylist()) == _sorted(read_with_deltalake(theirs).to_pylist())
    assert _settings(spark) == before
    return seen


def _sorted(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda row: (row["id"], row["v"]))


@pytest.mark.parametrize(("on", "static"), [("t.id = s.id", True), ("t.id - s.id = 0", False)], ids=["keys", "no-keys"])
def test_find_touched_files_is_one_static_job_by_key(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, on: str, static: bool
) -> None:
    """Without key equalities in ON the matches are counted per target row after a shuffle of every match: the
    query stays adaptive."""
    before = _settings(spark)
    with find_plan("source_keys"):
        seen = _merge(spark, monkeypatch, executors, tmp_path, on, UPSERT)
    assert seen == [STATIC_PLAN_CONF if static else before]


def test_a_delete_with_deletion_vectors_is_one_static_job(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen = _merge(
        spark, monkeypatch, merge_on_read, tmp_path, "t.id = s.id", [clause("matched", "delete")], deletion_vectors=True
    )
    assert seen == [STATIC_PLAN_CONF]
