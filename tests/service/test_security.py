"""What the API lets a merge run and read (issue 24: F1, F3): 422 problems naming the field, nothing queued,
nothing of the server leaked; and a fuzz suite over the SQL and spec parsers: no 5xx, and whatever the service
accepts calls only allowlisted functions, judged by re-reading the text the engine would send Spark."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine
from engine.functions import ALLOWED_FUNCTIONS, REFUSED_FUNCTIONS, SYNTAX_BEFORE_PAREN
from service.app import create_app
from service.manager import JobManager
from service.paths import LakeRoots
from service.settings import Settings
from service.specs import build_merge, parse_request

PROBLEM = "application/problem+json"


def structured(lake: Path, **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "target": str(lake / "t"),
        "source": {"rows": [{"id": 1, "name": "a"}], "schema": "id BIGINT, name STRING"},
        "target_alias": "t",
        "source_alias": "s",
        "on": "t.id = s.id",
        "when_matched": [{"action": "update", "set": {"name": "s.name"}}],
    }
    body.update(overrides)
    return body


def sql_body(lake: Path, using: str, **extra: Any) -> dict[str, Any]:
    return {
        "sql": f"MERGE INTO delta.`{lake / 't'}` AS t USING {using} AS s ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
        **extra,
    }


def assert_refused(client: TestClient, body: dict[str, Any], field: str, *words: str) -> None:
    response = client.post("/merges", json=body)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    problem = response.json()
    assert field in [e["field"] for e in problem["errors"]], problem
    for word in words:
        assert word in problem["detail"], problem
    assert os.environ["PATH"] not in response.text
    assert client.get("/merges").json()["items"] == []


@pytest.mark.parametrize(
    "select",
    [
        "SELECT CAST(1 AS BIGINT) AS id, reflect('java.lang.System', 'getenv', 'MERGE_SERVICE_API_TOKENS') AS name",
        "SELECT CAST(1 AS BIGINT) AS id, reflect('java.lang.System', 'getenv') AS name",
        "SELECT CAST(reflect('java.lang.System', 'getenv', 'MERGE_SERVICE_DATABASE_URL') AS INT) AS id, 'x' AS name",
        "SELECT reflect('java.lang.System', 'exit', 1) AS id, 'x' AS name",
    ],
)
@pytest.mark.parametrize("dry_run", [False, True])
def test_reflection_in_a_source_query_is_422(client: TestClient, lake: Path, select: str, dry_run: bool) -> None:
    """F1, as reported: each was accepted, then ran in Spark."""
    assert_refused(client, sql_body(lake, f"({select})", dry_run=dry_run), "sql", "reflect()", "not allowed")


def test_a_script_transform_is_422(client: TestClient, lake: Path) -> None:
    select = f"SELECT TRANSFORM(id, name) USING 'cat' AS (id BIGINT, name STRING) FROM delta.`{lake / 's'}`"
    assert_refused(client, sql_body(lake, f"({select})"), "sql", "script transforms")


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"on": "t.id = s.id AND java_method('java.lang.System', 'exit', 1) = 1"}, "on"),
        (
            {"when_matched": [{"action": "update", "set": {"name": "'${env:MERGE_SERVICE_API_TOKENS}'"}}]},
            "when_matched[0].set.name",
        ),
        ({"when_matched": [{"action": "delete", "condition": "user = 'root'"}]}, "when_matched[0].condition"),
    ],
)
def test_structured_expressions_are_held_to_the_allowlist(
    client: TestClient, lake: Path, overrides: dict[str, Any], field: str
) -> None:
    assert_refused(client, structured(lake, **overrides), field, "not allowed")


def test_a_glob_in_a_source_path_is_422(client: TestClient, lake: Path, tmp_path: Path) -> None:
    """F3: ``/lake/*/secret.parquet`` once passed the lake-root check and Hadoop expanded it through a
    symlink under the root to a directory outside."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.parquet").write_bytes(b"PAR1")
    os.symlink(outside, lake / "link")
    glob = f"{lake}/*/secret.parquet"
    assert_refused(
        client, structured(lake, source={"format": "parquet", "path": glob}), "source.path", "glob character"
    )
    assert_refused(client, sql_body(lake, f"parquet.`{glob}`"), "sql", "glob character")
    inner = f"(SELECT * FROM parquet.`{lake}/li[n]k/secret.parquet`)"
    assert_refused(client, sql_body(lake, inner), "sql", "glob character")


# --- fuzzing the parsers -------------------------------------------------------------------------------------

SAFE = sorted(ALLOWED_FUNCTIONS)[:: len(ALLOWED_FUNCTIONS) // 40]
SPELLINGS = ["{f}", "`{f}`", "builtin.{f}", "system.builtin.{f}", "{F}", "IDENTIFIER('{f}')"]
WORDS = [*SAFE, *REFUSED_FUNCTIONS, "transform", "identifier", "user", "current_user", "no_such_fn"]
literal = st.one_of(
    st.integers(-5, 5).map(str),
    st.sampled_from(["'a'", "NULL", "TRUE", "'${env:PATH}'", "'\\''", "'\\\\'", "s.id", "s.name", "t.id"]),
)


@st.composite
def call(draw: st.DrawFn, depth: int = 0) -> str:
    name = draw(st.sampled_from(WORDS))
    spelled = draw(st.sampled_from(SPELLINGS)).format(f=name, F=name.upper())
    inner = call(depth + 1) if depth < 2 else literal
    args = draw(st.lists(st.one_of(literal, inner), max_size=3))
    return f"{spelled}({', '.join(args)})"


expression = st.one_of(literal, call(), call(), st.text(max_size=30))
junk = st.sampled_from(["", "", "", "", " /* c */", " -- c\r", " /*+ BROADCAST(x) */", "\n", " ${x}", "`", "'"])


@st.composite
def source_query(draw: st.DrawFn) -> str:
    value = draw(expression)
    relation = draw(
        st.sampled_from(
            [
                "",
                " FROM delta.`{lake}/s` AS x",
                " FROM parquet.`{lake}/p/*.parquet`",
                " FROM VALUES (1) AS v(a)",
                " FROM range(3)",
                " FROM x",
                " FROM spark_catalog.default.x",
                " FROM delta.`{lake}/s` AS x LATERAL VIEW explode(array(1)) e AS y",
            ]
        )
    )
    select = f"SELECT CAST(1 AS BIGINT) AS id, {value} AS name{relation}{draw(junk)}"
    shape = draw(st.sampled_from(["{q}", "WITH c AS ({q}) SELECT * FROM c", "SELECT * FROM ({q}) z", "{q} UNION {q}"]))
    return shape.replace("{q}", select)


CALL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*|`(?:[^`]|``)*`)\s*\(")


def called_names(text: str) -> list[tuple[str, str]]:
    """(the word before, name) of every ``name(`` outside string literals: a reading of Spark SQL's lexer that
    shares no code with the service's."""
    out: list[tuple[str, str]] = []
    plain: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in "'\"":
            j = i + 1
            while j < len(text) and text[j] != ch:
                j += 2 if text[j] == "\\" else 1
            plain.append(" '' ")
            i = j + 1
        else:
            plain.append(ch)
            i += 1
    stripped = "".join(plain)
    for match in CALL.finditer(stripped):
        before = stripped[: match.start()].rstrip()
        previous = re.search(r"([A-Za-z_]+|\S)$", before)
        out.append((previous.group(1).upper() if previous else "", match.group(1).strip("`").lower()))
    return out


def sent_texts(spec: Any) -> list[str]:
    """Every expression and query text the engine sends Spark for this spec."""
    texts = [spec.on]
    for clause in spec.clauses:
        if clause.condition is not None:
            texts.append(clause.condition)
        action = clause.action
        texts.extend((getattr(action, "set", None) or getattr(action, "values", None) or {}).values())
    if isinstance(spec.source, engine.QuerySource):
        texts.append(spec.source.query)
    return texts


def assert_only_allowed_calls(body: dict[str, Any], lake: Path) -> None:
    built = build_merge(parse_request(body), LakeRoots([lake]))
    canonical = engine.validate_spec(built.spec)
    for text in sent_texts(canonical):
        assert "${" not in text
        for before, name in called_names(text):
            if before == "AS":
                continue  # a relation's alias and its column names
            assert name in ALLOWED_FUNCTIONS | SYNTAX_BEFORE_PAREN, (name, text)
            assert name not in REFUSED_FUNCTIONS, text
            assert before != ".", text


FUZZ = settings(max_examples=120, deadline=None, database=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def fuzz_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, Path]]:
    base = tmp_path_factory.mktemp("security-fuzz")
    lake = base / "lake"
    lake.mkdir()
    s = Settings(database_url=f"sqlite:///{base / 'jobs.db'}", lake_roots=[str(lake)])
    manager = JobManager.from_url(s.database_url)
    manager.migrate()
    yield TestClient(create_app(s, manager=manager), raise_server_exceptions=False), lake
    manager.dispose()


def assert_accepted_safely_or_refused(client: TestClient, body: dict[str, Any], lake: Path) -> None:
    """Never a 5xx: a 202 whose merge calls only allowlisted functions, or a 422."""
    response = client.post("/merges", json=body)
    assert response.status_code < 500, response.text
    if response.status_code == 202:
        assert_only_allowed_calls(body, lake)
    else:
        assert response.status_code == 422, response.text


@given(query=source_query(), tail=junk)
@FUZZ
def test_fuzzed_sql_merges_never_5xx_and_call_only_allowed_functions(
    fuzz_app: tuple[TestClient, Path], query: str, tail: str
) -> None:
    client, lake = fuzz_app
    body = {"sql": sql_body(lake, "(" + query.replace("{lake}", str(lake)) + ")")["sql"] + tail}
    assert_accepted_safely_or_refused(client, body, lake)


@given(on=expression, condition=st.one_of(st.none(), expression), value=expression)
@FUZZ
def test_fuzzed_structured_merges_never_5xx_and_call_only_allowed_functions(
    fuzz_app: tuple[TestClient, Path], on: str, condition: str | None, value: str
) -> None:
    client, lake = fuzz_app
    clause: dict[str, Any] = {"action": "update", "set": {"name": value}}
    if condition is not None:
        clause["condition"] = condition
    body = structured(lake, on=f"t.id = s.id AND {on} IS NOT NULL", when_matched=[clause])
    assert_accepted_safely_or_refused(client, body, lake)
