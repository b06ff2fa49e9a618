"""The Spark SQL text a merge's expressions reach Spark as: what the caller wrote, or a clear refusal."""

from __future__ import annotations

import pytest

from engine.errors import MergeSpecError
from engine.expression_rules import spark_text
from engine.expressions import parse_expression
from engine.sql import parse_merge_sql


def _sent(text: str) -> str:
    return spark_text(parse_expression(text, "set.v"), "set.v")


@pytest.mark.parametrize(
    ("written", "sent"),
    [
        ("parse_json(s.js)", "PARSE_JSON(s.js)"),
        ("to_char(s.amount, '999D99')", "TO_CHAR(s.amount, '999D99')"),
        ("to_char(s.day, 'yyyy-MM')", "TO_CHAR(s.day, 'yyyy-MM')"),
        ("levenshtein(s.a, t.a, 2)", "LEVENSHTEIN(s.a, t.a, 2)"),
        # Rewrites that mean the same in Spark are kept.
        ("log10(s.x)", "LOG(10, s.x)"),
        ("named_struct('a', s.x)", "STRUCT(s.x AS a)"),
        ("to_date(s.d, 'yyyy-MM-dd')", "TO_DATE(s.d)"),
        ("date_trunc('day', s.ts)", "DATE_TRUNC('DAY', s.ts)"),
    ],
)
def test_functions_reach_spark_as_written(written: str, sent: str) -> None:
    """sqlglot's Spark generator drops parse_json, turns to_char into a cast and drops levenshtein's threshold."""
    assert _sent(written) == sent


@pytest.mark.parametrize(
    ("written", "lost"),
    [
        ("hex(s.a, s.b)", "without b"),  # an argument hex does not take
        ("date_trunc(s.unit, s.ts)", "without s, unit"),  # a column where the unit is a literal
    ],
)
def test_an_expression_that_would_lose_a_name_is_refused(written: str, lost: str) -> None:
    with pytest.raises(MergeSpecError, match=lost) as refused:
        parse_expression(written, "set.v")
    assert refused.value.field == "set.v"


def test_a_merge_statement_that_would_lose_a_name_is_refused() -> None:
    with pytest.raises(MergeSpecError, match="without b") as refused:
        parse_merge_sql(
            "MERGE INTO delta.`/t` t USING delta.`/s` s ON t.id = s.id WHEN MATCHED THEN UPDATE SET t.v = hex(s.a, s.b)"
        )
    assert refused.value.field == "sql"
    spec = parse_merge_sql(
        "MERGE INTO delta.`/t` t USING delta.`/s` s ON t.id = s.id WHEN MATCHED THEN UPDATE SET t.v = parse_json(s.js)"
    )
    assert spec.matched[0].action.set == {"t.v": "PARSE_JSON(s.js)"}  # type: ignore[union-attr]
