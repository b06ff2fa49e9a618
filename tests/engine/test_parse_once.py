"""A merge parses its ON condition once: validation keeps the tree, and data skipping, the source's key ranges,
the join plans and resolution read it from there. Every SQL parse of the process is counted (sqlglot's own entry
points, which all of the engine's parsing goes through) and those of ON's text are picked out by the source
alias's reference to the key, which no other text of these merges holds."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import sqlglot
from deltalake import write_deltalake
from pyspark.sql import SparkSession

from engine import run_merge
from engine.spec import MergeClause
from tests.engine.harness import FindPlan, clause, find_plan, make_spec, rows

ON = "tgt.merge_key = src.merge_key AND tgt.part >= 0"
ON_TEXT = re.compile(r"`?src`?\s*\.\s*`?merge_key", re.IGNORECASE)


def count_on_parses(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often a text holding ON was handed to sqlglot's parser, from here on."""
    counts: Counter[str] = Counter()
    for name in ("parse", "parse_one"):
        real = getattr(sqlglot, name)

        def counting(sql: str, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            if ON_TEXT.search(sql):
                counts["on"] += 1
            return _real(sql, *args, **kwargs)

        monkeypatch.setattr(sqlglot, name, counting)
    return counts


def tables(tmp_path: Path) -> tuple[Path, Path]:
    """A target of two files (so that the source's key ranges skip files) and a Delta source."""
    target = tmp_path / "target"
    for ids in ([1, 2, 3], [10, 11, 12]):
        data = pa.table({"merge_key": pa.array(ids, pa.int64()), "part": pa.array([0] * 3, pa.int64()), "v": ids})
        write_deltalake(str(target), data, mode="append")
    source = tmp_path / "source"
    write_deltalake(
        str(source),
        pa.table({"merge_key": pa.array([2, 3, 4], pa.int64()), "part": pa.array([0] * 3, pa.int64()), "v": [7, 8, 9]}),
    )
    return target, source


def merge(spark: SparkSession, target: Path, source: Path, clauses: list[MergeClause]) -> None:
    spec = make_spec(target, source, ON, clauses, target_alias="tgt", source_alias="src")
    run_merge(spark, spec)


@pytest.mark.parametrize("plan", ["source_keys", "target_rows", "single_pass"])
def test_an_upsert_parses_on_once(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plan: FindPlan
) -> None:
    target, source = tables(tmp_path)
    counts = count_on_parses(monkeypatch)
    with find_plan(plan):
        merge(spark, target, source, [clause("matched", "update_all"), clause("notMatched", "insert_all")])
    assert counts["on"] == 1
    assert sorted(r[0] for r in rows(target, ["merge_key"])) == [1, 2, 3, 4, 10, 11, 12]


def test_a_matched_only_merge_with_conditions_parses_on_once(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Matched-only: the clause conditions' target-only conjuncts join data skipping too."""
    target, source = tables(tmp_path)
    counts = count_on_parses(monkeypatch)
    merge(spark, target, source, [clause("matched", "update", "tgt.v > 2", v="src.v"), clause("matched", "delete")])
    assert counts["on"] == 1
    assert rows(target, ["merge_key", "v"]) == [(1, 1), (10, 10), (11, 11), (12, 12), (3, 8)]
