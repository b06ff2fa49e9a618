"""Random merges (hypothesis): random schemas and values, NULL and duplicate keys, random ordered clause sets,
partitioned or not, empty source or target. Each is checked two independent ways:

- against a small reference model of Delta's MERGE semantics written here in plain Python, always; it is the
  judge where Delta's rules differ from delta-rs (the multiple-match check, which delta-rs does not make);
- against deltalake's own merge of the same data whenever no target row has several matches.

200 in ``make test`` (100 more in one pass); ``MERGE_RANDOM_EXAMPLES`` sets the number for a long run.
"""

from __future__ import annotations

import datetime as dt
import decimal
import itertools
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from engine import MergeClause, run_merge
from engine.errors import MultipleMatchError
from tests.engine.harness import clause, find_plan, join_plan, make_spec, oracle_merge, rows, write_table

EXAMPLES = int(os.environ.get("MERGE_RANDOM_EXAMPLES", "200"))

Row = dict[str, Any]
Counts = dict[str, int]

# --- value types ------------------------------------------------------------------------------------------------

TYPES: dict[str, tuple[pa.DataType, st.SearchStrategy[Any], Callable[[Any], str]]] = {
    "long": (pa.int64(), st.integers(-5, 5), lambda v: str(v)),
    "string": (pa.string(), st.sampled_from(["a", "b", "", "zz"]), lambda v: f"'{v}'"),
    "double": (pa.float64(), st.sampled_from([0.5, -1.25, 3.0]), lambda v: repr(v)),
    "date": (
        pa.date32(),
        st.sampled_from([dt.date(2024, 1, 1), dt.date(1999, 12, 31)]),
        lambda v: f"DATE '{v.isoformat()}'",
    ),
    "decimal": (
        pa.decimal128(10, 2),
        st.sampled_from([decimal.Decimal("1.50"), decimal.Decimal("-2.25")]),
        lambda v: f"CAST('{v}' AS DECIMAL(10,2))",
    ),
    "bool": (pa.bool_(), st.booleans(), lambda v: "true" if v else "false"),
}


# --- conditions: SQL text for both engines, and the same predicate in three-valued Python ---------------------


@dataclass(frozen=True)
class Cond:
    sql: str
    scope: str  # "both", "source", "target"
    fn: Callable[[Row | None, Row | None], bool | None]

    def holds(self, t: Row | None, s: Row | None) -> bool:
        return self.fn(t, s) is True


def _cmp(a: Any, b: Any, op: str) -> bool | None:
    if a is None or b is None:
        return None
    return {"<": a < b, ">": a > b, "=": a == b}[op]


def conditions(value_col: str) -> list[Cond]:
    return [
        Cond("s.k > 2", "source", lambda t, s: _cmp(s["k"], 2, ">")),  # type: ignore[index]
        Cond(f"s.{value_col} IS NULL", "source", lambda t, s: s[value_col] is None),  # type: ignore[index]
        Cond("t.k < 3", "target", lambda t, s: _cmp(t["k"], 3, "<")),  # type: ignore[index]
        Cond(f"t.{value_col} IS NOT NULL", "target", lambda t, s: t[value_col] is not None),  # type: ignore[index]
        Cond(
            "t.k = s.k AND s.k % 2 = 0",
            "both",
            lambda t, s: None if s["k"] is None else (t["k"] == s["k"] and s["k"] % 2 == 0),
        ),  # type: ignore[index]
    ]


# --- the reference model ----------------------------------------------------------------------------------------


class ModelMultipleMatch(Exception):
    pass


@dataclass(frozen=True)
class ModelClause:
    kind: str  # matched, notMatched, notMatchedBySource
    action: str  # update_all, update, delete, insert_all, insert
    cond: Cond | None
    assign: dict[str, Callable[[Row | None, Row | None], Any]]
    assign_sql: dict[str, str]

    def engine_clause(self) -> MergeClause:
        return clause(self.kind, self.action, self.cond.sql if self.cond else None, **self.assign_sql)


@dataclass(frozen=True)
class On:
    """A merge condition: SQL text for both engines, and when it holds in Python."""

    sql: str
    fn: Callable[[Row, Row], bool]


ONS = [
    On("t.k = s.k", lambda t, s: t["k"] is not None and s["k"] == t["k"]),
    On("t.k <=> s.k", lambda t, s: s["k"] == t["k"]),
    On("t.k = s.k AND s.k > 1", lambda t, s: t["k"] is not None and s["k"] == t["k"] and t["k"] > 1),
    On("s.k = t.k AND t.k < 5", lambda t, s: t["k"] is not None and s["k"] == t["k"] and t["k"] < 5),
]


def has_multiple_matches(target: list[Row], source: list[Row], on: On = ONS[0]) -> bool:
    return any(sum(1 for s in source if on.fn(t, s)) > 1 for t in target)


def skippable_rows(target: list[Row], clauses: list[ModelClause], partitioned: bool) -> set[int]:
    """The target rows that data skipping may leave out of a matched-only merge: Delta skips files by the
    target-only conjuncts of the WHEN MATCHED conditions (getTargetOnlyPredicates), so a file none of whose
    rows meets any of them may never be read, whatever their matches. Files here: one per partition value."""
    if any(c.kind != "matched" for c in clauses):
        return set()

    def may_act(t: Row) -> bool:
        return any(c.cond is None or c.cond.scope != "target" or c.cond.holds(t, None) for c in clauses)

    files: dict[Any, list[int]] = {}
    for i, t in enumerate(target):
        files.setdefault(t.get("p") if partitioned else None, []).append(i)
    return {i for rows_ in files.values() if not any(may_act(target[j]) for j in rows_) for i in rows_}


def unacted_multiple_matches(target: list[Row], source: list[Row], clauses: list[ModelClause], on: On) -> bool:
    """Whether a matched-only merge has target rows with several matches, none of which meets a WHEN MATCHED
    condition. Delta's findTouchedFiles keeps only the matches some clause may act on, so it sees no multiple
    match: it leaves such a row's file unread when nothing else touches it, and fails its own row count check
    when something does. The engine refuses the merge (docs/oracle.md, intended differences)."""
    if any(c.kind != "matched" for c in clauses):
        return False
    several = [(t, [s for s in source if on.fn(t, s)]) for t in target]
    several = [(t, ss) for t, ss in several if len(ss) > 1]
    return bool(several) and not any(
        c.cond is None or c.cond.holds(t, s) for t, ss in several for s in ss for c in clauses
    )


def _assigned(c: ModelClause, t: Row | None, s: Row | None, columns: list[str]) -> Row:
    """The row a clause writes: every source column for ``*``, else the target row with its assignments."""
    if c.action in ("update_all", "insert_all"):
        assert s is not None
        return {col: s[col] for col in columns}
    base = dict(t) if t is not None else dict.fromkeys(columns)
    for col, fn in c.assign.items():
        base[col] = fn(t, s)
    return base


def _act(chosen: ModelClause | None, t: Row, s: Row | None, columns: list[str], out: list[Row], counts: Counts) -> None:
    """One target row through the clause chosen for it: kept as it is (no clause), deleted, or updated."""
    if chosen is None:
        out.append(t)
    elif chosen.action == "delete":
        counts["num_deleted_rows"] += 1
    else:
        counts["num_updated_rows"] += 1
        out.append(_assigned(chosen, t, s, columns))


def model_merge(
    target: list[Row],
    source: list[Row],
    clauses: list[ModelClause],
    columns: list[str],
    on: On = ONS[0],
    skipped: frozenset[int] = frozenset(),
) -> tuple[list[Row], dict[str, int]]:
    """The merge by Delta's rules; ``skipped`` are target rows taken as left out by data skipping (see
    skippable_rows): their multiple matches go unseen, and no clause acts on them."""
    matched = [c for c in clauses if c.kind == "matched"]
    not_matched = [c for c in clauses if c.kind == "notMatched"]
    nmbs = [c for c in clauses if c.kind == "notMatchedBySource"]
    insert_only = not matched and not nmbs
    matches = {i: [s for s in source if on.fn(t, s)] for i, t in enumerate(target)}
    only_unconditional_delete = len(matched) == 1 and matched[0].action == "delete" and matched[0].cond is None
    if (
        not insert_only
        and any(len(m) > 1 for i, m in matches.items() if i not in skipped)
        and not only_unconditional_delete
    ):
        raise ModelMultipleMatch
    for i in skipped:
        matches[i] = matches[i][:1]  # one pass through the clauses, none of which acts on the row
    out: list[Row] = []
    counts: Counts = {"num_updated_rows": 0, "num_deleted_rows": 0, "num_inserted_rows": 0}
    for i, t in enumerate(target):
        pairs = matches[i]
        if not pairs:
            chosen = next((c for c in nmbs if c.cond is None or c.cond.holds(t, None)), None)
            _act(None if insert_only else chosen, t, None, columns, out, counts)
        elif insert_only:
            out.append(t)
        else:
            for s in pairs[:1] if only_unconditional_delete else pairs:
                chosen = next((c for c in matched if c.cond is None or c.cond.holds(t, s)), None)
                _act(chosen, t, s, columns, out, counts)
    for s in source:
        if any(on.fn(t, s) for t in target):
            continue
        chosen = next((c for c in not_matched if c.cond is None or c.cond.holds(None, s)), None)
        if chosen is not None:
            counts["num_inserted_rows"] += 1
            out.append(_assigned(chosen, None, s, columns))
    return out, counts


# --- strategies -------------------------------------------------------------------------------------------------


def _draw_columns(draw: st.DrawFn) -> tuple[list[str], dict[str, str], bool]:
    """The key ``k``, one to three value columns of random types, and maybe the partition column ``p``."""
    value_types = draw(st.lists(st.sampled_from(sorted(TYPES)), min_size=1, max_size=3))
    columns = ["k"] + [f"c{i}" for i in range(len(value_types))]
    types = {"k": "long", **{f"c{i}": t for i, t in enumerate(value_types)}}
    partitioned = draw(st.booleans())
    if partitioned:
        columns.append("p")
        types["p"] = "string"
    return columns, types, partitioned


def _row_strategy(columns: list[str], types: dict[str, str]) -> st.SearchStrategy[Row]:
    fields: dict[str, st.SearchStrategy[Any]] = {"k": st.one_of(st.none(), st.integers(0, 6))}
    for col in columns[1:]:
        fields[col] = st.one_of(st.none(), TYPES[types[col]][1]) if col != "p" else st.sampled_from(["x", "y"])
    return st.fixed_dictionaries(fields)


def _draw_clauses(
    draw: st.DrawFn, columns: list[str], types: dict[str, str], partitioned: bool, single_pass: bool
) -> list[ModelClause]:
    """Up to two clauses of each kind over the first value column, the groups in a random order."""
    value_col = columns[1]
    conds = conditions(value_col)
    literal = draw(TYPES[types[value_col]][1])
    literal_sql = TYPES[types[value_col]][2](literal)

    def pick_cond(scope: set[str], last: bool) -> Cond | None:
        pool = [c for c in conds if c.scope in scope]
        if last and draw(st.booleans()):
            return None
        return draw(st.sampled_from(pool))

    def group(kind: str, actions: list[str], scope: set[str]) -> list[ModelClause]:
        n = draw(st.integers(0, 2))
        result = []
        for i in range(n):
            action = draw(st.sampled_from(actions))
            cond = pick_cond(scope, last=i == n - 1)
            assign: dict[str, Callable[[Row | None, Row | None], Any]] = {}
            assign_sql: dict[str, str] = {}
            if action == "update" and kind == "matched":
                assign = {value_col: lambda t, s: s[value_col]}  # type: ignore[index]
                assign_sql = {value_col: f"s.{value_col}"}
            elif action == "update":
                assign = {value_col: lambda t, s, v=literal: v}
                assign_sql = {value_col: literal_sql}
            elif action == "insert":
                assign = {"k": lambda t, s: s["k"], value_col: lambda t, s, v=literal: v}  # type: ignore[index]
                assign_sql = {"k": "s.k", value_col: literal_sql}
                if partitioned:
                    assign["p"] = lambda t, s: s["p"]  # type: ignore[index]
                    assign_sql["p"] = "s.p"
            result.append(ModelClause(kind, action, cond, assign, assign_sql))
        return result

    # Clause groups are independent of each other; only the order within a group matters.
    groups = [
        group("matched", ["update_all", "update", "delete"], {"source", "target", "both"}),
        group("notMatched", ["insert_all", "insert"], {"source"}),
        group("notMatchedBySource", ["update", "delete"], {"target"}),
    ]
    if single_pass and draw(st.booleans()):
        groups.pop()  # half the examples without NOT MATCHED BY SOURCE: the single pass then has to guess
    clauses = [c for g in draw(st.permutations(groups)) for c in g]
    return clauses or [ModelClause("notMatched", "insert_all", None, {}, {})]


@st.composite
def merges(draw: st.DrawFn, *, single_pass: bool = False) -> dict[str, Any]:
    """A random merge. ``single_pass`` draws only what the single pass takes: an ON whose conjuncts are the key
    equality and source-only ones (what it needs when there is no NOT MATCHED BY SOURCE clause)."""
    columns, types, partitioned = _draw_columns(draw)
    target = draw(st.lists(_row_strategy(columns, types), max_size=10))
    source = draw(st.lists(_row_strategy(columns, types), max_size=7))
    clauses = _draw_clauses(draw, columns, types, partitioned, single_pass)
    return {
        "columns": columns,
        "types": types,
        "target": target,
        "source": source,
        "clauses": clauses,
        "partitioned": partitioned,
        "on": draw(st.sampled_from(ONS[:3] if single_pass else ONS)),
        **_draw_plans(draw, single_pass),
    }


def _draw_plans(draw: st.DrawFn, single_pass: bool) -> dict[str, Any]:
    """Both plans of each join: the source broadcast past the streamed target (with or without the source's key
    bitmap, and with it either way of finding the source rows matching no target row), or both sides shuffled;
    and findTouchedFiles by source keys, by target rows, or folded into the write (the single pass)."""
    return {
        "broadcast": draw(st.booleans()),
        "key_bitmap": draw(st.sampled_from([None, "held", "semi"])),
        "find_plan": "single_pass"
        if single_pass
        else draw(st.sampled_from(["source_keys", "target_rows", "single_pass"])),
    }


@st.composite
def merge_sequences(draw: st.DrawFn, *, steps: int) -> dict[str, Any]:
    """A random table and ``steps`` random merges into it in turn. Each source's keys are unique, so no target
    row has several matches (single merges cover those), and each merge draws its own ON, clauses and plans."""
    columns, types, partitioned = _draw_columns(draw)
    target = draw(st.lists(_row_strategy(columns, types), max_size=10))
    merges_ = [
        {
            "source": draw(st.lists(_row_strategy(columns, types), max_size=7, unique_by=lambda r: r["k"])),
            "clauses": _draw_clauses(draw, columns, types, partitioned, single_pass=False),
            "on": draw(st.sampled_from(ONS)),
            **_draw_plans(draw, single_pass=False),
        }
        for _ in range(steps)
    ]
    return {"columns": columns, "types": types, "partitioned": partitioned, "target": target, "merges": merges_}


def to_arrow(data: list[Row], columns: list[str], types: dict[str, str]) -> pa.Table:
    return pa.table({c: pa.array([r[c] for r in data], TYPES[types[c]][0]) for c in columns})


def as_sorted(data: list[Row], columns: list[str]) -> list[tuple[Any, ...]]:
    return sorted((tuple(r[c] for c in columns) for r in data), key=lambda r: tuple((v is not None, str(v)) for v in r))


_counter = itertools.count()


def random_merge_settings(examples: int) -> settings:
    """Each example runs two real merges: no deadline, no shrinking (it would take longer than the failure is
    worth), the same examples on every run."""
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
    )


@pytest.mark.slow
@random_merge_settings(EXAMPLES)
@given(case=merges())
def test_random_merges(spark: SparkSession, tmp_path: Path, case: dict[str, Any]) -> None:
    check_random_merge(spark, tmp_path, case)


@pytest.mark.slow
@random_merge_settings(max(EXAMPLES // 2, 1))
@given(case=merges(single_pass=True))
def test_random_merges_in_one_pass(spark: SparkSession, tmp_path: Path, case: dict[str, Any]) -> None:
    """The single pass on every merge it can take, whatever the key statistics expect: kept when every
    candidate file was touched, else redone over the touched files or failed by the multiple-match check."""
    check_random_merge(spark, tmp_path, case)


def check_random_merge(spark: SparkSession, tmp_path: Path, case: dict[str, Any]) -> None:
    note(f"case: {case!r}")
    note(f"clauses: {[(c.kind, c.action, c.cond.sql if c.cond else None, c.assign_sql) for c in case['clauses']]}")
    root = tmp_path / f"case{next(_counter)}"
    columns, types = case["columns"], case["types"]
    target_rows, source_rows = case["target"], case["source"]
    clauses: list[ModelClause] = case["clauses"]
    partition_by = ["p"] if case["partitioned"] else None
    ours = write_table(root / "ours", to_arrow(target_rows, columns, types), partition_by=partition_by)
    source_arrow = to_arrow(source_rows, columns, types)
    source = write_table(root / "source", source_arrow)
    on: On = case["on"]
    spec = make_spec(ours, source, on.sql, [c.engine_clause() for c in clauses])
    plans = (join_plan(broadcast=case["broadcast"], key_bitmap=case["key_bitmap"]), find_plan(case["find_plan"]))
    try:
        expected_rows, expected_counts = model_merge(target_rows, source_rows, clauses, columns, on)
    except ModelMultipleMatch:
        skipped = frozenset(skippable_rows(target_rows, clauses, case["partitioned"]))
        try:
            expected_rows, expected_counts = model_merge(target_rows, source_rows, clauses, columns, on, skipped)
        except ModelMultipleMatch:
            with pytest.raises(MultipleMatchError), plans[0], plans[1]:
                run_merge(spark, spec)
            assert DeltaTable(str(ours)).version() == 0
            return
        # The multiple matches lie in files data skipping may leave unread, as Delta's may: whether the
        # merge sees them depends on how tight the statistics are, so either answer is Delta's.
        try:
            with plans[0], plans[1]:
                result = run_merge(spark, spec)
        except MultipleMatchError:
            assert DeltaTable(str(ours)).version() == 0
            return
    else:
        with plans[0], plans[1]:
            result = run_merge(spark, spec)
    got_counts = {k: result.result[k] for k in expected_counts}
    assert got_counts == expected_counts
    assert rows(ours, columns) == as_sorted(expected_rows, columns)
    if sum(expected_counts.values()) == 0:
        # Nothing changed: committed only when a touched file was rewritten all the same, as Delta's commitIfNeeded.
        assert (result.table_version is None) == (result.metrics["numTargetFilesRemoved"] == 0)
    # deltalake's merge of the same data agrees wherever no target row has several matches.
    if not has_multiple_matches(target_rows, source_rows, on):
        theirs = root / "theirs"
        write_table(theirs, to_arrow(target_rows, columns, types), partition_by=partition_by)
        oracle_counts = oracle_merge(theirs, source_arrow, on.sql, [c.engine_clause() for c in clauses])
        assert oracle_counts == expected_counts
        assert rows(theirs, columns) == rows(ours, columns)
    shutil.rmtree(root, ignore_errors=True)
