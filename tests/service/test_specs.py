"""The memo of accepted expression sets: a repeated merge is not parsed again, anything else still is, and a
spec the engine refuses is refused every time."""

from __future__ import annotations

import dataclasses
from typing import Any

import pydantic
import pytest

import engine
import engine.errors as engine_errors
from service import specs
from service.errors import RequestValidationProblem
from service.specs import ValidExpressions


def spec(on: str = "t.id = s.id", *, target: str = "/lake/a", rows: int = 1, value: str = "s.amount") -> Any:
    return engine.MergeSpec(
        target=target,
        source=engine.RowsSource(rows=[{"id": i} for i in range(rows)]),
        on=on,
        matched=(engine.MergeClause(clause_type="matched", action=engine.UpdateAction(set={"amount": value})),),
        not_matched=(engine.MergeClause(clause_type="notMatched", action=engine.InsertAction(star=True)),),
        target_alias="t",
        source_alias="s",
    )


CHECK = engine.validate_spec
"""The engine's own check, taken before a test counts its calls."""


def test_a_remembered_merge_answers_the_engines_canonical_form(calls: list[Any]) -> None:
    """What the memo answers is what the engine would run: the canonical text, with the spec's own paths."""
    memo = ValidExpressions()
    loose = spec(on="T.ID=S.ID  AND  s.id>0", value="S.AMOUNT*2")
    first = memo.validate(loose)
    assert first == CHECK(loose) and first.on != loose.on
    elsewhere = spec(on="T.ID=S.ID  AND  s.id>0", value="S.AMOUNT*2", target="/lake/b", rows=2)
    again = memo.validate(elsewhere)
    assert again == CHECK(elsewhere)
    assert (again.target, again.source) == (elsewhere.target, elsewhere.source)
    assert len(calls) == 1


def test_what_the_engine_checks_beyond_expressions_is_part_of_the_memo(calls: list[Any]) -> None:
    memo = ValidExpressions()
    memo.validate(spec())
    with pytest.raises(engine_errors.MergeSpecError, match="deletion_vectors"):
        memo.validate(dataclasses.replace(spec(), deletion_vectors="always"))  # type: ignore[arg-type]
    query = engine.QuerySource(query="SELECT * FROM updates", relations={"updates": engine.TableSource("delta", "/u")})
    memo.validate(dataclasses.replace(spec(), source=query))
    renamed = engine.QuerySource(query="SELECT * FROM updates", relations={"other": engine.TableSource("delta", "/u")})
    with pytest.raises(engine_errors.MergeSpecError):
        memo.validate(dataclasses.replace(spec(), source=renamed))
    assert len(calls) == 4


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    seen: list[Any] = []
    real = engine.validate_spec

    def counting(s: Any) -> Any:
        seen.append(s)
        return real(s)

    monkeypatch.setattr(specs.engine, "validate_spec", counting)
    return seen


def test_a_repeated_merge_is_validated_once(calls: list[Any]) -> None:
    memo = ValidExpressions()
    first = spec()
    assert memo.validate(first) == CHECK(first)
    # Target and source are not part of what the engine checks here.
    other_data = spec(target="/lake/b", rows=3)
    assert memo.validate(other_data) == CHECK(other_data)
    assert len(calls) == 1
    memo.validate(spec(value="s.amount * 2"))
    memo.validate(dataclasses.replace(spec(), source_alias="src", on="t.id = src.id"))
    assert len(calls) == 3


def test_refused_specs_are_refused_every_time(calls: list[Any]) -> None:
    memo = ValidExpressions()
    for _ in range(2):
        with pytest.raises(engine_errors.MergeSpecError, match="rand"):
            memo.validate(spec(on="t.id = s.id AND rand() > 0.5"))
    assert len(calls) == 2


def test_the_memo_is_bounded(calls: list[Any]) -> None:
    memo = ValidExpressions(size=2)
    for on in ("t.id = s.id", "t.id = s.id + 1", "t.id = s.id + 2", "t.id = s.id"):
        memo.validate(spec(on=on))
    assert len(calls) == 4  # the first was evicted by the third


def test_source_options_take_json_scalars_as_spark_strings(tmp_path: Any) -> None:
    from service.paths import LakeRoots

    body = specs.parse_request(
        {
            "target": str(tmp_path / "t"),
            "source": {
                "format": "csv",
                "path": str(tmp_path / "s.csv"),
                "options": {"header": True, "sep": ";", "samplingRatio": 0.5, "maxColumns": 40},
            },
            "on": "t.id = s.id",
            "when_not_matched": [{"action": "insert_all"}],
        }
    )
    built = specs.build_merge(body, LakeRoots([tmp_path]))
    assert built.spec.source.options == {"header": "true", "sep": ";", "samplingRatio": "0.5", "maxColumns": "40"}
    with pytest.raises(pydantic.ValidationError, match="options"):
        specs.parse_request(
            {
                **body.model_dump(by_alias=True),
                "source": {"format": "csv", "path": str(tmp_path / "s.csv"), "options": {"header": ["no"]}},
            }
        )


@pytest.mark.parametrize("choice", [None, "auto", "off"])
def test_the_deletion_vectors_choice_reaches_every_kind_of_merge(tmp_path: Any, choice: str | None) -> None:
    """Structured, SQL and AUTO CDC bodies all carry ``deletion_vectors`` to the engine's spec, ``auto`` when absent."""
    from service.paths import LakeRoots

    target, source = str(tmp_path / "t"), {"rows": [{"id": 1}], "schema": "id BIGINT"}
    bodies: list[dict[str, Any]] = [
        {"target": target, "source": source, "on": "t.id = s.id", "when_not_matched": [{"action": "insert_all"}]},
        {
            "sql": f"MERGE INTO delta.`{target}` AS t USING (SELECT 1L AS id) AS s ON t.id = s.id "
            "WHEN MATCHED THEN DELETE"
        },
        {"target": target, "source": source, "auto_cdc": {"keys": ["id"], "sequence_by": "id"}},
    ]
    for body in bodies:
        if choice is not None:
            body["deletion_vectors"] = choice
        built = specs.build_merge(specs.parse_request(body), LakeRoots([tmp_path]))
        assert built.spec.deletion_vectors == (choice or "auto"), body


@pytest.mark.parametrize("column", ["amount", "my col", "x:y", "`a.b`"])
def test_a_refused_value_names_its_column_whole(tmp_path: Any, column: str) -> None:
    """The field at fault is the one the engine's error carries, whatever characters the column's name holds."""
    from service.paths import LakeRoots

    body = specs.parse_request(
        {
            "target": str(tmp_path / "t"),
            "source": {"rows": [{"id": 1}]},
            "on": "t.id = s.id",
            "when_matched": [{"action": "update", "set": {column: "upper("}}],
        }
    )
    with pytest.raises(RequestValidationProblem) as info:
        specs.build_merge(body, LakeRoots([tmp_path]))
    assert info.value.field == f"when_matched[0].set.{column}"
    assert info.value.message.startswith(f"when_matched[0].set.{column}: cannot parse 'upper('")


@pytest.mark.parametrize(
    ("rows", "schema", "field"),
    [
        ([{"id": 1}], "id DECIMAL(1,2,3)", "source.schema"),
        ([{"id": "x"}], "id BIGINT", "source.rows[0].id"),
        ([], None, "source.rows"),
    ],
)
def test_a_refused_source_names_its_field(tmp_path: Any, rows: list[Any], schema: str | None, field: str) -> None:
    from service.paths import LakeRoots

    source: dict[str, Any] = {"rows": rows} if schema is None else {"rows": rows, "schema": schema}
    body = specs.parse_request(
        {
            "target": str(tmp_path / "t"),
            "source": source,
            "on": "t.id = s.id",
            "when_not_matched": [{"action": "insert_all"}],
        }
    )
    with pytest.raises(RequestValidationProblem) as info:
        specs.build_merge(body, LakeRoots([tmp_path]))
    assert info.value.field == field
    assert info.value.message.startswith(f"{field}: ")


@pytest.mark.parametrize(("given", "taken"), [(1, 1), (2, 2), ("1", 1), ("2", 2), (3, None), (True, None), (2.0, None)])
def test_stored_as_scd_type_takes_the_numbers_and_their_strings(tmp_path: Any, given: Any, taken: int | None) -> None:
    """As Databricks' Python API takes it: 2 or "2"; never true or 2.0, which a lax reading would take as 1 and 2."""
    from service.paths import LakeRoots

    body = {
        "target": str(tmp_path / "t"),
        "source": {"rows": [{"id": 1}]},
        "auto_cdc": {"keys": ["id"], "sequence_by": "id", "stored_as_scd_type": given},
    }
    if taken is None:
        with pytest.raises((pydantic.ValidationError, RequestValidationProblem)) as caught:
            specs.parse_request(body)
        assert "stored_as_scd_type" in str(caught.value)
        return
    built = specs.build_merge(specs.parse_request(body), LakeRoots([tmp_path]))
    assert built.spec.stored_as_scd_type == taken
