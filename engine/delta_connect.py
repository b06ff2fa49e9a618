"""A merge run as Delta Lake's own ``MERGE INTO``, on a Spark Connect server whose Spark runs Delta.

The spec is the one ``run_merge`` takes, checked by the same rules (``validate_spec``: the function allowlist,
scopes, forbidden constructs) and its source read by the same code (``source_dataframe``: lake roots, no globs).
What differs is who merges: the statement ``MERGE INTO delta.`<target>` ... USING <source view> ...`` goes to
Spark, and Delta's ``MergeIntoCommand`` finds the touched files, writes and commits. Everything Delta's MERGE
needs from the server is its SQL extension and catalog; Delta Connect's plugins, which serve its DataFrame API,
are not used.

Exactly-once uses Delta's idempotent DML: the statement runs with ``spark.databricks.delta.write.txnAppId`` and
``txnVersion`` set to the job's ``txn``, so Delta records that ``txn`` in its commit and skips a statement whose
``txn`` the table already holds. As ``run_merge`` does, the log is read for the ``txn`` before anything runs; and
after a statement that failed or was interrupted, so that a commit which landed is reported as the job's commit.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from engine import delta
from engine.applied import applied_result, holds, recorded_metrics, result_row
from engine.delta import Snapshot
from engine.errors import (
    ConcurrentModificationError,
    InvariantViolationError,
    MergeCancelledError,
    MergeExecutionError,
    MergeServiceEngineError,
    MergeSpecError,
    MultipleMatchError,
    SchemaMismatchError,
    TableNotFoundError,
    spark_error_message,
)
from engine.result import AppTransaction, MergeResult, Phase
from engine.source import source_dataframe
from engine.spark import session_conf
from engine.spark_errors import translate_spark_error
from engine.spec import DeleteAction, InsertAction, MergeClause, MergeSpec, UpdateAction
from engine.validation import column_path, validate_spec

TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
SCHEMA_AUTO_MERGE_CONF = "spark.databricks.delta.schema.autoMerge.enabled"
NO_DELTA_ON_SERVER = (
    "The Spark Connect server has no Delta Lake: it cannot resolve delta.`<path>`, though the table exists. The "
    '"delta" engine needs a cluster with Delta\'s SQL extension (io.delta.sql.DeltaSparkSessionExtension) and catalog '
    '(org.apache.spark.sql.delta.catalog.DeltaCatalog); on this one, use the "builtin" engine.'
)
PERSISTENT_DELETION_VECTORS_CONF = "spark.databricks.delta.merge.deletionVectors.persistent"

DRY_RUN_REFUSED = (
    "dry_run: Delta's MERGE INTO has no dry run (it always commits what it computes); "
    "run the dry run with the service's own engine."
)

# Delta's error conditions, by the engine error of the same meaning.
_DELTA_ERRORS: tuple[tuple[tuple[str, ...], type[MergeServiceEngineError]], ...] = (
    (("DELTA_MULTIPLE_SOURCE_ROW_MATCHING_TARGET_ROW",), MultipleMatchError),
    (
        (
            "DELTA_CONCURRENT_",
            "DELTA_METADATA_CHANGED",
            "DELTA_PROTOCOL_CHANGED",
            "DELTA_CONCURRENT_TRANSACTION",
        ),
        ConcurrentModificationError,
    ),
    (("DELTA_MISSING_DELTA_TABLE", "DELTA_TABLE_NOT_FOUND", "DELTA_PATH_DOES_NOT_EXIST"), TableNotFoundError),
    (
        (
            "DELTA_NOT_NULL_CONSTRAINT_VIOLATED",
            "DELTA_VIOLATE_CONSTRAINT_WITH_VALUES",
            "DELTA_CHECK_CONSTRAINT",
            "DELTA_EXCEED_CHAR_VARCHAR_LIMIT",
            "EXCEED_LIMIT_LENGTH",
        ),
        InvariantViolationError,
    ),
    (("DELTA_FAILED_TO_MERGE_FIELDS", "DELTA_SCHEMA_CHANGED", "DELTA_MERGE_INCOMPATIBLE"), SchemaMismatchError),
)


def run_delta_merge(
    spark: SparkSession,
    spec: MergeSpec,
    *,
    txn: AppTransaction | None = None,
    on_progress: Callable[[Phase], None] | None = None,
    dry_run: bool = False,
    validated: bool = False,
) -> MergeResult:
    """Apply one merge with Delta's own MERGE INTO as one Delta commit; the result and metrics are Delta's.
    ``validated``: ``spec`` is what ``validate_spec`` returned for it in this process."""
    if dry_run:
        raise MergeSpecError(DRY_RUN_REFUSED)
    if not validated:
        spec = validate_spec(spec)
    progress = on_progress or (lambda phase: None)
    before = delta.load_snapshot(spec.target, lake_roots=spec.lake_roots)
    if txn is not None and holds(before, txn):
        return applied_result(before, txn, all_metrics=False)
    views: list[str] = []
    try:
        progress("preparing_source")
        try:
            source = source_dataframe(spark, spec.source, views, spec.lake_roots)
            view = f"merge_source_{uuid.uuid4().hex[:12]}"
            source.createOrReplaceTempView(view)
        except PySparkException as exc:
            raise translate_spark_error(exc) from exc
        views.append(view)
        statement = merge_statement(spec, view)
        # From here Delta may commit at any moment: the job counts as committing (a retry looks for its txn).
        progress("committing")
        rows = _run_statement(spark, statement, _statement_conf(spec, txn), before, txn)
    finally:
        for name in views:
            with contextlib.suppress(PySparkException):
                spark.catalog.dropTempView(name)
    return _result(spec, before, txn, rows)


def merge_statement(spec: MergeSpec, source_view: str) -> str:
    """The MERGE INTO statement of a checked spec: every expression as ``canonical_spec`` regenerated it, every
    name quoted."""
    parts = [
        f"MERGE INTO delta.{quote(spec.target)} AS {quote(spec.target_alias)}",
        f"USING {quote(source_view)} AS {quote(spec.source_alias)}",
        f"ON {spec.on}",
    ]
    heads = {
        "matched": "WHEN MATCHED",
        "notMatched": "WHEN NOT MATCHED",
        "notMatchedBySource": "WHEN NOT MATCHED BY SOURCE",
    }
    for clause in spec.clauses:
        condition = f" AND {clause.condition}" if clause.condition is not None else ""
        parts.append(f"{heads[clause.clause_type]}{condition} THEN {_action_sql(clause, spec.target_alias)}")
    return "\n".join(parts)


def quote(name: str) -> str:
    """A Spark SQL quoted identifier: backticks, a backtick inside doubled."""
    return "`" + name.replace("`", "``") + "`"


def _action_sql(clause: MergeClause, target_alias: str) -> str:
    action = clause.action
    if isinstance(action, DeleteAction):
        return "DELETE"
    if isinstance(action, UpdateAction):
        if action.star:
            return "UPDATE SET *"
        return "UPDATE SET " + ", ".join(
            f"{_column(column, target_alias)} = {value}" for column, value in action.set.items()
        )
    if isinstance(action, InsertAction):
        if action.star:
            return "INSERT *"
        columns = ", ".join(_column(column, target_alias) for column in action.values)
        return f"INSERT ({columns}) VALUES ({', '.join(action.values.values())})"
    raise MergeSpecError(f"{clause.describe()}: unknown action {action!r}")


def _column(column: str, target_alias: str) -> str:
    """A target column (or a field inside a struct) as the engine reads an assignment's key, quoted part by part."""
    return ".".join(quote(part) for part in column_path(column, target_alias))


def _statement_conf(spec: MergeSpec, txn: AppTransaction | None) -> dict[str, str]:
    """The Delta settings the statement runs under: the job's txn (Delta's idempotent DML), schema evolution as
    Delta's ``schema.autoMerge.enabled``, and whether Delta's MERGE may write deletion vectors."""
    conf = {
        SCHEMA_AUTO_MERGE_CONF: "true" if spec.schema_evolution else "false",
        PERSISTENT_DELETION_VECTORS_CONF: "true" if spec.deletion_vectors == "auto" else "false",
    }
    if txn is not None:
        conf[TXN_APP_ID_CONF] = txn.app_id
        conf[TXN_VERSION_CONF] = str(txn.version)
    return conf


def _run_statement(
    spark: SparkSession, statement: str, conf: Mapping[str, str], before: Snapshot, txn: AppTransaction | None
) -> list[dict[str, Any]]:
    """Delta's output row (none when Delta found the txn already applied). A statement that fails, or is
    interrupted, after its commit landed counts as done: Spark Connect answers an interrupted statement only once
    its execution thread has stopped, so the log read after the error is final."""
    try:
        with session_conf(spark, conf):
            return [row.asDict() for row in spark.sql(statement).collect()]
    except PySparkException as exc:
        if txn is not None and _landed(before, txn):
            return []
        raise _delta_error(exc) from exc
    except MergeServiceEngineError:
        raise
    except Exception:
        if txn is not None and _landed(before, txn):
            return []
        raise


def _landed(before: Snapshot, txn: AppTransaction) -> bool:
    """Whether the table now holds ``txn``: the statement's commit landed."""
    now = delta.load_snapshot(before.root, lake_roots=before.lake_roots)
    applied = now.app_transaction_version(txn.app_id)
    return applied is not None and applied >= txn.version


def _delta_error(exc: PySparkException) -> MergeServiceEngineError:
    """Delta's errors as the engine's kinds (so the job's problem type and retry rule are the same), the rest as
    ``translate_spark_error`` reads Spark's."""
    condition = ""
    with contextlib.suppress(Exception):
        condition = exc.getCondition() or ""
    text = str(exc)
    if condition.startswith("TABLE_OR_VIEW_NOT_FOUND") and "`delta`." in text[:500]:
        # The target was read from its log before the statement: only a Spark without Delta misses it.
        return MergeExecutionError(NO_DELTA_ON_SERVER)
    for prefixes, kind in _DELTA_ERRORS:
        if condition.startswith(prefixes) or any(p in text[:300] for p in prefixes):
            return kind(spark_error_message(exc))
    translated = translate_spark_error(exc)
    if isinstance(translated, MergeCancelledError):
        return MergeCancelledError("The merge was cancelled while Delta was running it; it did not commit.")
    return translated


def _result(
    spec: MergeSpec, before: Snapshot, txn: AppTransaction | None, rows: Sequence[dict[str, Any]]
) -> MergeResult:
    """The version Delta committed and its commit's ``operationMetrics``; the result row is Delta's own."""
    after = delta.load_snapshot(spec.target, lake_roots=spec.lake_roots)
    if txn is not None:
        version = delta.find_app_transaction_commit(after, txn.app_id, txn.version)
    else:
        version = after.version if after.version > before.version else None
    metrics = recorded_metrics(after, version)
    if not rows:
        # No output row: Delta found the txn in the table when its transaction began, or the statement failed
        # after its commit landed; either way the commit's own metrics say what it did.
        return MergeResult(table_version=version, result=result_row(metrics), metrics=metrics, already_applied=True)
    result = {key: int(rows[0].get(key) or 0) for key in result_row({})}
    return MergeResult(table_version=version, result=result, metrics=metrics)
