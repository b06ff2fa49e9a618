"""Data skipping against brute force: random files, random predicates; a file whose rows satisfy a predicate
(evaluated row by row here, with SQL's three-valued logic and Spark's comparison rules) must never be pruned.

The row evaluator below is written independently of engine.delta.skipping: it knows nothing of bounds.
"""

from __future__ import annotations

import datetime as dt
import math
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.delta import Snapshot, load_snapshot, prune_files
from engine.delta.skipping import FilePredicate
from engine.errors import MergeSpecError

from .util import parquet_add

UTC = dt.UTC
T0 = dt.datetime(2024, 1, 1, tzinfo=UTC)
D0 = dt.date(2024, 1, 1)

SCHEMA = pa.schema(
    [
        ("p", pa.int64()),
        ("i", pa.int64()),
        ("dec", pa.decimal128(10, 2)),
        ("f", pa.float64()),
        ("s", pa.string()),
        ("d", pa.date32()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("b", pa.bool_()),
        ("st", pa.struct([("x", pa.int32())])),
    ]
)
DATA_COLUMNS = [f.name for f in SCHEMA if f.name != "p"]

# --- random files --------------------------------------------------------------------------------------------

LONG = "a" * 30
string_values = st.one_of(
    st.text(alphabet="abz", max_size=3),
    st.builds(
        lambda tail: LONG + tail, st.text(alphabet=["a", "b", "\x7f", "é", "\U0010ffff", "\U0001f600"], max_size=5)
    ),
)
column_values: dict[str, st.SearchStrategy[Any]] = {
    "i": st.integers(-3, 3),
    "dec": st.sampled_from([Decimal("-1.50"), Decimal("0.00"), Decimal("1.00"), Decimal("1.50"), Decimal("2.25")]),
    "f": st.sampled_from([-1.5, 0.0, 1.0, 2.5, math.nan, math.inf, -math.inf]),
    "s": string_values,
    "d": st.builds(lambda n: D0 + dt.timedelta(days=n), st.integers(0, 3)),
    "ts": st.builds(lambda n: T0 + dt.timedelta(microseconds=n * 250), st.integers(0, 12)),
    "b": st.booleans(),
    "st": st.builds(lambda x: {"x": x}, st.one_of(st.none(), st.integers(-2, 2))),
}


@st.composite
def random_file(draw: st.DrawFn) -> tuple[int | None, list[dict[str, Any]]]:
    partition = draw(st.one_of(st.none(), st.integers(-1, 1)))
    count = draw(st.integers(0, 6))
    rows = []
    for _ in range(count):
        row: dict[str, Any] = {"p": partition}
        for name in DATA_COLUMNS:
            row[name] = draw(st.one_of(st.none(), column_values[name]) if draw(st.booleans()) else column_values[name])
        rows.append(row)
    return partition, rows


# --- random predicates with a row evaluator -------------------------------------------------------------------


@dataclass(frozen=True)
class Lit:
    sql: str
    value: Any  # Python value; None is NULL


def _spark_compare(left: Any, right: Any) -> int:
    """Spark's ordering of two non-null values of compatible types (NaN above everything, equal to itself)."""
    if isinstance(left, float) or isinstance(right, float):
        a, b = float(left), float(right)
        if math.isnan(a) or math.isnan(b):
            return 0 if math.isnan(a) and math.isnan(b) else (1 if math.isnan(a) else -1)
        return (a > b) - (a < b)
    if isinstance(left, dt.datetime) != isinstance(right, dt.datetime):
        left = left if isinstance(left, dt.datetime) else dt.datetime(left.year, left.month, left.day, tzinfo=UTC)
        right = right if isinstance(right, dt.datetime) else dt.datetime(right.year, right.month, right.day, tzinfo=UTC)
    return (left > right) - (left < right)


def _compare(op: str, left: Any, right: Any) -> bool | None:
    if left is None or right is None:
        return None
    c = _spark_compare(left, right)
    return {"=": c == 0, "!=": c != 0, "<": c < 0, "<=": c <= 0, ">": c > 0, ">=": c >= 0}[op]


def _and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def _or(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    return None if a is None or b is None else False


def _not(a: bool | None) -> bool | None:
    return None if a is None else not a


@dataclass(frozen=True)
class Pred:
    sql: str
    evaluate: Callable[[dict[str, Any]], bool | None]


def _column_ref(name: str) -> tuple[str, Callable[[dict[str, Any]], Any]]:
    if name == "st.x":
        return "st.x", lambda row: None if row["st"] is None else row["st"]["x"]
    return name, lambda row: row[name]


def _literals(column: str) -> st.SearchStrategy[Lit]:
    """Literals for a column: its own type, types Spark compares it with, and NULL."""
    null = st.just(Lit("NULL", None))
    if column in ("i", "p", "st.x"):
        return st.one_of(
            st.integers(-4, 4).map(lambda n: Lit(str(n), n)),
            st.sampled_from(["-1.5", "0.5", "2.00"]).map(lambda t: Lit(t, Decimal(t))),
            st.sampled_from([-1.5, 1.0, 2.5]).map(lambda x: Lit(f"{x}D", x)),
            st.integers(-4, 4).map(lambda n: Lit(f"CAST({n} AS BIGINT)", n)),
            null,
        )
    if column == "dec":
        return st.one_of(
            st.sampled_from(["-1.50", "0", "1", "1.5", "1.51", "2.25", "3"]).map(lambda t: Lit(t, Decimal(t))),
            st.sampled_from([1.5, 2.0]).map(lambda x: Lit(f"{x}D", x)),
            null,
        )
    if column == "f":
        return st.one_of(
            st.sampled_from([-1.5, 0.0, 1.0, 2.5, 3.0]).map(lambda x: Lit(f"{x}D", x)),
            st.integers(-2, 3).map(lambda n: Lit(str(n), n)),
            st.just(Lit("CAST('NaN' AS DOUBLE)", math.nan)),
            null,
        )
    if column == "s":
        return st.one_of(string_values.map(lambda v: Lit("'" + v + "'", v)), null)
    if column == "d":
        days = st.integers(-1, 4).map(lambda n: D0 + dt.timedelta(days=n))
        return st.one_of(
            days.map(lambda d: Lit(f"DATE '{d.isoformat()}'", d)),
            days.map(lambda d: Lit(f"'{d.isoformat()}'", d)),
            st.integers(0, 3 * 24)
            .map(lambda h: T0 + dt.timedelta(hours=h))
            .map(lambda t: Lit(f"TIMESTAMP '{t:%Y-%m-%d %H:%M:%S}'", t)),
            null,
        )
    if column == "ts":
        stamps = st.integers(-2, 14).map(lambda n: T0 + dt.timedelta(microseconds=n * 250))
        return st.one_of(
            stamps.map(lambda t: Lit(f"TIMESTAMP '{t:%Y-%m-%d %H:%M:%S.%f}'", t)),
            stamps.map(lambda t: Lit(f"'{t:%Y-%m-%d %H:%M:%S.%f}'", t)),
            st.just(Lit("DATE '2024-01-01'", D0)),
            null,
        )
    if column == "b":
        return st.one_of(st.sampled_from([Lit("TRUE", True), Lit("FALSE", False)]), null)
    raise AssertionError(column)


COLUMNS = ["p", "i", "dec", "f", "s", "d", "ts", "b", "st.x"]
OPS = ["=", "!=", "<", "<=", ">", ">="]


@st.composite
def leaf(draw: st.DrawFn) -> Pred:
    column = draw(st.sampled_from(COLUMNS))
    ref, get = _column_ref(column)
    kind = draw(
        st.sampled_from(
            ["cmp", "cmp", "cmp", "flipped", "null", "notnull", "in", "notin", "between", "nullsafe", "bare", "expr"]
        )
    )
    lit = draw(_literals(column))
    if kind == "cmp":
        op = draw(st.sampled_from(OPS))
        sql_op = draw(st.sampled_from(["!=", "<>"])) if op == "!=" else op
        return Pred(f"{ref} {sql_op} {lit.sql}", lambda r: _compare(op, get(r), lit.value))
    if kind == "flipped":
        op = draw(st.sampled_from(OPS))
        return Pred(f"{lit.sql} {op} {ref}", lambda r: _compare(op, lit.value, get(r)))
    if kind == "null":
        return Pred(f"{ref} IS NULL", lambda r: get(r) is None)
    if kind == "notnull":
        return Pred(f"{ref} IS NOT NULL", lambda r: get(r) is not None)
    if kind in ("in", "notin"):
        items = draw(st.lists(_literals(column), min_size=1, max_size=12))

        def member(r: dict[str, Any]) -> bool | None:
            result: bool | None = False
            for item in items:
                result = _or(result, _compare("=", get(r), item.value))
            return result

        sql_items = ", ".join(i.sql for i in items)
        if kind == "in":
            return Pred(f"{ref} IN ({sql_items})", member)
        return Pred(f"{ref} NOT IN ({sql_items})", lambda r: _not(member(r)))
    if kind == "between":
        high = draw(_literals(column))
        return Pred(
            f"{ref} BETWEEN {lit.sql} AND {high.sql}",
            lambda r: _and(_compare(">=", get(r), lit.value), _compare("<=", get(r), high.value)),
        )
    if kind == "nullsafe":

        def null_safe(r: dict[str, Any]) -> bool:
            value = get(r)
            if value is None or lit.value is None:
                return value is None and lit.value is None
            return bool(_compare("=", value, lit.value))

        return Pred(f"{ref} <=> {lit.sql}", null_safe)
    if kind == "bare":
        return Pred("b", lambda r: r["b"]) if column == "b" else Pred(f"{ref} IS NULL", lambda r: get(r) is None)
    # An expression we do not model (arithmetic, column against column): always kept.
    return Pred("i + 1 > p", lambda r: None if r["i"] is None or r["p"] is None else r["i"] + 1 > r["p"])


def predicates(depth: int = 3) -> st.SearchStrategy[Pred]:
    def extend(children: st.SearchStrategy[Pred]) -> st.SearchStrategy[Pred]:
        return st.one_of(
            st.tuples(children, children).map(
                lambda ab: Pred(
                    f"({ab[0].sql}) AND ({ab[1].sql})", lambda r, a=ab[0], b=ab[1]: _and(a.evaluate(r), b.evaluate(r))
                )
            ),
            st.tuples(children, children).map(
                lambda ab: Pred(
                    f"({ab[0].sql}) OR ({ab[1].sql})", lambda r, a=ab[0], b=ab[1]: _or(a.evaluate(r), b.evaluate(r))
                )
            ),
            children.map(lambda a: Pred(f"NOT ({a.sql})", lambda r, a=a: _not(a.evaluate(r)))),
        )

    return st.recursive(leaf(), extend, max_leaves=depth * 2)


# --- the properties --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def table_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp)


@pytest.fixture(scope="module")
def empty_snapshot(table_dir: Path) -> Snapshot:
    path = table_dir / "skipping"
    DeltaTable.create(str(path), SCHEMA, partition_by=["p"])
    return load_snapshot(str(path))


def _check(snapshot: Snapshot, files: list[tuple[Any, list[dict[str, Any]]]], preds: list[Pred]) -> None:
    written = []
    for partition, rows in files:
        data = pa.Table.from_pylist(rows, schema=SCHEMA).drop_columns(["p"])
        written.append((parquet_add(snapshot, data, partition={"p": partition}), rows))
    adds = [add for add, _ in written]
    for pred in preds:
        kept = {a.path for a in prune_files(snapshot, adds, pred.sql)}
        for add, rows in written:
            if any(pred.evaluate(row) is True for row in rows):
                assert add.path in kept, f"pruned a matching file for {pred.sql!r}: stats {add.stats}, rows {rows}"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.lists(random_file(), min_size=1, max_size=3), preds=st.lists(predicates(), min_size=1, max_size=4))
def test_never_prunes_a_file_with_a_matching_row(empty_snapshot: Snapshot, files: list[Any], preds: list[Pred]) -> None:
    _check(empty_snapshot, files, preds)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.lists(random_file(), min_size=1, max_size=2), preds=st.lists(predicates(), min_size=3, max_size=6))
def test_never_prunes_with_statistics_written_by_deltalake(
    table_dir: Path, files: list[Any], preds: list[Pred]
) -> None:
    """The same property over files and statistics delta-rs wrote (booleans have bounds, no string truncation,
    NaN ignored in float bounds), read back through load_snapshot."""
    import uuid

    path = str(table_dir / f"rs-{uuid.uuid4().hex[:8]}")
    DeltaTable.create(path, SCHEMA, partition_by=["p"])
    all_rows = []
    for _, rows in files:
        if rows:
            write_deltalake(path, pa.Table.from_pylist(rows, schema=SCHEMA), mode="append")
            all_rows.extend(rows)
    snapshot = load_snapshot(path)
    for pred in preds:
        kept = prune_files(snapshot, snapshot.files, pred.sql)
        matching = {row_key(r) for r in all_rows if pred.evaluate(r) is True}
        if matching:
            rows_kept = (
                pa.concat_tables([pa.parquet.read_table(f.absolute_path(snapshot.root)) for f in kept])
                if kept
                else None
            )
            kept_ids = set() if rows_kept is None else {row_key(r) for r in rows_kept.to_pylist()}
            assert matching <= kept_ids, pred.sql


def row_key(row: dict[str, Any]) -> str:
    def normal(value: Any) -> Any:
        return value.astimezone(UTC) if isinstance(value, dt.datetime) else value

    return repr(sorted((k, repr(normal(v))) for k, v in row.items() if k != "p"))


# --- pruning does happen, and specific cases -------------------------------------------------------------------


def test_range_predicates_prune_sorted_files(empty_snapshot: Snapshot) -> None:
    adds = []
    for n in range(10):
        rows = [
            {
                "i": n * 100 + k,
                "s": f"key-{n * 100 + k:05d}",
                "d": D0 + dt.timedelta(days=n),
                "ts": T0 + dt.timedelta(hours=n, microseconds=k),
            }
            for k in range(100)
        ]
        adds.append(
            parquet_add(empty_snapshot, pa.Table.from_pylist(rows, schema=SCHEMA.remove(0)), partition={"p": n % 3})
        )

    def kept(predicate: str) -> list[int]:
        return [adds.index(a) for a in prune_files(empty_snapshot, adds, predicate)]

    assert kept("i >= 950") == [9]
    assert kept("i BETWEEN 150 AND 250") == [1, 2]
    assert kept("i IN (5, 777, 12345)") == [0, 7]
    assert kept("i IN (" + ", ".join(str(n * 1000 + 555) for n in range(50)) + ")") == [5]
    assert kept("s = 'key-00420'") == [4]
    assert kept("d > DATE '2024-01-08'") == [8, 9]
    assert kept("ts < TIMESTAMP '2024-01-01 01:00:00'") == [0, 1]  # 1 starts at 01:00: bounds widen by 1 ms
    assert kept("ts < TIMESTAMP '2024-01-01 00:59:59.998'") == [0]
    assert kept("p = 2") == [2, 5, 8]
    assert kept("p = 2 AND i < 300") == [2]
    assert kept("NOT (i < 900)") == [9]
    assert kept("i > 950 OR p = 0") == [0, 3, 6, 9]
    assert kept("i IS NULL") == []
    assert kept("i IS NOT NULL AND i = -0.5") == []
    assert kept("i = 150.5D") == [1]
    assert kept("b = TRUE") == []  # every b is NULL: nullCount proves it
    assert kept("st.x > 0") == []
    assert kept("i + 1 > 5") == list(range(10))  # not modelled: kept
    assert kept("unknown_column = 1") == list(range(10))
    assert kept("t.i = 1") == list(range(10))  # qualified names are not resolved


def test_three_valued_logic_cases(empty_snapshot: Snapshot) -> None:
    one = parquet_add(
        empty_snapshot, pa.Table.from_pylist([{"i": 1}, {"i": None}], schema=SCHEMA.remove(0)), partition={"p": None}
    )
    only_null = parquet_add(
        empty_snapshot, pa.Table.from_pylist([{"i": None}], schema=SCHEMA.remove(0)), partition={"p": 1}
    )

    def kept(predicate: str) -> list[str]:
        names = {one.path: "one", only_null.path: "only_null"}
        return [names[a.path] for a in prune_files(empty_snapshot, [one, only_null], predicate)]

    assert kept("NOT (i = 1)") == []  # NULL and 1: never TRUE
    assert kept("NOT (i <> 1)") == ["one"]
    assert kept("i <=> NULL") == ["one", "only_null"]
    assert kept("NOT (i <=> 1)") == ["one", "only_null"]
    assert kept("i NOT IN (2, NULL)") == []
    assert kept("i IN (NULL)") == []
    assert kept("NOT (i IN (1, NULL))") == []
    assert kept("i = NULL OR p IS NULL") == ["one"]
    assert kept("NOT (p = 1)") == []  # the NULL partition is not TRUE for p <> 1 either
    assert kept("p <=> NULL") == ["one"]
    assert kept("TRUE") == ["one", "only_null"]
    assert kept("FALSE OR NULL") == []
    assert kept("NOT (NOT (i = 1))") == ["one"]


def test_string_and_timestamp_bounds_are_widened(empty_snapshot: Snapshot) -> None:
    long_value = "m" * 40 + "zzz"
    rows = [{"s": long_value, "ts": T0 + dt.timedelta(microseconds=999)}]
    add = parquet_add(empty_snapshot, pa.Table.from_pylist(rows, schema=SCHEMA.remove(0)))
    assert add.stats is not None and add.stats.max_values["s"] == "m" * 32 + "\x7f"
    assert add.stats.max_values["ts"] == T0 + dt.timedelta(microseconds=999)
    # the JSON statistic is truncated to milliseconds; what a reader gets back still keeps the row
    from engine.delta.file_stats import FileStats

    reread = FileStats.from_json(add.stats.to_json(), empty_snapshot.spark_schema)
    assert reread is not None and reread.max_values["ts"] == T0
    from dataclasses import replace

    stored = replace(add, stats=reread)
    assert prune_files(empty_snapshot, [stored], "ts > TIMESTAMP '2024-01-01 00:00:00.000500'") == [stored]
    assert prune_files(empty_snapshot, [stored], "ts > TIMESTAMP '2024-01-01 00:00:00.002'") == []
    assert prune_files(empty_snapshot, [stored], f"s = '{long_value}'") == [stored]
    assert prune_files(empty_snapshot, [stored], "s > '" + "m" * 40 + "zzzz'") == [stored]
    assert prune_files(empty_snapshot, [stored], "s > 'n'") == []


def test_predicates_as_sqlglot_and_bad_text(empty_snapshot: Snapshot) -> None:
    import sqlglot

    add = parquet_add(empty_snapshot, pa.Table.from_pylist([{"i": 5}], schema=SCHEMA.remove(0)))
    assert prune_files(empty_snapshot, [add], sqlglot.parse_one("I > 10", read="spark")) == []
    assert FilePredicate("i < 10", empty_snapshot.spark_schema, ["p"]).might_match(add)
    with pytest.raises(MergeSpecError):
        prune_files(empty_snapshot, [add], "i >")


def test_decimal_bounds_rounded_through_doubles_still_keep_the_row(table_dir: Path) -> None:
    """delta-rs records decimal bounds as doubles: 123456789012.3456789012 is logged as 123456789012.34567,
    below the value. Bounds of at most 17 digits are widened by what a double may have lost; exact bounds
    with more digits are trusted as they are."""
    path = str(table_dir / "decimals")
    exact = Decimal("123456789012.3456789012")
    decimal_type = pa.decimal128(38, 10)
    for values in ([Decimal("1.5"), exact], [Decimal("-5"), Decimal("0")]):
        write_deltalake(path, pa.table({"k": pa.array(values, decimal_type)}), mode="append")
    snapshot = load_snapshot(path)
    logged = {str(f.stats.max_values["k"]) for f in snapshot.files if f.stats is not None}
    assert "123456789012.3456789012" not in logged  # the lossy bound this guards against
    kept = prune_files(snapshot, snapshot.files, f"k = {exact}")
    assert len(kept) == 1 and kept[0].stats is not None and kept[0].stats.min_values["k"] == Decimal("1.5")
    assert prune_files(snapshot, snapshot.files, f"k >= {exact}") == kept
    assert prune_files(snapshot, snapshot.files, "k > 123456789013") == []
