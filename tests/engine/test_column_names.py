"""Every column name Delta accepts without column mapping, in every place a merge names a column: the keys of SET
and VALUES, ON and clause conditions, in the structured and the SQL form; rows read back with deltalake
(delta-rs) and compared with rows computed here by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from engine import InsertAction, MergeClause, MergeSpec, TableSource, UpdateAction, parse_merge_sql, run_merge
from engine.delta.names import ColumnPathError, parse_column_path, quote_identifier, quote_path
from engine.errors import MergeSpecError
from engine.expressions import column_path
from tests.engine.harness import rows, write_table

NAMES = ["comment", "desc", "select", "from", "case", "null", "a`b"]
"""Keywords sqlglot reads as statements or literals, and a backtick, which Delta allows without column mapping."""


def written(name: str) -> str:
    """A name as written bare where Spark allows it: one with a backtick must be backquoted."""
    return quote_identifier(name) if "`" in name else name


def merge_sql(spec: MergeSpec) -> str:
    """The SQL form of a structured spec over path tables, as a user would write it."""
    assert isinstance(spec.source, TableSource)
    text = (
        f"MERGE INTO delta.{quote_identifier(spec.target)} AS {spec.target_alias} "
        f"USING delta.{quote_identifier(spec.source.path)} AS {spec.source_alias} ON {spec.on}"
    )
    for c in (*spec.matched, *spec.not_matched):
        condition = f" AND {c.condition}" if c.condition else ""
        head = "WHEN MATCHED" if c.clause_type == "matched" else "WHEN NOT MATCHED"
        if isinstance(c.action, UpdateAction):
            action = (
                "UPDATE SET *"
                if c.action.star
                else "UPDATE SET " + ", ".join(f"{k} = {v}" for k, v in c.action.set.items())
            )
        else:
            assert isinstance(c.action, InsertAction)
            values = c.action.values
            action = (
                "INSERT *" if c.action.star else f"INSERT ({', '.join(values)}) VALUES ({', '.join(values.values())})"
            )
        text += f" {head}{condition} THEN {action}"
    return text


def run(spark: SparkSession, spec: MergeSpec, form: str) -> None:
    run_merge(spark, parse_merge_sql(merge_sql(spec)) if form == "sql" else spec)


def spec(target: Path, source: Path, on: str, *clauses: MergeClause) -> MergeSpec:
    return MergeSpec(
        target=str(target),
        source=TableSource(format="delta", path=str(source)),
        on=on,
        matched=tuple(c for c in clauses if c.clause_type == "matched"),
        not_matched=tuple(c for c in clauses if c.clause_type == "notMatched"),
        target_alias="t",
        source_alias="s",
    )


def table(ids: list[int], value: Any) -> pa.Table:
    """``id`` and every name of NAMES, each holding ``value(id)``."""
    return pa.table(
        {"id": pa.array(ids, pa.int64()), **{n: pa.array([value(i) for i in ids], pa.int64()) for n in NAMES}}
    )


# --- reading a column path ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("comment", ("comment",)),
        ("select", ("select",)),
        ("null", ("null",)),
        ("`a``b`", ("a`b",)),
        ("`a.b`.c", ("a.b", "c")),
        (" t . `from` ", ("t", "from")),
        ("1st", ("1st",)),
        ("été.Ünïcode", ("été", "Ünïcode")),
        ("````", ("`",)),
    ],
)
def test_a_column_path_is_read_as_spark_reads_an_attribute_name(text: str, parts: tuple[str, ...]) -> None:
    assert parse_column_path(text) == parts
    assert parse_column_path(quote_path(parts)) == parts


@pytest.mark.parametrize("text", ["a`b", "`a", "a.", ".a", "", "`a`b", "a..b"])
def test_a_column_path_spark_refuses_is_refused(text: str) -> None:
    with pytest.raises(ColumnPathError):
        parse_column_path(text)


def test_a_key_that_starts_with_the_alias_resolves_as_spark_resolves_it() -> None:
    # ``t.col`` is the column col when the target has one; else the field col of a struct column named t.
    assert column_path("t.col", "t", {"t", "col"}) == ("col",)
    assert column_path("T.col", "t", {"t"}) == ("t", "col")
    assert column_path("t", "t", {"t"}) == ("t",)
    assert column_path("`t`.`select`", "t") == ("select",)
    with pytest.raises(MergeSpecError, match=r"when_matched\[0\]\.set\.a`b: a backtick"):
        column_path("a`b", "t", where="when_matched[0].set.a`b")


# --- every name in every place, in both forms -------------------------------------------------------------------


@pytest.mark.parametrize("form", ["structured", "sql"])
@pytest.mark.parametrize("name", NAMES)
def test_every_name_is_set_inserted_and_read_in_on_and_conditions(
    spark: SparkSession, tmp_path: Path, name: str, form: str
) -> None:
    target = write_table(tmp_path / "target", table([1, 2, 3], lambda i: 10 * i))
    source = write_table(tmp_path / "source", table([2, 3, 4], lambda i: 10 * i + 5))
    ref = written(name)
    # The key is written bare, backquoted and behind the alias, by turns.
    keys = [ref, quote_identifier(name), f"t.{ref}"]
    merge = spec(
        target,
        source,
        f"t.id = s.id AND t.{ref} > 20",
        MergeClause(
            "matched", UpdateAction(set={keys[len(name) % 3]: f"s.{ref} + 1"}), f"s.{ref} > 30 AND t.{ref} < 40"
        ),
        MergeClause(
            "notMatched",
            InsertAction(values={"id": "s.id", keys[(len(name) + 1) % 3 if form == "structured" else 0]: f"s.{ref}"}),
            f"s.{ref} > 20",
        ),
    )
    run(spark, merge, form)

    others = [n for n in NAMES if n != name]
    got = rows(target, ["id", name, *others])
    # id 2 misses ON by its target value (20), so the source row is inserted beside it; id 3 is updated.
    assert got == sorted(
        [
            (1, 10, *[10] * len(others)),
            (2, 20, *[20] * len(others)),
            (2, 25, *[None] * len(others)),
            (3, 36, *[30] * len(others)),
            (4, 45, *[None] * len(others)),
        ],
        key=lambda r: tuple((v is not None, str(v)) for v in r),
    )
