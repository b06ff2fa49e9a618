"""The documentation kept in step with the product: docs/api.md against the OpenAPI document the app serves, the
problem types the code emits, the settings it reads and the metrics the engine reports; and the README and docs
link only inside the repository. No Spark: the app is built on a throwaway SQLite job table."""

from __future__ import annotations

import ast
import gc
import importlib
import inspect
import json
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

import engine
import engine.errors as engine_errors
from service import client_cli
from service.app import create_app
from service.errors import ServiceError
from service.jobs import Phase, Status
from service.paths import LakeRoots
from service.problems import GENERIC_ENGINE_SLUG, INTERNAL_SLUG, PROBLEM_SLUGS, TYPE_BASE, job_problem, slug_for
from service.retry import is_retryable
from service.settings import Settings
from service.specs import build_merge, parse_request

ROOT = Path(__file__).resolve().parents[2]
API_DOC = ROOT / "docs" / "api.md"
PRODUCT = ("README.md", "docs", "engine", "service", "pyproject.toml")
"""What a user of the product gets: none of it may point outside the repository."""
OUTSIDE_LINKS = ("../shared", "shared/api-contract")
HTTP_METHODS = ("get", "post", "put", "patch", "delete", "head", "options")
OPERATION = re.compile(r"`(GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS) (/[^`\s?]*)")
DOCUMENTED_TYPE = re.compile(re.escape(TYPE_BASE) + r"([a-z0-9-]+)")
DOCUMENTED_SETTING = re.compile(r"\bMERGE_SERVICE_[A-Z0-9_]+\b")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
JSON_EXAMPLE = re.compile(r"^```json\n(.*?)^```", re.MULTILINE | re.DOTALL)


@pytest.fixture(scope="module")
def api_doc() -> str:
    return API_DOC.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def openapi(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("docs")
    settings = Settings(database_url=f"sqlite:///{folder}/jobs.db", lake_roots=[str(folder)])
    app = create_app(settings)
    try:
        served: dict[str, Any] = TestClient(app).get("/openapi.json").json()
        return served
    finally:
        app.state.manager.dispose()


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def in_code(text: str, word: str) -> bool:
    """Whether ``word`` appears as a code span or a quoted JSON value: as a name, not as part of prose."""
    return re.search(rf"[`\"]{re.escape(word)}[`\"]", text) is not None


# --- the API against /openapi.json ------------------------------------------------------------------------------


def operations(openapi: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (method.upper(), path) for path, item in openapi["paths"].items() for method in item if method in HTTP_METHODS
    }


def test_every_operation_of_the_openapi_is_documented(openapi: dict[str, Any], api_doc: str) -> None:
    missing = sorted(f"{m} {p}" for m, p in operations(openapi) if f"`{m} {p}" not in api_doc)
    assert not missing, f"docs/api.md does not document {missing}"


def test_every_documented_operation_exists(openapi: dict[str, Any]) -> None:
    served = operations(openapi)
    for doc in markdown_files():
        named = {(m, p) for m, p in OPERATION.findall(doc.read_text(encoding="utf-8"))}
        unknown = sorted(f"{m} {p}" for m, p in named - served)
        assert not unknown, f"{doc.relative_to(ROOT)} documents {unknown}, which the API does not serve"


def _schema_names(node: Any) -> Iterator[str]:
    """Every property name and every enum or constant string value in a part of the OpenAPI document."""
    if isinstance(node, dict):
        yield from node.get("properties", {})
        for value in [*node.get("enum", []), node.get("const")]:
            if isinstance(value, str):
                yield value
        for child in node.values():
            yield from _schema_names(child)
    elif isinstance(node, list):
        for child in node:
            yield from _schema_names(child)


def test_every_body_field_parameter_and_value_is_documented(openapi: dict[str, Any], api_doc: str) -> None:
    names = set(_schema_names(openapi["components"]["schemas"]))
    for item in openapi["paths"].values():
        for operation in item.values():
            names |= {p["name"] for p in operation.get("parameters", []) if p["in"] != "path"}
    missing = sorted(n for n in names if not in_code(api_doc, n))
    assert not missing, f"docs/api.md does not name these fields, parameters or values: {missing}"


def _declared_headers(openapi: dict[str, Any]) -> dict[str, set[str]]:
    """Each response header the OpenAPI document declares, with the status codes that carry it."""
    declared: dict[str, set[str]] = {}
    for item in openapi["paths"].values():
        for method, operation in item.items():
            if method in HTTP_METHODS:
                for code, response in operation.get("responses", {}).items():
                    for name in response.get("headers", {}):
                        declared.setdefault(name, set()).add(code)
    return declared


def test_the_openapi_declares_the_headers_the_docs_promise(openapi: dict[str, Any], api_doc: str) -> None:
    declared = _declared_headers(openapi)
    table = api_doc.split("## Headers", 1)[1].split("\n## ", 1)[0]
    for name in declared:
        assert f"`{name}`" in table, f"docs/api.md's Headers table does not name {name}"
    assert "401" in declared.get("WWW-Authenticate", set())
    assert {"200", "202", "503"} <= declared.get("Retry-After", set())
    assert {"200", "202"} <= declared.get("Location", set())


def test_the_request_examples_are_accepted(api_doc: str, tmp_path: Path) -> None:
    """Each merge the document shows, structured or SQL, passes the submission's checks as it stands."""
    lake = tmp_path / "lake"
    examples = [json.loads(block) for block in JSON_EXAMPLE.findall(api_doc)]
    requests = [e for e in examples if isinstance(e, dict) and ("on" in e or "sql" in e)]
    assert {"on", "sql"} <= {key for e in requests for key in e}, "docs/api.md shows a merge in both forms"
    for example in requests:
        body = json.loads(json.dumps(example).replace('"/lake/', f'"{lake}/').replace("`/lake/", f"`{lake}/"))
        built = build_merge(parse_request(body), LakeRoots([lake]))
        assert built.target_key.startswith(str(lake))


# --- problem types ------------------------------------------------------------------------------------------------


def _python_files() -> Iterator[Path]:
    for package in ("engine", "service"):
        yield from sorted((ROOT / package).rglob("*.py"))


def _literal_slugs(tree: ast.AST) -> Iterator[str]:
    """Slugs the code spells out: ``problem_type("slug")``, ``"urn:merge-service:problem:slug"``, and class
    attributes named like ``slug = "..."``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            first = node.args[0]
            if name == "problem_type" and isinstance(first, ast.Constant) and isinstance(first.value, str):
                yield first.value
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(TYPE_BASE):
            yield node.value.removeprefix(TYPE_BASE)
        elif isinstance(node, ast.ClassDef):
            for statement in node.body:
                targets = (
                    statement.targets
                    if isinstance(statement, ast.Assign)
                    else [statement.target]
                    if isinstance(statement, ast.AnnAssign)
                    else []
                )
                value = getattr(statement, "value", None)
                if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
                    continue
                for target in targets:
                    if isinstance(target, ast.Name) and "slug" in target.id.lower():
                        yield value.value


def _import_all(package: Any) -> None:
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(module.name)


def _subclasses(cls: type) -> set[type]:
    found: set[type] = set()
    subclasses: list[type] = cls.__subclasses__()
    for sub in subclasses:
        found |= {sub, *_subclasses(sub)}
    return found


def _instance(cls: type[BaseException]) -> BaseException:
    """An instance of an error class with every required argument given as text."""
    try:
        signature = inspect.signature(cls)
    except ValueError:  # no __init__ of its own: Exception's, which takes the message
        return cls("detail")
    parameters = [
        p
        for p in signature.parameters.values()
        if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    positional = [f"{p.name} detail" for p in parameters if p.kind is not p.KEYWORD_ONLY]
    keywords = {p.name: f"{p.name} detail" for p in parameters if p.kind is p.KEYWORD_ONLY}
    return cls(*positional, **keywords)


def job_error_slugs() -> set[str]:
    """The ``type`` of a failed job's ``error`` for every error class the engine and the service define."""
    _import_all(engine)
    classes = _subclasses(engine_errors.MergeServiceEngineError) | _subclasses(ServiceError)
    slugs = set()
    for cls in classes:
        problem_type = job_problem(_instance(cls))["type"]
        assert problem_type.startswith(TYPE_BASE), f"{cls.__name__} gives the job error type {problem_type!r}"
        slugs.add(problem_type.removeprefix(TYPE_BASE))
    return slugs


def code_slugs() -> set[str]:
    slugs = set(job_error_slugs()) | set(PROBLEM_SLUGS.values())
    for path in _python_files():
        slugs |= set(_literal_slugs(ast.parse(path.read_text(encoding="utf-8"))))
    return {s for s in slugs if s}


def test_every_problem_type_the_code_emits_is_documented(api_doc: str) -> None:
    documented = set(DOCUMENTED_TYPE.findall(api_doc))
    missing = sorted(code_slugs() - documented)
    assert not missing, f"docs/api.md does not document the problem types {missing}"


def test_every_documented_problem_type_is_emitted(api_doc: str) -> None:
    unknown = sorted(set(DOCUMENTED_TYPE.findall(api_doc)) - code_slugs())
    assert not unknown, f"docs/api.md documents problem types the code never emits: {unknown}"


def test_the_slug_scan_sees_every_way_the_code_spells_a_slug() -> None:
    """The scan that the two tests above rest on finds each form a problem type is written in."""
    source = (
        'a = problem_type("from-call")\n'
        f'b = "{TYPE_BASE}from-literal"\n'
        "class E(Exception):\n"
        '    slug = "from-class"\n'
        '    problem_slug: str = "from-annotated"\n'
        '    title = "not a slug"\n'
    )
    assert set(_literal_slugs(ast.parse(source))) == {"from-call", "from-literal", "from-class", "from-annotated"}


def test_every_engine_error_class_has_its_slug_in_the_table() -> None:
    """A new engine error gets its public type on purpose, not from its class name."""
    _import_all(engine)
    classes = {engine_errors.MergeServiceEngineError, *_subclasses(engine_errors.MergeServiceEngineError)}
    missing = sorted(f"{c.__module__}.{c.__qualname__}" for c in classes if c not in PROBLEM_SLUGS)
    assert not missing, f"service/problems.py PROBLEM_SLUGS does not name {missing}"


def test_every_service_error_class_has_its_slug_in_the_table() -> None:
    classes = {ServiceError, *_subclasses(ServiceError)}
    missing = sorted(c.__qualname__ for c in classes if c not in PROBLEM_SLUGS)
    assert not missing, f"service/problems.py PROBLEM_SLUGS does not name {missing}"


def test_a_storage_failure_while_committing_is_a_retried_storage_write() -> None:
    """A full disk under the log is the same transient storage problem as under the table's files."""
    error = engine_errors.CommitStorageError("Cannot write commit 3 to /lake/t: [Errno 28] No space left on device")
    assert isinstance(error, engine_errors.CommitFailedError)
    assert is_retryable(error)
    problem = job_problem(error)
    assert (problem["type"], problem["status"], problem["title"]) == (
        TYPE_BASE + "storage-write",
        503,
        job_problem(engine_errors.StorageWriteError("Spark could not write"))["title"],
    )
    assert not is_retryable(engine_errors.CommitFailedError("Commit 3 of /lake/t vanished"))


def test_a_class_the_table_does_not_name_answers_its_nearest_named_base() -> None:
    class UnnamedConflictError(engine_errors.ConcurrentAppendError):
        pass

    class UnnamedEngineError(engine_errors.MergeServiceEngineError):
        pass

    class OutsideError(Exception):
        pass

    try:
        assert slug_for(UnnamedConflictError("detail")) == "concurrent-append"
        assert job_problem(UnnamedConflictError("detail"))["type"] == TYPE_BASE + "concurrent-append"
        assert slug_for(UnnamedEngineError) == GENERIC_ENGINE_SLUG
        assert job_problem(UnnamedEngineError("detail"))["type"] == TYPE_BASE + GENERIC_ENGINE_SLUG
        assert slug_for(OutsideError) == INTERNAL_SLUG
    finally:
        # Classes made here must not outlive the test: the walks above find every subclass still alive.
        del UnnamedConflictError, UnnamedEngineError, OutsideError
        gc.collect()


# --- settings, metrics, statuses and phases ------------------------------------------------------------------------


def setting_variables() -> set[str]:
    prefix = str(Settings.model_config.get("env_prefix", ""))
    return {f"{prefix}{name}".upper() for name in Settings.model_fields}


def test_every_setting_is_documented(api_doc: str) -> None:
    missing = sorted(v for v in setting_variables() if f"`{v}`" not in api_doc)
    assert not missing, f"docs/api.md does not document the settings {missing}"


def test_every_documented_setting_exists() -> None:
    known = setting_variables() | client_cli.CLIENT_VARIABLES
    for doc in markdown_files():
        unknown = sorted(set(DOCUMENTED_SETTING.findall(doc.read_text(encoding="utf-8"))) - known)
        assert not unknown, f"{doc.relative_to(ROOT)} names settings that do not exist: {unknown}"


def test_every_metric_status_and_phase_is_documented(api_doc: str) -> None:
    names = [*engine.ALL_METRICS, *(s.value for s in Status), *(p.value for p in Phase)]
    missing = [n for n in names if not in_code(api_doc, n)]
    assert not missing, f"docs/api.md does not name {missing}"


# --- links --------------------------------------------------------------------------------------------------------


def _product_files() -> Iterator[Path]:
    for name in PRODUCT:
        path = ROOT / name
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        else:
            yield path


def test_nothing_in_the_product_links_outside_the_repository() -> None:
    offending = []
    for path in _product_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        offending += [f"{path.relative_to(ROOT)}: {link}" for link in OUTSIDE_LINKS if link in text]
    assert not offending, offending


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    anchors = set()
    for line in FENCE.sub("", markdown).splitlines():
        heading = re.match(r"#{1,6}\s+(.*)", line)
        if heading:
            text = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower())
            anchors.add(text.replace(" ", "-"))
    return anchors


def test_every_relative_link_in_the_docs_resolves_inside_the_repository() -> None:
    for doc in markdown_files():
        text = FENCE.sub("", doc.read_text(encoding="utf-8"))
        for link in LINK.findall(text):
            if re.match(r"[a-z][a-z0-9+.-]*:", link):
                continue
            file_part, _, anchor = link.partition("#")
            target = (doc.parent / file_part).resolve() if file_part else doc
            where = f"{doc.relative_to(ROOT)} links {link}"
            assert target.is_relative_to(ROOT), f"{where}, outside the repository"
            assert target.exists(), f"{where}, which does not exist"
            if anchor:
                assert anchor in _anchors(target.read_text(encoding="utf-8")), f"{where}: no such heading"


def test_the_readme_links_both_documents() -> None:
    links = set(LINK.findall((ROOT / "README.md").read_text(encoding="utf-8")))
    assert {"docs/api.md", "docs/engine.md"} <= {link.partition("#")[0] for link in links}
