"""Running one merge two ways: through the engine, and through deltalake's own merge (the oracle)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any, Literal
from unittest.mock import patch
from urllib.parse import unquote

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from engine import (
    DeleteAction,
    InsertAction,
    MergeClause,
    MergeResult,
    MergeSpec,
    TableSource,
    UpdateAction,
    executors,
    join_keys,
    joins,
    run_merge,
    single_pass,
)
from engine.key_bitmap import KeyBitmap

COUNTS = ("num_updated_rows", "num_deleted_rows", "num_inserted_rows")


def write_table(
    path: Path,
    data: pa.Table,
    *,
    partition_by: Sequence[str] | None = None,
    configuration: dict[str, str] | None = None,
) -> Path:
    write_deltalake(
        str(path), data, partition_by=list(partition_by) if partition_by else None, configuration=configuration
    )
    return path


def rows(path: Path | str, columns: Sequence[str] | None = None) -> list[tuple[Any, ...]]:
    """The table's rows as sorted tuples (NULLs sort first), the comparison both sides agree on."""
    table = DeltaTable(str(path)).to_pyarrow_table()
    names = list(columns) if columns is not None else table.column_names
    values = [table.column(n).to_pylist() for n in names]
    return sorted(zip(*values, strict=True), key=lambda r: tuple((v is not None, str(v)) for v in r))


def clause(kind: str, action: str, condition: str | None = None, **assign: str) -> MergeClause:
    """``clause("matched", "update", "s.v > 1", v="s.v")`` and friends."""
    actions: dict[str, Any] = {
        "update": UpdateAction(set=assign),
        "update_all": UpdateAction(star=True),
        "delete": DeleteAction(),
        "insert": InsertAction(values=assign),
        "insert_all": InsertAction(star=True),
    }
    return MergeClause(kind, actions[action], condition)  # type: ignore[arg-type]


def make_spec(target: Path, source: Path, on: str, clauses: Sequence[MergeClause], **kwargs: Any) -> MergeSpec:
    return MergeSpec(
        target=str(target),
        source=TableSource(format="delta", path=str(source)),
        on=on,
        matched=tuple(c for c in clauses if c.clause_type == "matched"),
        not_matched=tuple(c for c in clauses if c.clause_type == "notMatched"),
        not_matched_by_source=tuple(c for c in clauses if c.clause_type == "notMatchedBySource"),
        target_alias=kwargs.pop("target_alias", "t"),
        source_alias=kwargs.pop("source_alias", "s"),
        **kwargs,
    )


def upsert_all_spec(target: Path, source: Path, **kwargs: Any) -> MergeSpec:
    """``UPDATE SET *`` / ``INSERT *`` on ``t.id = s.id``: the upsert the schema evolution tests run."""
    return make_spec(
        target, source, "t.id = s.id", [clause("matched", "update_all"), clause("notMatched", "insert_all")], **kwargs
    )


def oracle_merge(target: Path, source: pa.Table, on: str, clauses: Sequence[MergeClause]) -> dict[str, int]:
    """deltalake's merge of the same spec; answers our result-row counts from its metrics."""
    builder = DeltaTable(str(target)).merge(source=source, predicate=on, source_alias="s", target_alias="t")
    for c in clauses:
        a = c.action
        cond = c.condition
        if c.clause_type == "matched":
            if isinstance(a, DeleteAction):
                builder = builder.when_matched_delete(predicate=cond)
            elif a.star:
                builder = builder.when_matched_update_all(predicate=cond)
            else:
                builder = builder.when_matched_update(updates=dict(a.set), predicate=cond)
        elif c.clause_type == "notMatched":
            assert isinstance(a, InsertAction)
            if a.star:
                builder = builder.when_not_matched_insert_all(predicate=cond)
            else:
                builder = builder.when_not_matched_insert(updates=dict(a.values), predicate=cond)
        else:
            if isinstance(a, DeleteAction):
                builder = builder.when_not_matched_by_source_delete(predicate=cond)
            else:
                builder = builder.when_not_matched_by_source_update(updates=dict(a.set), predicate=cond)
    metrics = builder.execute()
    return {
        "num_updated_rows": int(metrics["num_target_rows_updated"]),
        "num_deleted_rows": int(metrics["num_target_rows_deleted"]),
        "num_inserted_rows": int(metrics["num_target_rows_inserted"]),
    }


def differential(
    spark: SparkSession,
    tmp: Path,
    target_data: pa.Table,
    source_data: pa.Table,
    on: str,
    clauses: Sequence[MergeClause],
    *,
    partition_by: Sequence[str] | None = None,
) -> tuple[MergeResult, dict[str, int], Path, Path]:
    """The same merge on two copies of one table; answers both results and both table paths."""
    ours = write_table(tmp / "ours", target_data, partition_by=partition_by)
    theirs = tmp / "theirs"
    shutil.copytree(ours, theirs)
    source = write_table(tmp / "source", source_data)
    result = run_merge(spark, make_spec(ours, source, on, clauses))
    expected = oracle_merge(theirs, source_data, on, clauses)
    return result, expected, ours, theirs


def stray_files(table: Path) -> set[str]:
    """Data files under the table folder that no commit of its log adds: what a merge must never leave."""
    added: set[str] = set()
    for commit in (table / "_delta_log").glob("*.json"):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            for kind in ("add", "cdc"):
                if kind in action:
                    added.add(unquote(action[kind]["path"]))
    return {str(p.relative_to(table)) for p in table.rglob("*.parquet") if "_delta_log" not in p.parts} - added


FindPlan = Literal["source_keys", "target_rows", "single_pass"]
KeyBitmapPlan = Literal["held", "semi"]


def find_plan(plan: FindPlan) -> AbstractContextManager[Any]:
    """Force one of findTouchedFiles' plans where ON allows it: the source grouped by its join keys and
    broadcast past the target; the matches counted per target row after a shuffle (Delta's own); or folded
    into writeAllChanges (the single pass) whatever the key statistics expect, so that a wrong guess (a
    candidate file left untouched) and its fallback are exercised too."""
    stack = ExitStack()
    if plan == "single_pass":
        stack.enter_context(patch.object(single_pass, "expects_every_candidate_touched", lambda ctx, keyed: True))
        return stack
    stack.enter_context(patch.object(single_pass, "takes_single_pass", lambda ctx: False))
    if plan == "target_rows":
        for module in (executors, join_keys):
            stack.enter_context(patch.object(module, "keyed_join", lambda ctx: None))
    return stack


def join_plan(*, broadcast: bool, key_bitmap: KeyBitmapPlan | None = None) -> AbstractContextManager[Any]:
    """Force one of the two plans of the merge's joins whatever the data's size: the source broadcast past
    the streamed target, or both sides shuffled (Delta's own plan). ``key_bitmap`` also gives the broadcast
    plan the source's key bitmap whatever the source's size, where ON allows one; the unmatched source rows
    are then found by broadcasting the target rows the bitmap holds (``held``) or by the semi join through
    the bitmap (``semi``). Without ``key_bitmap`` no merge gets one, not even the single pass, which
    otherwise counts its actions on the held rows whatever the source's size."""
    stack = ExitStack()
    if key_bitmap is None:
        stack.enter_context(patch.object(KeyBitmap, "for_merge", lambda *args, **kwargs: None))
    if broadcast:
        stack.enter_context(patch.object(joins, "BROADCAST_SIZE_RATIO", 0))
        if key_bitmap is not None:
            stack.enter_context(patch("engine.key_bitmap.KEY_BITMAP_MIN_SOURCE_ROWS", 0))
            if key_bitmap == "semi":
                stack.enter_context(patch.object(joins, "HELD_TARGET_ROWS_PER_KEY", -1))
    else:
        stack.enter_context(patch.object(joins, "BROADCAST_SOURCE_BYTES", 0))
    return stack
