"""A merge whose ``txn`` the table already holds: its result read back from the commit that recorded it, from the
log alone. A retried job finds its landed commit this way even while Spark is down."""

from __future__ import annotations

import contextlib

from engine import delta
from engine.delta import Snapshot
from engine.errors import TableNotFoundError
from engine.result import ALL_METRICS, AppTransaction, MergeResult
from engine.spec import MergeSpec


def result_row(m: dict[str, int]) -> dict[str, int]:
    """The result row of ``MERGE INTO`` from its metrics."""
    updated = m.get("numTargetRowsUpdated", 0)
    deleted = m.get("numTargetRowsDeleted", 0)
    inserted = m.get("numTargetRowsInserted", 0)
    return {
        "num_affected_rows": updated + deleted + inserted,
        "num_updated_rows": updated,
        "num_deleted_rows": deleted,
        "num_inserted_rows": inserted,
    }


def recorded_metrics(snapshot: Snapshot, version: int | None) -> dict[str, int]:
    """The ``operationMetrics`` a commit recorded (as strings), as numbers: exactly the keys it recorded."""
    metrics: dict[str, int] = {}
    if version is None:
        return metrics
    for key, value in (delta.commit_info(snapshot, version).get("operationMetrics") or {}).items():
        with contextlib.suppress(TypeError, ValueError):
            metrics[key] = int(value)
    return metrics


def holds(snapshot: Snapshot, txn: AppTransaction) -> bool:
    """Whether the table already holds ``txn``: Delta's rule, its version for the app at least ``txn``'s."""
    applied = snapshot.app_transaction_version(txn.app_id)
    return applied is not None and applied >= txn.version


def applied_result(snapshot: Snapshot, txn: AppTransaction, *, all_metrics: bool = True) -> MergeResult:
    """The result of the merge that recorded ``txn``, from its commit's metrics. ``all_metrics``: every metric the
    engine reports (those the commit did not record, as Delta shows some only in its UI, are 0), else exactly the
    recorded ones."""
    version = delta.find_app_transaction_commit(snapshot, txn.app_id, txn.version)
    metrics = recorded_metrics(snapshot, version)
    if all_metrics:
        metrics = {**dict.fromkeys(ALL_METRICS, 0), **metrics}
    # A log cleaned past that commit no longer says which version it was: no version rather than a wrong one.
    return MergeResult(
        table_version=version,
        result=result_row(metrics),
        metrics=metrics,
        already_applied=True,
    )


def holding(path: str, lake_roots: tuple[str, ...], txn: AppTransaction) -> Snapshot | None:
    """The table's snapshot when it holds ``txn``; None when it does not, or does not exist yet."""
    try:
        snapshot = delta.load_snapshot(path, lake_roots=lake_roots)
    except TableNotFoundError:
        return None
    return snapshot if holds(snapshot, txn) else None


def find_applied(spec: MergeSpec, txn: AppTransaction, *, all_metrics: bool = True) -> MergeResult | None:
    """The result of ``spec``'s merge when an earlier attempt committed it under ``txn``; None when it did not."""
    target = holding(spec.target, spec.lake_roots, txn)
    return None if target is None else applied_result(target, txn, all_metrics=all_metrics)
