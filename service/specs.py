"""From a request body to an ``engine.MergeSpec``: lake-root checks, clause rules and the engine's validation,
each failure a 422 that names the field at fault. The worker rebuilds the spec from the stored body the same way.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import sqlglot
from pydantic import TypeAdapter

import engine
import engine.errors as engine_errors
from service.errors import RequestValidationProblem
from service.paths import LakeRoots
from service.schemas import (
    AutoCdcMergeIn,
    DeleteClause,
    InsertAllClause,
    InsertClause,
    MergeRequest,
    RowsSourceIn,
    SqlMergeIn,
    StructuredMergeIn,
    UpdateAllClause,
    UpdateClause,
)

T = TypeVar("T")
_REQUEST = TypeAdapter(MergeRequest)
GROUPS: tuple[tuple[str, Literal["matched", "notMatched", "notMatchedBySource"], str], ...] = (
    ("when_matched", "matched", "MATCHED"),
    ("when_not_matched", "notMatched", "NOT MATCHED"),
    ("when_not_matched_by_source", "notMatchedBySource", "NOT MATCHED BY SOURCE"),
)


@dataclass(frozen=True)
class BuiltMerge:
    spec: Any
    """The ``engine.MergeSpec``, checked by the engine, in its canonical form and with every path resolved to its
    canonical local form: what ``engine.run_merge(..., validated=True)`` runs."""
    target: str
    """The target as the caller wrote it (what the job shows)."""
    target_key: str
    """The resolved target path: the table's identity for per-table ordering."""
    dry_run: bool


Request = StructuredMergeIn | SqlMergeIn | AutoCdcMergeIn
AUTO_CDC_FIELDS = frozenset(AutoCdcMergeIn.model_fields["auto_cdc"].annotation.model_fields)  # type: ignore[union-attr]


def parse_request(stored: dict[str, Any]) -> Request:
    return _REQUEST.validate_python(stored)


def build_merge(body: Request, roots: LakeRoots) -> BuiltMerge:
    if isinstance(body, AutoCdcMergeIn):
        return _build_auto_cdc(body, roots)
    if isinstance(body, SqlMergeIn):
        spec, target = _guard(body, lambda: _from_sql(body, roots))
        dry_run = body.dry_run
    else:
        spec = _from_structured(body, roots)
        target = body.target
        dry_run = body.dry_run
    try:
        spec = _guard(body, lambda: VALID_EXPRESSIONS.validate(spec))
    except engine_errors.MergeSpecError as exc:
        message = str(exc)
        if isinstance(body, SqlMergeIn):
            field = "sql"
            message = message if message.startswith("sql") else f"sql: {message}"
        else:
            field = exc.field or "body"
        raise RequestValidationProblem(field, message, title=exc.title) from exc
    _check_rows(spec)
    spec = dataclasses.replace(spec, lake_roots=tuple(str(r) for r in roots.roots))
    return BuiltMerge(spec=spec, target=target, target_key=spec.target, dry_run=dry_run)


def _build_auto_cdc(body: AutoCdcMergeIn, roots: LakeRoots) -> BuiltMerge:
    """An AUTO CDC batch: its spec checked by the engine's rules, each failure a 422 naming the field in the body
    (``auto_cdc.keys``, ``source.rows[2].id``)."""
    cdc = body.auto_cdc
    sequence = (cdc.sequence_by,) if isinstance(cdc.sequence_by, str) else tuple(cdc.sequence_by)

    def names(value: list[str] | None) -> tuple[str, ...] | None:
        return None if value is None else tuple(value)

    spec = engine.AutoCdcSpec(
        target=roots.resolve(body.target, "target"),
        source=_structured_source(body.source, roots),
        keys=tuple(cdc.keys),
        sequence_by=sequence,
        apply_as_deletes=cdc.apply_as_deletes,
        apply_as_truncates=cdc.apply_as_truncates,
        column_list=names(cdc.column_list),
        except_column_list=names(cdc.except_column_list),
        ignore_null_updates=cdc.ignore_null_updates,
        ignore_null_updates_column_list=names(cdc.ignore_null_updates_column_list),
        ignore_null_updates_except_column_list=names(cdc.ignore_null_updates_except_column_list),
        stored_as_scd_type=cdc.stored_as_scd_type,
        track_history_column_list=names(cdc.track_history_column_list),
        track_history_except_column_list=names(cdc.track_history_except_column_list),
        deletion_vectors=body.deletion_vectors,
    )
    try:
        spec = engine.validate_auto_cdc(spec)
    except engine_errors.MergeSpecError as exc:
        field = exc.field or "auto_cdc"
        if field.split("[", 1)[0] in AUTO_CDC_FIELDS:
            field = f"auto_cdc.{field}"
        message = str(exc)
        if exc.field and message.startswith(exc.field):
            message = field + message[len(exc.field) :]
        raise RequestValidationProblem(field, message, title=exc.title) from exc
    except Exception as exc:  # a parser that fails on input it should have refused: still the caller's input
        raise RequestValidationProblem(
            "auto_cdc", f"auto_cdc: cannot parse an expression as Spark SQL ({type(exc).__name__})."
        ) from exc
    _check_rows(spec)
    spec = dataclasses.replace(spec, lake_roots=tuple(str(r) for r in roots.roots))
    return BuiltMerge(spec=spec, target=body.target, target_key=spec.target, dry_run=body.dry_run)


def _structured_source(source: Any, roots: LakeRoots) -> Any:
    if isinstance(source, RowsSourceIn):
        return engine.RowsSource(rows=source.rows, schema=source.schema_ddl)
    return engine.TableSource(
        format=source.format,
        path=roots.resolve(source.path, "source.path"),
        options=dict(source.options),
    )


@dataclass(frozen=True)
class CheckedExpressions:
    """The parts of a spec that ``engine.validate_spec`` rewrites into their canonical text: what runs in Spark."""

    on: str
    query: str | None
    matched: tuple[Any, ...]
    not_matched: tuple[Any, ...]
    not_matched_by_source: tuple[Any, ...]

    @classmethod
    def of(cls, checked: Any) -> CheckedExpressions:
        query = checked.source.query if isinstance(checked.source, engine.QuerySource) else None
        return cls(checked.on, query, checked.matched, checked.not_matched, checked.not_matched_by_source)

    def apply(self, spec: Any) -> Any:
        """``spec`` as ``engine.validate_spec`` returns it, without parsing it again."""
        source = spec.source
        if self.query is not None:
            source = dataclasses.replace(source, query=self.query)
        return dataclasses.replace(
            spec,
            on=self.on,
            source=source,
            matched=self.matched,
            not_matched=self.not_matched,
            not_matched_by_source=self.not_matched_by_source,
        )


class ValidExpressions:
    """Remembers the expression parts of specs that ``engine.validate_spec`` accepted, in their canonical form.

    That check reads only the aliases, the ON condition, the clauses, a source query and the names of its
    relations, and the reader options of a table source and of each relation (never the paths); parsing their
    expressions with sqlglot is most of a submission's CPU, and integrations send the same few merges again and
    again. Only acceptance is remembered: a spec that fails is
    checked anew, so its 422 is unchanged. The memo lives in one process: a spec this process's engine has not
    checked is checked here before anything runs it.
    """

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self._seen: OrderedDict[Hashable, CheckedExpressions] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(spec: Any) -> Hashable:
        def action(a: Any) -> Hashable:
            assignments = getattr(a, "set", None) or getattr(a, "values", None) or {}
            return type(a).__name__, getattr(a, "star", False), tuple(assignments.items())

        def table(t: Any) -> Hashable:
            return t.format, tuple(t.options.items())

        source = spec.source
        if isinstance(source, engine.QuerySource):
            read: Hashable = (source.query, tuple((name, table(r)) for name, r in source.relations.items()))
        else:
            read = table(source) if isinstance(source, engine.TableSource) else None
        return (
            spec.on,
            read,
            spec.target_alias,
            spec.source_alias,
            spec.deletion_vectors,
            tuple(
                tuple((c.clause_type, c.condition, action(c.action)) for c in group)
                for group in (spec.matched, spec.not_matched, spec.not_matched_by_source)
            ),
        )

    def validate(self, spec: Any) -> Any:
        """``spec`` checked and in canonical form, as ``engine.validate_spec`` answers it."""
        key = self.key(spec)
        with self._lock:
            checked = self._seen.get(key)
            if checked is not None:
                self._seen.move_to_end(key)
        if checked is None:
            checked = CheckedExpressions.of(engine.validate_spec(spec))
            with self._lock:
                self._seen[key] = checked
                while len(self._seen) > self.size:
                    self._seen.popitem(last=False)
        return checked.apply(spec)


VALID_EXPRESSIONS = ValidExpressions()


def _guard(body: StructuredMergeIn | SqlMergeIn, step: Callable[[], T]) -> T:
    """A parser that fails on input it should have refused is still the caller's input: 422, not 500."""
    try:
        return step()
    except (engine_errors.MergeServiceEngineError, RequestValidationProblem):
        raise
    except Exception as exc:
        field = "sql" if isinstance(body, SqlMergeIn) else _unparseable_field(body)
        raise RequestValidationProblem(
            field, f"{field}: cannot parse this as Spark SQL ({type(exc).__name__})."
        ) from exc


def _unparseable_field(body: StructuredMergeIn) -> str:
    """The first expression sqlglot cannot read on its own."""
    for field, text in _expressions(body):
        try:
            sqlglot.parse_one(text, dialect="spark")
        except Exception:
            return field
    return "body"


def _expressions(body: StructuredMergeIn) -> list[tuple[str, str]]:
    found = [("on", body.on)]
    for name, _, _ in GROUPS:
        for index, clause in enumerate(getattr(body, name)):
            if clause.condition is not None:
                found.append((f"{name}[{index}].condition", clause.condition))
            for key in ("set", "values"):
                for column, value in (getattr(clause, key, None) or {}).items():
                    found.append((f"{name}[{index}].{key}.{column}", value))
    return found


def _from_sql(body: SqlMergeIn, roots: LakeRoots) -> tuple[Any, str]:
    try:
        spec = engine.parse_merge_sql(body.sql)
    except engine_errors.MergeSpecError as exc:
        raise RequestValidationProblem("sql", str(exc), title=exc.title) from exc
    target = spec.target
    source = spec.source
    if isinstance(source, engine.TableSource):
        source = dataclasses.replace(source, path=roots.resolve(source.path, "sql"))
    elif isinstance(source, engine.QuerySource):  # a SELECT over other sources: each relation must be in the lake
        relations = {
            name: dataclasses.replace(rel, path=roots.resolve(rel.path, "sql"))
            for name, rel in source.relations.items()
        }
        source = dataclasses.replace(source, relations=relations)
    spec = dataclasses.replace(
        spec,
        target=roots.resolve(target, "sql"),
        source=source,
        schema_evolution=spec.schema_evolution or body.schema_evolution,
        deletion_vectors=body.deletion_vectors,
    )
    return spec, target


def _from_structured(body: StructuredMergeIn, roots: LakeRoots) -> Any:
    target = roots.resolve(body.target, "target")
    source = _structured_source(body.source, roots)
    _check_clause_rules(body)
    groups: dict[str, tuple[Any, ...]] = {}
    for name, clause_type, _ in GROUPS:
        groups[name] = tuple(
            engine.MergeClause(clause_type=clause_type, action=_action(c), condition=c.condition)
            for c in getattr(body, name)
        )
    return engine.MergeSpec(
        target=target,
        source=source,
        on=body.on,
        matched=groups["when_matched"],
        not_matched=groups["when_not_matched"],
        not_matched_by_source=groups["when_not_matched_by_source"],
        target_alias=body.target_alias,
        source_alias=body.source_alias,
        schema_evolution=body.schema_evolution,
        deletion_vectors=body.deletion_vectors,
    )


def _action(clause: Any) -> Any:
    if isinstance(clause, UpdateClause):
        return engine.UpdateAction(set=dict(clause.set))
    if isinstance(clause, UpdateAllClause):
        return engine.UpdateAction(star=True)
    if isinstance(clause, DeleteClause):
        return engine.DeleteAction()
    if isinstance(clause, InsertClause):
        return engine.InsertAction(values=dict(clause.values))
    if isinstance(clause, InsertAllClause):
        return engine.InsertAction(star=True)
    raise TypeError(f"unknown clause {clause!r}")


def _check_clause_rules(body: StructuredMergeIn) -> None:
    """Delta's clause rules, checked here so the 422 can name the exact clause."""
    if not (body.when_matched or body.when_not_matched or body.when_not_matched_by_source):
        raise RequestValidationProblem(
            "when_matched",
            "A merge needs at least one clause in when_matched, when_not_matched or when_not_matched_by_source.",
        )
    for name, _, label in GROUPS:
        clauses = getattr(body, name)
        for index, clause in enumerate(clauses[:-1]):
            if clause.condition is None:
                raise RequestValidationProblem(
                    f"{name}[{index}].condition",
                    f"{name}[{index}].condition: when there are several {label} clauses, only the last one "
                    "may omit its condition.",
                )
    if body.target_alias.lower() == body.source_alias.lower():
        raise RequestValidationProblem(
            "source_alias", f"source_alias: the target and source aliases must differ (both are {body.target_alias!r})."
        )


def _check_rows(spec: Any) -> None:
    """Inline rows are converted now (typed by their schema, or inferred without one), so a value that does not
    fit, or a column the engine reserves, is a 422, not a failed job."""
    source = spec.source
    if not isinstance(source, engine.RowsSource):
        return
    try:
        table = engine.rows_to_arrow(source.rows, source.schema)
    except engine_errors.SourceRowError as exc:
        field = f"source.rows[{exc.row}]" + (f".{exc.column}" if exc.column else "")
        raise RequestValidationProblem(field, _in_source(exc), title=exc.title) from exc
    except engine_errors.SourceError as exc:
        field = f"source.{exc.field}" if exc.field else "source"
        raise RequestValidationProblem(field, _in_source(exc), title=exc.title) from exc
    field = "source.schema" if source.schema is not None else "source.rows"
    try:
        engine.check_no_internal_columns(field, table.column_names)
    except engine_errors.MergeSpecError as exc:
        raise RequestValidationProblem(field, str(exc), title=exc.title) from exc


def _in_source(exc: engine_errors.SourceError) -> str:
    """The engine names ``rows[1].id`` or ``schema``; in the request body they live under ``source``."""
    return f"source.{exc}" if exc.field else str(exc)
