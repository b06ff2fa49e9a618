"""Random merges over tables whose column names are Spark keywords (any case), unicode, start with a digit or an
underscore (a partition column's ``_x=...`` folders among them) or hold backticks, in the structured and the SQL
form, keys and references written bare, backquoted or behind the alias; a clause that sees the source only names
its columns unqualified where Spark reads the word as a column. Each merge's rows, read back with deltalake
(delta-rs), are compared with a small reference model of Delta's MERGE written here. ``COLUMN_NAMES_EXAMPLES`` sets
the number of examples (a few dozen by default); a long run of 1000 needs ``--timeout 0`` beside it (the suite stops
any test at 900 s).

Names with spaces, dots, commas and the other characters Delta allows only with column mapping are not drawn here
(deltalake writes these tables without it): ``tests/oracle/test_column_mapping.py`` merges such names."""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st
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
from engine.delta.names import quote_identifier
from tests.engine.harness import rows, write_table
from tests.engine.test_column_names import merge_sql

EXAMPLES = int(os.environ.get("COLUMN_NAMES_EXAMPLES", "20"))
KEYWORDS = [
    line.strip()
    for line in (Path(__file__).parent / "spark_keywords.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]
_ASCII_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NOT_WITHOUT_COLUMN_MAPPING = set(" ,;{}()\n\t=.")
EXPRESSION_WORDS = frozenset(
    """and any as between case current_date current_timestamp current_user distinct else except false ilike insert
    like not null or session_user then true when""".split()  # noqa: SIM905
)
"""Keywords that mean something standing alone in an expression (or, for insert, after THEN): such a column is
written qualified or backquoted there."""

Row = dict[str, Any]


# --- names -------------------------------------------------------------------------------------------------------


@st.composite
def keyword_names(draw: st.DrawFn) -> str:
    word = draw(st.sampled_from(KEYWORDS))
    cases = draw(st.lists(st.booleans(), min_size=len(word), max_size=len(word)))
    return "".join(c.upper() if up else c.lower() for c, up in zip(word, cases, strict=True))


NAMES = st.one_of(
    keyword_names(),
    st.text(alphabet="éÜßøñ漢字абвxyzXYZ_", min_size=1, max_size=5),
    st.builds(lambda d, rest: d + rest, st.sampled_from("0123456789"), st.text(alphabet="abcdeXYZ_0", max_size=4)),
    st.builds(
        lambda a, b: a + "`" + b, st.one_of(keyword_names(), st.text("ab`", max_size=2)), st.text("cd`", max_size=2)
    ),
    st.builds(lambda rest: "_" + rest, st.text(alphabet="abcXYZ_0é", max_size=4)),
).filter(lambda n: not (set(n) & _NOT_WITHOUT_COLUMN_MAPPING) and n.lower() != "id")


# --- merges ------------------------------------------------------------------------------------------------------

Value = tuple[Any, ...]
"""``("col", side, name, k)`` is side.name + k; ``("lit", k)``; ``("null",)``."""
Condition = tuple[Any, ...] | None
"""``("gt", side, name, k)``, ``("isnull", side, name)``, or None for no condition."""


@dataclass(frozen=True)
class Clause:
    kind: str
    condition: Condition
    delete: bool
    assignments: tuple[tuple[str, Value], ...]


@st.composite
def merges(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(NAMES, min_size=1, max_size=4, unique_by=str.lower))
    values = st.one_of(st.none(), st.integers(-3, 3))
    target_ids = draw(st.lists(st.integers(0, 7), max_size=5, unique=True))
    source_ids = draw(st.lists(st.integers(0, 7), max_size=5, unique=True))
    target = [{"id": i, **{n: draw(values) for n in names}} for i in target_ids]
    source = [{"id": i, **{n: draw(values) for n in names}} for i in source_ids]

    def condition(sides: list[str]) -> Condition:
        side, name = draw(st.sampled_from(sides)), draw(st.sampled_from(names))
        if draw(st.booleans()):
            return ("gt", side, name, draw(st.integers(-3, 3)))
        return ("isnull", side, name)

    def value(sides: list[str]) -> Value:
        kind = draw(st.sampled_from(["col", "lit", "null"]))
        if kind == "col":
            return ("col", draw(st.sampled_from(sides)), draw(st.sampled_from(names)), draw(st.integers(-1, 1)))
        return ("lit", draw(st.integers(-3, 3))) if kind == "lit" else ("null",)

    clauses: list[Clause] = []
    for kind, sides in (("matched", ["t", "s"]), ("notMatched", ["s"])):
        count = draw(st.integers(0, 2))
        for i in range(count):
            cond = condition(sides) if i < count - 1 or draw(st.booleans()) else None
            if kind == "matched" and draw(st.booleans()):
                clauses.append(Clause(kind, cond, True, ()))
                continue
            assigned = draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
            pairs = tuple((n, value(sides)) for n in assigned)
            if kind == "notMatched":
                pairs = (("id", ("col", "s", "id", 0)), *pairs)
            clauses.append(Clause(kind, cond, False, pairs))
    if not clauses:
        clauses.append(Clause("matched", None, True, ()))
    on_extra = condition(["t"]) if draw(st.booleans()) else None
    return {
        "names": names,
        "target": target,
        "source": source,
        "clauses": clauses,
        "on_extra": on_extra,
        "form": draw(st.sampled_from(["structured", "sql"])),
        "bare": draw(st.booleans()),
        "key_styles": draw(st.lists(st.sampled_from(["bare", "quoted", "alias"]), min_size=8, max_size=8)),
        "partition": draw(st.sampled_from([None, *names])) if names else None,
    }


# --- the reference model -----------------------------------------------------------------------------------------


def evaluate(value: Value, t: Row | None, s: Row) -> Any:
    if value[0] == "col":
        _, side, name, k = value
        v = (t if side == "t" else s)[name]  # type: ignore[index]
        return None if v is None else v + k
    return value[1] if value[0] == "lit" else None


def holds(condition: Condition, t: Row | None, s: Row | None) -> bool:
    if condition is None:
        return True
    row = t if condition[1] == "t" else s
    assert row is not None
    v = row[condition[2]]
    return v is None if condition[0] == "isnull" else (v is not None and v > condition[3])


def model(case: dict[str, Any]) -> list[Row]:
    """Delta's MERGE on the case's rows: the first clause whose condition holds acts (source ids are unique)."""
    columns = ["id", *case["names"]]
    out: list[Row] = []
    matched_ids = set()
    for t in case["target"]:
        s = next((s for s in case["source"] if s["id"] == t["id"] and holds(case["on_extra"], t, None)), None)
        if s is None:
            out.append(t)
            continue
        matched_ids.add(s["id"])
        clause = next((c for c in case["clauses"] if c.kind == "matched" and holds(c.condition, t, s)), None)
        if clause is None:
            out.append(t)
        elif not clause.delete:
            out.append({**t, **{n: evaluate(v, t, s) for n, v in clause.assignments}})
    for s in case["source"]:
        if s["id"] in matched_ids:
            continue
        clause = next((c for c in case["clauses"] if c.kind == "notMatched" and holds(c.condition, None, s)), None)
        if clause is not None:
            out.append({c: None for c in columns} | {n: evaluate(v, None, s) for n, v in clause.assignments})
    return out


# --- the spec, written as a user would -----------------------------------------------------------------------------


def reference(side: str, name: str, bare: bool, unqualified: bool = False) -> str:
    """``side.name``; or, in a clause that sees the source only, the name alone where Spark reads it as a column."""
    plain = bare and _ASCII_NAME.fullmatch(name)
    if unqualified and plain and name.lower() not in EXPRESSION_WORDS:
        return name
    return f"{side}.{name if plain else quote_identifier(name)}"


def key(name: str, style: str, form: str, insert: bool) -> str:
    """A SET or VALUES key: bare where the form reads it bare, backquoted, or behind the target's alias."""
    bare_ok = "`" not in name and (form == "structured" or _ASCII_NAME.fullmatch(name))
    written = name if style != "quoted" and bare_ok else quote_identifier(name)
    return f"t.{written}" if style == "alias" and not (insert and form == "sql") else written


def condition_sql(condition: Condition, bare: bool, unqualified: bool = False) -> str | None:
    if condition is None:
        return None
    ref = reference(condition[1], condition[2], bare, unqualified)
    return f"{ref} IS NULL" if condition[0] == "isnull" else f"{ref} > {condition[3]}"


def value_sql(value: Value, bare: bool, unqualified: bool = False) -> str:
    if value[0] == "col":
        ref = reference(value[1], value[2], bare, unqualified)
        return f"{ref} + {value[3]}" if value[3] else ref
    return str(value[1]) if value[0] == "lit" else "NULL"


def to_spec(case: dict[str, Any], target: Path, source: Path) -> MergeSpec:
    bare, form, styles = case["bare"], case["form"], itertools.cycle(case["key_styles"])
    clauses = []
    for c in case["clauses"]:
        if c.delete:
            action: Any = DeleteAction()
        else:
            insert = c.kind == "notMatched"
            pairs = {key(n, next(styles), form, insert): value_sql(v, bare, insert) for n, v in c.assignments}
            action = InsertAction(values=pairs) if insert else UpdateAction(set=pairs)
        clauses.append(MergeClause(c.kind, action, condition_sql(c.condition, bare, c.kind == "notMatched")))
    extra = condition_sql(case["on_extra"], bare)
    return MergeSpec(
        target=str(target),
        source=TableSource(format="delta", path=str(source)),
        on="t.id = s.id" + (f" AND {extra}" if extra else ""),
        matched=tuple(c for c in clauses if c.clause_type == "matched"),
        not_matched=tuple(c for c in clauses if c.clause_type == "notMatched"),
        target_alias="t",
        source_alias="s",
    )


def to_arrow(data: list[Row], columns: list[str]) -> pa.Table:
    return pa.table({c: pa.array([r[c] for r in data], pa.int64()) for c in columns})


_counter = itertools.count()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
@given(case=merges())
def test_random_merges_over_odd_names(spark: SparkSession, tmp_path: Path, case: dict[str, Any]) -> None:
    columns = ["id", *case["names"]]
    folder = tmp_path / f"case{next(_counter)}"
    partition = [case["partition"]] if case["partition"] else None
    target = write_table(folder / "target", to_arrow(case["target"], columns), partition_by=partition)
    source = write_table(folder / "source", to_arrow(case["source"], columns))
    spec = to_spec(case, target, source)
    if case["form"] == "sql":
        text = merge_sql(spec)
        note(text)
        spec = parse_merge_sql(text)
    else:
        note(repr(spec))
    run_merge(spark, spec)
    expected = sorted(
        (tuple(r[c] for c in columns) for r in model(case)), key=lambda r: tuple((v is not None, str(v)) for v in r)
    )
    assert rows(target, columns) == expected
