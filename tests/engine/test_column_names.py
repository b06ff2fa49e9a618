"""Every column name Delta accepts without column mapping, in every place a merge names a column: the keys of SET
and VALUES, ON and clause conditions, in the structured and the SQL form; rows read back with deltalake
(delta-rs) and compared with rows computed here by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from engine import (
    DeleteAction,
    InsertAction,
    MergeClause,
    MergeSpec,
    TableSource,
    UpdateAction,
    parse_merge_sql,
    run_merge,
)
from engine.delta.names import ColumnPathError, parse_column_path, quote_identifier, quote_path
from engine.errors import MergeResolutionError, MergeSpecError
from engine.validation import column_path, validate_spec
from tests.engine.delta.dv_tables import enable_deletion_vectors, read_with_deltalake
from tests.engine.harness import make_spec, rows, write_table
from tests.oracle.tables import latest_version, log_actions

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
        if isinstance(c.action, DeleteAction):
            action = "DELETE"
        elif isinstance(c.action, UpdateAction):
            sets = ", ".join(f"{k} = {v}" for k, v in c.action.set.items())
            action = "UPDATE SET *" if c.action.star else f"UPDATE SET {sets}"
        else:
            columns, values = ", ".join(c.action.values), ", ".join(c.action.values.values())
            action = "INSERT *" if c.action.star else f"INSERT ({columns}) VALUES ({values})"
        text += f" {head}{condition} THEN {action}"
    return text


def run(spark: SparkSession, spec: MergeSpec, form: str) -> None:
    run_merge(spark, parse_merge_sql(merge_sql(spec)) if form == "sql" else spec)


def spec(target: Path, source: Path, on: str, *clauses: MergeClause) -> MergeSpec:
    return make_spec(target, source, on, clauses)


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


@pytest.mark.parametrize("form", ["structured", "sql"])
def test_keyword_columns_through_star_actions_and_odd_partition_values(
    spark: SparkSession, tmp_path: Path, form: str
) -> None:
    """What worked before keeps working: UPDATE SET * and INSERT * over keyword columns, a keyword partition
    column whose values hold ``/ % =``, spaces and NULL, and a name starting with a digit."""
    schema = pa.schema([("id", pa.int64()), ("select", pa.string()), ("comment", pa.int64()), ("1st", pa.int64())])
    target = write_table(
        tmp_path / "target",
        pa.table([[1, 2, 3], ["a/b", "50%", None], [10, 20, 30], [1, 2, 3]], schema=schema),
        partition_by=["select"],
    )
    source = write_table(
        tmp_path / "source",
        pa.table([[2, 3, 4, 5], ["k=v", None, "with space", None], [21, 31, 41, 51], [7, 8, 9, 10]], schema=schema),
    )
    merge = spec(
        target,
        source,
        "t.id = s.id AND t.comment < 100",
        MergeClause("matched", UpdateAction(star=True), "s.`1st` > 7"),
        MergeClause("notMatched", InsertAction(star=True), "s.select IS NOT NULL OR s.comment > 50"),
    )
    run(spark, merge, form)
    assert rows(target, ["id", "select", "comment", "1st"]) == [
        (1, "a/b", 10, 1),
        (2, "50%", 20, 2),
        (3, None, 31, 8),
        (4, "with space", 41, 9),
        (5, None, 51, 10),
    ]


def _add_check_constraint(table: Path, name: str, expression: str) -> None:
    """A CHECK constraint as Delta's ALTER TABLE ADD CONSTRAINT records it, in Spark SQL (deltalake writes its own
    dialect, which quotes names in double quotes)."""
    log = table / "_delta_log"
    actions = [json.loads(line) for line in (log / f"{0:020d}.json").read_text().splitlines() if line.strip()]
    protocol = next(a["protocol"] for a in actions if "protocol" in a)
    metadata = next(a["metaData"] for a in actions if "metaData" in a)
    metadata["configuration"][f"delta.constraints.{name}"] = expression
    (log / f"{1:020d}.json").write_text(json.dumps({"protocol": protocol}) + "\n" + json.dumps({"metaData": metadata}))


@pytest.mark.parametrize("form", ["structured", "sql"])
def test_backticks_in_struct_fields_constraints_statistics_and_change_data(
    spark: SparkSession, tmp_path: Path, form: str
) -> None:
    record = pa.struct([("x`y", pa.int64())])
    schema = pa.schema([("id", pa.int64()), ("a`b", pa.int64()), ("rec", record)])
    target = write_table(
        tmp_path / "target",
        pa.table([[1, 2], [1, 2], [{"x`y": 1}, {"x`y": 2}]], schema=schema),
        configuration={
            "delta.enableChangeDataFeed": "true",
            "delta.dataSkippingStatsColumns": "id,`a``b`,rec.`x``y`",
        },
    )
    _add_check_constraint(target, "positive", "`a``b` > 0")
    source = write_table(tmp_path / "source", pa.table([[2, 3], [5, 6], [None, None]], schema=schema))
    merge = spec(
        target,
        source,
        "t.id = s.id",
        MergeClause("matched", UpdateAction(set={"`a``b`": "s.`a``b` * 10", "rec.`x``y`": "s.`a``b`"})),
        MergeClause("notMatched", InsertAction(values={"id": "s.id", "`a``b`": "s.`a``b`"})),
    )
    run(spark, merge, form)
    assert rows(target, ["id", "a`b", "rec"]) == [(1, 1, {"x`y": 1}), (2, 50, {"x`y": 5}), (3, 6, None)]

    # Statistics name the columns as the schema does, backtick and all.
    log = (target / "_delta_log" / f"{2:020d}.json").read_text().splitlines()
    stats = [json.loads(a["add"]["stats"]) for a in map(json.loads, log) if "add" in a]
    assert max(s["maxValues"]["a`b"] for s in stats) == 50
    assert max(s["maxValues"]["rec"]["x`y"] for s in stats if "rec" in s["maxValues"]) == 5
    table = DeltaTable(str(target))
    changes = table.load_cdf(starting_version=2).read_all()
    kinds, ids, values = (changes.column(n).to_pylist() for n in ("_change_type", "id", "a`b"))
    assert sorted(zip(kinds, ids, values, strict=True)) == [
        ("insert", 3, 6),
        ("update_postimage", 2, 50),
        ("update_preimage", 2, 2),
    ]

    # A row that breaks the CHECK constraint on ``a`b`` fails the merge, and the table is unchanged.
    version = table.version()
    bad = write_table(tmp_path / "bad", pa.table([[1], [-1], [None]], schema=schema))
    failing = spec(target, bad, "t.id = s.id", MergeClause("matched", UpdateAction(set={"`a``b`": "s.`a``b`"})))
    with pytest.raises(Exception, match=r"CHECK constraint positive"):
        run(spark, failing, form)
    assert DeltaTable(str(target)).version() == version


@pytest.mark.parametrize(
    ("statement", "message"),
    [
        # Spark's parser refuses both; the error names the place.
        ("UPDATE SET a`b = s.id", r"^sql: cannot parse the MERGE statement"),
        ("UPDATE SET été = s.id", r"^sql: \[INVALID_IDENTIFIER\] The unquoted identifier été .* `été`"),
        ("UPDATE SET comment = s.comment, COMMENT = 1", r"^sql: clause 1: the column `COMMENT` is assigned twice"),
        ("UPDATE SET t.comment = 1, COMMENT = 2", r"conflict from these SET columns: `comment` and `comment`"),
    ],
)
def test_sql_refuses_names_spark_refuses(statement: str, message: str) -> None:
    text = f"MERGE INTO delta.`/lake/t` AS t USING delta.`/lake/s` AS s ON t.id = s.id WHEN MATCHED THEN {statement}"
    with pytest.raises(MergeSpecError, match=message):
        validate_spec(parse_merge_sql(text))


def test_unknown_keys_are_named_as_spark_prints_them(spark: SparkSession, tmp_path: Path) -> None:
    target = write_table(tmp_path / "target", table([1], lambda i: i))
    merge = spec(target, target, "t.id = s.id", MergeClause("matched", UpdateAction(set={"`no``such`.x": "1"})))
    with pytest.raises(MergeResolutionError, match=r"when_matched\[0\]\.set: `no``such`\.`x` is not a column"):
        run_merge(spark, merge)


@pytest.mark.parametrize("form", ["structured", "sql"])
def test_bare_statement_words_are_columns_in_conditions_and_values(
    spark: SparkSession, tmp_path: Path, form: str
) -> None:
    """Spark reads ``comment``, ``desc``, ``select`` and ``from`` standing alone in an expression as columns; a NOT
    MATCHED clause sees the source only, so they need no qualifier there."""
    target = write_table(tmp_path / "target", table([1], lambda i: i))
    source = write_table(tmp_path / "source", table([1, 2, 3], lambda i: 10 * i))
    merge = spec(
        target,
        source,
        "t.id = s.id",
        MergeClause(
            "notMatched",
            InsertAction(values={"id": "id", "comment": "desc + 1", "desc": "CASE WHEN from > 25 THEN select END"}),
            "comment > 10 AND select IS NOT NULL",
        ),
    )
    run(spark, merge, form)
    assert rows(target, ["id", "comment", "desc", "select"]) == [(1, 1, 1, 1), (2, 21, None, None), (3, 31, 30, None)]


@pytest.mark.parametrize("kind", ["plain", "change data feed", "deletion vectors"])
def test_columns_named_with_a_leading_underscore_partition_and_key(
    spark: SparkSession, tmp_path: Path, kind: str
) -> None:
    """A partition column named ``_p``: Spark writes its files under ``_p=...`` folders, which are the table's
    partitions, not hidden folders like ``_temporary``. Every updated and inserted row is committed, in old
    partitions and new ones, whichever way the merge writes."""
    schema = pa.schema([("_id", pa.int64()), ("_p", pa.string()), ("_v", pa.int64())])
    configuration = {"delta.enableChangeDataFeed": "true"} if kind == "change data feed" else None
    target = write_table(
        tmp_path / "target",
        pa.table([[1, 2, 3, 4], ["a", "a", "b+%21", None], [10, 20, 30, 40]], schema=schema),
        partition_by=["_p"],
        configuration=configuration,
    )
    if kind == "deletion vectors":
        enable_deletion_vectors(target)
    source = write_table(
        tmp_path / "source", pa.table([[2, 3, 5, 6], ["a", "b+%21", "c", None], [21, 31, 51, 61]], schema=schema)
    )
    merge = spec(
        target,
        source,
        "t._id = s._id",
        MergeClause("matched", UpdateAction(star=True)),
        MergeClause("notMatched", InsertAction(star=True)),
    )
    result = run_merge(spark, merge)
    assert (result.result["num_updated_rows"], result.result["num_inserted_rows"]) == (2, 2)
    got = read_with_deltalake(target, order_by="_id")
    assert got.select(["_id", "_p", "_v"]).to_pylist() == [
        {"_id": 1, "_p": "a", "_v": 10},
        {"_id": 2, "_p": "a", "_v": 21},
        {"_id": 3, "_p": "b+%21", "_v": 31},
        {"_id": 4, "_p": None, "_v": 40},
        {"_id": 5, "_p": "c", "_v": 51},
        {"_id": 6, "_p": None, "_v": 61},
    ]
    adds = [a["add"] for a in log_actions(target, latest_version(target)) if "add" in a]
    assert any(a.get("deletionVector") for a in adds) == (kind == "deletion vectors")
