"""Identity columns: values generated for INSERTs above the high-water mark, which the commit raises; Delta's rules
on explicit values and updates. Tables are written by deltalake, then given identity columns by a metaData
commit as Delta writes them (deltalake cannot create them)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from engine import run_merge
from engine.delta.identity import IdentityColumn
from engine.errors import MergeResolutionError
from tests.engine.harness import clause, make_spec, write_table

from .util import log_entries, write_log_entry


def _identity_table(lake: Path, *, allow_explicit: bool, step: int = 5) -> Path:
    path = lake / f"ident-{uuid.uuid4().hex[:6]}"
    write_deltalake(str(path), pa.table({"id": pa.array([10, 15], pa.int64()), "v": ["a", "b"]}))
    meta = next(a["metaData"] for a in log_entries(path, 0) if "metaData" in a)
    schema = json.loads(meta["schemaString"])
    schema["fields"][0]["metadata"] = {
        "delta.identity.start": 10,
        "delta.identity.step": step,
        "delta.identity.highWaterMark": 15,
        "delta.identity.allowExplicitInsert": allow_explicit,
    }
    write_log_entry(
        path,
        1,
        [
            {"commitInfo": {"operation": "CHANGE COLUMN"}},
            {"protocol": {"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": ["identityColumns"]}},
            {"metaData": {**meta, "schemaString": json.dumps(schema)}},
        ],
    )
    return path


def _identity_metadata(path: Path) -> dict[str, Any]:
    schema = json.loads(DeltaTable(str(path)).schema().to_json())
    return dict(schema["fields"][0]["metadata"])


def test_inserts_generate_values_above_the_high_water_mark(spark: SparkSession, lake: Path) -> None:
    path = _identity_table(lake, allow_explicit=False)
    source = write_table(lake / "src", pa.table({"v": ["b", "c", "d", "e"]}))
    clauses = [clause("matched", "update", v="concat(s.v, '!')"), clause("notMatched", "insert", v="s.v")]
    result = run_merge(spark, make_spec(path, source, "t.v = s.v", clauses))
    assert result.result["num_inserted_rows"] == 3
    got = {r["v"]: r["id"] for r in DeltaTable(str(path)).to_pyarrow_table().to_pylist()}
    assert got["a"] == 10 and got["b!"] == 15  # the update keeps the row's identity value
    new = [got[v] for v in ("c", "d", "e")]
    assert len(set(new)) == 3
    assert all(value > 15 and (value - 10) % 5 == 0 for value in new), new
    metadata = _identity_metadata(path)
    assert metadata["delta.identity.highWaterMark"] == max(new)
    assert metadata["delta.identity.start"] == 10 and metadata["delta.identity.step"] == 5

    # The next merge starts above the new mark.
    more = write_table(lake / "src2", pa.table({"v": ["f"]}))
    run_merge(spark, make_spec(path, more, "t.v = s.v", [clause("notMatched", "insert", v="s.v")]))
    got = {r["v"]: r["id"] for r in DeltaTable(str(path)).to_pyarrow_table().to_pylist()}
    assert got["f"] > max(new)
    assert _identity_metadata(path)["delta.identity.highWaterMark"] == got["f"]


def test_several_insert_clauses_never_generate_the_same_value(spark: SparkSession, lake: Path) -> None:
    """Each INSERT clause's expression counts only the rows it is evaluated for: each takes its own lane."""
    path = _identity_table(lake, allow_explicit=False)
    source = write_table(lake / "src", pa.table({"v": [f"r{i}" for i in range(20)]}))
    clauses = [
        clause("notMatched", "insert", "s.v < 'r5'", v="concat('first ', s.v)"),
        clause("notMatched", "insert", v="concat('second ', s.v)"),
    ]
    result = run_merge(spark, make_spec(path, source, "t.v = s.v", clauses))
    assert result.result["num_inserted_rows"] == 20
    ids = [r["id"] for r in DeltaTable(str(path)).to_pyarrow_table().to_pylist()]
    assert len(ids) == len(set(ids)) == 22
    assert all(i > 15 and (i - 10) % 5 == 0 for i in ids if i not in (10, 15))


def test_explicit_values_need_allow_explicit_insert(spark: SparkSession, lake: Path) -> None:
    source = write_table(lake / "src", pa.table({"id": pa.array([99], pa.int64()), "v": ["z"]}))
    always = _identity_table(lake, allow_explicit=False)
    before = DeltaTable(str(always)).version()
    for clauses in ([clause("notMatched", "insert_all")], [clause("notMatched", "insert", id="s.id", v="s.v")]):
        with pytest.raises(MergeResolutionError, match="GENERATED ALWAYS AS IDENTITY column id"):
            run_merge(spark, make_spec(always, source, "t.v = s.v", clauses))
    assert DeltaTable(str(always)).version() == before

    by_default = _identity_table(lake, allow_explicit=True)
    run_merge(spark, make_spec(by_default, source, "t.v = s.v", [clause("notMatched", "insert_all")]))
    assert sorted(r["id"] for r in DeltaTable(str(by_default)).to_pyarrow_table().to_pylist()) == [10, 15, 99]
    # Delta raises the mark only for columns the write generated values for.
    assert _identity_metadata(by_default)["delta.identity.highWaterMark"] == 15


def test_updates_of_an_identity_column_are_refused(spark: SparkSession, lake: Path) -> None:
    path = _identity_table(lake, allow_explicit=True)
    source = write_table(lake / "src", pa.table({"id": pa.array([1], pa.int64()), "v": ["a"]}))
    for clauses in ([clause("matched", "update_all")], [clause("matched", "update", id="s.id")]):
        with pytest.raises(MergeResolutionError, match="UPDATE on IDENTITY column id"):
            run_merge(spark, make_spec(path, source, "t.v = s.v", clauses))
    assert DeltaTable(str(path)).version() == 1


def test_high_water_mark_follows_deltas_rounding() -> None:
    up = IdentityColumn("id", start=10, step=5, high_water_mark=15, allow_explicit_insert=True)
    assert up.next_value == 20
    assert up.round_to_next(21) == 25 and up.round_to_next(20) == 20 and up.round_to_next(7) == 10
    assert up.new_high_water_mark(21) == 25
    assert up.new_high_water_mark(12) is None  # never lowered
    assert up.new_high_water_mark(3) is None  # before start
    down = IdentityColumn("id", start=-1, step=-3, high_water_mark=None, allow_explicit_insert=False)
    assert down.next_value == -1
    assert down.round_to_next(-5) == -7
    assert down.new_high_water_mark(-5) == -7
    assert down.new_high_water_mark(4) is None
