"""A merge-on-read write reads of the target only the columns ON and the clauses read: a copied or deleted row is
never written. Every merge here runs on a table with deletion vectors and, copy-on-write, on the same table
without: the two must leave the same rows, whatever the clauses read (kept columns, struct fields, bare names,
names Delta allows that need quoting, a column named like the source's alias, schema evolution)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import SparkSession

from engine import run_merge
from engine.merge_on_read import MergeOnReadExecutor
from engine.spec import MergeClause
from engine.target_reads import target_columns_read
from tests.engine.delta.dv_tables import enable_deletion_vectors, read_with_deltalake
from tests.engine.harness import clause, join_plan, make_spec, write_table

STRUCT = pa.struct([("a", pa.int64()), ("b", pa.string())])


def _rows(ids: list[int], tag: str, *, extra: bool = False) -> pa.Table:
    columns: dict[str, Any] = {
        "id": pa.array(ids, pa.int64()),
        "v": [f"{tag}{i}" for i in ids],
        "n": pa.array(ids, pa.int64()),
        "st": pa.array([{"a": i * 10, "b": f"{tag}b{i}"} for i in ids], STRUCT),
        "odd.col": [f"{tag}.{i}" for i in ids],
        "S": pa.array([i % 7 for i in ids], pa.int64()),
    }
    if extra:
        columns["extra"] = [f"x{i}" for i in ids]
    return pa.table(columns)


def _target(path: Path, *, deletion_vectors: bool) -> Path:
    """Three files of 50 rows (the even ids 0-298)."""
    for start in range(0, 300, 100):
        write_deltalake(str(path), _rows(list(range(start, start + 100, 2)), "t"), mode="append")
    if deletion_vectors:
        enable_deletion_vectors(path)
    return path


ALL = frozenset(["id", "v", "n", "st", "odd.col", "S"])

CASES: dict[str, tuple[str, list[MergeClause], dict[str, Any], frozenset[str]]] = {
    # name: ON, clauses, spec options, the target columns the write reads. ``S`` is read wherever the source is:
    # ``s.v`` could name the field ``v`` of a struct ``S``.
    "upsert": (
        "t.id = s.id",
        [clause("matched", "update_all"), clause("notMatched", "insert_all")],
        {},
        frozenset({"id", "S"}),
    ),
    "conditional-upsert": (
        "t.id = s.id",
        [clause("matched", "update_all", "t.v LIKE 't%' AND s.n > 0"), clause("notMatched", "insert_all")],
        {},
        frozenset({"id", "v", "S"}),
    ),
    "delete-and-insert": (
        "t.id = s.id",
        [clause("matched", "delete", "t.st.a % 40 = 0"), clause("notMatched", "insert_all")],
        {},
        frozenset({"id", "st", "S"}),
    ),
    # An UPDATE SET of some columns keeps the others: they are read.
    "kept-columns": (
        "t.id = s.id",
        [clause("matched", "update", v="s.v"), clause("notMatched", "insert", id="s.id", v="s.v")],
        {},
        ALL - {"v"},
    ),
    "target-conditions": (
        "t.id = s.id",
        [
            clause("matched", "update", "t.n % 4 = 0", n="t.n + s.n"),
            clause("matched", "delete", "t.S > 3"),
            clause("notMatched", "insert_all"),
        ],
        {},
        ALL,
    ),
    "struct-field": ("t.id = s.id", [clause("matched", "update", **{"st.a": "t.st.a + s.n"})], {}, ALL),
    "bare-names": (
        "t.id = s.id",
        [clause("matched", "update", "`odd.col` LIKE 't.%'", v="concat(`odd.col`, '/', s.v)")],
        {"drop": "odd.col"},
        ALL - {"v"},
    ),
    "not-matched-by-source": (
        "t.id = s.id",
        [
            clause("matched", "update_all"),
            clause("notMatchedBySource", "delete", "t.n > 280"),
            clause("notMatchedBySource", "update", "t.n < 100", v="concat(st.b, '!')"),
        ],
        {},
        ALL - {"v"},
    ),
    "upper-case": (
        "T.ID = S.ID AND T.st.a >= 0",
        [clause("matched", "update_all", "T.`odd.col` <> S.V")],
        {},
        frozenset({"id", "st", "odd.col", "S"}),
    ),
    "schema-evolution": (
        "t.id = s.id",
        [clause("matched", "update_all"), clause("notMatched", "insert_all")],
        {"schema_evolution": True, "extra": True},
        frozenset({"id", "S"}),
    ),
}


def _live(path: Path) -> list[dict[str, Any]]:
    return sorted(read_with_deltalake(path).to_pylist(), key=lambda r: r["id"])


@pytest.mark.parametrize("join", ["broadcast", "shuffled"])
@pytest.mark.parametrize("name", list(CASES))
def test_merge_on_read_equals_copy_on_write(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, join: str
) -> None:
    on, clauses, case_options, expected_read = CASES[name]
    options = dict(case_options)
    ids = [*range(0, 60, 3), *range(200, 230, 2), 1001, 1003]
    rows = _rows(ids, "s", extra=bool(options.pop("extra", False)))
    if "drop" in options:
        rows = rows.drop_columns([options.pop("drop")])
    source = write_table(tmp_path / "source", rows)
    read: list[frozenset[str] | None] = []
    real = MergeOnReadExecutor._sides_for_write

    def recorded(self: MergeOnReadExecutor, **kwargs: Any) -> Any:
        read.append(kwargs.get("columns"))
        return real(self, **kwargs)

    results = {}
    for dv in (True, False):
        target = _target(tmp_path / f"target-{dv}", deletion_vectors=dv)
        with join_plan(broadcast=join == "broadcast"), monkeypatch.context() as patched:  # type: ignore[arg-type]
            patched.setattr(MergeOnReadExecutor, "_sides_for_write", recorded)
            results[dv] = run_merge(spark, make_spec(target, source, on, clauses, **options))
    on_read, on_write = results[True], results[False]
    assert on_read.metrics["numTargetDeletionVectorsAdded"] > 0
    assert on_read.result == on_write.result
    assert _live(tmp_path / "target-True") == _live(tmp_path / "target-False")
    assert read == [expected_read]


def test_a_change_data_feed_write_reads_every_column(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Its delete and update_preimage rows carry the target row as it was."""
    path = tmp_path / "target"
    write_deltalake(str(path), _rows(list(range(0, 100, 2)), "t"), configuration={"delta.enableChangeDataFeed": "true"})
    enable_deletion_vectors(path)
    source = write_table(tmp_path / "source", _rows([2, 4, 7], "s"))
    read: list[frozenset[str] | None] = []
    real = MergeOnReadExecutor._sides_for_write

    def recorded(self: MergeOnReadExecutor, **kwargs: Any) -> Any:
        read.append(kwargs.get("columns"))
        return real(self, **kwargs)

    monkeypatch.setattr(MergeOnReadExecutor, "_sides_for_write", recorded)
    clauses = [
        clause("matched", "delete", "s.id = 2"),
        clause("matched", "update_all"),
        clause("notMatched", "insert_all"),
    ]
    result = run_merge(spark, make_spec(path, source, "t.id = s.id", clauses))
    assert read == [None]
    assert result.metrics["numTargetRowsDeleted"] == 1 and result.metrics["numTargetRowsUpdated"] == 1
    live = _live(path)
    assert [r["id"] for r in live] == sorted([i for i in range(0, 100, 2) if i != 2] + [7])
    assert next(r for r in live if r["id"] == 4)["v"] == "s4"


TARGET = ["id", "v", "n", "st", "odd.col"]


@pytest.mark.parametrize(
    ("texts", "expected"),
    [
        (["`t`.`id` = `s`.`id`", "`s`.`v`", "`s`.`n`"], {"id"}),
        (["t.id = s.id", "`t`.`n`", "concat(t.v, s.v)"], {"id", "n", "v"}),
        (["T.ID = s.id"], {"id"}),
        # A struct's field: its column.
        (["t.id = s.id", "t.st.a + 1", "`t`.`st`.`b`"], {"id", "st"}),
        # Unqualified: any part may name a target column.
        (["n + 1", "st.b"], {"n", "st"}),
        (["`odd.col`", "`t`.`odd.col`"], {"odd.col"}),
        (["transform(array(t.n), x -> x + 1)"], {"n"}),
        (["true", "s.id"], set()),
    ],
)
def test_target_columns_read(texts: list[str], expected: set[str]) -> None:
    assert target_columns_read(texts, TARGET, target_alias="t", source_alias="s") == frozenset(expected)


def test_a_target_column_named_like_the_source_alias_is_read_with_the_source() -> None:
    """``s.x`` could be the field ``x`` of the target's struct ``S``."""
    columns = [*TARGET, "S"]
    assert target_columns_read(["s.id"], columns, target_alias="t", source_alias="s") == {"S"}
    assert target_columns_read(["src.id"], columns, target_alias="t", source_alias="src") == frozenset()


@pytest.mark.parametrize("texts", [["struct(t.*)"], ["count(*)"], ["t.id = s.id", "((("]])
def test_a_star_or_an_unreadable_text_reads_every_column(texts: list[str]) -> None:
    assert target_columns_read(texts, TARGET, target_alias="t", source_alias="s") is None
