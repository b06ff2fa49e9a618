"""Bounds on what a merge may give, checked before any recursive parser or Spark sees it: expression size and
nesting, DECIMAL precision and scale, nesting of row types, and the range of integers inferred without a
schema. Each refusal names the place at fault; values at the bound are accepted."""

from __future__ import annotations

import decimal
import re
import sys

import pyarrow as pa
import pytest

from engine import rows_to_arrow
from engine.errors import MergeSpecError, SourceError, SourceRowError
from engine.expressions import (
    MAX_EXPRESSION_CHARS,
    MAX_EXPRESSION_DEPTH,
    MAX_EXPRESSION_NESTING,
    MAX_EXPRESSION_NODES,
    nesting_depth,
    parse_expression,
)
from engine.inline_rows import MAX_NESTING, ddl_to_arrow
from engine.merge_condition import conjuncts


def nested_parens(levels: int) -> str:
    return "(" * levels + "t.id = s.id" + ")" * levels


def test_parentheses_are_counted_outside_quotes() -> None:
    assert nesting_depth("f(a[1], (b))") == 2
    assert nesting_depth("'((((' || \"(((\" || `(((` || 'it''s (' || 'a\\' ((('") == 0
    assert nesting_depth(nested_parens(7)) == 7


def test_nesting_at_the_bound_parses_and_beyond_is_refused_by_name() -> None:
    assert parse_expression(nested_parens(MAX_EXPRESSION_NESTING), "on") is not None
    with pytest.raises(MergeSpecError, match=r"^on: parentheses or brackets nest 5000 levels deep .* at most 32"):
        parse_expression(nested_parens(5000), "on")


def test_the_bound_leaves_room_below_python_s_recursion_limit() -> None:
    """The worker parses expressions deep in its own stack: the bound must parse with most of it used."""

    def parse_at(depth: int) -> object:
        return parse_expression(nested_parens(MAX_EXPRESSION_NESTING), "on") if depth == 0 else parse_at(depth - 1)

    assert parse_at(sys.getrecursionlimit() // 4) is not None


def test_nesting_the_scan_cannot_see_is_refused_as_too_deep() -> None:
    with pytest.raises(MergeSpecError, match=r"^when_matched\[0\].condition: .* nests too deeply to parse"):
        parse_expression("NOT " * 2000 + "s.ok", "when_matched[0].condition")


def test_long_expressions_are_refused_before_parsing() -> None:
    twenty_thousand_terms = " OR ".join(["t.id = s.id"] * 20_000)
    with pytest.raises(MergeSpecError, match=f"^on: the expression is {len(twenty_thousand_terms)} characters long"):
        parse_expression(twenty_thousand_terms, "on")
    assert len(twenty_thousand_terms) > MAX_EXPRESSION_CHARS


def test_chains_deeper_than_the_bound_are_refused() -> None:
    fits = " AND ".join(["t.id = s.id"] * (MAX_EXPRESSION_DEPTH - 4))
    assert len(conjuncts(parse_expression(fits, "on"))) == MAX_EXPRESSION_DEPTH - 4
    too_deep = " OR ".join(["t.id = s.id"] * MAX_EXPRESSION_DEPTH)
    with pytest.raises(MergeSpecError, match=f"^on: .* nests more than {MAX_EXPRESSION_DEPTH} operations deep"):
        parse_expression(too_deep, "on")


def test_flat_lists_count_their_parts() -> None:
    assert parse_expression("s.id IN (" + ",".join(map(str, range(5_000))) + ")", "on") is not None
    with pytest.raises(MergeSpecError, match=f"^on: .* has more than {MAX_EXPRESSION_NODES} parts"):
        parse_expression("s.id IN (" + ",".join(map(str, range(MAX_EXPRESSION_NODES))) + ")", "on")


def test_error_messages_do_not_echo_huge_inputs() -> None:
    with pytest.raises(MergeSpecError) as info:
        parse_expression(nested_parens(5000), "on")
    assert len(str(info.value)) < 400


@pytest.mark.parametrize(
    ("ddl", "reason"),
    [
        ("amount DECIMAL(100,2)", "the precision must be 1 to 38"),
        ("amount DECIMAL(0,0)", "the precision must be 1 to 38"),
        ("amount DECIMAL(38,50)", r"the scale must be 0 to the precision \(38\)"),
        ("amount DECIMAL(5,2,1)", "DECIMAL takes at most a precision and a scale"),
        ("amount DECIMAL(p,s)", "the precision and scale must be whole numbers"),
    ],
)
def test_decimal_bounds_are_spark_s(ddl: str, reason: str) -> None:
    with pytest.raises(SourceError, match=f"^schema: DECIMAL.* of column 'amount': {reason}"):
        ddl_to_arrow(ddl)


def test_decimals_at_the_bounds() -> None:
    assert ddl_to_arrow("a DECIMAL(38,38), b DECIMAL(1,0), c DECIMAL(38)").types == [
        pa.decimal128(38, 38),
        pa.decimal128(1, 0),
        pa.decimal128(38, 0),
    ]
    widest = "1234567890123456789012345678.1234567890"  # 38 digits, more than Python's default 28
    table = rows_to_arrow([{"a": widest, "b": "0.001"}], "a DECIMAL(38,10), b DECIMAL(2,2)")
    assert table.to_pylist() == [{"a": decimal.Decimal(widest), "b": decimal.Decimal("0.00")}]


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("1e400", "does not fit DECIMAL"),
        ("9" * 500, r"does not fit DECIMAL"),
        ("NaN", "expected a finite decimal number"),
        ("-Infinity", "expected a finite decimal number"),
        ("12,5", "expected a decimal number"),
        ("99.995", "does not fit DECIMAL"),
    ],
)
def test_decimal_values_that_do_not_fit_are_named(value: str, reason: str) -> None:
    with pytest.raises(SourceRowError, match=f"^rows\\[0\\].a: .*{reason}") as info:
        rows_to_arrow([{"a": value}], "a DECIMAL(4,2)")
    assert (info.value.row, info.value.column) == (0, "a")
    assert len(str(info.value)) < 400


def test_row_types_nest_at_most_the_bound() -> None:
    def array_of(levels: int) -> str:
        return "ARRAY<" * levels + "INT" + ">" * levels

    assert ddl_to_arrow(f"x {array_of(MAX_NESTING)}").field("x").type is not None
    with pytest.raises(SourceError, match=f"^schema: the type of column 'x' nests more than {MAX_NESTING} levels"):
        ddl_to_arrow(f"x {array_of(MAX_NESTING + 1)}")
    with pytest.raises(SourceError, match=f"^schema: .* nests more than {MAX_NESTING} levels deep"):
        ddl_to_arrow(f"x {array_of(5000)}")


@pytest.mark.parametrize(
    ("rows", "row", "column", "where"),
    [
        ([{"id": 1}, {"id": 2**70}], 1, "id", "rows[1].id"),
        ([{"id": 2**63}], 0, "id", "rows[0].id"),
        ([{"id": -(2**63) - 1}], 0, "id", "rows[0].id"),
        ([{"id": 1, "x": {"y": [1, 10**400]}}], 0, "x", "rows[0].x.y[1]"),
        ([{"a": 1.5}, {"a": 2**70}], 1, "a", "rows[1].a"),
    ],
)
def test_integers_inferred_beyond_int64_are_named(
    rows: list[dict[str, object]], row: int, column: str, where: str
) -> None:
    with pytest.raises(SourceRowError, match=f"^{re.escape(where)}: ") as info:
        rows_to_arrow(rows, None)
    assert (info.value.row, info.value.column) == (row, column)
    assert "does not fit a 64-bit integer" in str(info.value)


def test_int64_bounds_are_inferred() -> None:
    table = rows_to_arrow([{"id": 2**63 - 1}, {"id": -(2**63)}], None)
    assert table.schema.field("id").type == pa.int64()
    assert table.column("id").to_pylist() == [2**63 - 1, -(2**63)]
